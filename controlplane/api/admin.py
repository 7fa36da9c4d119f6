"""The Admin gRPC service of a coordinator, its server with health checking and reflection, and a
client used by ``controlplane status``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controlplane import __version__
from controlplane.api.v1 import admin_pb2, admin_pb2_grpc
from controlplane.domain.errors import (
    AlreadyExists,
    CommitTimeout,
    Conflict,
    ControlPlaneError,
    NotFound,
    NotLeader,
    PermanentError,
    Unavailable,
    ValidationError,
)

MAX_WORKERS = 8
"""Threads serving RPCs of one coordinator (admin calls are cheap)."""
STATUS_DEADLINE_S = 3.0


@dataclass(frozen=True, slots=True)
class PeerStatus:
    node_id: str
    zone: str
    raft_address: str
    api_address: str
    reachable: bool


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


def to_proto(s: NodeStatus) -> admin_pb2.StatusResponse:
    return admin_pb2.StatusResponse(
        node_id=s.node_id, zone=s.zone, pid=s.pid, role=s.role, term=s.term, leader_id=s.leader_id,
        lease_holder=s.lease_holder, lease_epoch=s.lease_epoch, lease_remaining_ms=s.lease_remaining_ms,
        commit_index=s.commit_index, applied_index=s.applied_index, version=s.version,
        raft_address=s.raft_address, api_address=s.api_address,
        peers=[admin_pb2.Peer(node_id=p.node_id, zone=p.zone, raft_address=p.raft_address,
                              api_address=p.api_address, reachable=p.reachable) for p in s.peers],
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
    }


class Membership(Protocol):
    """Membership changes (implemented by the coordinator with ``RaftNode``)."""

    def add_member(self, node_id: str, raft_address: str, api_address: str) -> int: ...

    def remove_member(self, raft_address: str) -> int: ...


def abort_with(context: grpc.ServicerContext, exc: ControlPlaneError) -> None:
    """Translate the control plane's error tree into a gRPC status (the one place that does)."""
    if isinstance(exc, NotLeader):
        if exc.leader_hint:
            context.set_trailing_metadata((("leader-hint", exc.leader_hint),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{exc} (leader: {exc.leader_hint or 'unknown'})")
    code = next((code for cls, code in _STATUS_OF if isinstance(exc, cls)), grpc.StatusCode.UNAVAILABLE)
    context.abort(code, str(exc))


_STATUS_OF = (
    (ValidationError, grpc.StatusCode.INVALID_ARGUMENT),
    (Conflict, grpc.StatusCode.ABORTED),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (CommitTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (PermanentError, grpc.StatusCode.FAILED_PRECONDITION),
)


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(self, status: Callable[[], NodeStatus], members: Membership | None = None) -> None:
        self._status = status
        self._members = members

    def Status(self, request: admin_pb2.StatusRequest, context: grpc.ServicerContext) -> admin_pb2.StatusResponse:
        return to_proto(self._status())

    def AddMember(self, request: admin_pb2.MemberRequest, context: grpc.ServicerContext) -> admin_pb2.MemberReply:
        members = self._require_members(context)
        for name in ("node_id", "raft_address", "api_address"):
            if not getattr(request, name):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: must not be empty")
        try:
            index = members.add_member(request.node_id, request.raft_address, request.api_address)
        except ControlPlaneError as exc:
            abort_with(context, exc)
        return admin_pb2.MemberReply(commit_index=index)

    def RemoveMember(self, request: admin_pb2.MemberRequest, context: grpc.ServicerContext) -> admin_pb2.MemberReply:
        members = self._require_members(context)
        if not request.raft_address:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "raft_address: must not be empty")
        try:
            index = members.remove_member(request.raft_address)
        except ControlPlaneError as exc:
            abort_with(context, exc)
        return admin_pb2.MemberReply(commit_index=index)

    def _require_members(self, context: grpc.ServicerContext) -> Membership:
        if self._members is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "membership changes are not served by this node")
        return self._members


@dataclass
class ApiServer:
    server: grpc.Server
    health: health.HealthServicer
    port: int

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", "controlplane.api.v1.Admin"):
            self.health.set(name, status)

    def stop(self, grace_s: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait(grace_s + 1.0)


def serve(address: str, status: Callable[[], NodeStatus], members: Membership | None = None) -> ApiServer:
    """Start the coordinator's gRPC server: Admin, grpc.health.v1 and reflection."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="grpc"))
    admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(status, members), server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise Unavailable(f"api_address: cannot bind {address}")
    server.start()
    api = ApiServer(server, health_servicer, port)
    api.set_serving(True)
    return api


def fetch_status(endpoints: Sequence[str], timeout_s: float = STATUS_DEADLINE_S) -> list[dict[str, object]]:
    """Status of every endpoint; an unreachable one is reported as such, never raised."""
    out: list[dict[str, object]] = []
    for ep in endpoints:
        with grpc.insecure_channel(ep) as channel:
            try:
                reply = admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=timeout_s)
                out.append({"endpoint": ep, "reachable": True, **from_proto(reply)})
            except grpc.RpcError as exc:
                out.append({"endpoint": ep, "reachable": False, "error": f"{exc.code().name}: {exc.details()}"})
    return out


def change_member(endpoint: str, op: str, node_id: str, raft_address: str, api_address: str,
                  timeout_s: float = 10.0) -> int:
    """Ask ``endpoint`` to add or remove a member; follows one leader hint. Returns the commit index."""
    request = admin_pb2.MemberRequest(node_id=node_id, raft_address=raft_address, api_address=api_address)
    for _ in range(2):
        with grpc.insecure_channel(endpoint) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            call = stub.AddMember if op == "add" else stub.RemoveMember
            try:
                return call(request, timeout=timeout_s).commit_index
            except grpc.RpcError as exc:
                hint = dict(exc.trailing_metadata() or ()).get("leader-hint")
                if exc.code() is grpc.StatusCode.FAILED_PRECONDITION and hint and hint != endpoint:
                    endpoint = hint
                    continue
                raise ControlPlaneError(f"{op} member via {endpoint}: {exc.code().name}: {exc.details()}") from None
    raise ControlPlaneError(f"{op} member: the leader kept moving")
