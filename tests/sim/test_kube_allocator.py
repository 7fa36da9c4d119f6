"""The Kubernetes-scheduler baseline in the simulator: a high-priority burst under the HPA preempts
the low-priority tenant's pods (drained with their grace, ``preempted``), and the burst's pods bind
on the freed nodes and serve."""

from __future__ import annotations

from pathlib import Path

from controlplane.domain import commands as c
from controlplane.domain.instances import InstanceEvent
from controlplane.sim import runner
from controlplane.sim.baselines import HpaAutoscaler
from controlplane.sim.engine import Simulation
from controlplane.sim.kube import KubeScheduler
from controlplane.sim.scenario import scenario_from_data

GRACE_MS = 10_000


def two_tenants():
    """16 H100s on two nodes: ``batch`` (priority 10, three 4-GPU pods) holds 12, ``chat`` (priority
    100, 1-GPU pods) one; chat's burst from 90 s wants 12 replicas: 3 free GPUs fit 3 more, the rest
    needs batch's GPUs."""
    data = {
        "name": "kube-preempt", "seed": 5, "tick_ms": 250, "duration_s": 200, "preemption_grace_ms": GRACE_MS,
        "start": "warm",
        "clusters": [{"id": "c-a", "zone": "az-a", "capacity": {"h100": 8}},
                     {"id": "c-b", "zone": "az-b", "capacity": {"h100": 8}}],
        "tenants": [{"id": "hi", "priority": 100, "quota": {"h100": 12}, "borrow_limit": {"h100": 4}},
                    {"id": "lo", "priority": 10, "quota": {"h100": 4}, "borrow_limit": {"h100": 12}}],
        "deployments": [
            {"id": "chat", "tenant": "hi", "engine": "vllm", "model": "llama3-8b-h100", "pool": "h100",
             "min_replicas": 1, "max_replicas": 12, "warm_pool": 0,
             "workload": {"generator": {"duration_s": 200, "base_rps": 2, "burst_every_s": 120,
                                        "burst_duration_s": 90, "burst_factor": 20}}},
            {"id": "batch", "tenant": "lo", "engine": "vllm", "model": "llama3-70b-h100x4", "pool": "h100",
             "min_replicas": 3, "max_replicas": 3, "warm_pool": 0,
             "workload": {"generator": {"duration_s": 200, "base_rps": 3}}},
        ],
    }
    return scenario_from_data(data, source="test", base_dir=Path("."))


def run(sc):
    kube = KubeScheduler()
    sim = Simulation(sc, runner.workloads_of(sc, 5), seed=5, policy=HpaAutoscaler(), allocator=kube)
    plans = []
    tick = sim.loop.tick

    def recording_tick(now_ms: int):
        report = tick(now_ms)
        if report is not None and report.plan is not None:
            plans.append((now_ms, report.plan))
        return report

    sim.loop.tick = recording_tick  # type: ignore[method-assign]
    return kube, sim.run(), plans


def test_high_priority_burst_preempts_the_low_priority_tenant_and_then_serves() -> None:
    kube, res, plans = run(two_tenants())
    preempting = [(t, p) for t, p in plans if p.preemptions]
    assert preempting, "the burst never preempted"
    first_ms = preempting[0][0]
    for t, p in preempting:
        assert {(b, v) for b, v, _ in p.preemptions} == {("chat", "batch")}
        drains = [cmd for cmd in p.commands if isinstance(cmd, c.TransitionInstance) and cmd.preempted]
        assert len(drains) == sum(n for _, _, n in p.preemptions)
        assert all(cmd.event is InstanceEvent.DRAIN and cmd.drain_deadline_ms == t + GRACE_MS for cmd in drains)
    deps = res.summary["deployments"]
    assert deps["batch"]["preemptions"] == sum(n for _, p in preempting for _, _, n in p.preemptions)
    assert deps["chat"]["preemptions"] == 0
    # Without preemption chat could serve at most 4 (1 + 3 free GPUs); afterwards it serves more.
    tl = res.timeline
    serving = [r + b for r, b in zip(tl.states["chat"]["Ready"], tl.states["chat"]["Busy"])]
    after = [n for t, n in zip(tl.t_s, serving) if t * 1000 > first_ms + GRACE_MS]
    assert max(after) > 4, serving
    # The victims' replacements stay Pending: batch never gets its GPUs back during the burst.
    assert kube.last is not None and kube.last.pending.get("batch", 0) >= 1


def test_the_kube_baseline_is_reproducible() -> None:
    sc = two_tenants()
    _, a, _ = run(sc)
    _, b, _ = run(sc)
    assert runner.to_json(a) == runner.to_json(b)
