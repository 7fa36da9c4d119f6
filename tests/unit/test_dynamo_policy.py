"""The NVIDIA Dynamo planner baseline (controlplane/sim/dynamo.py, docs/baselines-dynamo.md).

The first tests need no Dynamo: the traffic windows, engine snapshots, the profile's forward-pass
model and the settings the adapter gives Dynamo. The rest drive Dynamo's own planner (ai-dynamo
1.6.1) and compare the adapter's decisions with Dynamo's functions called directly; they skip,
saying so, where Dynamo is not installed (the product's .venv), and run in .venv-bench, where
`make test` sets CP_REQUIRE_DYNAMO=1 so that a failed import fails instead of skipping.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.domain.ids import DeploymentId, InstanceId, PoolId, TenantId
from controlplane.domain.instances import InstanceState
from controlplane.domain.profiles import PROFILES
from controlplane.domain.tenants import Deployment, Engine
from controlplane.sim import dynamo as dy
from controlplane.sim.baselines import PodView, PolicyView
from controlplane.sim.cluster import SimInstance, SimRequest
from controlplane.sim.dynamo_profile import MAX_NUM_BATCHED_TOKENS, ProfileForwardPassModel, forward_pass_ms
from controlplane.sim.traffic import EngineLoad, TrafficMeter, TrafficWindow, engine_loads, merge_windows

REASON = dy.dynamo_available()
REQUIRED = os.environ.get("CP_REQUIRE_DYNAMO") == "1"
needs_dynamo = pytest.mark.skipif(REASON is not None and not REQUIRED,
                                  reason=f"NVIDIA Dynamo's planner is not installed here: {REASON}")
DEP = DeploymentId("d")
P8 = PROFILES["llama3-8b-h100"]


def deployment(model: str = "llama3-8b-h100", lo: int = 1, hi: int = 64) -> Deployment:
    return Deployment(DEP, TenantId("t"), Engine.VLLM, model, PoolId("h100"), PROFILES[model].gpus_per_instance,
                      min_replicas=lo, max_replicas=hi)


# --- without Dynamo ------------------------------------------------------------------------------

def test_traffic_meter_windows_and_merge() -> None:
    meter = TrafficMeter([DEP])
    reqs = [SimRequest(i, DEP, 0, 1000 + 100 * i, 11) for i in range(3)]
    for r in reqs:
        meter.arrival(r)
    reqs[0].first_token_ms, reqs[1].first_token_ms = 200, 400
    meter.done(reqs[0], 1200)  # 10 more tokens in 1000 ms: ITL 100 ms
    meter.done(reqs[1], 2400)  # ITL 200 ms
    reqs[2].dropped = True
    meter.done(reqs[2], 2400)  # dropped: not a completion
    w = meter.take(DEP, 5000)
    assert (w.duration_ms, w.arrived, w.completed) == (5000, 3, 2)
    assert (w.mean_prompt_tokens, w.mean_output_tokens, w.mean_ttft_ms, w.mean_itl_ms) == (1050.0, 11.0, 300.0, 150.0)
    empty = meter.take(DEP, 7000)  # the window restarts at each take
    assert (empty.duration_ms, empty.arrived, empty.completed, empty.mean_ttft_ms) == (2000, 0, 0, None)
    m = merge_windows(w, empty)
    assert (m.duration_ms, m.arrived, m.completed, m.mean_prompt_tokens, m.mean_itl_ms) == (7000, 3, 2, 1050.0, 150.0)


def test_engine_loads_split_decode_batch_and_prefill_backlog() -> None:
    sim = SimInstance(InstanceId("i"), DEP, "c", P8, 1, 0, phase="serving")
    decoding = SimRequest(1, DEP, 0, 1000, 50, first_token_ms=100)
    prefilling = SimRequest(2, DEP, 0, 2400, 50, first_token_ms=10_000)
    sim.running = {1: decoding, 2: prefilling}
    sim.queue.append(SimRequest(3, DEP, 0, 500, 10))
    sim.prefill_free_ms = 1100.0  # 100 ms of prefill left at t=1000: 2,400 tokens at 24,000 tokens/s
    (e,) = engine_loads([sim, SimInstance(InstanceId("j"), DEP, "c", P8, 1, 0)], 1000)  # "starting" is left out
    steps = min(50, 1 + int(900 / P8.step_ms(2)))  # tokens generated so far, at most the output
    assert e == EngineLoad(InstanceId("i"), 1, 1000 + steps, 2, 2400 + 500)


def test_forward_pass_model_is_the_simulators_service_model() -> None:
    assert forward_pass_ms(P8, 2400, 0) == pytest.approx(100.0)
    assert forward_pass_ms(P8, 0, 10) == pytest.approx(P8.step_ms(10))
    assert forward_pass_ms(P8, 8192, 64) == pytest.approx(8192 / 24.0 + P8.step_ms(64))
    model = ProfileForwardPassModel(P8)
    fpm = {"scheduled_requests": {"sum_prefill_tokens": 2400, "num_decode_requests": 3}}
    assert model.estimate_forward_pass_time_ms([fpm]) == pytest.approx(100.0 + P8.step_ms(3))
    assert model.diagnostics()["readiness"] == "ready"


def test_planner_settings_budget_min_endpoint_and_bad_input() -> None:
    s = dy.planner_settings("throughput", deployment(lo=0, hi=10), gpu_budget=64, ttft_ms=2000)
    assert (s["mode"], s["optimization_target"], s["enable_throughput_scaling"], s["enable_load_scaling"]) == (
        "agg", "sla", True, False)
    assert s["max_gpu_budget"] == 10  # capped at what the deployment may hold
    assert s["min_endpoint"] == 1  # Dynamo's floor: an agg deployment keeps one endpoint
    s = dy.planner_settings("load", deployment("llama3-70b-h100x4", lo=2, hi=12), gpu_budget=16, ttft_ms=500)
    assert (s["max_gpu_budget"], s["min_endpoint"], s["decode_engine_num_gpu"], s["itl_ms"]) == (16, 2, 4, 50.0)
    assert (s["enable_throughput_scaling"], s["enable_load_scaling"]) == (False, True)
    with pytest.raises(ValueError, match="mode"):
        dy.planner_settings("sla", deployment(), gpu_budget=8, ttft_ms=2000)
    with pytest.raises(ValueError, match="less than one instance"):
        dy.planner_settings("load", deployment("llama3-70b-h100x4"), gpu_budget=3, ttft_ms=2000)
    with pytest.raises(ValueError, match="ttft_ms"):
        dy.planner_settings("load", deployment(), gpu_budget=8, ttft_ms=0)


def test_dynamo_available_explains_itself() -> None:
    assert REASON is None or ("ai-dynamo" in REASON and REASON.endswith(")") or "cannot" in REASON)
    if REASON is not None:
        with pytest.raises(RuntimeError, match="ai-dynamo"):
            dy.DynamoPolicy("throughput", {DEP: 8}, {DEP: 2000.0})


def test_dynamo_is_installed_where_required() -> None:
    if not REQUIRED:
        pytest.skip("CP_REQUIRE_DYNAMO is not set (only the bench environment requires Dynamo)")
    assert REASON is None, REASON


# --- Dynamo's own code -----------------------------------------------------------------------------

def pods(n: int, state: InstanceState = InstanceState.READY) -> tuple[PodView, ...]:
    return tuple(PodView(InstanceId(f"p{i}"), state, 0.0) for i in range(n))


def idle(n: int) -> tuple[EngineLoad, ...]:
    return tuple(EngineLoad(InstanceId(f"p{i}"), 0, 0, 0, 0) for i in range(n))


def window(arrived: int, isl: float = 1000.0, osl: float = 200.0, engines: tuple[EngineLoad, ...] = (),
           ms: int = 5000) -> TrafficWindow:
    return TrafficWindow(ms, arrived, arrived, isl, osl, 100.0, 10.0, arrived, engines)


def drive(policy: dy.DynamoPolicy, d: Deployment, n: int, per_5s: list[int], **kw) -> list[tuple[int, int]]:
    """Call the policy every 5 s (Dynamo's tick) with ``per_5s[k]`` arrivals; the replica count
    follows its targets at once. Returns the (time, target) of every change."""
    changes = []
    for k, arrived in enumerate(per_5s):
        now = 5000 * (k + 1)
        want = policy.target(d, PolicyView(n, pods(n), 0, window(arrived, engines=idle(n), **kw)), now)
        if want != n:
            changes.append((now, want))
            n = want
    return changes


def direct_state(settings: dict, profile, current: int):
    """Dynamo's PlannerScalingState, built and called directly (the wheel's own unit tests' way)."""
    PlannerConfig, EngineCapabilities, WorkerCapabilities, _ = dy._dynamo()
    from dynamo.planner.core.state_machine import PlannerScalingState
    from dynamo.planner.core.types import WorkerCounts

    state = PlannerScalingState(PlannerConfig(**settings),
                                WorkerCapabilities(decode=EngineCapabilities(**dy.engine_capabilities(profile))))
    state.observe_worker_counts(WorkerCounts(ready_num_decode=current, expected_num_decode=current))
    return state


@needs_dynamo
def test_wheel_unit_tests_pass_with_the_profile_stand_in(tmp_path: Path) -> None:
    """Dynamo's own unit tests of throughput scaling and of the load predictors, from the installed
    wheel, pass in this environment with our forward-pass stand-in registered."""
    import dynamo.planner

    unit = Path(dynamo.planner.__file__).parent / "tests" / "unit"
    files = [str(unit / "test_throughput_scaling.py"), str(unit / "test_load_predictors.py")]
    code = ("from controlplane.sim.dynamo_profile import install_sdk_stand_in; install_sdk_stand_in()\n"
            "import sys, pytest\nsys.exit(pytest.main(sys.argv[1:]))")
    res = subprocess.run([sys.executable, "-c", code, "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                          "-W", "ignore::pytest.PytestUnknownMarkWarning", "--rootdir", str(tmp_path), *files],
                         capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout


@needs_dynamo
def test_throughput_decision_equals_dynamos_own_functions() -> None:
    d = deployment()
    policy = dy.policy_for("throughput", _scenario_of(d, 2000), {DEP: 64})
    try:
        # 180 s at 20 req/s of 1000/200 tokens: one throughput tick at t=180 s.
        changes = drive(policy, d, 1, [100] * 36)
    finally:
        policy.close()
    settings = dy.planner_settings("throughput", d, gpu_budget=64, ttft_ms=2000)
    state = direct_state(settings, P8, 1)
    capacity = state.agg_regression.find_engine_capacity_rps(isl=1000.0, osl=200.0, ttft_sla_ms=2000.0, itl_sla_ms=50.0)
    assert capacity is not None and capacity.eligible and capacity.itl_ms <= 50.0 and capacity.ttft_ms <= 2000.0
    from dynamo.planner.core.types import TrafficObservation

    decision = state.advance_throughput_from_prediction(
        TrafficObservation(duration_s=180.0, num_req=3600, isl=1000.0, osl=200.0),
        predicted_num_req=3600, predicted_isl=1000.0, predicted_osl=200.0, predicted_kv_hit_rate=0.0)
    expected = min(1 + 8, math.ceil(20.0 / capacity.rps))  # Dynamo caps a change at 8 replicas per tick
    assert decision is not None and decision.num_decode == expected
    assert changes == [(180_000, expected)]


@needs_dynamo
def test_arima_predictor_through_the_adapter() -> None:
    """A rising load: the adapter's targets follow Dynamo's ARIMAPredictor, not the last value."""
    from dynamo.planner.core.load.predictors import ARIMAPredictor

    d = deployment()
    series = [40 * (k + 1) for k in range(8)]  # requests per 5 s, constant within each 180 s window
    per_5s = [n for n in series for _ in range(36)]
    policy = dy.policy_for("throughput", _scenario_of(d, 2000), {DEP: 64}, settings={"max_throughput_scaling_replicas": 64})
    try:
        changes = dict(drive(policy, d, 1, per_5s))
        targets = [t for dec in policy.decisions[DEP] if (t := dec.target) is not None]
    finally:
        policy.close()
    settings = dy.planner_settings("throughput", d, gpu_budget=64, ttft_ms=2000)
    with dy._root_logging_kept():
        state = direct_state(settings, P8, 1)
        rps = state.agg_regression.find_engine_capacity_rps(isl=1000.0, osl=200.0, ttft_sla_ms=2000.0,
                                                            itl_sla_ms=50.0).rps
        predictor = ARIMAPredictor(state._config)
        expected, differs = [], False
        for n in series:
            predictor.add_data_point(36 * n)
            pred = predictor.predict_next()
            differs |= math.ceil(pred / 180 / rps) != math.ceil(36 * n / 180 / rps)
            expected.append(max(1, math.ceil(pred / 180 / rps)))
    assert differs  # the series is one where ARIMA's forecast changes the answer
    counts, n = [], 1
    for k in range(len(series)):  # the replica count after each 180 s throughput tick
        n = changes.get(180_000 * (k + 1), n)
        counts.append(n)
    assert counts == expected
    assert targets == [c for i, c in enumerate(counts) if c != ([1] + counts)[i]]


@needs_dynamo
def test_gpu_budget_clamps_and_min_endpoint_floors() -> None:
    d = deployment("llama3-70b-h100x4", lo=3, hi=12)
    policy = dy.policy_for("throughput", _scenario_of(d, 2000), {DEP: 20})  # 5 replicas of 4 GPUs
    try:
        up = drive(policy, d, 3, [400] * 36)  # far more than 5 replicas serve
    finally:
        policy.close()
    assert up == [(180_000, 5)]
    policy = dy.policy_for("throughput", _scenario_of(d, 2000), {DEP: 20})
    try:
        down = drive(policy, d, 5, [1] * 36)  # almost idle: down to min_endpoint = min_replicas = 3
    finally:
        policy.close()
    assert down == [(180_000, 3)]


def _busy(n: int, tokens: int) -> tuple[EngineLoad, ...]:
    return tuple(EngineLoad(InstanceId(f"p{i}"), 8, 8 * 1200, 20, tokens) for i in range(n))


def _load_tick(policy: dy.DynamoPolicy, d: Deployment, n: int, engines, now_ms: int) -> int:
    return policy.target(d, PolicyView(n, pods(n), 0, window(10, engines=engines)), now_ms)


@needs_dynamo
def test_load_based_steps_are_plus_minus_one_every_5_s() -> None:
    d = deployment()
    policy = dy.policy_for("load", _scenario_of(d, 2000), {DEP: 64})
    try:
        # 96,000 queued prompt tokens per engine = 4 s of prefill > the 2 s TTFT SLO on every engine.
        assert _load_tick(policy, d, 3, _busy(3, 96_000), 2_500) == 3  # between ticks: unchanged
        assert _load_tick(policy, d, 3, _busy(3, 96_000), 5_000) == 4
        assert _load_tick(policy, d, 4, _busy(4, 96_000), 10_000) == 5
        assert _load_tick(policy, d, 5, idle(5), 15_000) == 4  # all idle: one down
        assert _load_tick(policy, d, 4, idle(4), 20_000) == 3
    finally:
        policy.close()
    # Scale-up needs every engine above the SLO: one busy engine among idle ones holds.
    policy = dy.policy_for("load", _scenario_of(d, 2000), {DEP: 64})
    try:
        mixed = _busy(1, 96_000) + idle(3)[1:]
        assert _load_tick(policy, d, 3, mixed, 5_000) == 3
    finally:
        policy.close()


@needs_dynamo
def test_load_based_scale_down_sensitivity() -> None:
    """With two engines each holding a queue whose consolidated (x2) drain takes ~90 % of the TTFT
    budget, Dynamo's default sensitivity (80 %) refuses the scale-down; 100 % allows it."""
    d = deployment()
    tokens = int(0.45 * 2.0 * P8.prefill_tokens_per_s)  # x2 when consolidated: ~0.9 of a 2 s budget
    results = {}
    for sensitivity in (80, 100):
        policy = dy.policy_for("load", _scenario_of(d, 2000), {DEP: 64},
                               settings={"load_scaling_down_sensitivity": sensitivity})
        try:
            results[sensitivity] = _load_tick(policy, d, 2, _busy(2, tokens), 5_000)
        finally:
            policy.close()
    assert results == {80: 2, 100: 1}


@needs_dynamo
def test_a_short_simulation_is_deterministic_and_ticks_on_dynamos_schedule(traces_dir: Path) -> None:
    from controlplane.sim.engine import Simulation
    from controlplane.sim.runner import trace_scenario, workloads_of

    trace = traces_dir / "AzureLLMInferenceTrace_conv.csv"
    scenario = trace_scenario(str(trace), model="llama3-8b-h100", engine="vllm", rate_scale=1.0, seed=1)
    scenario = _limit(scenario, 420)
    summaries, decisions = [], []
    for mode in ("throughput", "load", "load"):
        budgets = {dd.id: dd.max_replicas * dd.gpus_per_instance for dd in scenario.deployments}
        policy = dy.policy_for(mode, scenario, budgets)
        try:
            result = Simulation(scenario, workloads_of(scenario, 1), seed=1, policy=policy).run()
        finally:
            policy.close()
        summaries.append(result.summary)
        decisions.append([dec for decs in policy.decisions.values() for dec in decs])
    assert summaries[1] == summaries[2] and decisions[1] == decisions[2]
    assert summaries[0]["total"]["requests"] > 0
    assert {dec.at_ms % 180_000 for dec in decisions[0] if dec.target is not None} <= {0}
    assert decisions[1] and all(dec.at_ms % 5_000 == 0 for dec in decisions[1])
    assert all(dec.target is None or abs(dec.target - dec.current) == 1 for dec in decisions[1])


def _scenario_of(d: Deployment, ttft_ms: int):
    from types import SimpleNamespace

    return SimpleNamespace(tenants=[SimpleNamespace(id=d.tenant, slo=SimpleNamespace(ttft_p99_ms=ttft_ms))],
                           deployments=[d])


def _limit(scenario, limit_s: float):
    import dataclasses

    deps = [d.model_copy(update={"workload": d.workload.model_copy(update={"limit_s": limit_s})})
            for d in scenario.spec.deployments]
    return dataclasses.replace(scenario, spec=scenario.spec.model_copy(update={"deployments": deps}))
