"""The adapter service: fencing, idempotent commands, and the observation stream with its ring buffer.

**Fencing.** A :class:`FencingGuard` persists the highest (epoch, holder) accepted. It is what makes
split brain harmless: a coordinator that lost its lease (paused, cut off) may still *send*, but every
command below the highest persisted epoch is refused with FAILED_PRECONDITION (and trailing metadata
``cp-error: stale-epoch``), and an equal epoch from a different holder too (a log rolled back by
correlated power loss could hand the same epoch to two nodes). The epoch is written to disk
(atomically, fsync'ed) *before* a command with a new epoch is acknowledged, so an adapter restart
never forgets it.

**Commands** are carried out by a pluggable :class:`~adapters.backend.Backend` (Kubernetes, the
real-time simulator, or :class:`RecordingBackend` for the fault tests), one at a time. A request id
is remembered as applied only once the backend has carried it out, so a command that failed with
UNAVAILABLE can be sent again under the same id; a repeated id that did apply is acknowledged with
``applied=false`` and not carried out again.

**Observations.** An :class:`ObservationHub` asks the backend for an observation every interval
(250 ms by default), numbers it, keeps the last ``ring_s`` seconds in a ring buffer and hands each
batch to every open ``Observe`` stream. ``Recent`` returns the ring buffer: a new lease holder reads
it to rebuild its signal filters and to see lifecycle reports the previous holder may not have
committed.

**Authentication.** Three layers (docs/security.md "The adapter channel"): mutual TLS where only
coordinator certificates may call ``ClusterAdapter`` (``client_ca``, :mod:`adapters.identity`); a
bearer token (``auth_token_file``: ``authorization: Bearer <token>``, refused with UNAUTHENTICATED
before the request is parsed, :class:`BearerAuth`); and signed fencing tokens (``fence_verifier``,
:mod:`controlplane.fencing`): an epoch no coordinator's fence key signed is refused with
PERMISSION_DENIED and never persisted. Health and reflection stay open. Off loopback all three are
required; on a loopback address each missing one is a warning line (development and tests).
"""

from __future__ import annotations

import hmac
import json
import math
import os
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from adapters.backend import (
    INSTANCE_ACTIONS,
    MAX_GPUS_PER_INSTANCE,
    MAX_REPLICAS,
    Backend,
    FenceToken,
    InstanceCommand,
    InstanceSpec,
    ScaleCommand,
)
from adapters.identity import CoordinatorIdentity
from adapters.wire import STALE_EPOCH_METADATA, batch_of
from controlplane.api.v1 import adapter_pb2, adapter_pb2_grpc
from controlplane.config import is_loopback_address
from controlplane.domain.errors import (
    ControlPlaneError,
    NotFound,
    PermanentError,
    StaleEpoch,
    TemporaryError,
    Unavailable,
    ValidationError,
)
from controlplane.domain.observations import Observations
from controlplane.fencing import MAX_EPOCH, FenceVerifier
from controlplane.runtime.clock import wall_ms
from raft.lease import check_fence

log = structlog.get_logger("adapters.service")

MAX_REMEMBERED_REQUESTS = 100_000
"""Idempotency memory: request ids applied recently (oldest forgotten first)."""
MAX_STREAMS = 16
"""Open Observe streams per adapter (each holds a server thread); more get RESOURCE_EXHAUSTED."""
SERVICE_NAME = adapter_pb2.DESCRIPTOR.services_by_name["ClusterAdapter"].full_name
AUTHORIZATION = "authorization"
UNAUTHENTICATED_WARNING = "adapter is unauthenticated (loopback only)"
PLAINTEXT_WARNING = "adapter does not serve mutual TLS: any local process may call it (loopback only)"
UNSIGNED_FENCE_WARNING = "adapter accepts unsigned fencing epochs: no fence_public_key_files (loopback only)"


class BearerAuth(grpc.ServerInterceptor):
    """Refuses every call to a method under ``/<service>/`` that lacks ``authorization: Bearer
    <token>`` with exactly this token (constant-time comparison) with UNAUTHENTICATED. Other services
    (health, reflection) pass. The token is never logged or echoed."""

    def __init__(self, token: str, service: str = SERVICE_NAME) -> None:
        if not token:
            raise ValidationError("auth_token", "must not be empty")
        self._expected = token.encode()
        self._prefix = f"/{service}/"
        self._lock = threading.Lock()
        self.refused = 0

    def __repr__(self) -> str:
        return f"BearerAuth({self._prefix!r}, <token>)"

    def problem(self, metadata) -> str | None:
        """Why ``metadata`` does not authenticate, or None."""
        values = [v for k, v in (metadata or ()) if k == AUTHORIZATION]
        if not values:
            return "missing 'authorization: Bearer <token>' metadata"
        if len(values) > 1:
            return "more than one 'authorization' metadata entry"
        value = values[0] if isinstance(values[0], str) else values[0].decode("ascii", "replace")
        scheme, _, presented = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return "the 'authorization' metadata must be 'Bearer <token>'"
        if not hmac.compare_digest(presented.strip().encode(), self._expected):
            return "the bearer token is not this adapter's"
        return None

    def intercept_service(self, continuation, handler_call_details):
        if not handler_call_details.method.startswith(self._prefix):
            return continuation(handler_call_details)
        problem = self.problem(handler_call_details.invocation_metadata)
        if problem is None:
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:  # unknown method: UNIMPLEMENTED as usual
            return None
        with self._lock:
            self.refused += 1
            count = self.refused
        if count & (count - 1) == 0:  # the 1st, 2nd, 4th, 8th ... refusal: visible, never a flood
            log.warning("call_unauthenticated", method=handler_call_details.method, problem=problem, refused=count)

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)

        def deny_stream(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)
            yield  # pragma: no cover  (abort raises)

        # No request deserializer: an unauthenticated caller's bytes are never parsed.
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(deny, response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(deny_stream, response_serializer=handler.response_serializer)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(deny, response_serializer=handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(deny_stream, response_serializer=handler.response_serializer)


class EpochFileError(PermanentError):
    """``<cluster>.epoch.json`` cannot be trusted (unreadable, empty, garbage, or an epoch no fence key
    signed): the adapter refuses to start, since it would not know the highest epoch it accepted."""


class ForgedFence(PermanentError):
    """A fencing token no coordinator's fence key signed (PERMISSION_DENIED; never persisted)."""


EPOCH_FILE_HELP = "see docs/adapters.md \"Resetting an adapter's epoch file\""


class FencingGuard:
    """Highest (epoch, holder) accepted, persisted in ``path`` with its signature; thread-safe.

    With a ``verifier`` (the coordinators' fence public keys) every token is verified *before* its
    epoch is compared or persisted, and a persisted epoch is verified again at start."""

    def __init__(self, path: Path, verifier: FenceVerifier | None = None) -> None:
        self._path = path
        self._verifier = verifier
        self._lock = threading.Lock()
        self.epoch, self.holder = self._load()

    def _load(self) -> tuple[int, str]:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return 0, ""
        except (OSError, UnicodeDecodeError) as exc:
            raise EpochFileError(f"epoch file {str(self._path)!r} cannot be read ({exc}); {EPOCH_FILE_HELP}") from None
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            epoch, holder = data["epoch"], data["holder"]
            if type(epoch) is not int or not 0 <= epoch <= MAX_EPOCH or not isinstance(holder, str):
                raise ValueError("epoch must be an integer in [0, 2**63-1] and holder a string")
            signature = bytes.fromhex(data.get("signature", "")) if isinstance(data.get("signature", ""), str) else b""
            kid = data.get("key_id", "") if isinstance(data.get("key_id", ""), str) else ""
        except (ValueError, KeyError, TypeError) as exc:
            what = "empty" if not text.strip() else f"not a valid epoch record ({type(exc).__name__}: {str(exc)[:80]})"
            raise EpochFileError(f"epoch file {str(self._path)!r} is {what}; {EPOCH_FILE_HELP}") from None
        if self._verifier is not None and epoch > 0:
            problem = self._verifier.problem(epoch, holder, kid, signature)
            if problem is not None:
                raise EpochFileError(f"epoch file {str(self._path)!r} holds epoch {epoch} that no fence key signed "
                                     f"({problem}); {EPOCH_FILE_HELP}")
        return epoch, holder

    def _persist(self, epoch: int, holder: str, token: FenceToken | None) -> None:
        record: dict[str, object] = {"epoch": epoch, "holder": holder}
        if token is not None and token.signature:
            record.update(key_id=token.key_id, signature=token.signature.hex())
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:  # tmp + fsync + rename + fsync(dir): atomic and durable
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        dir_fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def admit(self, epoch: int, holder: str, token: FenceToken | None = None) -> None:
        """Accept (and persist a higher) epoch, or raise :class:`StaleEpoch`; with a verifier, a token
        no fence key signed raises :class:`ForgedFence` first (and nothing is compared or written)."""
        if self._verifier is not None:
            problem = self._verifier.problem(epoch, holder, token.key_id if token else "", token.signature if token else b"")
            if problem is not None:
                raise ForgedFence(problem)
        with self._lock:
            verdict = check_fence(self.epoch, self.holder, epoch, holder)
            if not verdict.accepted:
                raise StaleEpoch(epoch, self.epoch)
            if epoch > self.epoch:
                self._persist(epoch, holder, token)
                self.epoch, self.holder = epoch, holder


class RecordingBackend:
    """Accepts every command and appends it as a JSON line to ``path`` (fsync'ed per line), together
    with every accepted fence and every rejected (stale) attempt: the evidence fault tests read. It
    runs no instances, so it observes nothing."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def apply(self, command: InstanceCommand, now_ms: int) -> None:
        f = command.fence
        self._write({"request_id": command.request_id, "action": command.action, "epoch": f.epoch, "seq": f.seq,
                     "holder": f.holder, "instance_id": command.instance.instance_id, "accepted": True})

    def scale(self, command: ScaleCommand, now_ms: int) -> None:
        f = command.fence
        self._write({"request_id": command.request_id, "action": "scale", "epoch": f.epoch, "seq": f.seq,
                     "holder": f.holder, "deployment_id": command.deployment_id, "replicas": command.replicas,
                     "victims": list(command.victims), "accepted": True})

    def observe(self, now_ms: int) -> Observations:
        return Observations(now_ms)

    def close(self) -> None:
        pass

    def fence(self, token: FenceToken) -> None:
        self._write({"action": "fence", "epoch": token.epoch, "seq": token.seq, "holder": token.holder, "accepted": True})

    def rejected(self, what: str, token: FenceToken, reason: str) -> None:
        self._write({"action": what, "epoch": token.epoch, "seq": token.seq, "holder": token.holder,
                     "accepted": False, "reason": reason})

    def _write(self, record: dict[str, object]) -> None:
        line = json.dumps(record, sort_keys=True)
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


class ObservationHub:
    """Polls the backend every ``interval_ms``, numbers the batches and keeps ``ring_s`` of them."""

    def __init__(self, cluster_id: str, backend: Backend, *, interval_ms: int = 250, ring_s: float = 120.0,
                 clock_ms: Callable[[], int] = wall_ms) -> None:
        if interval_ms <= 0:
            raise ValidationError("observe_interval_ms", f"must be > 0, got {interval_ms}")
        self.cluster_id = cluster_id
        self.interval_ms = interval_ms
        self.stream_id = uuid.uuid4().hex[:16]
        self._backend = backend
        self._clock_ms = clock_ms
        self._ring: deque[adapter_pb2.ObservationBatch] = deque(maxlen=max(1, math.ceil(ring_s * 1000 / interval_ms)))
        self._cond = threading.Condition()
        self._seq = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.observe_errors = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"observe-{self.cluster_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(5.0)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def _run(self) -> None:
        period_s = self.interval_ms / 1000
        next_at = time.monotonic()
        while not self._stopped.is_set():
            self.pump()
            next_at += period_s
            self._stopped.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - period_s)  # never catch up a backlog

    def pump(self) -> adapter_pb2.ObservationBatch:
        """Take one observation from the backend and publish it (the thread calls this every interval)."""
        now = self._clock_ms()
        failed = False
        try:
            obs = self._backend.observe(now)
        except Exception as exc:  # a backend failure must not stop the stream: publish an empty batch,
            self.observe_errors += 1  # marked, so that nobody takes it for an empty cluster
            log.error("observe_failed", cluster=self.cluster_id, error=f"{type(exc).__name__}: {exc}")
            obs, failed = Observations(now), True
        with self._cond:
            self._seq += 1
            try:
                batch = batch_of(self.cluster_id, self._seq, self.stream_id, obs, observe_failed=failed)
            except Exception as exc:  # a value the wire cannot carry (a backend bug): never kill the stream
                self.observe_errors += 1
                log.error("observe_unencodable", cluster=self.cluster_id, error=f"{type(exc).__name__}: {exc}")
                batch = batch_of(self.cluster_id, self._seq, self.stream_id, Observations(now), observe_failed=True)
            self._ring.append(batch)
            self._cond.notify_all()
        return batch

    def after(self, seq: int, timeout_s: float) -> list[adapter_pb2.ObservationBatch]:
        """Batches newer than ``seq`` (waiting up to ``timeout_s`` for one)."""
        with self._cond:
            if self._seq <= seq and not self._stopped.is_set():
                self._cond.wait(timeout_s)
            return [b for b in self._ring if b.seq > seq]

    def recent(self, max_age_ms: int) -> tuple[int, list[adapter_pb2.ObservationBatch]]:
        now = self._clock_ms()
        with self._cond:
            return now, [b for b in self._ring if b.at_ms >= now - max_age_ms]


def _token(msg: adapter_pb2.FenceToken) -> FenceToken:
    return FenceToken(msg.epoch, msg.seq, msg.holder, msg.signature, msg.key_id)


class AdapterServicer(adapter_pb2_grpc.ClusterAdapterServicer):
    def __init__(self, cluster_id: str, guard: FencingGuard, backend: Backend, hub: ObservationHub | None = None,
                 clock_ms: Callable[[], int] = wall_ms) -> None:
        self._cluster_id = cluster_id
        self._guard = guard
        self._backend = backend
        self._hub = hub
        self._clock_ms = clock_ms
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._apply_lock = threading.Lock()
        """Commands are carried out one at a time: the backend's view of an instance never races."""
        self._streams = 0
        self.stale_rejected = 0
        self.forged_rejected = 0
        self.applied = 0

    def _check_cluster(self, cluster_id: str, context: grpc.ServicerContext) -> None:
        if cluster_id != self._cluster_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cluster_id: this adapter serves {self._cluster_id!r}, not {cluster_id!r}")

    def _stale(self, what: str, token: FenceToken, exc: StaleEpoch, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.stale_rejected += 1
        rejected = getattr(self._backend, "rejected", None)
        if rejected is not None:
            rejected(what, token, str(exc))
        context.set_trailing_metadata((STALE_EPOCH_METADATA,))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def _admit(self, what: str, cluster_id: str, token: FenceToken, context: grpc.ServicerContext) -> None:
        self._check_cluster(cluster_id, context)
        try:
            self._guard.admit(token.epoch, token.holder, token)
        except StaleEpoch as exc:
            self._stale(what, token, exc, context)
        except ForgedFence as exc:
            with self._lock:
                self.forged_rejected += 1
                count = self.forged_rejected
            if count & (count - 1) == 0:  # 1st, 2nd, 4th ... : visible, never a flood
                log.error("fence_refused", cluster=self._cluster_id, action=what, epoch=token.epoch,
                          holder=token.holder[:64], problem=str(exc), refused=count)
            rejected = getattr(self._backend, "rejected", None)
            if rejected is not None:
                rejected(what, token, str(exc))
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))

    def Fence(self, request: adapter_pb2.FenceRequest, context: grpc.ServicerContext) -> adapter_pb2.FenceReply:
        token = _token(request.fence)
        self._admit("fence", request.cluster_id, token, context)
        record = getattr(self._backend, "fence", None)
        if record is not None:
            record(token)
        return adapter_pb2.FenceReply(highest_epoch=self._guard.epoch, highest_holder=self._guard.holder)

    def Apply(self, request: adapter_pb2.ApplyRequest, context: grpc.ServicerContext) -> adapter_pb2.ApplyReply:
        if request.action not in INSTANCE_ACTIONS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"action: must be one of {', '.join(INSTANCE_ACTIONS)}, got {request.action!r}")
        inst = request.instance
        if not inst.instance_id or not inst.deployment_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "instance: instance_id and deployment_id must not be empty")
        if request.drain_timeout_ms < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"drain_timeout_ms: must be >= 0, got {request.drain_timeout_ms}")
        if not 0 <= inst.gpus <= MAX_GPUS_PER_INSTANCE:  # 0: unset, means 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"instance.gpus: must be between 1 and {MAX_GPUS_PER_INSTANCE}, got {inst.gpus}")
        command = InstanceCommand(
            request.request_id, request.action,
            InstanceSpec(inst.instance_id, inst.deployment_id, inst.tenant_id, inst.zone, inst.pool, inst.gpus or 1),
            _token(request.fence), self._clock_ms() + request.drain_timeout_ms,
        )
        return self._carry_out(request.action, request.cluster_id, command, context)

    def Scale(self, request: adapter_pb2.ScaleRequest, context: grpc.ServicerContext) -> adapter_pb2.ApplyReply:
        if not request.deployment_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "deployment_id: must not be empty")
        if not 0 <= request.replicas <= MAX_REPLICAS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"replicas: must be between 0 and {MAX_REPLICAS}, got {request.replicas}")
        if len(set(request.victims)) != len(request.victims):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "victims: must not repeat an instance id")
        command = ScaleCommand(request.request_id, request.deployment_id, request.replicas, tuple(request.victims),
                               _token(request.fence))
        return self._carry_out("scale", request.cluster_id, command, context)

    def _carry_out(self, what: str, cluster_id: str, command: InstanceCommand | ScaleCommand,
                   context: grpc.ServicerContext) -> adapter_pb2.ApplyReply:
        if not command.request_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id: must not be empty")
        self._admit(what, cluster_id, command.fence, context)
        with self._apply_lock:
            if command.request_id in self._seen:
                return adapter_pb2.ApplyReply(applied=False, highest_epoch=self._guard.epoch)
            try:
                if isinstance(command, ScaleCommand):
                    self._backend.scale(command, self._clock_ms())
                else:
                    self._backend.apply(command, self._clock_ms())
            except StaleEpoch as exc:  # the backend's shared store knows a newer epoch
                self._stale(what, command.fence, exc, context)
            except ControlPlaneError as exc:
                log.warning("command_failed", cluster=self._cluster_id, request_id=command.request_id, action=what,
                            error=str(exc), kind=type(exc).__name__)
                context.abort(_status_of(exc), f"{what}: {exc}")
            except Exception as exc:  # a backend bug: a clear INTERNAL, not grpc's bare UNKNOWN
                log.exception("command_crashed", cluster=self._cluster_id, request_id=command.request_id, action=what)
                context.abort(grpc.StatusCode.INTERNAL, f"{what}: internal error in the backend: {type(exc).__name__}: {exc}")
            self._seen[command.request_id] = None
            if len(self._seen) > MAX_REMEMBERED_REQUESTS:
                self._seen.popitem(last=False)
            self.applied += 1
        return adapter_pb2.ApplyReply(applied=True, highest_epoch=self._guard.epoch)

    def Observe(self, request: adapter_pb2.ObserveRequest, context: grpc.ServicerContext) -> Iterator[adapter_pb2.ObservationBatch]:
        self._check_cluster(request.cluster_id, context)
        hub = self._hub
        if hub is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this adapter streams no observations")
        with self._lock:
            if self._streams >= MAX_STREAMS:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"at most {MAX_STREAMS} observation streams per adapter")
            self._streams += 1
        try:
            after = request.after_seq if request.stream_id == hub.stream_id else 0
            while context.is_active() and not hub.stopped:
                for batch in hub.after(after, timeout_s=1.0):
                    yield batch
                    after = batch.seq
        finally:
            with self._lock:
                self._streams -= 1

    def Recent(self, request: adapter_pb2.RecentRequest, context: grpc.ServicerContext) -> adapter_pb2.RecentReply:
        self._check_cluster(request.cluster_id, context)
        if request.max_age_ms < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"max_age_ms: must be >= 0, got {request.max_age_ms}")
        if self._hub is None:
            return adapter_pb2.RecentReply(now_ms=self._clock_ms())
        now, batches = self._hub.recent(request.max_age_ms)
        return adapter_pb2.RecentReply(now_ms=now, batches=batches)


def _status_of(exc: ControlPlaneError) -> grpc.StatusCode:
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, ValidationError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, TemporaryError):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.FAILED_PRECONDITION


@dataclass
class AdapterServer:
    server: grpc.Server
    servicer: AdapterServicer
    hub: ObservationHub | None
    health: health.HealthServicer
    port: int
    backend: Backend
    auth: BearerAuth | None = None
    identity: CoordinatorIdentity | None = None

    def stop(self, grace_s: float = 0.5) -> None:
        self.health.enter_graceful_shutdown()
        if self.hub is not None:
            self.hub.stop()
        self.server.stop(grace_s).wait(grace_s + 1.0)
        self.backend.close()


def serve_adapter(cluster_id: str, address: str, state_dir: Path, backend: Backend, *,
                  observe_interval_ms: int = 250, ring_s: float = 120.0, observe: bool = True,
                  clock_ms: Callable[[], int] = wall_ms, auth_token: str | None = None,
                  tls: tuple[bytes, bytes] | None = None, client_ca: bytes | None = None,
                  allowed_coordinators: Collection[str] | None = None,
                  fence_verifier: FenceVerifier | None = None) -> AdapterServer:
    """Start the adapter's gRPC server (ClusterAdapter, grpc.health.v1, reflection) on ``address``.

    ``auth_token``: the bearer token every ClusterAdapter call must carry. ``tls``: (certificate
    chain PEM, private key PEM) to serve TLS only; with ``client_ca`` (PEM) it is mutual TLS and only
    coordinator certificates (``adapters/identity.py``; ``allowed_coordinators`` narrows them to
    these node ids) may call ClusterAdapter. ``fence_verifier``: the coordinators' fence public keys;
    every fencing token must be signed by one. On a non-loopback address all of these are required;
    on a loopback address (development, tests) each one missing is one warning line."""
    loopback = is_loopback_address(address)
    if auth_token is None and not loopback:
        raise ValidationError("auth_token_file", f"required: {address} is not a loopback address, so other hosts "
                                                 "could command this cluster without it")
    if not loopback and (tls is None or client_ca is None):
        raise ValidationError("tls.client_ca_file" if tls is not None else "tls",
                              f"required: {address} is not a loopback address, so the adapter serves mutual TLS "
                              "only (tls.cert_file, tls.key_file and tls.client_ca_file, the coordinators' CA)")
    if fence_verifier is None and not loopback:
        raise ValidationError("fence_public_key_files", f"required: {address} is not a loopback address, so every "
                                                        "epoch must be signed by a coordinator's fence key")
    if client_ca is not None and tls is None:
        raise ValidationError("tls", "client_ca_file needs the server's cert_file and key_file")
    auth = BearerAuth(auth_token) if auth_token is not None else None
    identity = CoordinatorIdentity(SERVICE_NAME, allowed_coordinators) if client_ca is not None else None
    state_dir.mkdir(parents=True, exist_ok=True)
    guard = FencingGuard(state_dir / f"{cluster_id}.epoch.json", fence_verifier)  # before anything starts
    hub = ObservationHub(cluster_id, backend, interval_ms=observe_interval_ms, ring_s=ring_s, clock_ms=clock_ms) if observe else None
    servicer = AdapterServicer(cluster_id, guard, backend, hub, clock_ms)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_STREAMS + 8, thread_name_prefix="adapter"),
                         interceptors=[i for i in (identity, auth) if i is not None])
    adapter_pb2_grpc.add_ClusterAdapterServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    try:
        if tls is not None:
            port = server.add_secure_port(address, grpc.ssl_server_credentials(
                [(tls[1], tls[0])], root_certificates=client_ca, require_client_auth=client_ca is not None))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise Unavailable(f"listen: cannot bind {address}")
    server.start()
    if hub is not None:
        hub.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("adapter_started", cluster=cluster_id, address=f"{address.rsplit(':', 1)[0]}:{port}",
             backend=type(backend).__name__, epoch=guard.epoch, observe_interval_ms=observe_interval_ms,
             authenticated=auth_token is not None, tls=tls is not None, mutual_tls=client_ca is not None,
             fence_keys=fence_verifier.key_ids if fence_verifier is not None else [])
    if auth_token is None:
        log.warning(UNAUTHENTICATED_WARNING, cluster=cluster_id)
    if client_ca is None:
        log.warning(PLAINTEXT_WARNING, cluster=cluster_id)
    if fence_verifier is None:
        log.warning(UNSIGNED_FENCE_WARNING, cluster=cluster_id)
    return AdapterServer(server, servicer, hub, health_servicer, port, backend, auth, identity)
