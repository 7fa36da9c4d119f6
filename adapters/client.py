"""The coordinators' side of the adapter protocol: :class:`RemoteAdapter` (the fenced command port)
and :class:`RemoteObservations` (the observation source, fed by one ``Observe`` stream per cluster).

Clocks: adapters stamp observations with their wall clock; a coordinator decides on its own
(monotonic) clock. :class:`ClockMap` keeps, per adapter, the smallest ``receive - at`` difference seen
recently; adding it maps an adapter time onto the coordinator's clock no later than the moment the
batch arrived (the error is the one-way delay of the fastest recent batch, ~1 ms on a LAN), with no
assumption that the two clocks agree.

Security: both take ``token`` (sent as ``authorization: Bearer <token>`` on every call, the
coordinator's ``adapter_token_file``) and ``tls`` (:class:`AdapterTls`: mutual TLS to the adapters,
the coordinator's client certificate ``controlplane://coordinator/<node_id>`` and the CA that
signed the adapters' certificates; the coordinator's ``adapter_tls``). Without ``tls`` only
loopback adapter addresses are reached (development); any other is refused with a
``ValidationError`` naming ``adapter_tls``. Fencing tokens carry the signature of the
coordinators' fence key (``controlplane.fencing``) when the loop has one. Channels come from
:func:`controlplane.api.channel.open_channel`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from adapters.wire import STALE_EPOCH_METADATA, observations_of
from controlplane.api.channel import open_channel
from controlplane.api.v1 import adapter_pb2, adapter_pb2_grpc
from controlplane.config import is_loopback_address
from controlplane.domain.errors import NotFound, StaleEpoch, Unavailable, ValidationError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId
from controlplane.domain.observations import GpuReport, InstanceReport, InstanceSample, Observations

log = structlog.get_logger("adapters.client")

SAMPLE_MAX_AGE_MS = 1_000
"""A sample older than this (on the coordinator's clock) is no longer reported: the instance has
stopped being observed (gone, or its adapter is unreachable)."""
MAX_PENDING_REPORTS = 100_000
"""Bound on lifecycle reports held between two gathers."""
RECENT_DEADLINE_S = 1.0


def _raise_translated(exc: grpc.RpcError) -> None:
    code = exc.code()
    trailing = dict(exc.trailing_metadata() or ())
    if code is grpc.StatusCode.FAILED_PRECONDITION and trailing.get(STALE_EPOCH_METADATA[0]) == STALE_EPOCH_METADATA[1]:
        got, highest = _parse_stale(exc.details() or "")
        raise StaleEpoch(got, highest) from exc
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        raise ValidationError("adapter", exc.details() or "invalid argument") from exc
    if code is grpc.StatusCode.NOT_FOUND:
        raise NotFound("adapter", exc.details() or "not found") from exc
    raise Unavailable(f"adapter: {code.name}: {exc.details()}") from exc


def _parse_stale(details: str) -> tuple[int, int]:
    # "[what: ]stale epoch 3: highest seen is 7" (StaleEpoch's message)
    try:
        head, _, tail = details.rpartition("stale epoch ")[2].partition(":")
        return int(head.split()[-1]), int(tail.split()[-1])
    except (ValueError, IndexError):
        return -1, -1


@dataclass(frozen=True, slots=True)
class AdapterTls:
    """The coordinator's side of the adapters' mutual TLS (PEM files)."""

    ca_file: str | Path
    cert_file: str | Path
    key_file: str | Path
    server_name: str | None = None


def open_adapter_channel(address: str, token: str | None, tls: AdapterTls | None) -> grpc.Channel:
    """A channel to one adapter: mutual TLS with ``tls``; plaintext only to a loopback address."""
    if tls is None:
        if not is_loopback_address(address):
            raise ValidationError("adapter_tls", f"required to reach the adapter at {address}: it is not a loopback "
                                                 "address, and adapter channels are mutual TLS")
        return open_channel(address, token=token)
    return open_channel(address, ca_file=tls.ca_file, cert_file=tls.cert_file, key_file=tls.key_file, token=token,
                        server_name=tls.server_name)


def _channels(addresses: Mapping[str, str], token: str | None, tls: AdapterTls | None) -> dict[str, grpc.Channel]:
    return {cid: open_adapter_channel(addr, token, tls) for cid, addr in addresses.items()}


def _fence_message(fence) -> adapter_pb2.FenceToken:
    return adapter_pb2.FenceToken(epoch=fence.epoch, seq=fence.seq, holder=fence.holder,
                                  signature=getattr(fence, "signature", b""), key_id=getattr(fence, "key_id", ""))


class RemoteAdapter:
    """``ports.FencedAdapter`` over gRPC: one channel per cluster's adapter address. ``token`` and
    ``tls``: see the module docstring (a bad one raises ``ValidationError`` naming it)."""

    def __init__(self, addresses: Mapping[str, str], deadline_s: float = 0.5, *, token: str | None = None,
                 tls: AdapterTls | None = None) -> None:
        self._token, self._tls = token, tls
        self._addresses = dict(addresses)
        self._channels = _channels(addresses, token, tls)
        self._stubs = {cid: adapter_pb2_grpc.ClusterAdapterStub(ch) for cid, ch in self._channels.items()}
        self._deadline_s = deadline_s

    def clusters(self) -> list[str]:
        return sorted(self._stubs)

    def ensure(self, cluster_id: str, address: str) -> bool:
        """Reach ``cluster_id``'s adapter at ``address`` from now on (a cluster registered or moved
        through the API). True when something changed. Called from the control loop's thread."""
        if self._addresses.get(cluster_id) == address:
            return False
        channel = open_adapter_channel(address, self._token, self._tls)
        old = self._channels.get(cluster_id)
        self._addresses[cluster_id] = address
        self._channels[cluster_id] = channel
        self._stubs[cluster_id] = adapter_pb2_grpc.ClusterAdapterStub(channel)
        if old is not None:
            old.close()
        return True

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()

    def _stub(self, cluster_id: str) -> adapter_pb2_grpc.ClusterAdapterStub:
        stub = self._stubs.get(cluster_id)
        if stub is None:
            raise Unavailable(f"adapter: no address configured for cluster {cluster_id!r}")
        return stub

    def fence(self, cluster_id: str, fence, now_ms: int) -> None:
        token = _fence_message(fence)
        try:
            self._stub(cluster_id).Fence(adapter_pb2.FenceRequest(cluster_id=cluster_id, fence=token), timeout=self._deadline_s)
        except grpc.RpcError as exc:
            _raise_translated(exc)

    def scale(self, cluster_id: str, request_id: str, deployment_id: str, replicas: int, victims: list[str], fence) -> bool:
        """Scale a deployment to ``replicas`` removing ``victims`` first; False if ``request_id`` had
        been applied before."""
        request = adapter_pb2.ScaleRequest(
            cluster_id=cluster_id, request_id=request_id, deployment_id=deployment_id, replicas=replicas,
            victims=victims, fence=_fence_message(fence))
        try:
            return self._stub(cluster_id).Scale(request, timeout=self._deadline_s).applied
        except grpc.RpcError as exc:
            _raise_translated(exc)
            raise  # unreachable: _raise_translated always raises

    def send(self, cluster_id: str, command, fence, now_ms: int) -> None:
        inst = command.instance
        request = adapter_pb2.ApplyRequest(
            cluster_id=cluster_id, request_id=command.request_id, action=command.action,
            drain_timeout_ms=max(0, command.deadline_ms - now_ms) if command.deadline_ms else 0,
            fence=_fence_message(fence),
            instance=adapter_pb2.InstanceRef(instance_id=inst.id, deployment_id=inst.deployment, tenant_id=inst.tenant,
                                             zone=inst.zone, pool=inst.pool, gpus=inst.gpus),
        )
        try:
            self._stub(cluster_id).Apply(request, timeout=self._deadline_s)
        except grpc.RpcError as exc:
            _raise_translated(exc)


def _load_jumped(prev: InstanceSample | None, now: InstanceSample) -> bool:
    """A burst starting at this instance: its queue grew, or its running + waiting grew by at least
    half (and by 2 requests) since its last sample. A queue that stays long (sustained overload) is
    not news: the periodic tick handles it, so pressure never makes the holder tick flat out."""
    if prev is None:
        return now.waiting > 0
    before, after = prev.running + prev.waiting, now.running + now.waiting
    return now.waiting > prev.waiting or after - before >= max(2, before / 2)


class ClockMap:
    """Maps one adapter's clock onto the local one: ``local = remote + offset`` where ``offset`` is
    the smallest ``local_receive - remote_at`` over the last ``window`` batches."""

    def __init__(self, window: int = 32) -> None:
        self._diffs: deque[int] = deque(maxlen=window)

    def observe(self, remote_at_ms: int, local_receive_ms: int) -> None:
        self._diffs.append(local_receive_ms - remote_at_ms)

    def offset(self) -> int | None:
        return min(self._diffs) if self._diffs else None


class RemoteObservations:
    """``ports.ReplayableSource`` over the adapters' Observe streams (one thread per cluster).

    ``gather`` returns the newest sample of every instance observed within ``SAMPLE_MAX_AGE_MS``
    (holding the last value between two batches, as Prometheus-based autoscalers do), every lifecycle
    report received since the previous gather, and the newest gateway queue of each deployment.
    """

    def __init__(self, addresses: Mapping[str, str], clock_ms: Callable[[], int], *,
                 reconnect_max_s: float = 2.0, token: str | None = None, tls: AdapterTls | None = None,
                 on_pressure: Callable[[], None] | None = None) -> None:
        self._clock_ms = clock_ms
        self._on_pressure = on_pressure
        """Called (from a stream thread) when a batch shows something to act on: queued requests or
        lifecycle reports. The coordinator wakes its control loop with it instead of waiting for the
        next periodic tick."""
        self._reconnect_max_s = reconnect_max_s
        self._token, self._tls = token, tls
        self._addresses = dict(addresses)
        self._started = False
        self._channels = _channels(addresses, token, tls)
        self._stubs = {cid: adapter_pb2_grpc.ClusterAdapterStub(ch) for cid, ch in self._channels.items()}
        self._clocks = {cid: ClockMap() for cid in addresses}
        self._lock = threading.Lock()
        self._samples: dict[InstanceId, InstanceSample] = {}
        self._reports: list[InstanceReport] = []
        self._gateway: dict[tuple[str, DeploymentId], int] = {}
        self._caches: dict[ClusterId, tuple[str, ...]] = {}
        """Each cluster's model cache as its adapter last reported it (kept across batches without one)."""
        self._gpu: dict[ClusterId, GpuReport] = {}
        """Each cluster's GPU memory report, the latest (its ``at_ms`` says how old; the loop ages it out)."""
        self._calls: dict[str, grpc.Future] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.batches_received = 0
        self.connected: dict[str, bool] = {cid: False for cid in addresses}
        self.observe_failing: dict[str, bool] = {cid: False for cid in addresses}
        """Cluster -> its latest batch said the backend could not observe (``observe_failed``)."""
        self.refused: dict[str, str] = {}
        """Clusters whose adapter refused this coordinator (UNAUTHENTICATED / PERMISSION_DENIED / TLS), with why."""

    def start(self) -> None:
        self._started = True
        for cid in sorted(self._stubs):
            self._start_follower(cid)

    def _start_follower(self, cid: str) -> None:
        t = threading.Thread(target=self._follow, args=(cid,), name=f"observe-{cid}", daemon=True)
        t.start()
        self._threads.append(t)

    def ensure(self, cluster_id: str, address: str) -> bool:
        """Follow ``cluster_id``'s adapter at ``address`` from now on (registered or moved through the
        API): a new cluster gets its own stream thread; a moved one reconnects to the new address.
        True when something changed."""
        if self._addresses.get(cluster_id) == address or self._stop.is_set():
            return False
        channel = open_adapter_channel(address, self._token, self._tls)
        with self._lock:
            old = self._channels.get(cluster_id)
            self._addresses[cluster_id] = address
            self._channels[cluster_id] = channel
            self._stubs[cluster_id] = adapter_pb2_grpc.ClusterAdapterStub(channel)
            self._clocks.setdefault(cluster_id, ClockMap())
            self.connected.setdefault(cluster_id, False)
            self.observe_failing.setdefault(cluster_id, False)
            call = self._calls.get(cluster_id)
        if old is None:
            if self._started:
                self._start_follower(cluster_id)
        else:
            if call is not None:
                call.cancel()  # its thread reconnects, through the new stub
            old.close()
        return True

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            calls = list(self._calls.values())
        for call in calls:
            call.cancel()
        for t in self._threads:
            t.join(5.0)
        for ch in self._channels.values():
            ch.close()

    # -- the stream threads ---------------------------------------------------------------------
    def _follow(self, cid: str) -> None:
        after, stream_id, backoff = 0, "", 0.1
        while not self._stop.is_set():
            if not self._read_clock(cid):
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._reconnect_max_s)
                continue
            call = self._stubs[cid].Observe(adapter_pb2.ObserveRequest(cluster_id=cid, after_seq=after, stream_id=stream_id))
            with self._lock:
                self._calls[cid] = call
            if self._stop.is_set():  # close() ran between the loop check and the call: it missed this one
                call.cancel()
                return
            reason = "stream ended (adapter stopping)"
            try:
                for batch in call:
                    if not self.connected[cid]:
                        self.connected[cid] = True
                        log.info("observe_connected", cluster=cid, stream_id=batch.stream_id, after_seq=after)
                    after, stream_id, backoff = batch.seq, batch.stream_id, 0.1
                    self._receive(cid, batch)
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                reason = f"{exc.code().name}: {exc.details()}"
            if self.connected[cid]:
                log.warning("observe_disconnected", cluster=cid, reason=reason)
            self.connected[cid] = False
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self._reconnect_max_s)

    def _read_clock(self, cid: str) -> bool:
        """Read the adapter's clock (an empty ``Recent``) before each (re)connect. A stream starts
        with the ring buffer's old batches, whose ``receive - at`` differences are as large as
        their age: mapped with those alone, a two-minute-old report would look fresh and pass the
        stale-report check in ``facts``. False when the adapter does not answer."""
        try:
            reply = self._stubs[cid].Recent(adapter_pb2.RecentRequest(cluster_id=cid, max_age_ms=0),
                                            timeout=RECENT_DEADLINE_S)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                why = f"{exc.code().name}: {exc.details()}"
                if self.refused.get(cid) != why:  # once per distinct refusal, not once per retry
                    log.error("observe_refused", cluster=cid, reason=why)
                self.refused[cid] = why
            return False
        if self.refused.pop(cid, None) is not None:
            log.info("observe_accepted", cluster=cid)
        self._clocks[cid].observe(reply.now_ms, self._clock_ms())
        return True

    def _receive(self, cid: str, batch: adapter_pb2.ObservationBatch) -> None:
        self.observe_failing[cid] = batch.observe_failed
        clock = self._clocks[cid]
        clock.observe(batch.at_ms, self._clock_ms())
        obs = observations_of(batch, clock.offset() or 0)
        pressure = bool(obs.reports)
        with self._lock:
            self.batches_received += 1
            pressure = pressure or any(n > self._gateway.get((cid, dep), 0) for dep, n in obs.gateway_waiting)
            for s in obs.samples:
                prev = self._samples.get(s.instance_id)
                pressure = pressure or _load_jumped(prev, s)
                self._samples[s.instance_id] = s
            room = MAX_PENDING_REPORTS - len(self._reports)
            self._reports.extend(obs.reports[:max(0, room)])
            for key in [k for k in self._gateway if k[0] == cid]:
                del self._gateway[key]
            for dep, n in obs.gateway_waiting:
                self._gateway[(cid, dep)] = n
            for cache_cluster, models in obs.model_caches:
                if cache_cluster == cid:
                    self._caches[ClusterId(cid)] = models
            for gpu_cluster, report in obs.gpu_memory:
                if gpu_cluster == cid:
                    self._gpu[ClusterId(cid)] = report
        if pressure and self._on_pressure is not None:
            self._on_pressure()

    # -- the ObservationSource port -------------------------------------------------------------
    def gather(self, now_ms: int) -> Observations:
        with self._lock:
            for iid in [i for i, s in self._samples.items() if now_ms - s.at_ms > SAMPLE_MAX_AGE_MS]:
                del self._samples[iid]
            samples = tuple(self._samples[i] for i in sorted(self._samples))
            reports, self._reports = tuple(self._reports), []
            gateway: dict[DeploymentId, int] = {}
            for (_, dep), n in self._gateway.items():
                gateway[dep] = gateway.get(dep, 0) + n
            caches = tuple(sorted(self._caches.items()))
            gpu = tuple(sorted(self._gpu.items()))
        return Observations(now_ms, samples, reports, tuple(sorted(gateway.items())), caches, gpu)

    def recent(self, since_ms: int) -> list[Observations]:
        """The adapters' ring buffers since ``since_ms`` (local clock), oldest first; an adapter that
        does not answer within a second is skipped (logged)."""
        out: list[Observations] = []
        with self._lock:
            stubs = dict(self._stubs)
        for cid in sorted(stubs):
            asked = self._clock_ms()
            try:
                reply = stubs[cid].Recent(
                    adapter_pb2.RecentRequest(cluster_id=cid, max_age_ms=max(0, asked - since_ms)), timeout=RECENT_DEADLINE_S)
            except grpc.RpcError as exc:
                log.warning("recent_unavailable", cluster=cid, code=exc.code().name, detail=exc.details())
                continue
            shift = self._clock_ms() - reply.now_ms  # no later than the adapter's "now", like ClockMap
            out.extend(observations_of(b, shift) for b in reply.batches)
        out.sort(key=lambda o: o.at_ms)
        return out
