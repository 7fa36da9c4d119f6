"""The simulator in-process: determinism, failure injection through the breakers, outages."""

from __future__ import annotations

from pathlib import Path

from controlplane.domain.records import BreakerPhase
from controlplane.sim import runner
from controlplane.sim.engine import Simulation
from controlplane.sim.scenario import scenario_from_data


def scenario(**overrides):
    data = {
        "name": "t",
        "seed": 3,
        "clusters": [
            {"id": "c-a", "zone": "az-a", "capacity": {"h100": 8}},
            {"id": "c-b", "zone": "az-b", "capacity": {"h100": 8}},
            {"id": "c-c", "zone": "az-c", "capacity": {"h100": 8}},
        ],
        "tenants": [{"id": "t1", "priority": 10, "quota": {"h100": 24}}],
        "deployments": [
            {
                "id": "d1", "tenant": "t1", "engine": "vllm", "model": "llama3-8b-h100", "pool": "h100",
                "min_replicas": 3, "max_replicas": 12, "warm_pool": 0,
                "workload": {"generator": {"duration_s": 240, "base_rps": 20, "burst_every_s": 60,
                                           "burst_duration_s": 20, "burst_factor": 4}},
            }
        ],
    }
    data.update(overrides)
    return scenario_from_data(data, source="test", base_dir=Path("."))


def simulate(sc, seed=3):
    sim = Simulation(sc, runner.workloads_of(sc, seed), seed=seed)
    return sim, sim.run()


def test_same_seed_same_result_different_seed_different_result():
    sc = scenario()
    _, a = simulate(sc, 3)
    _, b = simulate(sc, 3)
    _, c = simulate(sc, 4)
    assert runner.to_json(a) == runner.to_json(b)
    assert a.timeline == b.timeline
    assert a.summary["total"] != c.summary["total"]


def test_every_request_is_accounted_for():
    sim, res = simulate(scenario())
    total = res.summary["total"]
    assert total["requests"] == len(sim._requests)
    assert total["completed"] + total["dropped"] == total["requests"]
    assert total["cold_starts"] > 0  # the bursts needed new instances


def test_failed_warmups_open_the_breaker_and_new_instances_spill_to_other_zones():
    sc = scenario(failures=[{"kind": "warmup_failures", "cluster": "c-c", "probability": 1.0,
                             "start_s": 0, "end_s": 10_000}])
    sim, res = simulate(sc)
    rec = sim.state.breakers.get("deployment/c-c/d1")
    assert rec is not None and rec.trips >= 1, sim.state.breakers
    # Nothing ever warmed up in c-c, yet the deployment scaled and served.
    assert all(i.cluster != "c-c" or i.created_ms == 0 for i in sim.state.instances.values())
    assert res.summary["total"]["completed"] > 0.9 * res.summary["total"]["requests"]
    # The breaker limited the retries: far fewer cold starts into c-c than ticks with demand.
    assert res.summary["total"]["cold_starts"] < 60


def _step_trace(path: Path, low_rps: int, high_rps: int, step_s: int, end_s: int) -> Path:
    """An Azure-format trace: ``low_rps`` until ``step_s``, then ``high_rps`` until ``end_s``."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for sec in range(end_s):
        rps = low_rps if sec < step_s else high_rps
        for k in range(rps):
            micros = k * 1_000_000 // rps
            lines.append(f"2023-11-16 18:{sec // 60:02d}:{sec % 60:02d}.{micros:06d}0,1000,200")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cluster_outage_loses_instances_opens_the_cluster_breaker_and_recovers(tmp_path):
    trace = _step_trace(tmp_path / "step.csv", low_rps=15, high_rps=80, step_s=150, end_s=240)
    sc = scenario(
        failures=[{"kind": "cluster_outage", "cluster": "c-a", "start_s": 30, "end_s": 120}],
        deployments=[{
            "id": "d1", "tenant": "t1", "engine": "vllm", "model": "llama3-8b-h100", "pool": "h100",
            "min_replicas": 3, "max_replicas": 20, "warm_pool": 0, "workload": {"trace": str(trace)},
        }],
    )
    seen: dict[str, int] = {}

    class Probe(Simulation):
        def _tick(self, now_ms):
            super()._tick(now_ms)
            rec = self.state.breakers.get("cluster/c-a")
            if rec is not None and rec.phase is BreakerPhase.OPEN:
                seen.setdefault("opened_ms", now_ms)
            live = [i for i in self.state.instances.values() if i.cluster == "c-a"]
            if 35_000 <= now_ms < 120_000:
                seen["max_live_in_outage"] = max(seen.get("max_live_in_outage", 0), len(live))
            if now_ms >= 150_000:
                seen["max_live_after"] = max(seen.get("max_live_after", 0), len(live))

    sim = Probe(sc, runner.workloads_of(sc, 3), seed=3)
    res = sim.run()
    # The outage lost c-a's instance at t=30 s; the breaker opened within a tick or two.
    assert 30_000 <= seen["opened_ms"] < 31_000
    # While c-a is down the control plane keeps at most one probe instance there at a time.
    assert seen["max_live_in_outage"] <= 1
    # After recovery, the step in load is served from all three zones again: a probe succeeded,
    # the breaker closed, and placement spread the new instances back into zone a.
    assert seen["max_live_after"] >= 3
    assert sim.state.breakers["cluster/c-a"].phase is BreakerPhase.CLOSED
    assert res.summary["total"]["completed"] > 0.95 * res.summary["total"]["requests"]


def test_cold_start_scenario_starts_from_nothing():
    sim, res = simulate(scenario(start="cold"))
    assert res.summary["total"]["cold_starts"] >= 3
    _, warm = simulate(scenario())
    assert warm.summary["total"]["ttft_ms"]["p99"] < res.summary["total"]["ttft_ms"]["p99"]
