"""Cluster drain and deployment deletion, driven by the production planner in virtual time.

A :class:`Scripted` simulation commits operator writes (what the API would commit) at given virtual
times, before the control loop's tick, and records the fleet after every tick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, PoolId
from controlplane.domain.instances import InstanceState
from controlplane.domain.state import ControlState
from controlplane.sim import runner
from controlplane.sim.engine import Simulation
from controlplane.sim.scenario import Scenario, scenario_from_data

D1 = DeploymentId("d1")
H100 = PoolId("h100")
STEADY = {"duration_s": 240, "base_rps": 20, "diurnal_amplitude": 0.0, "burst_every_s": 0, "burst_factor": 1}


def scenario(workload: dict[str, float], **overrides: object) -> Scenario:
    data = {
        "name": "evacuation",
        "seed": 5,
        "duration_s": 300,
        "clusters": [
            {"id": "c-a", "zone": "az-a", "capacity": {"h100": 8}},
            {"id": "c-b", "zone": "az-b", "capacity": {"h100": 8}},
            {"id": "c-c", "zone": "az-c", "capacity": {"h100": 8}},
        ],
        "tenants": [{"id": "t1", "priority": 10, "quota": {"h100": 24}}],
        "deployments": [{
            "id": "d1", "tenant": "t1", "engine": "vllm", "model": "llama3-8b-h100", "pool": "h100",
            "min_replicas": 3, "max_replicas": 12, "warm_pool": 1, "workload": {"generator": workload},
        }],
    }
    data.update(overrides)
    return scenario_from_data(data, source="test", base_dir=Path("."))


class Scripted(Simulation):
    """Commits ``writes[t]`` (built from the state at that time) at the first tick at or after ``t``."""

    def __init__(
        self, sc: Scenario, writes: dict[int, Callable[[ControlState], list[c.Command]]], seed: int = 5
    ) -> None:
        super().__init__(sc, runner.workloads_of(sc, seed), seed=seed)
        self.writes = dict(sorted(writes.items()))
        self.ticks: list[tuple[int, int, int, dict[str, int]]] = []
        """Per tick: (now_ms, serving d1 instances, desired d1 replicas, d1 instances per cluster)."""

    def _tick(self, now_ms: int) -> None:
        for at in [t for t in self.writes if t <= now_ms]:
            result = self.replicator.commit(self.writes.pop(at)(self.state), now_ms)
            assert result.ok, [r.error for r in result.results]
        super()._tick(now_ms)
        insts = list(self.state.instances_of(D1))
        per_cluster: dict[str, int] = {}
        for i in insts:
            per_cluster[i.cluster] = per_cluster.get(i.cluster, 0) + 1
        desired = self.state.desired.get(D1)
        serving = sum(1 for i in insts if i.state in (InstanceState.READY, InstanceState.BUSY))
        self.ticks.append((now_ms, serving, desired.replicas if desired else 0, per_cluster))


def drain(cluster_id: str) -> Callable[[ControlState], list[c.Command]]:
    def build(state: ControlState) -> list[c.Command]:
        cl = state.clusters[ClusterId(cluster_id)]
        return [c.PutCluster(dataclasses.replace(cl, cordoned=True, draining=True))]
    return build


def delete(deployment_id: DeploymentId) -> Callable[[ControlState], list[c.Command]]:
    def build(state: ControlState) -> list[c.Command]:
        return [c.PutDeployment(dataclasses.replace(state.deployments[deployment_id], deleting=True))]
    return build


def test_draining_a_cluster_moves_every_instance_elsewhere_without_losing_serving_capacity() -> None:
    sim = Scripted(scenario(STEADY), {60_000: drain("c-a")})
    res = sim.run()

    before = [t for t in sim.ticks if 30_000 <= t[0] < 60_000]
    assert any(t[3].get("c-a", 0) > 0 for t in before)  # c-a served d1 before the drain
    # After the drain started, no tick ever had fewer serving instances than the grant minus one.
    after = [t for t in sim.ticks if t[0] >= 60_000]
    assert all(serving >= desired - 1 for _, serving, desired, _ in after), min(
        (serving - desired, now) for now, serving, desired, _ in after
    )
    # Within the scale-in grace (60 s) plus a few ticks, c-a is empty and stays empty.
    assert all(t[3].get("c-a", 0) == 0 for t in sim.ticks if t[0] >= 125_000)
    assert sim.state.free_gpus(ClusterId("c-a"), H100) == 8
    assert not any(i.cluster == "c-a" for i in sim.fleet.instances.values() if i.phase != "gone")
    # No new instance ever went to c-a, and the deployment kept serving: nothing was dropped.
    total = res.summary["total"]
    assert total["dropped"] == 0 and total["completed"] == total["requests"]
    assert sim.ticks[-1][1] >= 3


def test_deleting_a_deployment_scales_it_to_zero_and_removes_it() -> None:
    workload = {**STEADY, "duration_s": 100}
    sim = Scripted(scenario(workload), {120_000: delete(D1)})
    res = sim.run()

    assert D1 not in sim.state.deployments and D1 not in sim.state.desired
    assert list(sim.state.instances_of(D1)) == [] and sim.fleet.by_deployment[D1] == {}
    assert all(sim.state.free_gpus(ClusterId(cid), H100) == 8 for cid in ("c-a", "c-b", "c-c"))
    # Before the deletion it served at least its minimum; after it the desired count is 0 and stays.
    assert all(t[1] >= 3 for t in sim.ticks if 30_000 <= t[0] < 120_000)
    removed_at = next(t[0] for t in sim.ticks if t[0] >= 120_000 and t[2] == 0 and not t[3])
    assert removed_at < 120_000 + 61_000  # at most the scale-in grace
    total = res.summary["total"]
    assert total["dropped"] == 0 and total["completed"] == total["requests"]
