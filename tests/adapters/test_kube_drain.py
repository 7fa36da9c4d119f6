"""Drains on Kubernetes (adapters/kube_drain.py) against the strict fake apiserver and fake vLLM
engines: routing stops at drain start (the Service's endpoints lose the pod), the pod is deleted only
once its requests finished or its deadline passed, an early deletion by someone else still reports
``drained``, a repeated drain is idempotent and a restarted adapter resumes the drain."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client as k8s
from structlog.testing import capture_logs

from adapters.backend import FenceToken, InstanceCommand, InstanceSpec
from adapters.kube_drain import DrainReason, drain_reason
from adapters.kube_model import DRAIN_DEADLINE, DRAINED_INSTANCES, SERVING_LABEL
from adapters.kubernetes import KubernetesBackend, KubernetesConfig, WorkloadConfig
from controlplane.domain.errors import StaleEpoch, ValidationError
from tests.adapters.test_kubernetes import DEP, NS, EngineFarm, Env, Reports, env, serving  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
SERVICE = {"app": "web", SERVING_LABEL: "true"}
"""The engine Service's selector (deploy/base/engines/*.yaml)."""


def now_ms() -> int:
    return int(time.time() * 1000)


def drain(iid: str, deadline_ms: int, epoch: int = 1) -> InstanceCommand:
    return InstanceCommand(request_id=f"drain-{iid}-{epoch}", action="drain",
                           instance=InstanceSpec(instance_id=iid, deployment_id=DEP),
                           fence=FenceToken(epoch=epoch, seq=1, holder="coord-a"), deadline_ms=deadline_ms)


def two_serving(env: Env) -> tuple[KubernetesBackend, Reports, str]:
    env.fake.add_workload("Deployment", NS, "web", template_labels={SERVING_LABEL: "true"})
    backend = env.backend()
    reports = Reports(backend)
    serving(env, backend, reports, "i-1", "i-2")
    victim = env.pod_of("i-1")
    assert victim is not None and sorted(env.fake.endpoints(NS, SERVICE)) == sorted(env.fake.pod_names(NS))
    return backend, reports, victim


def poll_at(reports: Reports, at_ms: int) -> None:
    """One observation at ``at_ms`` whose reports ``reports`` keeps."""
    obs = reports.backend.observe(at_ms)
    reports.seen += [(r.instance_id, r.event) for r in obs.reports]


def labels(env: Env, pod: str) -> dict[str, str]:
    [p] = [p for p in env.fake.pods(NS) if p["metadata"]["name"] == pod]
    return dict(p["metadata"].get("labels") or {})


def test_the_decision_is_pure_and_asks_the_engine_only_when_it_matters() -> None:
    asked: list[int] = []

    def count(n: int | None) -> Any:
        return lambda: asked.append(1) or n

    assert drain_reason(5, 10, False, count(3)) == (DrainReason.POD_GONE, None)
    assert drain_reason(10, 10, True, count(3)) == (DrainReason.DEADLINE, None)
    assert asked == []
    assert drain_reason(5, 10, True, count(0)) == (DrainReason.IN_FLIGHT_ZERO, 0)
    assert drain_reason(5, 10, True, count(2)) == (None, 2)
    assert drain_reason(5, 10, True, count(None)) == (None, None)  # cannot tell: wait for the deadline


def test_a_drain_with_requests_in_flight_stops_routing_and_waits_for_them(env: Env) -> None:
    backend, reports, victim = two_serving(env)
    engine = env.farm.servers[victim]
    engine.running, engine.waiting = 2, 1
    with capture_logs() as logs:
        backend.apply(drain("i-1", now_ms() + 60_000), now_ms())
        assert labels(env, victim)[SERVING_LABEL] == "false"
        assert victim not in env.fake.endpoints(NS, SERVICE)  # the Service stops routing at once
        for _ in range(3):
            reports.poll()
        assert victim in env.fake.pod_names(NS) and env.workload()["spec"]["replicas"] == 2
        assert ("i-1", "drained") not in reports.seen
        engine.running = 0
        reports.poll()
        assert victim in env.fake.pod_names(NS)  # one request still waiting
        engine.waiting = 0
        reports.wait_for("i-1", "drained")
    assert victim not in env.fake.pod_names(NS) and env.workload()["spec"]["replicas"] == 1
    wait_until(lambda: env.fake.pod_names(NS) == [env.pod_of("i-2")])  # no replacement left behind
    events = [e for e in logs if e["event"].startswith("kubernetes.drain_")]
    assert [e["event"] for e in events] == ["kubernetes.drain_started", "kubernetes.drain_done"]
    assert events[1]["reason"] == "in_flight_zero"
    assert not any(e == "lost" for _, e in reports.poll())


def test_a_drain_past_its_deadline_is_deleted_with_requests_still_running(env: Env) -> None:
    backend, reports, victim = two_serving(env)
    env.farm.servers[victim].running = 5
    deadline = now_ms() + 60_000
    backend.apply(drain("i-1", deadline), now_ms())
    with capture_logs() as logs:
        poll_at(reports, deadline - 1)
        assert victim in env.fake.pod_names(NS)
        poll_at(reports, deadline)
    assert victim not in env.fake.pod_names(NS) and env.workload()["spec"]["replicas"] == 1
    [done] = [e for e in logs if e["event"] == "kubernetes.drain_done"]
    assert done["reason"] == "deadline"
    reports.wait_for("i-1", "drained")


def test_an_engine_that_cannot_tell_is_waited_for_until_the_deadline(env: Env) -> None:
    backend, reports, victim = two_serving(env)
    env.farm.servers[victim].garbage_line = "this is not prometheus"  # every scrape fails: in_flight unknown
    deadline = now_ms() + 60_000
    backend.apply(drain("i-1", deadline), now_ms())
    for _ in range(3):
        poll_at(reports, now_ms())
    assert victim in env.fake.pod_names(NS)
    poll_at(reports, deadline + 1)
    assert victim not in env.fake.pod_names(NS)
    reports.wait_for("i-1", "drained")


def test_a_pod_deleted_early_by_someone_else_reports_drained(env: Env) -> None:
    backend, reports, victim = two_serving(env)
    env.farm.servers[victim].running = 3
    backend.apply(drain("i-1", now_ms() + 60_000), now_ms())
    env.fake.delete_pod(NS, victim)  # an operator or the node; the ReplicaSet starts a replacement
    reports.wait_for("i-1", "drained")
    assert ("i-1", "lost") not in reports.seen
    assert env.workload()["spec"]["replicas"] == 1
    wait_until(lambda: env.fake.pod_names(NS) == [env.pod_of("i-2")])


def test_a_repeated_drain_is_idempotent_and_keeps_the_first_deadline(env: Env) -> None:
    backend, reports, victim = two_serving(env)
    env.farm.servers[victim].running = 1
    first = now_ms() + 60_000
    with capture_logs() as logs:
        backend.apply(drain("i-1", first), now_ms())
        backend.apply(drain("i-1", first + 30_000), now_ms())
    assert [e["event"] for e in logs].count("kubernetes.drain_started") == 1
    [pod] = [p for p in env.fake.pods(NS) if p["metadata"]["name"] == victim]
    assert pod["metadata"]["annotations"][DRAIN_DEADLINE] == str(first)
    poll_at(reports, first)
    assert victim not in env.fake.pod_names(NS)
    backend.apply(drain("i-1", first + 30_000), now_ms())  # after the removal: nothing happens
    assert env.workload()["spec"]["replicas"] == 1
    reports.wait_for("i-1", "drained")
    assert [e for _, e in reports.seen if e == "drained"] == ["drained"]


def test_a_restarted_adapter_resumes_the_drain(env: Env) -> None:
    backend, _reports, victim = two_serving(env)
    env.farm.servers[victim].running = 2
    deadline = now_ms() + 60_000
    backend.apply(drain("i-1", deadline), now_ms())
    backend.close()
    again = env.backend()
    reports = Reports(again)
    reports.poll()
    assert ("i-1", "start_warmup") not in reports.seen and ("i-1", "warmed") not in reports.seen
    assert "i-1" not in {s.instance_id for s in reports.samples}  # draining: no longer serving capacity
    env.farm.servers[victim].running = 0
    with capture_logs() as logs:
        reports.poll()
    assert victim in env.fake.pod_names(NS)  # no fence token since the restart: it waits
    assert any(e["event"] == "kubernetes.drain_waiting" for e in logs)
    again.apply(drain("i-1", deadline + 5_000), now_ms())  # the coordinator repeats its drain
    reports.wait_for("i-1", "drained")
    assert victim not in env.fake.pod_names(NS) and env.workload()["spec"]["replicas"] == 1


def test_a_stale_epoch_cannot_start_a_drain(env: Env) -> None:
    backend, _reports, victim = two_serving(env)
    backend.apply(drain("i-2", now_ms() + 60_000, epoch=5), now_ms())
    with pytest.raises(StaleEpoch):
        backend.apply(drain("i-1", now_ms() + 60_000, epoch=4), now_ms())
    assert labels(env, victim)[SERVING_LABEL] == "true"


def test_a_workload_selecting_on_the_serving_label_is_refused(env: Env) -> None:
    env.fake.add_workload("Deployment", NS, "web", labels={"app": "web", SERVING_LABEL: "true"})
    cfg = KubernetesConfig(workloads=[WorkloadConfig(deployment=DEP, namespace=NS, kind="Deployment", name="web",
                                                     engine="vllm", port=8000)])
    backend = KubernetesBackend(cfg, k8s.ApiClient(k8s.Configuration(host=env.fake.host)),
                                driver_factory=EngineFarm().factory)
    try:
        with pytest.raises(ValidationError, match=SERVING_LABEL):
            backend.start()
    finally:
        backend.close()


def test_a_terminate_overtakes_a_drain(env: Env) -> None:
    backend, reports, victim = two_serving(env)
    env.farm.servers[victim].running = 4
    backend.apply(drain("i-1", now_ms() + 60_000), now_ms())
    backend.apply(InstanceCommand(request_id="t-1", action="terminate",
                                  instance=InstanceSpec(instance_id="i-1", deployment_id=DEP),
                                  fence=FenceToken(epoch=1, seq=2, holder="coord-a")), now_ms())
    reports.wait_for("i-1", "drained")
    assert victim not in env.fake.pod_names(NS) and env.workload()["spec"]["replicas"] == 1


def test_statefulset_drains_wait_for_requests_and_go_highest_ordinal_first(env: Env) -> None:
    env.fake.add_workload("StatefulSet", NS, "db", template_labels={SERVING_LABEL: "true"})
    backend = env.backend("StatefulSet", "db")
    reports = Reports(backend)
    serving(env, backend, reports, "i-0", "i-1", "i-2")
    deadline = now_ms() + 60_000
    backend.apply(drain("i-0", deadline), now_ms())  # swapped onto db-2
    backend.apply(drain("i-1", deadline), now_ms())  # swapped onto db-1 (already there)
    assert env.pod_of("i-0") == "db-2" and env.pod_of("i-1") == "db-1" and env.pod_of("i-2") == "db-0"
    service = {"app": "db", SERVING_LABEL: "true"}
    assert env.fake.endpoints(NS, service) == ["db-0"]
    env.farm.servers["db-2"].running = 1  # i-0 (top) still busy, i-1 idle: i-1 must wait for it
    with capture_logs() as logs:
        for _ in range(2):
            poll_at(reports, now_ms())
    assert env.fake.pod_names(NS) == ["db-0", "db-1", "db-2"]
    assert any(e["event"] == "kubernetes.drain_blocked" for e in logs)
    env.farm.servers["db-2"].running = 0
    wait_until(lambda: poll_at(reports, now_ms()) or env.fake.pod_names(NS) == ["db-0"])
    reports.wait_for("i-0", "drained")
    reports.wait_for("i-1", "drained")
    assert env.workload("StatefulSet", "db")["spec"]["replicas"] == 1 and env.pod_of("i-2") == "db-0"
    assert ("i-2", "lost") not in reports.seen


def test_the_shrink_after_a_drain_is_written_once_even_when_repeated(env: Env) -> None:
    """A retry after a lost answer repeats the shrink: the drained id in the same conditional patch
    as spec.replicas makes the repeat a no-op (replicas never go down twice for one drain)."""
    backend, reports, victim = two_serving(env)
    deadline = now_ms() + 60_000
    backend.apply(drain("i-1", deadline), now_ms())
    drained = backend._drainer.get("i-1")
    assert drained is not None
    poll_at(reports, deadline)
    assert env.workload()["spec"]["replicas"] == 1
    assert json.loads(env.workload()["metadata"]["annotations"][DRAINED_INSTANCES]) == ["i-1"]
    wl = backend._workloads[DEP]
    backend._drainer._shrink(wl, drained, drained.fence)  # the retry
    assert env.workload()["spec"]["replicas"] == 1


def test_a_failed_removal_keeps_observing_and_is_retried(env: Env) -> None:
    backend, reports, victim = two_serving(env)
    deadline = now_ms() + 60_000
    backend.apply(drain("i-1", deadline), now_ms())
    env.fake.fail_next(500, method="DELETE", path_contains=f"/pods/{victim}")
    with capture_logs() as logs:
        poll_at(reports, deadline)  # the delete fails: observe still answers
    assert any(e["event"] == "kubernetes.drain_remove_failed" for e in logs)
    assert victim in env.fake.pod_names(NS) and env.workload()["spec"]["replicas"] == 2
    poll_at(reports, deadline + 1)
    assert victim not in env.fake.pod_names(NS) and env.workload()["spec"]["replicas"] == 1
    reports.wait_for("i-1", "drained")
