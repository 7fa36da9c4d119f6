"""GPU memory from the node agents to the coordinators: the agent's record from GpuMonitor over the
NVML fake (real pynvml codes and structs: v2 reserved memory, MIG devices, a lost GPU, a foreign
process holding memory), the typed refusal of malformed records, the Kubernetes backend reading the
per-node ConfigMaps from the strict fake apiserver, the simulated backend's report and the wire."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from structlog.testing import capture_logs

from adapters.gpu import GpuMonitor
from adapters.gpu_report import (
    DATA_KEY,
    NODE_LABEL,
    AgentRecord,
    ConfigMapPublisher,
    GpuReportConfig,
    NodeGpuReader,
    parse_record,
    record_of,
    report_of,
    run_agent,
)
from adapters.kubernetes import KubernetesBackend, KubernetesConfig, WorkloadConfig
from adapters.simulated import SimulatedBackend, SimulatedConfig
from adapters.wire import batch_of, observations_of
from controlplane.core.gpu_memory import MemoryView, need_bytes
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId
from controlplane.domain.observations import GpuReport, GpuUnit, Observations
from controlplane.domain.profiles import PROFILES
from tests.adapters.test_gpu import FakeDev, FakeNvml, proc
from tests.fakes.kube_apiserver import FakeKubeApiServer

pytestmark = pytest.mark.timeout(60)
GiB = 1024**3
MiB = 1024**2
NS = "serving"
H100 = 81_559 * MiB  # what NVML reports for an H100 80GB HBM3
RESERVED = 512 * MiB


def read(devs: list[FakeDev], **kw: Any) -> AgentRecord:
    mon = GpuMonitor(FakeNvml(devs, **kw))
    mon.start()
    try:
        return record_of("gpu-node-1", "h100", 1_000, mon.read())
    finally:
        mon.close()


def test_free_for_us_is_total_minus_used_minus_reserved_and_a_foreign_process_counts() -> None:
    leak = 20 * GiB  # a process that is not ours (a leaked CUDA context)
    rec = read([FakeDev("GPU-a", "H100", H100, RESERVED, leak, procs=[proc(999, leak)]),
                FakeDev("GPU-b", "H100", H100, RESERVED, 0)])
    assert [(g.unit, g.free_for_us, g.reserved_bytes, g.problem) for g in rec.gpus] == [
        ("GPU-a", H100 - RESERVED - leak, RESERVED, ""), ("GPU-b", H100 - RESERVED, RESERVED, "")]
    units = report_of([rec], 1_000).units
    assert [u.free_bytes for u in units] == [H100 - RESERVED - leak, H100 - RESERVED]
    need = need_bytes(PROFILES["llama3-8b-h100"])  # 72 GiB: vLLM's 0.9 x 80 GiB
    assert units[1].free_bytes >= need > units[0].free_bytes  # the leaked GPU cannot take the instance


def test_v1_memory_call_used_includes_reserved() -> None:
    rec = read([FakeDev("GPU-a", "H100", H100, RESERVED, 10 * GiB)], v2=False)
    (g,) = rec.gpus
    assert g.reserved_bytes is None and g.used_bytes == RESERVED + 10 * GiB
    assert g.free_for_us == H100 - RESERVED - 10 * GiB  # the same free memory either way


def test_mig_devices_are_the_units_and_the_parent_is_not() -> None:
    m0 = FakeDev("MIG-0", "3g.40gb", 40 * GiB, 0, 5 * GiB, procs=[proc(7, 5 * GiB)])
    m1 = FakeDev("MIG-1", "3g.40gb", 40 * GiB, 0, 0)
    bad = FakeDev("MIG-2", "1g.10gb", 10 * GiB, 0, 0, fail={"nvmlDeviceGetName": pynvml.NVML_ERROR_UNKNOWN})
    parent = FakeDev("GPU-p", "H100", H100, RESERVED, 5 * GiB, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
                     migs={0: m0, 1: m1, 3: bad}, max_migs=7)
    rec = read([parent])
    assert [(g.unit, g.total_bytes, g.free_for_us) for g in rec.gpus] == [
        ("MIG-0", 40 * GiB, 35 * GiB), ("MIG-1", 40 * GiB, 40 * GiB), ("MIG-2", 0, 0)]
    assert "Unknown" in rec.gpus[2].problem


def test_a_lost_gpu_and_a_failing_one_offer_nothing() -> None:
    devs = [FakeDev("GPU-a", "H100", H100, RESERVED, 0, fail={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST}),
            FakeDev("GPU-b", "H100", H100, RESERVED, 0, fail={"nvmlDeviceGetUUID": pynvml.NVML_ERROR_UNKNOWN}),
            FakeDev("GPU-c", "H100", H100, RESERVED, 0)]
    rec = read(devs)
    assert [(g.unit, g.problem[:4], g.free_for_us) for g in rec.gpus] == [
        ("GPU-a", "lost", 0), ("gpu1", "NVML", 0), ("GPU-c", "", H100 - RESERVED)]
    units = report_of([rec], 0).units
    assert [bool(u.problem) for u in units] == [True, False, True]  # sorted: GPU-a, GPU-c, gpu1


def test_no_driver_publishes_an_empty_record_saying_why() -> None:
    published: list[AgentRecord] = []
    failed = run_agent(GpuMonitor(FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)), published.append,
                       "n1", "", 5, threading.Event(), lambda: 42, once=True)
    assert failed == 0 and published[0].gpus == [] and published[0].nvml.startswith("unavailable: NVMLError_LibraryNotFound")


def test_the_agent_publishes_every_interval_until_stopped_and_survives_a_failed_publish() -> None:
    stop = threading.Event()
    got: list[AgentRecord] = []

    def publish(rec: AgentRecord) -> None:
        got.append(rec)
        if len(got) == 1:
            raise ApiException(status=500, reason="boom")
        if len(got) == 3:
            stop.set()

    api = FakeNvml([FakeDev("GPU-a", "H100", H100, RESERVED, 0)])
    failed = run_agent(GpuMonitor(api), publish, "n1", "h100", 0.001, stop, lambda: 7)
    assert failed == 1 and len(got) == 3 and api.inited == 0  # nvmlShutdown once at the end


class FakeCore:
    """The two CoreV1Api calls ConfigMapPublisher makes, with the API server's 404 on a first replace."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def replace_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append("replace")
        if name not in self.maps:
            raise ApiException(status=404, reason="Not Found")
        self.maps[name] = body

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append("create")
        self.maps[body["metadata"]["name"]] = body


def test_publisher_creates_then_replaces_the_node_configmap_owned_by_its_pod() -> None:
    core = FakeCore()
    pub = ConfigMapPublisher(core, NS, "gpu-node-1", "gpu-agent-x", "uid-1")
    rec = read([FakeDev("GPU-a", "H100", H100, RESERVED, 0)])
    pub(rec)
    pub(rec)
    assert core.calls == ["replace", "create", "replace"]
    body = core.maps["gpu-memory-gpu-node-1"]
    assert body["metadata"]["labels"] == {NODE_LABEL: "node"}
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "gpu-agent-x", "uid": "uid-1"}]
    assert parse_record("m", body["data"][DATA_KEY]) == rec  # what the adapter parses is what was read


def good(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"version": 1, "node": "n1", "pool": "h100", "at_ms": 1_000_000,
                           "gpus": [{"unit": "GPU-a", "total_bytes": 80 * GiB, "used_bytes": GiB, "reserved_bytes": 0}]}
    doc.update(over)
    return doc


def gpu(**over: Any) -> dict[str, Any]:
    return good(gpus=[{"unit": "GPU-a", "total_bytes": 80 * GiB, "used_bytes": GiB, "reserved_bytes": 0, **over}])


@pytest.mark.parametrize(("text", "field", "problem"), [
    ("{not json", "configmap m: gpus.json", "not JSON"),
    ("", "configmap m: gpus.json", "missing or empty"),
    (None, "configmap m: gpus.json", "missing or empty"),
    (json.dumps(gpu(used_bytes=-5)), "configmap m: gpus.json.gpus.0.used_bytes", "greater than or equal to 0"),
    (json.dumps(gpu(total_bytes=-1)), "configmap m: gpus.json.gpus.0.total_bytes", "greater than or equal to 0"),
    (json.dumps(gpu(used_bytes=81 * GiB)), "configmap m: gpus.json.gpus.0", "used_bytes + reserved_bytes: "),
    (json.dumps(gpu(reserved_bytes=None, used_bytes=81 * GiB)), "configmap m: gpus.json.gpus.0", "used_bytes: "),
    (json.dumps(gpu(used_bytes="lots")), "configmap m: gpus.json.gpus.0.used_bytes", "valid integer"),
    (json.dumps(good(version=2)), "configmap m: gpus.json.version", "Input should be 1"),
    (json.dumps(good(node="")), "configmap m: gpus.json.node", "at least 1 character"),
    (json.dumps([1, 2]), "configmap m: gpus.json", "valid dictionary"),
    (json.dumps(good(extra=1)), "configmap m: gpus.json.extra", "Extra inputs"),
])  # fmt: skip
def test_a_malformed_record_is_a_typed_error_naming_the_field(text: Any, field: str, problem: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_record("m", text)
    assert exc.value.field == field and problem in exc.value.problem, (exc.value.field, exc.value.problem)


def reader(**cfg: Any) -> NodeGpuReader:
    return NodeGpuReader(None, GpuReportConfig(namespace=NS, **cfg), lambda: 0, 1.0)


def test_bad_and_stale_records_are_left_out_with_one_warning_each() -> None:
    r = reader(max_age_s=60)
    maps = [("gpu-memory-n1", {DATA_KEY: json.dumps(good())}),
            ("gpu-memory-n2", {DATA_KEY: json.dumps(gpu(used_bytes=81 * GiB) | {"node": "n2"})}),
            ("gpu-memory-n3", {DATA_KEY: "]["}),
            ("gpu-memory-n4", {DATA_KEY: json.dumps(good(node="n4", at_ms=1_000_000 - 61_000))}),
            ("gpu-memory-n5", {DATA_KEY: json.dumps(good())}),  # a second record for n1
            ("gpu-memory-n6", None)]
    with capture_logs() as logs:
        rep = r.report_from(maps, 1_000_000)
        again = r.report_from(maps, 1_000_000)
    assert rep == again == GpuReport(1_000_000, (GpuUnit("n1", "GPU-a", 79 * GiB, 80 * GiB, "h100"),))
    warned = [(e["configmap"], e["field"]) for e in logs if e["event"] == "gpu_report.bad_record"]
    assert warned == [("gpu-memory-n2", "configmap gpu-memory-n2: gpus.json.gpus.0"),
                      ("gpu-memory-n3", "configmap gpu-memory-n3: gpus.json"),
                      ("gpu-memory-n4", "configmap gpu-memory-n4: gpus.json.at_ms"),
                      ("gpu-memory-n5", "configmap gpu-memory-n5: gpus.json.node"),
                      ("gpu-memory-n6", "configmap gpu-memory-n6: gpus.json")]  # once each, not per list
    assert r.rejected == 10


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def fake() -> Iterator[FakeKubeApiServer]:
    server = FakeKubeApiServer(seed=1).start()
    server.add_workload("Deployment", NS, "web")
    try:
        yield server
    finally:
        server.stop()


def kube(fake: FakeKubeApiServer, clock: Clock, gpu_cfg: GpuReportConfig | None) -> KubernetesBackend:
    cfg = KubernetesConfig(workloads=[WorkloadConfig(deployment="chat", namespace=NS, kind="Deployment", name="web",
                                                     engine="vllm", port=8000)],
                           request_timeout_s=5, watch_timeout_s=2, gpu_memory=gpu_cfg)
    api = k8s.ApiClient(k8s.Configuration(host=fake.host))
    return KubernetesBackend(cfg, api, rng=random.Random(1), clock_ms=clock, cluster_id="gpu-a").start()


def test_kubernetes_backend_reports_the_agents_records(fake: FakeKubeApiServer) -> None:
    clock = Clock()
    core = FakeCore()
    ConfigMapPublisher(core, NS, "n1")(AgentRecord.model_validate(good(at_ms=clock.ms)))
    fake.put_configmap(NS, "gpu-memory-n1", core.maps["gpu-memory-n1"]["data"], {NODE_LABEL: "node"})
    fake.put_configmap(NS, "gpu-memory-n2", {DATA_KEY: json.dumps(gpu(used_bytes=-1) | {"node": "n2"})}, {NODE_LABEL: "node"})
    fake.put_configmap(NS, "unrelated", {DATA_KEY: json.dumps(good(node="x"))}, {"app": "x"})
    b = kube(fake, clock, GpuReportConfig(namespace=NS, refresh_s=5))
    try:
        obs = b.observe(clock.ms)
        first = GpuReport(clock.ms, (GpuUnit("n1", "GPU-a", 79 * GiB, 80 * GiB, "h100"),))
        assert obs.gpu_memory == ((ClusterId("gpu-a"), first),)
        clock.ms += 1_000
        assert b.observe(clock.ms).gpu_memory == ()  # sent once per refresh, not every batch
        fake.fail_next(500, path_contains="/configmaps")
        clock.ms += 4_000
        assert b.observe(clock.ms).gpu_memory == ()  # an API failure: nothing new (the coordinators age the old one out)
        clock.ms += 5_000
        assert b.observe(clock.ms).gpu_memory == ((ClusterId("gpu-a"), GpuReport(clock.ms, first.units)),)
        lists = [p for m, p, _ in fake.requests if m == "GET" and "/configmaps" in p]
        assert all("labelSelector=controlplane.io/gpu-memory%3Dnode" in p for p in lists) and len(lists) == 3
    finally:
        b.close()


def test_without_the_gpu_memory_section_nothing_is_read(fake: FakeKubeApiServer) -> None:
    clock = Clock()
    b = kube(fake, clock, None)
    try:
        assert b.observe(clock.ms).gpu_memory == ()
        assert not any("/configmaps" in p for _, p, _ in fake.requests)
    finally:
        b.close()


def test_the_wire_carries_the_cluster_own_report_and_clamps_a_peer_nonsense() -> None:
    rep = GpuReport(7, (GpuUnit("n1", "GPU-a", 5, 10, "h100"), GpuUnit("n1", "GPU-b", 0, 0, "", "lost")))
    obs = Observations(9, gpu_memory=((ClusterId("other"), GpuReport(1)), (ClusterId("gpu-a"), rep)))
    batch = batch_of("gpu-a", 1, "s", obs)
    assert observations_of(batch, shift_ms=100).gpu_memory == (
        (ClusterId("gpu-a"), GpuReport(107, rep.units)),)
    assert observations_of(batch_of("gpu-a", 1, "s", Observations(9))).gpu_memory == ()  # absent: no report
    batch.gpu_memory.units[0].free_bytes = 50  # more free than total: never more than total
    batch.gpu_memory.units[1].total_bytes = -3
    got = observations_of(batch).gpu_memory[0][1].units
    assert [(u.free_bytes, u.total_bytes) for u in got] == [(10, 10), (0, 0)]


def sim_backend(gpu_cfg: dict[str, Any] | None) -> tuple[SimulatedBackend, Clock]:
    clock = Clock()
    cfg = SimulatedConfig.model_validate({"deployments": [{"deployment": "chat"}], "gpu_memory": gpu_cfg})
    return SimulatedBackend("gpu-a", cfg, clock), clock


def test_the_simulated_backend_reports_simulated_memory_with_foreign_and_lost_gpus() -> None:
    b, clock = sim_backend({"nodes": 1, "gpus_per_node": 4, "total_bytes": 80 * GiB,
                            "foreign": [{"node": 0, "gpu": 1, "bytes": 30 * GiB}], "lost": [{"node": 0, "gpu": 3}]})
    from adapters.backend import FenceToken, InstanceCommand, InstanceSpec

    b.apply(InstanceCommand("r1", "create", InstanceSpec("chat-1", "chat", "t", "z", "h100", 1), FenceToken(1, 1, "c")),
            clock.ms)
    ((cid, rep),) = b.observe(clock.ms).gpu_memory
    assert cid == "gpu-a"
    free = {u.unit: (u.free_bytes, u.problem) for u in rep.units}
    assert free == {"GPU-sim-0-0": (80 * GiB - int(80 * GiB * 0.9), ""),  # our starting instance
                    "GPU-sim-0-1": (50 * GiB, ""), "GPU-sim-0-2": (80 * GiB, ""), "GPU-sim-0-3": (0, "lost")}
    assert sim_backend(None)[0].observe(clock.ms).gpu_memory == ()


def test_simulated_mig_slices_are_units() -> None:
    b, clock = sim_backend({"nodes": 1, "gpus_per_node": 1, "mig_devices": 2, "total_bytes": 80 * GiB})
    ((_, rep),) = b.observe(clock.ms).gpu_memory
    assert [(u.unit, u.total_bytes) for u in rep.units] == [("GPU-sim-0-0/mig0", 40 * GiB), ("GPU-sim-0-0/mig1", 40 * GiB)]
    assert MemoryView({ClusterId("gpu-a"): rep}, {}, ()).covers(ClusterId("gpu-a"), "h100") is False  # unknown cluster


def test_the_gpu_agent_command_checks_its_flags_and_prints_a_record(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.cli.main import main

    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["gpu-agent", "--once", "--print"]) == 2
    assert "gpu-agent: --node: a Kubernetes node name is required" in capsys.readouterr().err
    assert main(["gpu-agent", "--node", "n1", "--interval-s", "0", "--once", "--print"]) == 2
    assert main(["gpu-agent", "--node", "n1", "--pool", "Bad Pool", "--once", "--print"]) == 2
    assert main(["gpu-agent", "--node", "n1", "--once"]) == 2  # publishing needs a namespace
    fake_nvml = FakeNvml([FakeDev("GPU-a", "H100", H100, RESERVED, 0)])
    monkeypatch.setattr("adapters.gpu.GpuMonitor", lambda: GpuMonitor(fake_nvml))
    assert main(["gpu-agent", "--node", "n1", "--pool", "h100", "--once", "--print"]) == 0
    rec = parse_record("stdout", capsys.readouterr().out.strip())
    assert rec.node == "n1" and rec.pool == "h100" and [g.unit for g in rec.gpus] == ["GPU-a"]


def test_the_coordinators_keep_each_cluster_latest_report_across_batches_without_one() -> None:
    from adapters.client import RemoteObservations

    clock = Clock()
    source = RemoteObservations({"gpu-a": "127.0.0.1:1", "gpu-b": "127.0.0.1:2"}, clock)
    try:
        rep = GpuReport(clock.ms, (GpuUnit("n1", "GPU-a", 5 * GiB, 80 * GiB),))
        source._receive("gpu-a", batch_of("gpu-a", 1, "s", Observations(clock.ms, gpu_memory=((ClusterId("gpu-a"), rep),))))
        source._receive("gpu-a", batch_of("gpu-a", 2, "s", Observations(clock.ms + 250)))
        # a batch carries its own cluster's report only: gpu-b's cannot speak for gpu-a
        source._receive("gpu-b", batch_of("gpu-b", 1, "s", Observations(clock.ms, gpu_memory=((ClusterId("gpu-a"), GpuReport(1)),))))
        (cid, got), = source.gather(clock.ms + 500).gpu_memory
        assert cid == "gpu-a" and got.units == rep.units
    finally:
        source.close()
