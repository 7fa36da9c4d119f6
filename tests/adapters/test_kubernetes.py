"""KubernetesBackend against the strict fake apiserver (tests/fakes/kube_apiserver.py) and the fake
engines: binding, lifecycle reports, scale-down victims, fencing in the cluster, 409 retries, restart,
watch 410 re-list, sleep/wake with and without a warm path."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from kubernetes import client as k8s
from structlog.testing import capture_logs

from adapters.backend import FenceToken, InstanceCommand, InstanceSpec, ScaleCommand
from adapters.kubernetes import (
    FENCE_EPOCH,
    FENCE_HOLDER,
    INSTANCE_ID,
    PENDING_INSTANCES,
    KubernetesBackend,
    KubernetesConfig,
    OrdinalConflict,
    PodInfo,
    WorkloadConfig,
)
from adapters.vllm import VllmDriver
from controlplane.domain.errors import StaleEpoch, Unavailable
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.fakes.vllm_server import FakeVllmServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
NS = "serving"
DEP = "chat"


class EngineFarm:
    """One fake vLLM server per pod, started on first use; the backend's injected driver factory."""

    def __init__(self, dev_mode: bool = True) -> None:
        self.dev_mode = dev_mode
        self.servers: dict[str, FakeVllmServer] = {}

    def factory(self, workload: WorkloadConfig, pod: PodInfo) -> VllmDriver:
        if pod.name not in self.servers:
            self.servers[pod.name] = FakeVllmServer(model_name="m", dev_mode=self.dev_mode).start()
        return VllmDriver(self.servers[pod.name].base_url, timeout_s=1.0)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


class Env:
    def __init__(self, fake: FakeKubeApiServer, farm: EngineFarm) -> None:
        self.fake, self.farm = fake, farm
        self.backends: list[KubernetesBackend] = []

    def backend(self, kind: str = "Deployment", name: str = "web", **overrides: Any) -> KubernetesBackend:
        cfg = KubernetesConfig(workloads=[WorkloadConfig(deployment=DEP, namespace=NS, kind=kind, name=name,
                                                         engine="vllm", port=8000)],
                               conflict_backoff_ms=1, conflict_backoff_cap_ms=4, request_timeout_s=5,
                               watch_timeout_s=2, **overrides)
        api = k8s.ApiClient(k8s.Configuration(host=self.fake.host))
        b = KubernetesBackend(cfg, api, driver_factory=self.farm.factory, rng=random.Random(7)).start()
        self.backends.append(b)
        return b

    def workload(self, kind: str = "Deployment", name: str = "web") -> dict[str, Any]:
        obj = self.fake.get("deployments" if kind == "Deployment" else "statefulsets", NS, name)
        assert obj is not None
        return obj

    def pod_of(self, iid: str) -> str | None:
        for pod in self.fake.pods(NS):
            if (pod["metadata"].get("annotations") or {}).get(INSTANCE_ID) == iid:
                return str(pod["metadata"]["name"])
        return None


@pytest.fixture
def env() -> Iterator[Env]:
    fake = FakeKubeApiServer(seed=3).start()
    farm = EngineFarm()
    e = Env(fake, farm)
    try:
        yield e
    finally:
        for b in e.backends:
            b.close()
        farm.stop()
        fake.stop()


def fence(epoch: int = 1, holder: str = "coord-a") -> FenceToken:
    return FenceToken(epoch=epoch, seq=1, holder=holder)


def cmd(action: str, iid: str, epoch: int = 1, holder: str = "coord-a") -> InstanceCommand:
    return InstanceCommand(request_id=f"{action}-{iid}-{epoch}", action=action,
                           instance=InstanceSpec(instance_id=iid, deployment_id=DEP), fence=fence(epoch, holder))


class Reports:
    """Accumulates the reports of successive observe() calls."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend
        self.seen: list[tuple[str, str]] = []
        self.samples: list[Any] = []

    def poll(self) -> list[tuple[str, str]]:
        obs = self.backend.observe(int(time.time() * 1000))
        self.seen += [(r.instance_id, r.event) for r in obs.reports]
        self.samples = list(obs.samples)
        return self.seen

    def wait_for(self, iid: str, event: str) -> None:
        wait_until(lambda: (iid, event) in self.poll())


def serving(env: Env, backend: KubernetesBackend, reports: Reports, *iids: str) -> None:
    """create each instance, make its pod ready and wait for ``warmed``."""
    for iid in iids:
        backend.apply(cmd("create", iid), 0)
        reports.wait_for(iid, "start_warmup")
        pod = env.pod_of(iid)
        assert pod is not None
        env.fake.set_pod_ready(NS, pod)
        reports.wait_for(iid, "warmed")


# -- config -----------------------------------------------------------------------------------------
def test_config_validation_names_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="port"):
        WorkloadConfig(deployment="d", namespace="ns", kind="Deployment", name="w", engine="vllm", port=0)
    with pytest.raises(pydantic.ValidationError, match="model"):
        WorkloadConfig(deployment="d", namespace="ns", kind="Deployment", name="w", engine="triton", port=8000)
    triton = WorkloadConfig(deployment="d", namespace="ns", kind="StatefulSet", name="w", engine="triton",
                            port=8000, model="llm")
    assert triton.metrics_port == 8002 and triton.grpc_port == 50050
    with pytest.raises(pydantic.ValidationError, match="kind"):
        WorkloadConfig(deployment="d", namespace="ns", kind="ReplicaSet", name="w", engine="vllm", port=1)
    with pytest.raises(pydantic.ValidationError, match="unique"):
        KubernetesConfig(workloads=[triton, triton])
    cfg = KubernetesConfig.model_validate({"workloads": [triton.model_dump()]})
    assert cfg.conflict_retries == 5 and cfg.conflict_backoff_ms == 50 and cfg.conflict_backoff_cap_ms == 1000


# -- happy path ---------------------------------------------------------------------------------------
def test_create_binds_pod_reports_warmup_then_warmed_and_samples(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    backend.apply(cmd("create", "i-1", epoch=3), 0)
    wl = env.workload()
    assert wl["spec"]["replicas"] == 1
    assert wl["metadata"]["annotations"][FENCE_EPOCH] == "3"
    assert wl["metadata"]["annotations"][FENCE_HOLDER] == "coord-a"
    reports.wait_for("i-1", "start_warmup")
    pod = env.pod_of("i-1")
    assert pod is not None
    assert json.loads(env.workload()["metadata"]["annotations"][PENDING_INSTANCES]) == []
    assert ("i-1", "warmed") not in reports.poll()  # pod Pending: not warmed
    env.fake.set_pod_ready(NS, pod)
    reports.wait_for("i-1", "warmed")
    env.farm.servers[pod].running = 2
    reports.poll()
    assert [(s.instance_id, s.running, s.healthy) for s in reports.samples] == [("i-1", 2, True)]
    assert reports.seen.count(("i-1", "start_warmup")) == 1 and reports.seen.count(("i-1", "warmed")) == 1


def test_a_serving_pod_that_is_not_ready_is_still_named_unhealthy(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    serving(env, backend, reports, "i-1", "i-2")
    env.fake.set_pod_ready(NS, env.pod_of("i-1"), ready=False)  # readiness probe failing
    wait_until(lambda: (reports.poll() or True) and
               sorted((s.instance_id, s.healthy) for s in reports.samples) == [("i-1", False), ("i-2", True)])
    assert not any(e == "lost" for i, e in reports.seen if i == "i-1")  # it still exists: not lost
    env.fake.set_pod_ready(NS, env.pod_of("i-1"))
    wait_until(lambda: (reports.poll() or True) and all(s.healthy for s in reports.samples) and len(reports.samples) == 2)


def test_repeated_create_does_not_add_replicas(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    backend.apply(cmd("create", "i-1"), 0)
    backend.apply(cmd("create", "i-1"), 0)
    assert env.workload()["spec"]["replicas"] == 1


def test_two_tenants_chat_are_two_workloads_with_their_own_instances(env: Env) -> None:
    """Deployment names are per tenant: ``alpha/chat`` and ``bravo/chat`` map to two workloads, and
    the instance ids the planner gives them (``instance_prefix``) are distinct labels without '/'."""
    from controlplane.domain.ids import id_problem, instance_prefix

    for name in ("chat-a", "chat-b"):
        env.fake.add_workload("Deployment", NS, name)
    cfg = KubernetesConfig(workloads=[
        WorkloadConfig(deployment=dep, namespace=NS, kind="Deployment", name=name, engine="vllm", port=8000)
        for dep, name in (("alpha/chat", "chat-a"), ("bravo/chat", "chat-b"))],
        conflict_backoff_ms=1, conflict_backoff_cap_ms=4, request_timeout_s=5, watch_timeout_s=2)
    backend = KubernetesBackend(cfg, k8s.ApiClient(k8s.Configuration(host=env.fake.host)),
                                driver_factory=env.farm.factory, rng=random.Random(7)).start()
    env.backends.append(backend)
    reports = Reports(backend)
    iids = {dep: f"{instance_prefix(dep)}-1700000000000-0" for dep in ("alpha/chat", "bravo/chat")}
    assert len(set(iids.values())) == 2 and all(id_problem(i) is None and "/" not in i for i in iids.values())
    for dep, iid in iids.items():
        backend.apply(InstanceCommand(request_id=f"create-{iid}", action="create",
                                      instance=InstanceSpec(instance_id=iid, deployment_id=dep), fence=fence()), 0)
    for name in ("chat-a", "chat-b"):
        assert env.workload(name=name)["spec"]["replicas"] == 1
    for iid in iids.values():
        reports.wait_for(iid, "start_warmup")
    pods = {iid: env.pod_of(iid) for iid in iids.values()}
    assert None not in pods.values() and len(set(pods.values())) == 2
    assert pods[iids["alpha/chat"]].startswith("chat-a") and pods[iids["bravo/chat"]].startswith("chat-b")


# -- scale-down ---------------------------------------------------------------------------------------
def test_drain_deletes_exactly_the_victim_pod_on_a_deployment(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    serving(env, backend, reports, "i-1", "i-2", "i-3")
    victim = env.pod_of("i-1")  # the oldest: a plain scale-down would remove the newest
    backend.apply(cmd("drain", "i-1"), 0)  # deadline 0: already past, removed at the next observation
    assert victim in env.fake.pod_names(NS) and env.workload()["spec"]["replicas"] == 3
    reports.wait_for("i-1", "drained")
    assert env.workload()["spec"]["replicas"] == 2
    assert victim not in env.fake.pod_names(NS)
    assert env.pod_of("i-2") and env.pod_of("i-3") and len(env.fake.pod_names(NS)) == 2
    assert not any(e == "lost" for _, e in reports.poll())


def test_cancel_of_pending_instance_drops_the_id_and_lowers_replicas(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    env.fake.auto_reconcile = False  # no pods yet: the id stays pending
    backend = env.backend()
    backend.apply(cmd("create", "i-1"), 0)
    assert json.loads(env.workload()["metadata"]["annotations"][PENDING_INSTANCES]) == ["i-1"]
    backend.apply(cmd("cancel", "i-1"), 0)
    wl = env.workload()
    assert wl["spec"]["replicas"] == 0 and json.loads(wl["metadata"]["annotations"][PENDING_INSTANCES]) == []


def test_scale_command_annotates_victims_then_sets_replicas(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    serving(env, backend, reports, "i-1", "i-2", "i-3")
    backend.scale(ScaleCommand("s-1", DEP, replicas=1, victims=("i-1", "i-3"), fence=fence()), 0)
    assert env.fake.pod_names(NS) == [env.pod_of("i-2")]
    reports.wait_for("i-1", "drained")
    reports.wait_for("i-3", "drained")


def test_statefulset_drain_swaps_ids_onto_the_highest_ordinal(env: Env) -> None:
    env.fake.add_workload("StatefulSet", NS, "db", template_labels={"controlplane.io/serving": "true"})
    backend = env.backend("StatefulSet", "db")
    reports = Reports(backend)
    serving(env, backend, reports, "i-0", "i-1", "i-2")
    assert [env.pod_of(i) for i in ("i-0", "i-1", "i-2")] == ["db-0", "db-1", "db-2"]
    backend.apply(cmd("drain", "i-0"), 0)
    assert env.pod_of("i-2") == "db-0" and env.pod_of("i-0") == "db-2"  # swapped at drain start
    assert env.fake.endpoints(NS, {"app": "db", "controlplane.io/serving": "true"}) == ["db-0", "db-1"]
    reports.wait_for("i-0", "drained")
    assert env.fake.pod_names(NS) == ["db-0", "db-1"]
    reports.poll()
    assert ("i-2", "lost") not in reports.seen
    assert sorted(s.instance_id for s in reports.samples) == ["i-1", "i-2"]


def test_statefulset_drain_refused_when_no_interchangeable_pod(env: Env) -> None:
    env.fake.add_workload("StatefulSet", NS, "db")
    backend = env.backend("StatefulSet", "db")
    reports = Reports(backend)
    serving(env, backend, reports, "i-0")
    backend.apply(cmd("create", "i-1"), 0)
    reports.wait_for("i-1", "start_warmup")  # db-1 is still warming: not interchangeable with a Ready pod
    with pytest.raises(OrdinalConflict, match="db-0"):
        backend.apply(cmd("drain", "i-0"), 0)
    assert env.workload("StatefulSet", "db")["spec"]["replicas"] == 2
    assert env.pod_of("i-0") == "db-0" and env.pod_of("i-1") == "db-1"


# -- conflicts and fencing ----------------------------------------------------------------------------
def test_conflicts_are_retried_then_unavailable(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    env.fake.auto_reconcile = False
    backend = env.backend()
    env.fake.inject_conflicts(3)
    backend.apply(cmd("create", "i-1"), 0)
    assert env.workload()["spec"]["replicas"] == 1
    assert backend.statistics()["conflicts"] == 3
    env.fake.inject_conflicts(6)  # conflict_retries=5: six attempts, all conflicting
    with pytest.raises(Unavailable, match="web"):
        backend.apply(cmd("create", "i-2"), 0)
    assert env.workload()["spec"]["replicas"] == 1


def test_stale_epoch_rejected_by_the_annotation(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web", annotations={FENCE_EPOCH: "7", FENCE_HOLDER: "coord-b"})
    backend = env.backend()
    with pytest.raises(StaleEpoch) as err:
        backend.apply(cmd("create", "i-1", epoch=6), 0)
    assert (err.value.got, err.value.highest) == (6, 7)
    with pytest.raises(StaleEpoch):  # same epoch, other holder
        backend.apply(cmd("create", "i-1", epoch=7, holder="coord-a"), 0)
    assert env.workload()["spec"]["replicas"] == 0
    backend.apply(cmd("create", "i-1", epoch=8), 0)
    assert env.workload()["spec"]["replicas"] == 1


def test_two_adapters_racing_newer_epoch_wins(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    env.fake.auto_reconcile = False
    a, b = env.backend(), env.backend()
    for round_ in range(20):
        old, new = 2 * round_ + 2, 2 * round_ + 3
        outcome: dict[str, BaseException | None] = {}

        def run(backend: KubernetesBackend, epoch: int, replicas: int, key: str,
                outcome: dict[str, BaseException | None] = outcome) -> None:
            try:
                backend.scale(ScaleCommand(f"r{epoch}", DEP, replicas, (), fence(epoch, key)), 0)
                outcome[key] = None
            except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
                outcome[key] = exc

        threads = [threading.Thread(target=run, args=(a, old, 10 + round_, "a")),
                   threading.Thread(target=run, args=(b, new, 50 + round_, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert outcome["b"] is None
        assert outcome["a"] is None or isinstance(outcome["a"], StaleEpoch)
        wl = env.workload()
        assert wl["metadata"]["annotations"][FENCE_EPOCH] == str(new)
        assert wl["spec"]["replicas"] == 50 + round_
        with pytest.raises(StaleEpoch):
            a.scale(ScaleCommand("late", DEP, 1, (), fence(old, "a")), 0)


def test_stale_writer_scale_hits_409_after_newer_fence_and_is_rejected(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    env.fake.auto_reconcile = False
    a, b = env.backend(), env.backend()

    def newer_writer_runs_whole() -> None:
        b.scale(ScaleCommand("b", DEP, 5, (), fence(5, "b")), 0)

    # A has read and fenced with epoch 4; just before its Scale PUT, B fences with 5 and scales
    env.fake.on_request("PUT", r"/deployments/web/scale$", newer_writer_runs_whole)
    with pytest.raises(StaleEpoch) as err:
        a.scale(ScaleCommand("a", DEP, 2, (), fence(4, "a")), 0)
    assert (err.value.got, err.value.highest) == (4, 5)
    assert env.workload()["spec"]["replicas"] == 5
    assert env.workload()["metadata"]["annotations"][FENCE_EPOCH] == "5"


# -- restart, watch -----------------------------------------------------------------------------------
def test_restart_keeps_pending_bindings(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    env.fake.auto_reconcile = False
    first = env.backend()
    first.apply(cmd("create", "i-1"), 0)
    first.close()
    second = env.backend()
    reports = Reports(second)
    env.fake.auto_reconcile = True
    env.fake.reconcile()
    reports.wait_for("i-1", "start_warmup")
    assert env.pod_of("i-1") is not None


def test_restart_adopts_bound_pods_without_repeating_start_warmup(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    first = env.backend()
    serving(env, first, Reports(first), "i-1")
    first.close()
    second = env.backend()
    reports = Reports(second)
    reports.poll()
    assert reports.seen == [] and [s.instance_id for s in reports.samples] == ["i-1"]
    second.apply(cmd("drain", "i-1"), 0)
    reports.wait_for("i-1", "drained")


def test_watch_410_relists_and_keeps_following(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    lists = backend.statistics()["lists"]
    env.fake.compact()
    env.fake.break_watches()
    wait_until(lambda: backend.statistics()["gone"] >= 1)
    wait_until(lambda: backend.statistics()["lists"] > lists)
    backend.apply(cmd("create", "i-1"), 0)
    reports.wait_for("i-1", "start_warmup")


# -- lifecycle reports --------------------------------------------------------------------------------
def test_pod_failing_during_warmup_reports_warmup_failed(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    backend.apply(cmd("create", "i-1"), 0)
    reports.wait_for("i-1", "start_warmup")
    pod = env.pod_of("i-1")
    assert pod is not None
    env.fake.fail_pod(NS, pod, waiting_reason="CrashLoopBackOff")
    reports.wait_for("i-1", "warmup_failed")


def test_unasked_pod_deletion_reports_lost(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    serving(env, backend, reports, "i-1")
    pod = env.pod_of("i-1")
    assert pod is not None
    env.fake.delete_pod(NS, pod)
    reports.wait_for("i-1", "lost")
    # the ReplicaSet replaced the pod; the next create adopts it instead of adding a replica
    backend.apply(cmd("create", "i-2"), 0)
    reports.wait_for("i-2", "start_warmup")
    assert env.workload()["spec"]["replicas"] == 1


def test_driver_error_gives_unhealthy_sample(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    serving(env, backend, reports, "i-1")
    pod = env.pod_of("i-1")
    assert pod is not None
    env.farm.servers[pod].stop()
    reports.poll()
    assert [(s.instance_id, s.healthy) for s in reports.samples] == [("i-1", False)]


# -- sleep / wake ---------------------------------------------------------------------------------------
def test_sleep_and_wake_with_vllm_dev_mode(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    serving(env, backend, reports, "i-1")
    pod = env.pod_of("i-1")
    assert pod is not None
    backend.apply(cmd("sleep", "i-1"), 0)
    assert env.farm.servers[pod].sleep_level == 1
    reports.poll()
    assert reports.samples == []  # a sleeping engine is not serving capacity
    backend.apply(cmd("wake", "i-1"), 0)
    assert env.farm.servers[pod].sleep_level is None
    reports.wait_for("i-1", "warmed")
    assert reports.seen.count(("i-1", "warmed")) == 2
    assert env.workload()["spec"]["replicas"] == 1


def test_sleep_without_warm_path_keeps_a_hot_standby(env: Env) -> None:
    env.farm.dev_mode = False
    env.fake.add_workload("Deployment", NS, "web")
    backend = env.backend()
    reports = Reports(backend)
    serving(env, backend, reports, "i-1")
    with capture_logs() as logs:
        backend.apply(cmd("sleep", "i-1"), 0)
        backend.apply(cmd("sleep", "i-1"), 0)
    events = [e for e in logs if e["event"] == "warm_path_unavailable"]
    assert len(events) == 1 and events[0]["instance"] == "i-1" and "VLLM_SERVER_DEV_MODE" in events[0]["reason"]
    assert env.pod_of("i-1") is not None and env.workload()["spec"]["replicas"] == 1
    backend.apply(cmd("wake", "i-1"), 7)
    obs = backend.observe(8)
    assert [(r.instance_id, r.event, r.at_ms) for r in obs.reports] == [("i-1", "warmed", 7)]
