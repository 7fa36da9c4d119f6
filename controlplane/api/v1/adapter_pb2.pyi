from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FenceToken(_message.Message):
    __slots__ = ("epoch", "seq", "holder")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    seq: int
    holder: str
    def __init__(self, epoch: _Optional[int] = ..., seq: _Optional[int] = ..., holder: _Optional[str] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("cluster_id", "fence")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    fence: FenceToken
    def __init__(self, cluster_id: _Optional[str] = ..., fence: _Optional[_Union[FenceToken, _Mapping]] = ...) -> None: ...

class FenceReply(_message.Message):
    __slots__ = ("highest_epoch", "highest_holder")
    HIGHEST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_HOLDER_FIELD_NUMBER: _ClassVar[int]
    highest_epoch: int
    highest_holder: str
    def __init__(self, highest_epoch: _Optional[int] = ..., highest_holder: _Optional[str] = ...) -> None: ...

class InstanceRef(_message.Message):
    __slots__ = ("instance_id", "deployment_id", "tenant_id", "zone", "pool", "gpus")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    deployment_id: str
    tenant_id: str
    zone: str
    pool: str
    gpus: int
    def __init__(self, instance_id: _Optional[str] = ..., deployment_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., zone: _Optional[str] = ..., pool: _Optional[str] = ..., gpus: _Optional[int] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("cluster_id", "fence", "request_id", "action", "instance", "deadline_ms")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    fence: FenceToken
    request_id: str
    action: str
    instance: InstanceRef
    deadline_ms: int
    def __init__(self, cluster_id: _Optional[str] = ..., fence: _Optional[_Union[FenceToken, _Mapping]] = ..., request_id: _Optional[str] = ..., action: _Optional[str] = ..., instance: _Optional[_Union[InstanceRef, _Mapping]] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class ApplyReply(_message.Message):
    __slots__ = ("applied", "highest_epoch")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    highest_epoch: int
    def __init__(self, applied: _Optional[bool] = ..., highest_epoch: _Optional[int] = ...) -> None: ...
