"""The Admin gRPC service of a coordinator, its server with health checking and reflection, and a
client used by ``controlplane status``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controlplane import __version__
from controlplane.api.v1 import admin_pb2, admin_pb2_grpc
from controlplane.domain.errors import Unavailable

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


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(self, status: Callable[[], NodeStatus]) -> None:
        self._status = status

    def Status(self, request: admin_pb2.StatusRequest, context: grpc.ServicerContext) -> admin_pb2.StatusResponse:
        return to_proto(self._status())


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


def serve(address: str, status: Callable[[], NodeStatus]) -> ApiServer:
    """Start the coordinator's gRPC server: Admin, grpc.health.v1 and reflection."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="grpc"))
    admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(status), server)
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
