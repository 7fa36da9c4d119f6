"""Fleet files (issue 15): the two reference fleets' shape and shortfall, rate-series workloads, and
bad input reported as every problem with its file and line."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from controlplane.domain.profiles import PROFILES
from controlplane.sim import rates
from controlplane.domain.ids import PoolId
from controlplane.sim.fleet import fleet_shortfall, tenant_demand_gpus
from controlplane.sim.runner import builtin_scenario, load_scenario, workloads_of
from controlplane.sim.scenario import Scenario, ScenarioError, scenario_from_data, shared_traces_dir
from controlplane.sim.workload import TraceError, read_azure_trace

REPO = Path(__file__).resolve().parents[2]
DOCS_FLEET = REPO / "docs" / "fleets" / "shared-traces.yaml"


def docs_fleet() -> Scenario:
    if not shared_traces_dir().is_dir():
        pytest.fail(f"{shared_traces_dir()} is missing: the docs fleet reads the shared traces in place "
                    "(set SHARED_TRACES to their folder)")
    return load_scenario(DOCS_FLEET)


# --- the reference fleets ------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["builtin", "docs"])
def test_reference_fleets_have_the_issue_15_shape(which: str) -> None:
    sc = builtin_scenario("fleet") if which == "builtin" else docs_fleet()
    assert len({t.priority for t in sc.tenants}) >= 3
    assert len(sc.deployments) >= 6
    assert {str(d.engine.value) for d in sc.deployments} == {"vllm", "triton", "deepspeed-mii"}
    sizes = {d.model.split("-")[1] for d in sc.deployments}
    assert len(sizes) >= 2, sizes
    pools = {str(p) for c in sc.clusters for p in c.capacity}
    assert len(pools) >= 2 and {str(d.pool) for d in sc.deployments} == pools
    assert len({c.zone for c in sc.clusters}) >= 2
    for t in sc.tenants:
        assert t.quota and t.borrow_limit, t.id
    for d in sc.deployments:
        assert d.model.endswith(str(d.pool)) or str(d.pool) in d.model, (d.id, d.model, d.pool)  # profile fits the pool
        if d.engine.value == "deepspeed-mii":
            assert d.warm_pool == 0, "DeepSpeed-MII has no sleep mode: a warm pool would be fiction"
    assert sc.fleet.termination_grace_s == 30 and sc.fleet.description


@pytest.mark.parametrize("which", ["builtin", "docs"])
def test_reference_fleets_are_30_to_50_percent_short_at_their_bursts(which: str) -> None:
    sc = builtin_scenario("fleet") if which == "builtin" else docs_fleet()
    short = fleet_shortfall(sc, workloads_of(sc, sc.spec.seed))
    assert set(short) == {"h100", "a100"}
    for pool, s in short.items():
        assert s.pool_gpus == sum(c.capacity.get(pool, 0) for c in sc.clusters)
        assert 0.30 <= s.short_fraction <= 0.50, s
        assert s.peak_demand_gpus > s.pool_gpus and 0 <= s.at_s <= sc.spec.duration_s
    # The bare per-second lower bound is smaller than what must be held over the cold starts.
    bare = fleet_shortfall(sc, workloads_of(sc, sc.spec.seed), hold=False)
    assert all(bare[p].peak_demand_gpus <= short[p].peak_demand_gpus for p in short)


@pytest.mark.parametrize("which", ["builtin", "docs"])
def test_reference_fleets_are_short_only_in_sum_never_for_their_top_tenant(which: str) -> None:
    """The shortfall comes from the sum over tenants: per pool, the highest-priority tenant's own held
    peak fits its ceiling and what the others can never lose (their guaranteed minimums, and their
    quotas where the top tenant borrows: preemption.py lets a borrower take only borrowed GPUs), and
    no tenant's own peak exceeds the pool. Otherwise no policy could serve it, and the fleet would
    measure an impossible tenant instead of preemption."""
    sc = builtin_scenario("fleet") if which == "builtin" else docs_fleet()
    wl = workloads_of(sc, sc.spec.seed)
    short = fleet_shortfall(sc, wl)
    tenants = {str(t.id): t for t in sc.tenants}
    for pool, by_tenant in tenant_demand_gpus(sc, wl).items():
        size = short[pool].pool_gpus
        peak = {t: max(series) for t, series in by_tenant.items()}
        for t, p in peak.items():
            assert p <= size, f"{which} {pool}: {t} alone needs {p} GPUs at its peak, the pool has {size}"
        top = max(by_tenant, key=lambda t: (tenants[t].priority, t))
        others = [t for t in by_tenant if t != top]
        assert all(tenants[o].priority < tenants[top].priority for o in others), (pool, top, others)
        minimums = {o: sum(d.min_replicas * d.gpus_per_instance for d in sc.deployments
                           if str(d.tenant) == o and str(d.pool) == pool) for o in others}
        kept = sum(minimums.values())
        if peak[top] > tenants[top].quota_in(PoolId(pool)):  # borrowing: the others keep their quotas
            kept = sum(max(minimums[o], tenants[o].quota_in(PoolId(pool))) for o in others)
        assert peak[top] <= tenants[top].ceiling_in(PoolId(pool)), (which, pool, top, peak[top])
        assert peak[top] <= size - kept, (which, pool, top, peak[top], size, kept)
        # ... and the pool is still 30-50 % short of the sum at its peak (preemption has to act).
        assert sum(peak.values()) >= short[pool].peak_demand_gpus > size
        assert 0.30 <= short[pool].short_fraction <= 0.50, short[pool]


def test_shortfall_is_zero_for_an_ample_pool() -> None:
    sc = scenario_from_data(_fleet_data(capacity=1000), source="t", base_dir=Path("."))
    short = fleet_shortfall(sc, workloads_of(sc, 0))
    assert short["h100"].short_fraction == 0.0 and short["h100"].pool_gpus == 1000
    assert short["h100"].peak_demand_gpus >= 1  # min_replicas


def test_every_scenario_is_a_fleet_with_defaults() -> None:
    demo = builtin_scenario("demo")
    assert demo.fleet.termination_grace_s == 30.0 and demo.fleet.description == ""


def test_a100_profiles_follow_the_datasheet_ratios() -> None:
    for size, h, a in (("8b", "llama3-8b-h100", "llama3-8b-a100"), ("70b", "llama3-70b-h100x4", "llama3-70b-a100x4")):
        ph, pa = PROFILES[h], PROFILES[a]
        assert ph.gpus_per_instance == pa.gpus_per_instance, size
        assert 2.5 < ph.prefill_tokens_per_s / pa.prefill_tokens_per_s < 3.5  # 989 vs 312 TFLOP/s
        assert 1.4 < pa.decode_step_ms / ph.decode_step_ms < 1.8  # 3.35 vs 2.04 TB/s
        assert pa.cold_start_ms == ph.cold_start_ms and pa.warm_start_ms > ph.warm_start_ms


# --- rate-series workloads -------------------------------------------------------------------------

def _fleet_data(capacity: int = 8, workload: dict | None = None, **dep) -> dict:
    return {
        "clusters": [{"id": "c1", "zone": "az-a", "capacity": {"h100": capacity}}],
        "tenants": [{"id": "t1", "priority": 10, "quota": {"h100": capacity}}],
        "deployments": [{"id": "d1", "tenant": "t1", "engine": "vllm", "model": "llama3-8b-h100", "pool": "h100",
                         "workload": workload or {"generator": {"duration_s": 60, "base_rps": 2}}, **dep}],
    }


def _rates_file(tmp_path: Path, rows: list[tuple[float, float]], name: str = "r.csv") -> Path:
    path = tmp_path / name
    path.write_text("window_start_s,total_rate_rps\n" + "".join(f"{a:g},{r:g}\n" for a, r in rows))
    return path


def _trace_file(tmp_path: Path, pairs: list[tuple[int, int]], name: str = "t.csv") -> Path:
    path = tmp_path / name
    rows = "".join(f"2023-11-16 18:17:{i:02d}.0000000,{p},{o}\n" for i, (p, o) in enumerate(pairs))
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    return path


def _rate_scenario(tmp_path: Path, **workload) -> Scenario:
    return scenario_from_data(_fleet_data(workload=workload), source=str(tmp_path / "f.yaml"), base_dir=tmp_path)


def test_rate_series_is_compressed_scaled_and_seeded(tmp_path: Path) -> None:
    _rates_file(tmp_path, [(0, 100), (600, 0), (1200, 300)])
    sc = _rate_scenario(tmp_path, rates="r.csv", time_compression=60, rate_scale=0.1)
    reqs = workloads_of(sc, 3)["d1"]
    # Windows of 600 s become 10 s: 10 req/s for 10 s, nothing, then 30 req/s for 10 s (the last
    # window lasts as long as the one before it).
    first = [r for r in reqs if r.arrival_ms < 10_000]
    gap = [r for r in reqs if 10_000 <= r.arrival_ms < 20_000]
    last = [r for r in reqs if r.arrival_ms >= 20_000]
    assert not gap and max(r.arrival_ms for r in reqs) < 30_000
    assert 100 - 5 * 10 <= len(first) <= 100 + 5 * 10  # Poisson(100): within 5 sigma
    assert 300 - 5 * 18 <= len(last) <= 300 + 5 * 18
    assert [r.arrival_ms for r in reqs] == sorted(r.arrival_ms for r in reqs)
    assert workloads_of(sc, 3)["d1"] == reqs  # deterministic
    assert workloads_of(sc, 4)["d1"] != reqs  # and the seed is used


def test_window_range_offset_and_linear_interpolation(tmp_path: Path) -> None:
    _rates_file(tmp_path, [(0, 0), (100, 1000), (200, 1000), (300, 0)])
    sc = _rate_scenario(tmp_path, rates="r.csv", from_s=100, to_s=200, offset_s=5, rate_scale=0.1)
    reqs = workloads_of(sc, 0)["d1"]
    assert all(5_000 <= r.arrival_ms < 105_000 for r in reqs)
    assert 10_000 - 5 * 100 <= len(reqs) <= 10_000 + 5 * 100  # 100 req/s for 100 s
    lin = rates.plan(rates.read_rate_series(tmp_path / "r.csv"), time_compression=1, rate_scale=1, linear=True)
    assert lin.segments[0] == (0.0, 100.0, 0.0, 1000.0)  # a ramp from one window start to the next
    assert lin.expected_requests() == pytest.approx(50_000 + 100_000 + 50_000)
    step = rates.plan(rates.read_rate_series(tmp_path / "r.csv"), time_compression=1, rate_scale=1, to_s=100)
    assert step.expected_requests() == 0.0  # a step: the first window's own rate
    ramp = rates.arrivals(rates.plan(rates.read_rate_series(tmp_path / "r.csv"), time_compression=1, rate_scale=0.1,
                                     to_s=100, linear=True), random.Random(1), lambda r: (1, 1))
    early = sum(1 for r in ramp if r.arrival_ms < 50_000)
    assert early < len(ramp) / 2 - 3 * len(ramp) ** 0.5 / 2  # a rising ramp: fewer arrivals in its first half


def test_lengths_are_pairs_from_the_named_trace_or_built_in(tmp_path: Path) -> None:
    pairs = [(100, 7), (2000, 30), (50, 900)]
    _trace_file(tmp_path, pairs, "lengths.csv")
    _rates_file(tmp_path, [(0, 20)])
    sc = _rate_scenario(tmp_path, rates="r.csv", time_compression=10, lengths_from="lengths.csv")
    got = {(r.prompt_tokens, r.output_tokens) for r in workloads_of(sc, 0)["d1"]}
    assert got == set(pairs)  # joint pairs, each drawn (1,200 draws of 3 pairs)
    builtin = _rate_scenario(tmp_path, rates="r.csv", time_compression=1, prompt_mean=500, output_mean=50)
    reqs = workloads_of(builtin, 0)["d1"]
    mean_p = sum(r.prompt_tokens for r in reqs) / len(reqs)
    assert 400 < mean_p < 600 and len({r.prompt_tokens for r in reqs}) > 100


def test_a_rate_series_asking_too_much_is_refused_naming_the_line(tmp_path: Path) -> None:
    _rates_file(tmp_path, [(0, 1e9)])
    (tmp_path / "f.yaml").write_text(_yaml_with_workload("{rates: r.csv, time_compression: 0.001}"))
    sc = load_scenario(tmp_path / "f.yaml")
    with pytest.raises(ScenarioError, match=r"f\.yaml:\d+: deployments\[0\]\.workload: .* more than"):
        workloads_of(sc, 0)


def test_trace_skip_and_offset(tmp_path: Path) -> None:
    path = _trace_file(tmp_path, [(i + 1, 1) for i in range(20)])  # one row per second
    reqs = read_azure_trace(path, skip_s=5, rate_scale=2)
    assert [r.prompt_tokens for r in reqs] == list(range(6, 21)) and reqs[0].arrival_ms == 0
    assert reqs[2].arrival_ms == 1000  # two trace seconds after the first kept row, at 2x
    sc = scenario_from_data(_fleet_data(workload={"trace": "t.csv", "skip_s": 5, "offset_s": 100}),
                            source="f", base_dir=tmp_path)
    assert workloads_of(sc, 0)["d1"][0].arrival_ms == 100_000


def test_burst_group_shares_burst_windows() -> None:
    gen = {"duration_s": 600, "base_rps": 5, "diurnal_amplitude": 0, "burst_every_s": 100, "burst_duration_s": 20,
           "burst_factor": 20}
    data = _fleet_data(capacity=16)
    data["deployments"].append({**data["deployments"][0], "id": "d2"})
    for dep in data["deployments"]:
        dep["workload"] = {"generator": {**gen, "burst_group": "launch"}}
    sc = scenario_from_data(data, source="t", base_dir=Path("."))
    w = workloads_of(sc, 0)

    def busy_seconds(reqs):
        per = [0] * 600
        for r in reqs:
            per[r.arrival_ms // 1000] += 1
        return {s for s, n in enumerate(per) if n >= 40}  # base 5/s; bursts 100/s

    a, b = busy_seconds(w["d1"]), busy_seconds(w["d2"])
    assert a and len(a & b) >= 0.8 * len(a)
    assert w["d1"] != w["d2"]  # the arrivals themselves stay per deployment


def test_shared_traces_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rates_file(tmp_path, [(0, 1)], "x.csv")
    monkeypatch.setenv("SHARED_TRACES", str(tmp_path))
    sc = scenario_from_data(_fleet_data(workload={"rates": "${SHARED_TRACES}/x.csv"}), source="f", base_dir=Path("/"))
    assert sc.path("${SHARED_TRACES}/x.csv") == tmp_path / "x.csv"
    with pytest.raises(ScenarioError, match=r"deployments\[0\]\.workload\.rates: unknown variable \$\{HOME\}"):
        scenario_from_data(_fleet_data(workload={"rates": "${HOME}/x.csv"}), source="f", base_dir=Path("/"))


# --- bad input: every problem, FILE:LINE: field: message -------------------------------------------

BAD = """\
name: bad
colour: blue
fleet: {termination_grace_s: -1}
clusters:
  - {id: c1, zone: az-a, capacity: {h100: 8}}
  - {id: c1, zone: az-b, capacity: {h100: many}}
tenants:
  - id: t1
    priority: 1
    quota: {h100: 4, a100: 2}
deployments:
  - id: d1
    tenant: t9
    engine: vllm
    model: llama3-8b-h100
    pool: h200
    min_replicas: 9
    max_replicas: 2
    workload: {trace: missing.csv}
  - id: d2
    tenant: t1
    engine: tgi
    model: llama3-8b-h100
    pool: h100
    workload:
      rates: nowhere.csv
      time_compression: 0
failures:
  - {kind: cluster_outage, cluster: c7, start_s: 10, end_s: 5}
"""


def test_every_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    expected = [
        (2, "colour", "unknown field"),
        (3, "fleet.termination_grace_s", "greater than or equal to 0"),
        (6, "clusters[1].capacity.h100", "valid integer"),
        (6, "clusters[1].id", "duplicate id 'c1'"),
        (10, "tenants[0].quota.a100", "no cluster has pool 'a100'"),
        (13, "deployments[0].tenant", "unknown tenant 't9'"),
        (16, "deployments[0].pool", "no cluster has pool 'h200'"),
        (17, "deployments[0].min_replicas", "must not exceed max_replicas"),
        (19, "deployments[0].workload.trace", "missing.csv: no such file"),
        (22, "deployments[1].engine", "'vllm', 'triton' or 'deepspeed-mii'"),
        (26, "deployments[1].workload.rates", "nowhere.csv: no such file"),
        (27, "deployments[1].workload.time_compression", "greater than 0"),
        (29, "failures[0].cluster", "unknown cluster 'c7'"),
        (29, "failures[0].end_s", "must be after start_s"),
    ]
    lines = str(err.value).splitlines()
    assert lines == list(err.value.problems)
    for line, field, message in expected:
        prefix = f"{path}:{line}: {field}: "
        assert any(x.startswith(prefix) and message in x for x in lines), (prefix, message, lines)
    assert len(lines) == len(expected), lines


def _yaml_with_workload(workload: str) -> str:
    return ("clusters: [{id: c1, zone: az-a, capacity: {h100: 8}}]\n"
            "tenants: [{id: t1, priority: 1, quota: {h100: 8}}]\n"
            "deployments:\n"
            "  - id: d1\n"
            "    tenant: t1\n"
            "    engine: vllm\n"
            "    model: llama3-8b-h100\n"
            "    pool: h100\n"
            f"    workload: {workload}\n")


@pytest.mark.parametrize("field", ["rates", "lengths_from"])
def test_malformed_rate_or_lengths_file_names_its_own_line(tmp_path: Path, field: str) -> None:
    good_rates = _rates_file(tmp_path, [(0, 1)], "good.csv")
    bad = tmp_path / "bad.csv"
    if field == "rates":
        bad.write_text("window_start_s,total_rate_rps\n0,1\n600,lots\n")
        workload = "{rates: bad.csv}"
        needle = f"{bad}:3: total_rate_rps: not a number ('lots')"
    else:
        bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,10,x\n")
        workload = f"{{rates: {good_rates.name}, lengths_from: bad.csv}}"
        needle = f"{bad}:2: GeneratedTokens: not an integer ('x')"
    (tmp_path / "f.yaml").write_text(_yaml_with_workload(workload))
    sc = load_scenario(tmp_path / "f.yaml")
    with pytest.raises(TraceError) as err:
        workloads_of(sc, 0)
    assert needle in str(err.value)


@pytest.mark.parametrize(("rows", "needle"), [
    ("", "empty file"),
    ("window,rate\n", ":1: header must be window_start_s,total_rate_rps"),
    ("window_start_s,total_rate_rps\n600,1\n0,1\n", ":3: window_start_s: must increase"),
    ("window_start_s,total_rate_rps\n0,-1\n", ":2: total_rate_rps: must be a finite number"),
    ("window_start_s,total_rate_rps\n0,nan\n", ":2: total_rate_rps: must be a finite number"),
    ("window_start_s,total_rate_rps\n0\n", ":2: expected 2 fields"),
    ("window_start_s,total_rate_rps\n", "no rows"),
])
def test_rate_series_reader_errors(tmp_path: Path, rows: str, needle: str) -> None:
    path = tmp_path / "r.csv"
    path.write_text(rows)
    with pytest.raises(TraceError, match=None) as err:
        rates.read_rate_series(path)
    assert str(path) in str(err.value) and needle in str(err.value), err.value
