"""The Admin service's values (a node's status) and its clients: :func:`fetch_status` (``controlplane
status``) and :func:`change_member` (``controlplane members``). The servicer itself lives in
:mod:`controlplane.api.server` with the rest of the API (it needs a token: Status any principal,
membership changes an admin)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import grpc

from controlplane import __version__
from controlplane.api.channel import open_channel
from controlplane.api.v1 import admin_pb2, admin_pb2_grpc
from controlplane.domain.errors import ControlPlaneError

STATUS_DEADLINE_S = 1.0


@dataclass(frozen=True, slots=True)
class Credentials:
    """How a client authenticates: a bearer token, and TLS files when the API is served over TLS."""

    token: str | None = None
    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    server_name: str | None = None

    def channel(self, endpoint: str) -> grpc.Channel:
        return open_channel(endpoint, ca_file=self.ca_file, token=self.token, cert_file=self.cert_file,
                            key_file=self.key_file, server_name=self.server_name)

    def __repr__(self) -> str:  # never show the token
        return f"Credentials(token={'<set>' if self.token else None}, ca_file={self.ca_file!r})"


NO_CREDENTIALS = Credentials()


@dataclass(frozen=True, slots=True)
class PeerStatus:
    node_id: str
    zone: str
    raft_address: str
    api_address: str
    reachable: bool


@dataclass(frozen=True, slots=True)
class FencedClusterStatus:
    """A cluster this node stopped commanding: its adapter holds a higher epoch (admins only)."""

    cluster_id: str
    epoch: int
    adapter_epoch: int
    since_ms: int


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node_id: str
    zone: str
    role: str
    term: int
    leader_id: str
    lease_holder: str
    lease_epoch: int
    lease_remaining_ms: int
    commit_index: int
    applied_index: int
    raft_address: str
    api_address: str
    peers: tuple[PeerStatus, ...] = ()
    pid: int = field(default_factory=os.getpid)
    version: str = __version__
    fenced_clusters: tuple[FencedClusterStatus, ...] = ()


def for_tenant(s: NodeStatus) -> NodeStatus:
    """What a tenant principal sees of a node's status: no addresses, no pid, no epochs, no fenced
    clusters (operators' details; a current epoch and holder were half of what it took to forge an
    adapter command before fencing tokens were signed). Roles, terms and ids stay."""
    return replace(s, lease_epoch=0, raft_address="", api_address="", pid=0, fenced_clusters=(),
                   peers=tuple(replace(p, raft_address="", api_address="") for p in s.peers))


def to_proto(s: NodeStatus) -> admin_pb2.StatusResponse:
    return admin_pb2.StatusResponse(
        node_id=s.node_id, zone=s.zone, pid=s.pid, role=s.role, term=s.term, leader_id=s.leader_id,
        lease_holder=s.lease_holder, lease_epoch=s.lease_epoch, lease_remaining_ms=s.lease_remaining_ms,
        commit_index=s.commit_index, applied_index=s.applied_index, version=s.version,
        raft_address=s.raft_address, api_address=s.api_address,
        peers=[admin_pb2.Peer(node_id=p.node_id, zone=p.zone, raft_address=p.raft_address,
                              api_address=p.api_address, reachable=p.reachable) for p in s.peers],
        fenced_clusters=[admin_pb2.FencedCluster(cluster_id=f.cluster_id, epoch=f.epoch, adapter_epoch=f.adapter_epoch,
                                                 since_ms=f.since_ms) for f in s.fenced_clusters],
    )


def from_proto(r: admin_pb2.StatusResponse) -> dict[str, object]:
    """A JSON-ready dict (what ``controlplane status --json`` prints per node)."""
    return {
        "node_id": r.node_id, "zone": r.zone, "pid": r.pid, "role": r.role, "term": r.term,
        "leader_id": r.leader_id, "lease": {"holder": r.lease_holder, "epoch": r.lease_epoch,
                                            "remaining_ms": r.lease_remaining_ms},
        "commit_index": r.commit_index, "applied_index": r.applied_index, "version": r.version,
        "raft_address": r.raft_address, "api_address": r.api_address,
        "peers": [{"node_id": p.node_id, "zone": p.zone, "raft_address": p.raft_address,
                   "api_address": p.api_address, "reachable": p.reachable} for p in r.peers],
        "fenced_clusters": [{"cluster_id": f.cluster_id, "epoch": f.epoch, "adapter_epoch": f.adapter_epoch,
                             "since_ms": f.since_ms} for f in r.fenced_clusters],
    }


class Membership(Protocol):
    """Membership changes (implemented by the coordinator with ``RaftNode``)."""

    def add_member(self, node_id: str, raft_address: str, api_address: str) -> int: ...

    def remove_member(self, raft_address: str) -> int: ...


def fetch_status(endpoints: Sequence[str], timeout_s: float = STATUS_DEADLINE_S,
                 creds: Credentials = NO_CREDENTIALS) -> list[dict[str, object]]:
    """Status of every endpoint, all asked at once (one node down costs ``timeout_s`` once, not per
    node); an unreachable one (or a refused call) is reported as such, never raised: ``error`` is
    ``CODE: details`` as gRPC said it, ``why`` the same in one short line
    (:func:`controlplane.api.tls_errors.reason`). ``creds`` carries the token (any principal may ask)
    and the TLS files."""
    from concurrent.futures import ThreadPoolExecutor

    from controlplane.api.tls_errors import reason

    def one(ep: str) -> dict[str, object]:
        with creds.channel(ep) as channel:
            try:
                reply = admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=timeout_s)
                return {"endpoint": ep, "reachable": True, **from_proto(reply)}
            except grpc.RpcError as exc:
                code, details = exc.code().name, exc.details() or ""
                transport = code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
                why = reason(details, code, tls=creds.ca_file is not None, ca_file=str(creds.ca_file or "") or None,
                             server_name=creds.server_name, host=ep.rsplit(":", 1)[0]) if transport \
                    else f"{code}: {details}"
                return {"endpoint": ep, "reachable": False, "error": f"{code}: {details}", "why": why}

    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:
        return list(pool.map(one, endpoints))


def change_member(endpoint: str, op: str, node_id: str, raft_address: str, api_address: str,
                  timeout_s: float = 10.0, creds: Credentials = NO_CREDENTIALS) -> int:
    """Ask ``endpoint`` to add or remove a member (an admin token in ``creds``); follows one leader
    hint. Returns the commit index."""
    request = admin_pb2.MemberRequest(node_id=node_id, raft_address=raft_address, api_address=api_address)
    for _ in range(2):
        with creds.channel(endpoint) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            call = stub.AddMember if op == "add" else stub.RemoveMember
            try:
                return call(request, timeout=timeout_s).commit_index
            except grpc.RpcError as exc:
                hint = dict(exc.trailing_metadata() or ()).get("leader-hint")
                retryable = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)
                if retryable and hint and hint != endpoint:
                    endpoint = hint
                    continue
                raise ControlPlaneError(f"{op} member via {endpoint}: {exc.code().name}: {exc.details()}") from None
    raise ControlPlaneError(f"{op} member: the leader kept moving")
