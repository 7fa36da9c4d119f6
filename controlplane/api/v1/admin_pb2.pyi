from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemberRequest(_message.Message):
    __slots__ = ("node_id", "raft_address", "api_address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    API_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    raft_address: str
    api_address: str
    def __init__(self, node_id: _Optional[str] = ..., raft_address: _Optional[str] = ..., api_address: _Optional[str] = ...) -> None: ...

class MemberReply(_message.Message):
    __slots__ = ("commit_index",)
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    commit_index: int
    def __init__(self, commit_index: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Peer(_message.Message):
    __slots__ = ("node_id", "zone", "raft_address", "api_address", "reachable")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    API_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    zone: str
    raft_address: str
    api_address: str
    reachable: bool
    def __init__(self, node_id: _Optional[str] = ..., zone: _Optional[str] = ..., raft_address: _Optional[str] = ..., api_address: _Optional[str] = ..., reachable: _Optional[bool] = ...) -> None: ...

class FencedCluster(_message.Message):
    __slots__ = ("cluster_id", "epoch", "adapter_epoch", "since_ms")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    epoch: int
    adapter_epoch: int
    since_ms: int
    def __init__(self, cluster_id: _Optional[str] = ..., epoch: _Optional[int] = ..., adapter_epoch: _Optional[int] = ..., since_ms: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "zone", "pid", "role", "term", "leader_id", "lease_holder", "lease_epoch", "lease_remaining_ms", "commit_index", "applied_index", "peers", "version", "raft_address", "api_address", "fenced_clusters")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    LEASE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    API_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FENCED_CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    zone: str
    pid: int
    role: str
    term: int
    leader_id: str
    lease_holder: str
    lease_epoch: int
    lease_remaining_ms: int
    commit_index: int
    applied_index: int
    peers: _containers.RepeatedCompositeFieldContainer[Peer]
    version: str
    raft_address: str
    api_address: str
    fenced_clusters: _containers.RepeatedCompositeFieldContainer[FencedCluster]
    def __init__(self, node_id: _Optional[str] = ..., zone: _Optional[str] = ..., pid: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[str] = ..., lease_holder: _Optional[str] = ..., lease_epoch: _Optional[int] = ..., lease_remaining_ms: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ..., version: _Optional[str] = ..., raft_address: _Optional[str] = ..., api_address: _Optional[str] = ..., fenced_clusters: _Optional[_Iterable[_Union[FencedCluster, _Mapping]]] = ...) -> None: ...
