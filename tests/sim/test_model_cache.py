"""The simulator's node-local model caches: cold and cached starts, the cache filling after a cold
start, placement's preference reaching the simulated fleet through the replicated state, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.domain.instances import InitMethod
from controlplane.domain.profiles import PROFILES
from controlplane.domain.start_tiers import start_ms
from controlplane.sim import runner
from controlplane.sim.engine import Simulation
from controlplane.sim.scenario import ScenarioError, load_scenario, scenario_from_data

MODEL = "llama3-8b-h100"
P = PROFILES[MODEL]
TICK_MS = 250


def scenario(clusters: list[dict], **overrides: object):
    data = {
        "name": "cache", "seed": 5, "start": "cold", "tick_ms": TICK_MS,
        "clusters": clusters,
        "tenants": [{"id": "t1", "priority": 10, "quota": {"h100": 16}}],
        "deployments": [{
            "id": "d1", "tenant": "t1", "engine": "vllm", "model": MODEL, "pool": "h100",
            "min_replicas": 1, "max_replicas": 8, "warm_pool": 0,
            # Traffic from 150 s on: the min_replicas instance started at 0 is Ready before it.
            "workload": {"offset_s": 150, "generator": {"duration_s": 300, "base_rps": 2, "burst_every_s": 200,
                                                        "burst_duration_s": 60, "burst_factor": 40}},
        }],
    }
    data.update(overrides)
    return scenario_from_data(data, source="test", base_dir=Path("."))


def run(sc, seed: int = 5):
    sim = Simulation(sc, runner.workloads_of(sc, seed), seed=seed)
    return sim, sim.run()


def within_jitter(values: list[float | None], tier: InitMethod) -> bool:
    nominal = start_ms(P, tier)
    return all(v is not None and 0.9 * nominal - 1 <= v <= 1.1 * nominal + TICK_MS for v in values)


def test_an_empty_cache_makes_the_first_start_cold_and_the_next_ones_cached() -> None:
    sc = scenario([{"id": "c-a", "zone": "az-a", "capacity": {"h100": 8}}], model_cache="empty")
    sim, res = run(sc)
    total = res.summary["total"]
    tiers, latency = total["starts_by_tier"], total["start_latency_ms"]
    assert tiers["cold"] >= 1 and tiers.get("cached", 0) >= 1, tiers
    assert total["cold_starts"] == tiers["cold"] + tiers["cached"]
    assert within_jitter([latency["cold"]["p50"], latency["cold"]["p99"]], InitMethod.COLD), latency
    assert within_jitter([latency["cached"]["p50"], latency["cached"]["p99"]], InitMethod.CACHED), latency
    assert sim.fleet.caches == {"c-a": {MODEL}}
    assert sim.state.model_caches["c-a"].models == (MODEL,)  # reached the state through the facts


def test_placement_prefers_the_cluster_whose_cache_holds_the_model() -> None:
    sc = scenario([
        {"id": "c-a", "zone": "az-a", "capacity": {"h100": 8}, "model_cache": []},
        {"id": "c-b", "zone": "az-a", "capacity": {"h100": 8}, "model_cache": [MODEL]},
    ])
    sim, res = run(sc)
    tiers = res.summary["total"]["starts_by_tier"]
    assert tiers.get("cached", 0) >= 1 and "cold" not in tiers, tiers  # c-b had room for every start
    assert sim.state.model_caches["c-b"].models == (MODEL,) and "c-a" not in sim.state.model_caches


def test_the_default_prefetches_every_model_everywhere() -> None:
    sc = scenario([{"id": "c-a", "zone": "az-a", "capacity": {"h100": 8}},
                   {"id": "c-b", "zone": "az-b", "capacity": {"h100": 8}}])
    assert sc.model_caches() == {"c-a": (MODEL,), "c-b": (MODEL,)}
    sim, res = run(sc)
    assert set(res.summary["total"]["starts_by_tier"]) == {"cached"}
    assert within_jitter([res.summary["total"]["start_latency_ms"]["cached"]["p99"]], InitMethod.CACHED)


def test_same_seed_same_result_with_caches() -> None:
    sc = scenario([{"id": "c-a", "zone": "az-a", "capacity": {"h100": 8}, "model_cache": []}])
    _, a = run(sc)
    _, b = run(sc)
    assert runner.to_json(a) == runner.to_json(b)


def one_cluster_scenario(tmp_path: Path, *, top: str = "", cluster_extra: str = "") -> Path:
    """A one-cluster, one-deployment scenario file; ``top`` goes first, ``cluster_extra`` into the cluster."""
    path = tmp_path / "s.yaml"
    path.write_text(
        top + "clusters:\n"
        f"  - {{id: c-a, zone: az-a, capacity: {{h100: 8}}{cluster_extra}}}\n"
        "tenants:\n  - {id: t1, quota: {h100: 8}}\n"
        "deployments:\n"
        "  - {id: d1, tenant: t1, engine: vllm, model: llama3-8b-h100, pool: h100,\n"
        "     workload: {generator: {duration_s: 10}}}\n"
    )
    return path


@pytest.mark.parametrize(("cache", "needle"), [
    ("[llama3-8b-h100, nope]", "clusters[0].model_cache[1]: unknown model profile 'nope'"),
    ("[llama3-8b-h100, llama3-8b-h100]", "clusters[0].model_cache[1]: model 'llama3-8b-h100' is listed twice"),
    ("llama3-8b-h100", "clusters[0].model_cache: Input should be a valid list"),
])  # fmt: skip
def test_bad_cache_lists_name_file_line_and_field(tmp_path: Path, cache: str, needle: str) -> None:
    path = one_cluster_scenario(tmp_path, cluster_extra=f", model_cache: {cache}")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert any(p.startswith(f"{path}:2: ") and needle in p for p in info.value.problems), info.value.problems


def test_bad_scenario_default(tmp_path: Path) -> None:
    path = one_cluster_scenario(tmp_path, top="model_cache: sometimes\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert any(p.startswith(f"{path}:1: model_cache: ") and "prefetched" in p for p in info.value.problems)
