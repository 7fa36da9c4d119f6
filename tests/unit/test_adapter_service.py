"""The adapter's fencing guard and gRPC service, through the coordinators' RemoteAdapter client."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import deque
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from adapters.backend import MAX_GPUS_PER_INSTANCE, MAX_REPLICAS, InstanceCommand, ScaleCommand
from adapters.client import RemoteAdapter, _raise_translated
from adapters.service import (
    PLAINTEXT_WARNING,
    SERVICE_NAME,
    UNSIGNED_FENCE_WARNING,
    FencingGuard,
    ObservationHub,
    RecordingBackend,
    serve_adapter,
)
from controlplane.api.v1 import adapter_pb2, adapter_pb2_grpc
from controlplane.domain.errors import (
    NotFound,
    PermanentError,
    StaleEpoch,
    Unavailable,
    ValidationError,
)
from controlplane.domain.instances import InitMethod, Instance, InstanceState
from controlplane.domain.observations import (
    InstanceReport,
    InstanceSample,
    Observations,
)
from controlplane.ports import AdapterCommand, Fence
from tests.support.waiting import wait_until

INST = Instance("d1-1", "d1", "t1", "c1", "az-a", "h100", 1, InstanceState.PENDING, InitMethod.COLD, 0, 0)


@pytest.fixture
def adapter(tmp_path: Path):
    record = tmp_path / "record.jsonl"
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", RecordingBackend(record))
    client = RemoteAdapter({"c1": f"127.0.0.1:{server.port}"}, deadline_s=2.0)
    yield server, client, record
    server.stop(0.1)


def lines(record: Path) -> list[dict]:
    return [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []


def test_commands_below_the_highest_epoch_are_rejected_and_not_applied(adapter) -> None:
    server, client, record = adapter
    client.send("c1", AdapterCommand("e5-1", "create", INST), Fence(5, 1, "n1"), 0)
    client.fence("c1", Fence(9, 1, "n2"), 0)  # a new holder fences the adapter
    with pytest.raises(StaleEpoch) as err:
        client.send("c1", AdapterCommand("e5-2", "drain", INST, 10), Fence(5, 2, "n1"), 0)
    assert (err.value.got, err.value.highest) == (5, 9)
    with pytest.raises(StaleEpoch):
        client.fence("c1", Fence(8, 3, "n3"), 0)
    client.send("c1", AdapterCommand("e9-2", "drain", INST, 10), Fence(9, 2, "n2"), 0)
    got = [(x["action"], x["epoch"], x["accepted"]) for x in lines(record)]
    assert got == [("create", 5, True), ("fence", 9, True), ("drain", 5, False), ("fence", 8, False), ("drain", 9, True)]
    assert server.servicer.stale_rejected == 2


def test_equal_epoch_from_another_holder_is_rejected(adapter) -> None:
    _, client, _ = adapter
    client.fence("c1", Fence(4, 1, "n1"), 0)
    client.fence("c1", Fence(4, 2, "n1"), 0)
    with pytest.raises(StaleEpoch):
        client.fence("c1", Fence(4, 1, "n2"), 0)


def test_request_ids_apply_at_most_once(adapter) -> None:
    _, client, record = adapter
    for _ in range(3):
        client.send("c1", AdapterCommand("e1-1", "create", INST), Fence(1, 1, "n1"), 0)
    assert [x["action"] for x in lines(record)] == ["create"]


def test_bad_requests_are_invalid_argument(adapter) -> None:
    _, client, _ = adapter
    with pytest.raises(ValidationError, match="action"):
        client.send("c1", AdapterCommand("e1-1", "explode", INST), Fence(1, 1, "n1"), 0)
    client._stubs["c9"] = client._stubs["c1"]
    with pytest.raises(ValidationError, match="cluster_id"):
        client.fence("c9", Fence(1, 1, "n1"), 0)


def test_the_guard_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "c1.epoch.json"
    guard = FencingGuard(path)
    guard.admit(7, "n2")
    again = FencingGuard(path)
    assert (again.epoch, again.holder) == (7, "n2")
    with pytest.raises(StaleEpoch):
        again.admit(6, "n1")


# --- Scale, error mapping, persistence, health and reflection (a scripted backend) ----------------


class ScriptedBackend:
    """Backend fake: records what it carried out; ``fail`` holds exceptions raised by the next
    commands (one each); ``observations`` are returned by ``observe`` in order (else empty)."""

    def __init__(self) -> None:
        self.applied: list[InstanceCommand] = []
        self.scaled: list[ScaleCommand] = []
        self.fail: deque[Exception] = deque()
        self.observations: deque[Observations | Exception] = deque()
        self.observed_at: list[int] = []
        self.closed = False
        self._lock = threading.Lock()

    def _maybe_fail(self) -> None:
        with self._lock:
            exc = self.fail.popleft() if self.fail else None
        if exc is not None:
            raise exc

    def apply(self, command: InstanceCommand, now_ms: int) -> None:
        self._maybe_fail()
        self.applied.append(command)

    def scale(self, command: ScaleCommand, now_ms: int) -> None:
        self._maybe_fail()
        self.scaled.append(command)

    def observe(self, now_ms: int) -> Observations:
        self.observed_at.append(now_ms)
        with self._lock:
            nxt = self.observations.popleft() if self.observations else None
        if isinstance(nxt, Exception):
            raise nxt
        return nxt if nxt is not None else Observations(now_ms)

    def close(self) -> None:
        self.closed = True


ADAPTER_NOW = 50_000_000
"""The scripted adapter's clock (fixed): command deadlines are relative on the wire."""


@pytest.fixture
def scripted(tmp_path: Path):
    backend = ScriptedBackend()
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", backend, observe=False,
                           clock_ms=lambda: ADAPTER_NOW)
    client = RemoteAdapter({"c1": f"127.0.0.1:{server.port}"}, deadline_s=2.0)
    yield server, client, backend
    client.close()
    server.stop(0.1)


FENCE_1 = Fence(1, 1, "n1")


def scale(client: RemoteAdapter, request_id: str, deployment: str, replicas: int, victims=(), *,
          fence: Fence = FENCE_1, cluster_id: str = "c1") -> adapter_pb2.ApplyReply:
    """RemoteAdapter has no scale(): call the stub and translate errors as the client does."""
    request = adapter_pb2.ScaleRequest(
        cluster_id=cluster_id, request_id=request_id, deployment_id=deployment, replicas=replicas, victims=list(victims),
        fence=adapter_pb2.FenceToken(epoch=fence.epoch, seq=fence.seq, holder=fence.holder))
    try:
        return client._stubs["c1"].Scale(request, timeout=2.0)
    except grpc.RpcError as exc:
        _raise_translated(exc)
        raise AssertionError("unreachable")


def test_scale_reaches_the_backend_and_is_idempotent_by_request_id(scripted) -> None:
    server, client, backend = scripted
    first = scale(client, "s-1", "d1", 3, ["d1-a", "d1-b"], fence=Fence(4, 2, "n1"))
    again = scale(client, "s-1", "d1", 3, ["d1-a", "d1-b"], fence=Fence(4, 3, "n1"))
    assert (first.applied, again.applied) == (True, False)
    assert first.highest_epoch == 4
    assert len(backend.scaled) == 1
    cmd = backend.scaled[0]
    assert (cmd.request_id, cmd.deployment_id, cmd.replicas, cmd.victims) == ("s-1", "d1", 3, ("d1-a", "d1-b"))
    assert (cmd.fence.epoch, cmd.fence.seq, cmd.fence.holder) == (4, 2, "n1")
    assert scale(client, "s-2", "d1", 0, fence=Fence(4, 4, "n1")).applied  # zero replicas is valid
    assert [c.replicas for c in backend.scaled] == [3, 0]
    assert server.servicer.applied == 2


@pytest.mark.parametrize("kwargs, field", [
    ({"replicas": -1}, "replicas"),
    ({"replicas": MAX_REPLICAS + 1}, "replicas: must be between 0 and 10000"),
    ({"replicas": 2**31 - 1}, "replicas"),
    ({"victims": ["x", "y", "x"]}, "victims"),
    ({"deployment": ""}, "deployment_id"),
    ({"request_id": ""}, "request_id"),
    ({"cluster_id": "c9"}, "cluster_id"),
])
def test_bad_scale_requests_are_invalid_argument(scripted, kwargs, field) -> None:
    _, client, backend = scripted
    args = {"request_id": "s-1", "deployment": "d1", "replicas": 2, "victims": []} | kwargs
    cluster = args.pop("cluster_id", "c1")
    with pytest.raises(ValidationError, match=field):
        scale(client, args["request_id"], args["deployment"], args["replicas"], args["victims"], cluster_id=cluster)
    assert backend.scaled == []


@pytest.mark.parametrize("command, field", [
    (AdapterCommand("r-1", "reboot", INST), "action"),
    (AdapterCommand("", "create", INST), "request_id"),
])
def test_bad_apply_requests_are_invalid_argument(scripted, command, field) -> None:
    _, client, backend = scripted
    with pytest.raises(ValidationError, match=field):
        client.send("c1", command, Fence(1, 1, "n1"), 0)
    assert backend.applied == []


@pytest.mark.parametrize("gpus", [MAX_GPUS_PER_INSTANCE + 1, 2**31 - 1])
def test_an_instance_asking_for_too_many_gpus_is_invalid_argument(scripted, gpus: int) -> None:
    _, client, backend = scripted
    big = dataclasses.replace(INST, gpus=gpus)
    with pytest.raises(ValidationError, match="instance.gpus: must be between 1 and 64"):
        client.send("c1", AdapterCommand("r-1", "create", big), Fence(1, 1, "n1"), 0)
    assert backend.applied == []


def test_a_crashing_backend_is_a_clear_internal_error_and_not_remembered(scripted) -> None:
    server, client, backend = scripted
    backend.fail.append(KeyError("slot"))
    with pytest.raises(Unavailable, match="INTERNAL: create: internal error in the backend: KeyError"):
        client.send("c1", AdapterCommand("r-1", "create", INST), Fence(1, 1, "n1"), 0)
    client.send("c1", AdapterCommand("r-1", "create", INST), Fence(1, 2, "n1"), 0)  # the same id applies later
    assert [c.request_id for c in backend.applied] == ["r-1"] and server.servicer.applied == 1


def test_apply_with_the_wrong_cluster_id_is_invalid_argument(scripted) -> None:
    _, client, backend = scripted
    client._stubs["c2"] = client._stubs["c1"]
    with pytest.raises(ValidationError, match="cluster_id"):
        client.send("c2", AdapterCommand("r-1", "create", INST), Fence(1, 1, "n1"), 0)
    assert backend.applied == []


def test_apply_carries_the_instance_and_the_deadline(scripted) -> None:
    _, client, backend = scripted
    # The drain deadline travels as a timeout relative to the sender's clock and lands on the adapter's.
    client.send("c1", AdapterCommand("r-1", "drain", INST, 12_345), Fence(2, 5, "n1"), 10_000)
    client.send("c1", AdapterCommand("r-2", "drain", INST, 9_000), Fence(2, 6, "n1"), 10_000)  # already past
    (cmd, past) = backend.applied
    assert (cmd.action, cmd.deadline_ms, cmd.instance.instance_id, cmd.instance.deployment_id) == (
        "drain", ADAPTER_NOW + 2_345, "d1-1", "d1")
    assert past.deadline_ms == ADAPTER_NOW
    assert (cmd.instance.tenant_id, cmd.instance.zone, cmd.instance.pool, cmd.instance.gpus) == ("t1", "az-a", "h100", 1)


def test_backend_not_found_is_not_found(scripted) -> None:
    _, client, backend = scripted
    backend.fail.append(NotFound("deployment", "d9"))
    with pytest.raises(NotFound, match="d9"):
        client.send("c1", AdapterCommand("r-1", "create", INST), Fence(1, 1, "n1"), 0)
    backend.fail.append(NotFound("victims", "d1-x"))
    with pytest.raises(NotFound, match="d1-x"):
        scale(client, "s-1", "d1", 1, ["d1-x"])


def test_backend_validation_error_is_validation_error(scripted) -> None:
    _, client, backend = scripted
    backend.fail.append(ValidationError("gpus", "too many"))
    with pytest.raises(ValidationError, match="gpus"):
        client.send("c1", AdapterCommand("r-1", "create", INST), Fence(1, 1, "n1"), 0)


def test_unavailable_is_not_remembered_so_the_same_request_id_applies_later(scripted) -> None:
    server, client, backend = scripted
    backend.fail.append(Unavailable("kube api down"))
    with pytest.raises(Unavailable):
        client.send("c1", AdapterCommand("r-1", "create", INST), Fence(1, 1, "n1"), 0)
    assert backend.applied == []
    client.send("c1", AdapterCommand("r-1", "create", INST), Fence(1, 2, "n1"), 0)
    assert [c.request_id for c in backend.applied] == ["r-1"]
    client.send("c1", AdapterCommand("r-1", "create", INST), Fence(1, 3, "n1"), 0)  # now remembered
    assert len(backend.applied) == 1
    backend.fail.append(Unavailable("again"))
    with pytest.raises(Unavailable):
        scale(client, "s-1", "d1", 2)
    assert scale(client, "s-1", "d1", 2).applied
    assert len(backend.scaled) == 1
    assert server.servicer.applied == 2


def test_backend_stale_epoch_is_stale_epoch_with_its_numbers(scripted) -> None:
    server, client, backend = scripted
    backend.fail.append(StaleEpoch(3, 11))  # the backend's shared store knows epoch 11
    with pytest.raises(StaleEpoch) as err:
        client.send("c1", AdapterCommand("r-1", "create", INST), Fence(3, 1, "n1"), 0)
    assert (err.value.got, err.value.highest) == (3, 11)
    assert server.servicer.stale_rejected == 1
    backend.fail.append(StaleEpoch(3, 12))
    with pytest.raises(StaleEpoch) as err:
        scale(client, "s-1", "d1", 1, fence=Fence(3, 2, "n1"))
    assert (err.value.got, err.value.highest) == (3, 12)
    assert backend.applied == [] and backend.scaled == []


def test_failed_precondition_without_the_stale_metadata_is_not_stale_epoch(scripted) -> None:
    _, client, backend = scripted
    backend.fail.append(PermanentError("stale epoch 1: highest seen is 2"))  # looks like one, is not one
    with pytest.raises(Exception) as err:
        client.send("c1", AdapterCommand("r-1", "create", INST), Fence(1, 1, "n1"), 0)
    assert not isinstance(err.value, StaleEpoch)
    cause = err.value.__cause__
    assert isinstance(cause, grpc.RpcError) and cause.code() is grpc.StatusCode.FAILED_PRECONDITION


def test_the_stale_epoch_survives_a_server_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = serve_adapter("c1", "127.0.0.1:0", state, ScriptedBackend(), observe=False)
    client = RemoteAdapter({"c1": f"127.0.0.1:{first.port}"}, deadline_s=2.0)
    try:
        client.fence("c1", Fence(9, 1, "n2"), 0)
    finally:
        client.close()
        first.stop(0.1)
    backend = ScriptedBackend()
    second = serve_adapter("c1", "127.0.0.1:0", state, backend, observe=False)
    client = RemoteAdapter({"c1": f"127.0.0.1:{second.port}"}, deadline_s=2.0)
    try:
        with pytest.raises(StaleEpoch) as err:
            client.send("c1", AdapterCommand("r-1", "create", INST), Fence(5, 1, "n1"), 0)
        assert (err.value.got, err.value.highest) == (5, 9)
        with pytest.raises(StaleEpoch):  # same epoch, other holder
            client.fence("c1", Fence(9, 2, "n3"), 0)
        client.send("c1", AdapterCommand("r-2", "create", INST), Fence(9, 3, "n2"), 0)
        assert [c.request_id for c in backend.applied] == ["r-2"]
    finally:
        client.close()
        second.stop(0.1)


def test_health_reports_serving_and_reflection_lists_the_service(scripted) -> None:
    server, _, _ = scripted
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for name in ("", SERVICE_NAME):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=2.0)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=2.0)
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=2.0))
        names = {s.name for s in replies[0].list_services_response.service}
    assert SERVICE_NAME == "controlplane.api.v1.ClusterAdapter"
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


# --- ObservationHub (no threads: pump() by hand, an injected clock) --------------------------------


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def sample(iid: str, at_ms: int, running: int = 1) -> InstanceSample:
    return InstanceSample(iid, "d1", at_ms, running, 0, 0.1, 10.0, 20.0)


def test_hub_numbers_batches_one_by_one_and_bounds_the_ring() -> None:
    clock = FakeClock(1_000)
    hub = ObservationHub("c1", ScriptedBackend(), interval_ms=250, ring_s=1.0, clock_ms=clock)  # 4 batches
    seqs = []
    for _ in range(7):
        clock.now += 250
        seqs.append(hub.pump().seq)
    assert seqs == [1, 2, 3, 4, 5, 6, 7]
    ring = hub.after(0, timeout_s=0)
    assert [b.seq for b in ring] == [4, 5, 6, 7]
    assert [b.at_ms for b in ring] == [2_000, 2_250, 2_500, 2_750]
    assert {b.stream_id for b in ring} == {hub.stream_id} and {b.cluster_id for b in ring} == {"c1"}


def test_hub_ring_size_rounds_up() -> None:
    hub = ObservationHub("c1", ScriptedBackend(), interval_ms=300, ring_s=1.0, clock_ms=FakeClock(0))
    for _ in range(10):
        hub.pump()
    assert len(hub.after(0, timeout_s=0)) == 4  # ceil(1000 / 300)


def test_hub_after_returns_only_newer_batches_and_waits_boundedly() -> None:
    clock = FakeClock(0)
    hub = ObservationHub("c1", ScriptedBackend(), interval_ms=250, clock_ms=clock)
    for _ in range(5):
        clock.now += 250
        hub.pump()
    assert [b.seq for b in hub.after(3, timeout_s=0)] == [4, 5]
    assert hub.after(5, timeout_s=0.05) == []  # nothing newer: returns after the timeout
    got: list = []
    t = threading.Thread(target=lambda: got.extend(hub.after(5, timeout_s=5.0)))
    t.start()
    clock.now += 250
    hub.pump()
    t.join(5.0)
    assert not t.is_alive() and [b.seq for b in got] == [6]


def test_hub_recent_filters_by_age_on_the_injected_clock() -> None:
    clock = FakeClock(10_000)
    backend = ScriptedBackend()
    hub = ObservationHub("c1", backend, interval_ms=250, clock_ms=clock)
    for _ in range(8):
        clock.now += 250
        hub.pump()
    assert backend.observed_at == [10_250 + 250 * k for k in range(8)]
    clock.now = 12_000 + 100
    now, batches = hub.recent(600)
    assert now == 12_100
    assert [b.at_ms for b in batches] == [11_500, 11_750, 12_000]
    assert [b.seq for b in hub.recent(0)[1]] == []
    assert len(hub.recent(10**9)[1]) == 8


def test_hub_carries_the_backends_observations() -> None:
    clock = FakeClock(5_000)
    backend = ScriptedBackend()
    backend.observations.append(Observations(5_000, (sample("i1", 5_000, running=3),),
                                             (InstanceReport("i1", "warmed", 4_990, "ok"),), (("d1", 7),)))
    batch = ObservationHub("c1", backend, clock_ms=clock).pump()
    assert [(s.instance_id, s.running, s.at_ms) for s in batch.samples] == [("i1", 3, 5_000)]
    assert not batch.samples[0].HasField("ttft_p99_ms")
    assert [(r.instance_id, r.event, r.at_ms, r.detail) for r in batch.reports] == [("i1", "warmed", 4_990, "ok")]
    assert [(g.deployment_id, g.waiting) for g in batch.gateway] == [("d1", 7)]


def test_a_failing_observe_still_publishes_an_empty_batch() -> None:
    clock = FakeClock(1_000)
    backend = ScriptedBackend()
    backend.observations.extend([RuntimeError("driver bug"), Observations(1_250, (sample("i1", 1_250),))])
    hub = ObservationHub("c1", backend, clock_ms=clock)
    bad = hub.pump()
    assert (bad.seq, bad.at_ms, len(bad.samples), len(bad.reports), len(bad.gateway)) == (1, 1_000, 0, 0, 0)
    assert bad.observe_failed and hub.observe_errors == 1  # not to be taken for an empty cluster
    clock.now = 1_250
    good = hub.pump()
    assert (good.seq, len(good.samples), good.observe_failed) == (2, 1, False)
    assert hub.observe_errors == 1


def test_a_sample_the_wire_cannot_carry_still_publishes_an_empty_batch() -> None:
    clock = FakeClock(1_000)
    backend = ScriptedBackend()
    backend.observations.extend([Observations(1_000, (sample("i1", 1_000, running=2**40),)),
                                 Observations(1_250, (sample("i1", 1_250),))])
    hub = ObservationHub("c1", backend, clock_ms=clock)
    bad = hub.pump()
    assert (bad.seq, len(bad.samples), bad.observe_failed, hub.observe_errors) == (1, 0, True, 1)
    clock.now = 1_250
    assert (hub.pump().seq, hub.observe_errors) == (2, 1)  # the stream goes on


def test_hub_rejects_a_non_positive_interval() -> None:
    with pytest.raises(ValidationError, match="observe_interval_ms"):
        ObservationHub("c1", ScriptedBackend(), interval_ms=0)


# --- Observe and Recent over real gRPC ------------------------------------------------------------


@pytest.fixture
def streaming(tmp_path: Path):
    """An adapter whose hub thread pumps once at start and then not for a minute: the test pumps."""
    clock = FakeClock(1_000_000)
    backend = ScriptedBackend()
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", backend, observe_interval_ms=60_000,
                           ring_s=3_600, clock_ms=clock)
    assert server.hub is not None
    wait_until(lambda: len(server.hub.after(0, timeout_s=0)) == 1, what="the hub thread's first pump")
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield server, adapter_pb2_grpc.ClusterAdapterStub(channel), clock, backend
    channel.close()
    server.stop(0.1)


def test_observe_streams_batches_in_order_and_resumes_without_duplicates(streaming) -> None:
    server, stub, clock, backend = streaming
    for k in range(3):
        clock.now += 1_000
        backend.observations.append(Observations(clock.now, (sample(f"i{k}", clock.now),)))
        server.hub.pump()
    call = stub.Observe(adapter_pb2.ObserveRequest(cluster_id="c1"), timeout=10.0)
    got = [next(call) for _ in range(4)]
    assert [b.seq for b in got] == [1, 2, 3, 4]
    assert [[s.instance_id for s in b.samples] for b in got] == [[], ["i0"], ["i1"], ["i2"]]
    clock.now += 1_000
    server.hub.pump()
    assert next(call).seq == 5  # a live batch
    call.cancel()
    stream_id = got[0].stream_id
    assert stream_id == server.hub.stream_id
    for _ in range(2):
        clock.now += 1_000
        server.hub.pump()
    resumed = stub.Observe(adapter_pb2.ObserveRequest(cluster_id="c1", after_seq=5, stream_id=stream_id), timeout=10.0)
    assert [next(resumed).seq for _ in range(2)] == [6, 7]
    resumed.cancel()
    other = stub.Observe(adapter_pb2.ObserveRequest(cluster_id="c1", after_seq=5, stream_id="another-process"),
                         timeout=10.0)
    assert next(other).seq == 1  # an unknown stream id restarts from the start of the ring
    other.cancel()


def test_observe_with_the_wrong_cluster_is_invalid_argument(streaming) -> None:
    _, stub, _, _ = streaming
    with pytest.raises(grpc.RpcError) as err:
        next(stub.Observe(adapter_pb2.ObserveRequest(cluster_id="c2"), timeout=5.0))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_recent_returns_the_window_and_the_adapter_clock(streaming) -> None:
    server, stub, clock, _ = streaming
    for _ in range(4):
        clock.now += 1_000  # batches at +1 s ... +4 s; the thread's first one at +0
        server.hub.pump()
    clock.now += 500
    reply = stub.Recent(adapter_pb2.RecentRequest(cluster_id="c1", max_age_ms=2_000), timeout=5.0)
    assert reply.now_ms == 1_004_500
    assert [(b.seq, b.at_ms) for b in reply.batches] == [(4, 1_003_000), (5, 1_004_000)]
    everything = stub.Recent(adapter_pb2.RecentRequest(cluster_id="c1", max_age_ms=10**9), timeout=5.0)
    assert [b.seq for b in everything.batches] == [1, 2, 3, 4, 5]
    with pytest.raises(grpc.RpcError) as err:
        stub.Recent(adapter_pb2.RecentRequest(cluster_id="c1", max_age_ms=-1), timeout=5.0)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_observe_without_a_hub_is_unimplemented_and_recent_is_empty(scripted) -> None:
    server, _, _ = scripted
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        stub = adapter_pb2_grpc.ClusterAdapterStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            next(stub.Observe(adapter_pb2.ObserveRequest(cluster_id="c1"), timeout=5.0))
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
        reply = stub.Recent(adapter_pb2.RecentRequest(cluster_id="c1", max_age_ms=1_000), timeout=5.0)
        assert list(reply.batches) == [] and reply.now_ms > 0


def test_the_client_scale_call_is_fenced_and_idempotent(adapter) -> None:
    server, client, record = adapter
    assert client.scale("c1", "s-1", "d1", 3, ["d1-1"], Fence(2, 1, "n1")) is True
    assert client.scale("c1", "s-1", "d1", 3, ["d1-1"], Fence(2, 2, "n1")) is False  # repeated id
    with pytest.raises(StaleEpoch):
        client.scale("c1", "s-2", "d1", 1, [], Fence(1, 3, "n0"))
    with pytest.raises(ValidationError):
        client.scale("c1", "s-3", "d1", -1, [], Fence(2, 4, "n1"))
    scales = [x for x in lines(record) if x["action"] == "scale"]
    assert [(x.get("replicas"), x.get("victims"), x["epoch"], x["accepted"]) for x in scales] == [
        (3, ["d1-1"], 2, True), (None, None, 1, False)]  # the stale one is recorded as refused; the invalid one not at all


# --- authentication and TLS ---------------------------------------------------------------------------

TOKEN = "adapter-token-0123456789abcdef"


@pytest.fixture
def secured(tmp_path: Path):
    """An adapter that demands TOKEN, with an observation hub (one batch pumped at start)."""
    record = tmp_path / "record.jsonl"
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", RecordingBackend(record),
                           observe_interval_ms=60_000, auth_token=TOKEN)
    assert server.hub is not None
    wait_until(lambda: len(server.hub.after(0, timeout_s=0)) == 1, what="the hub thread's first pump")
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield server, adapter_pb2_grpc.ClusterAdapterStub(channel), record
    channel.close()
    server.stop(0.1)


FENCE_MSG = adapter_pb2.FenceToken(epoch=1, seq=1, holder="n1")
CALLS = {
    "Fence": lambda stub, md: stub.Fence(adapter_pb2.FenceRequest(cluster_id="c1", fence=FENCE_MSG), metadata=md, timeout=5),
    "Apply": lambda stub, md: stub.Apply(adapter_pb2.ApplyRequest(
        cluster_id="c1", request_id="r1", action="create", fence=FENCE_MSG,
        instance=adapter_pb2.InstanceRef(instance_id="i1", deployment_id="d1")), metadata=md, timeout=5),
    "Scale": lambda stub, md: stub.Scale(adapter_pb2.ScaleRequest(
        cluster_id="c1", request_id="s1", deployment_id="d1", replicas=1, fence=FENCE_MSG), metadata=md, timeout=5),
    "Observe": lambda stub, md: next(stub.Observe(adapter_pb2.ObserveRequest(cluster_id="c1"), metadata=md, timeout=5)),
    "Recent": lambda stub, md: stub.Recent(adapter_pb2.RecentRequest(cluster_id="c1", max_age_ms=60_000), metadata=md,
                                           timeout=5),
}


@pytest.mark.parametrize("rpc", sorted(CALLS))
@pytest.mark.parametrize("metadata, problem", [
    ((), "missing 'authorization: Bearer <token>'"),
    ((("authorization", "Bearer wrong-token-0123456789abcd"),), "not this adapter's"),
    ((("authorization", f"Bearer {TOKEN}x"),), "not this adapter's"),
    ((("authorization", f"Bearer {TOKEN[:-1]}"),), "not this adapter's"),
    ((("authorization", TOKEN),), "must be 'Bearer <token>'"),
    ((("authorization", f"Basic {TOKEN}"),), "must be 'Bearer <token>'"),
    ((("authorization", "Bearer "),), "must be 'Bearer <token>'"),
])
def test_every_adapter_call_without_the_right_token_is_unauthenticated(secured, rpc, metadata, problem) -> None:
    server, stub, record = secured
    with pytest.raises(grpc.RpcError) as err:
        CALLS[rpc](stub, metadata)
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert problem in err.value.details() and TOKEN not in err.value.details()
    assert lines(record) == []  # nothing reached the backend, not even a refused-fence record
    assert server.servicer.applied == 0 and server.servicer._guard.epoch == 0
    assert server.hub is not None  # Observe/Recent gave nothing away either (they raised)


@pytest.mark.parametrize("rpc", sorted(CALLS))
def test_every_adapter_call_with_the_token_works(secured, rpc) -> None:
    _, stub, _ = secured
    CALLS[rpc](stub, (("authorization", f"Bearer {TOKEN}"),))
    CALLS[rpc](stub, (("authorization", f"bearer {TOKEN}"),))  # the scheme is case-insensitive (RFC 7235)


def test_the_client_sends_its_token_on_every_call(secured) -> None:
    server, _, record = secured
    client = RemoteAdapter({"c1": f"127.0.0.1:{server.port}"}, deadline_s=2.0, token=TOKEN)
    try:
        client.fence("c1", Fence(3, 1, "n1"), 0)
        client.send("c1", AdapterCommand("r1", "create", INST), Fence(3, 2, "n1"), 0)
        assert client.scale("c1", "s1", "d1", 2, [], Fence(3, 3, "n1")) is True
    finally:
        client.close()
    assert [x["action"] for x in lines(record)] == ["fence", "create", "scale"]
    wrong = RemoteAdapter({"c1": f"127.0.0.1:{server.port}"}, deadline_s=2.0, token="another-token-0123456789")
    try:
        with pytest.raises(Unavailable, match="UNAUTHENTICATED"):
            wrong.fence("c1", Fence(4, 1, "n1"), 0)
    finally:
        wrong.close()
    assert server.servicer._guard.epoch == 3


def test_health_and_reflection_need_no_token(secured) -> None:
    server, _, _ = secured
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2.0)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=2.0))
        assert SERVICE_NAME in {s.name for s in replies[0].list_services_response.service}


def test_refusals_are_logged_sparsely_and_never_with_the_token(secured) -> None:
    from structlog.testing import capture_logs

    _, stub, _ = secured
    with capture_logs() as logs:
        for _ in range(5):
            with pytest.raises(grpc.RpcError):
                CALLS["Recent"](stub, (("authorization", f"Bearer {TOKEN}-nope"),))
    refusals = [e for e in logs if e["event"] == "call_unauthenticated"]
    assert [e["refused"] for e in refusals] == [1, 2, 4]
    assert refusals[0]["method"] == f"/{SERVICE_NAME}/Recent"
    assert TOKEN not in repr(logs)


def test_without_a_token_only_loopback_and_one_warning(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    with pytest.raises(ValidationError) as err:
        serve_adapter("c1", "0.0.0.0:0", tmp_path / "state", RecordingBackend(tmp_path / "r.jsonl"), observe=False)
    assert err.value.field == "auth_token_file" and "0.0.0.0:0 is not a loopback address" in str(err.value)
    assert not (tmp_path / "state").exists()
    with capture_logs() as logs:
        server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", RecordingBackend(tmp_path / "r.jsonl"), observe=False)
    server.stop(0.1)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["adapter is unauthenticated (loopback only)", PLAINTEXT_WARNING,
                                              UNSIGNED_FENCE_WARNING]
    with pytest.raises(ValidationError) as err:  # off loopback a token alone is not enough: mutual TLS
        serve_adapter("c1", "0.0.0.0:0", tmp_path / "state", RecordingBackend(tmp_path / "r.jsonl"), observe=False,
                      auth_token=TOKEN)
    assert err.value.field == "tls" and "mutual TLS" in str(err.value)
    from controlplane.fencing import FenceVerifier, make_fence_key
    from controlplane.tls import make_dev_pki

    pki = make_dev_pki(tmp_path / "pki")
    tls = (pki.server_cert.read_bytes(), pki.server_key.read_bytes())
    with pytest.raises(ValidationError) as err:
        serve_adapter("c1", "0.0.0.0:0", tmp_path / "state", RecordingBackend(tmp_path / "r.jsonl"), observe=False,
                      auth_token=TOKEN, tls=tls, client_ca=pki.ca_cert.read_bytes())
    assert err.value.field == "fence_public_key_files"
    verifier = FenceVerifier.from_files([make_fence_key(tmp_path / "fence").public_key])
    with capture_logs() as logs:
        server = serve_adapter("c1", "0.0.0.0:0", tmp_path / "state", RecordingBackend(tmp_path / "r.jsonl"), observe=False,
                               auth_token=TOKEN, tls=tls, client_ca=pki.ca_cert.read_bytes(), fence_verifier=verifier)
    server.stop(0.1)
    assert not [e for e in logs if e["log_level"] == "warning"]
    assert TOKEN not in repr(logs)


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1:1", True), ("127.9.9.9:1", True), ("localhost:1", True), ("LOCALHOST:1", True), ("[::1]:1", True),
    ("::1", True), ("0.0.0.0:1", False), ("10.0.0.1:1", False), ("[::]:1", False), ("example.com:1", False),
    ("localhost.example.com:1", False),
])
def test_is_loopback(address: str, loopback: bool) -> None:
    from controlplane.config import is_loopback_address as is_loopback

    assert is_loopback(address) is loopback


def test_tls_with_a_token_end_to_end_and_plaintext_is_refused(tmp_path: Path) -> None:
    from controlplane.tls import make_dev_pki

    from adapters.client import AdapterTls
    from controlplane.tls import issue_coordinator_cert

    pki = make_dev_pki(tmp_path / "pki")
    cert, key = issue_coordinator_cert(pki, "n1")
    record = tmp_path / "record.jsonl"
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", RecordingBackend(record), observe=False,
                           auth_token=TOKEN, tls=(pki.server_cert.read_bytes(), pki.server_key.read_bytes()),
                           client_ca=pki.ca_cert.read_bytes())
    address = {"c1": f"127.0.0.1:{server.port}"}
    client = RemoteAdapter(address, deadline_s=5.0, token=TOKEN, tls=AdapterTls(pki.ca_cert, cert, key))
    plain = RemoteAdapter(address, deadline_s=1.0, token=TOKEN)
    other_ca = make_dev_pki(tmp_path / "other")
    stranger = RemoteAdapter(address, deadline_s=1.0, token=TOKEN,
                             tls=AdapterTls(other_ca.ca_cert, *issue_coordinator_cert(other_ca, "n1")))
    try:
        client.fence("c1", Fence(2, 1, "n1"), 0)
        with pytest.raises(Unavailable):
            plain.fence("c1", Fence(3, 1, "n1"), 0)
        with pytest.raises(Unavailable):  # a server certificate from another CA is not trusted
            stranger.fence("c1", Fence(3, 1, "n1"), 0)
    finally:
        for c in (client, plain, stranger):
            c.close()
        server.stop(0.1)
    assert [(x["action"], x["epoch"]) for x in lines(record)] == [("fence", 2)]


def test_the_client_refuses_an_unreadable_ca_or_a_bad_token(tmp_path: Path) -> None:
    from adapters.client import AdapterTls

    with pytest.raises(ValidationError) as err:
        RemoteAdapter({"c1": "127.0.0.1:1"}, tls=AdapterTls(tmp_path / "nope.pem", tmp_path / "c.pem", tmp_path / "k.pem"))
    assert err.value.field == "ca_file"
    with pytest.raises(ValidationError) as err:  # plaintext reaches loopback adapters only
        RemoteAdapter({"c1": "10.0.0.7:7001"}, token=TOKEN)
    assert err.value.field == "adapter_tls" and "10.0.0.7:7001" in str(err.value)
    with pytest.raises(ValidationError) as err:
        RemoteAdapter({"c1": "127.0.0.1:1"}, token="has space")
    assert err.value.field == "token"
