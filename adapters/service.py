"""The adapter side of fencing: a guard that persists the highest epoch it has accepted, idempotent
command handling, and the gRPC service the coordinators call.

The guard is what makes split brain harmless: a coordinator that lost its lease (paused, cut off)
may still *send*, but every command below the highest persisted epoch is refused with
FAILED_PRECONDITION, and an equal epoch from a different holder too (a log rolled back by
correlated power loss could hand the same epoch to two nodes). The epoch is written to disk
(atomically, fsync'ed) *before* a command with a new epoch is acknowledged, so an adapter restart
never forgets it.

The backend that carries commands out is pluggable (``Backend``); ``RecordingBackend`` writes each
accepted command as a JSON line, which is what the fault tests inspect.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from controlplane.api.v1 import adapter_pb2, adapter_pb2_grpc
from controlplane.domain.errors import StaleEpoch, Unavailable, ValidationError
from controlplane.ports import ADAPTER_ACTIONS
from raft.lease import check_fence

MAX_REMEMBERED_REQUESTS = 100_000
"""Idempotency memory: request ids applied recently (oldest forgotten first)."""


class FencingGuard:
    """Highest (epoch, holder) accepted, persisted in ``path``; thread-safe."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self.epoch, self.holder = self._load()

    def _load(self) -> tuple[int, str]:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            return int(data["epoch"]), str(data["holder"])
        except FileNotFoundError:
            return 0, ""

    def _persist(self, epoch: int, holder: str) -> None:
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"epoch": epoch, "holder": holder}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        dir_fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def admit(self, epoch: int, holder: str) -> None:
        """Accept (and persist a higher) epoch, or raise :class:`StaleEpoch`."""
        with self._lock:
            verdict = check_fence(self.epoch, self.holder, epoch, holder)
            if not verdict.accepted:
                raise StaleEpoch(epoch, self.epoch)
            if epoch > self.epoch:
                self._persist(epoch, holder)
                self.epoch, self.holder = epoch, holder


class Backend(Protocol):
    def apply(self, request: adapter_pb2.ApplyRequest) -> None: ...


class RecordingBackend:
    """Accepts every command and appends it as a JSON line to ``path`` (fsync'ed per line), together
    with every accepted fence and every rejected (stale) attempt: the evidence fault tests read."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def apply(self, request: adapter_pb2.ApplyRequest) -> None:
        self._write({"request_id": request.request_id, "action": request.action, "epoch": request.fence.epoch,
                     "seq": request.fence.seq, "holder": request.fence.holder,
                     "instance_id": request.instance.instance_id, "accepted": True})

    def fence(self, token: adapter_pb2.FenceToken) -> None:
        self._write({"action": "fence", "epoch": token.epoch, "seq": token.seq, "holder": token.holder, "accepted": True})

    def rejected(self, what: str, token: adapter_pb2.FenceToken, reason: str) -> None:
        self._write({"action": what, "epoch": token.epoch, "seq": token.seq, "holder": token.holder,
                     "accepted": False, "reason": reason})

    def _write(self, record: dict[str, object]) -> None:
        line = json.dumps(record, sort_keys=True)
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


class AdapterServicer(adapter_pb2_grpc.ClusterAdapterServicer):
    def __init__(self, cluster_id: str, guard: FencingGuard, backend: Backend) -> None:
        self._cluster_id = cluster_id
        self._guard = guard
        self._backend = backend
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.stale_rejected = 0

    def _check(self, what: str, cluster_id: str, token: adapter_pb2.FenceToken, context: grpc.ServicerContext) -> None:
        if cluster_id != self._cluster_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cluster_id: this adapter serves {self._cluster_id!r}, not {cluster_id!r}")
        try:
            self._guard.admit(token.epoch, token.holder)
        except StaleEpoch as exc:
            with self._lock:
                self.stale_rejected += 1
            rejected = getattr(self._backend, "rejected", None)
            if rejected is not None:
                rejected(what, token, str(exc))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def Fence(self, request: adapter_pb2.FenceRequest, context: grpc.ServicerContext) -> adapter_pb2.FenceReply:
        self._check("fence", request.cluster_id, request.fence, context)
        record = getattr(self._backend, "fence", None)
        if record is not None:
            record(request.fence)
        return adapter_pb2.FenceReply(highest_epoch=self._guard.epoch, highest_holder=self._guard.holder)

    def Apply(self, request: adapter_pb2.ApplyRequest, context: grpc.ServicerContext) -> adapter_pb2.ApplyReply:
        if request.action not in ADAPTER_ACTIONS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"action: must be one of {', '.join(ADAPTER_ACTIONS)}, got {request.action!r}")
        if not request.request_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id: must not be empty")
        self._check(request.action, request.cluster_id, request.fence, context)
        with self._lock:
            if request.request_id in self._seen:
                return adapter_pb2.ApplyReply(applied=False, highest_epoch=self._guard.epoch)
            self._seen[request.request_id] = None
            if len(self._seen) > MAX_REMEMBERED_REQUESTS:
                self._seen.popitem(last=False)
        self._backend.apply(request)
        return adapter_pb2.ApplyReply(applied=True, highest_epoch=self._guard.epoch)


@dataclass
class AdapterServer:
    server: grpc.Server
    servicer: AdapterServicer
    port: int

    def stop(self, grace_s: float = 0.5) -> None:
        self.server.stop(grace_s).wait(grace_s + 1.0)


def serve_adapter(cluster_id: str, address: str, state_dir: Path, backend: Backend) -> AdapterServer:
    state_dir.mkdir(parents=True, exist_ok=True)
    servicer = AdapterServicer(cluster_id, FencingGuard(state_dir / f"{cluster_id}.epoch.json"), backend)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="adapter"))
    adapter_pb2_grpc.add_ClusterAdapterServicer_to_server(servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise Unavailable(f"cannot bind {address}")
    server.start()
    return AdapterServer(server, servicer, port)


def _raise_translated(exc: grpc.RpcError) -> None:
    code = exc.code()
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        got, highest = _parse_stale(exc.details() or "")
        raise StaleEpoch(got, highest) from exc
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        raise ValidationError("adapter", exc.details() or "invalid argument") from exc
    raise Unavailable(f"adapter: {code.name}: {exc.details()}") from exc


def _parse_stale(details: str) -> tuple[int, int]:
    # "stale epoch 3: highest seen is 7" (StaleEpoch's message)
    try:
        head, _, tail = details.partition(":")
        return int(head.split()[-1]), int(tail.split()[-1])
    except (ValueError, IndexError):
        return -1, -1


class RemoteAdapter:
    """``ports.FencedAdapter`` over gRPC: one channel per cluster's adapter address."""

    def __init__(self, addresses: dict[str, str], deadline_s: float = 0.5) -> None:
        self._stubs = {cid: adapter_pb2_grpc.ClusterAdapterStub(grpc.insecure_channel(addr)) for cid, addr in addresses.items()}
        self._deadline_s = deadline_s

    def clusters(self) -> list[str]:
        return sorted(self._stubs)

    def fence(self, cluster_id: str, fence, now_ms: int) -> None:
        token = adapter_pb2.FenceToken(epoch=fence.epoch, seq=fence.seq, holder=fence.holder)
        try:
            self._stubs[cluster_id].Fence(adapter_pb2.FenceRequest(cluster_id=cluster_id, fence=token), timeout=self._deadline_s)
        except grpc.RpcError as exc:
            _raise_translated(exc)

    def send(self, cluster_id: str, command, fence, now_ms: int) -> None:
        inst = command.instance
        request = adapter_pb2.ApplyRequest(
            cluster_id=cluster_id, request_id=command.request_id, action=command.action, deadline_ms=command.deadline_ms,
            fence=adapter_pb2.FenceToken(epoch=fence.epoch, seq=fence.seq, holder=fence.holder),
            instance=adapter_pb2.InstanceRef(instance_id=inst.id, deployment_id=inst.deployment, tenant_id=inst.tenant,
                                             zone=inst.zone, pool=inst.pool, gpus=inst.gpus),
        )
        try:
            self._stubs[cluster_id].Apply(request, timeout=self._deadline_s)
        except grpc.RpcError as exc:
            _raise_translated(exc)
