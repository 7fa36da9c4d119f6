"""The scaling decision with a forecast (stage 6 of ``core.scaling``): ahead of demand, warm pool,
the shorter stabilization window, and exactly today's decision without a usable forecast."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.scaling import ScaleReason, decide, wake_fits
from controlplane.domain.demand import Forecast
from controlplane.domain.profiles import PROFILES
from controlplane.domain.records import EMPTY_MEMORY, ScaleMemory
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Slo
from tests.unit.test_scaling import signals

SLO = Slo(ttft_p99_ms=2_000)


def dep(model: str = "llama3-8b-h100", engine: Engine = Engine.VLLM, warm_pool: int = 0, max_replicas: int = 64) -> Deployment:
    return Deployment(id="acme/chat", tenant="acme", engine=engine, model=model, pool="h100",
                      gpus_per_instance=PROFILES[model].gpus_per_instance, min_replicas=1,
                      max_replicas=max_replicas, warm_pool=warm_pool, policy=ScalingPolicy())


def forecast(ready: float, total: float, *, wake_ms: int = 1_000, restart_ms: int = 30_000, usable: bool = True) -> Forecast:
    return Forecast(0, ready, total, total, wake_ms, restart_ms, 0.9, 100, None, usable, "")


def test_a_fast_wake_serves_the_wake_horizon_and_sleeps_the_rest() -> None:
    d = dep()
    dec = decide(d, PROFILES[d.model], SLO, signals(1_000, 24.0, serving=1), EMPTY_MEMORY, 1, 1_000,
                 forecast(3.2, 7.5))
    assert (dec.target, dec.warm_pool, dec.reason) == (4, 4, ScaleReason.FORECAST)
    assert "within its wake horizon (1000ms" in dec.message and dec.forecast is not None


def test_a_wake_slower_than_the_slo_keeps_the_whole_restart_horizon_serving() -> None:
    d = dep("llama3-70b-h100x4")
    f = forecast(3.2, 7.5, wake_ms=4_000, restart_ms=90_000)
    assert not wake_fits(d, SLO, f)
    dec = decide(d, PROFILES[d.model], SLO, signals(1_000, 24.0, serving=1), EMPTY_MEMORY, 1, 1_000, f)
    assert (dec.target, dec.warm_pool, dec.reason) == (8, 0, ScaleReason.FORECAST)
    assert "does not fit the 2000ms TTFT SLO" in dec.message


def test_an_engine_that_cannot_sleep_never_gets_a_warm_pool() -> None:
    d = dep(engine=Engine.DEEPSPEED_MII, warm_pool=3)
    dec = decide(d, PROFILES[d.model], SLO, signals(1_000, 24.0, serving=1), EMPTY_MEMORY, 1, 1_000,
                 forecast(3.2, 7.5, wake_ms=0))
    assert (dec.target, dec.warm_pool) == (8, 0)
    reactive = decide(d, PROFILES[d.model], SLO, signals(1_000, 24.0, serving=1), EMPTY_MEMORY, 1, 1_000)
    assert reactive.warm_pool == 0  # the configured 3 too: MII has no sleep


def test_the_forecast_never_exceeds_max_replicas() -> None:
    d = dep(max_replicas=5)
    dec = decide(d, PROFILES[d.model], SLO, signals(1_000, 24.0, serving=1), EMPTY_MEMORY, 1, 1_000,
                 forecast(30.0, 80.0))
    assert (dec.target, dec.warm_pool) == (5, 0)


def test_with_a_forecast_a_scale_down_waits_for_the_restart_horizon_not_ten_minutes() -> None:
    d = dep()
    f = forecast(0.0, 0.0, restart_ms=30_000)
    mem, current = EMPTY_MEMORY, 6
    for t in range(0, 59_000, 1_000):  # 6 replicas' demand for a minute
        dec = decide(d, PROFILES[d.model], SLO, signals(t, 6 * 24.0, serving=6), mem, current, t, f)
        mem = dec.memory
    t = 59_000 + 61_000  # then idle: 61 s later (the forecast's 60 s floor) the window has let go
    dec = decide(d, PROFILES[d.model], SLO, signals(t, 24.0, serving=6), mem, current, t, f)
    assert dec.target < current
    no_forecast = decide(d, PROFILES[d.model], SLO, signals(t, 24.0, serving=6), mem, current, t)
    assert no_forecast.target == current and no_forecast.reason is ScaleReason.STABILIZED


@settings(max_examples=200, deadline=None)
@given(conc=st.floats(0, 2_000), current=st.integers(0, 40), t=st.integers(0, 10**7),
       warm=st.integers(0, 3), engine=st.sampled_from(list(Engine)))
def test_without_a_usable_forecast_the_decision_is_todays(conc: float, current: int, t: int, warm: int,
                                                          engine: Engine) -> None:
    d = dep(engine=engine, warm_pool=warm)
    sig = signals(t, conc, serving=current)
    mem = ScaleMemory(((t - t % 1000, current),), 0, 0, -1, -1)
    plain = decide(d, PROFILES[d.model], SLO, sig, mem, current, t)
    unusable = decide(d, PROFILES[d.model], SLO, sig, mem, current, t, forecast(50.0, 90.0, usable=False))
    assert replace(unusable, forecast=None) == plain


def test_demand_recorded_is_the_load_not_the_ttft_feedback() -> None:
    d = dep()
    sig = signals(1_000, 48.0, serving=2, ttft=9_000.0)
    dec = decide(d, PROFILES[d.model], SLO, sig, EMPTY_MEMORY, 2, 1_000)
    assert dec.proposals["ttft_p99_ms"] > dec.proposals["concurrency"]
    assert dec.demand == 48.0 / d.policy.target_concurrency  # no token rates: the concurrency
    assert decide(d, PROFILES[d.model], SLO, None, EMPTY_MEMORY, 2, 1_000).demand is None


def test_demand_recorded_is_the_work_rate_when_the_engine_reports_tokens() -> None:
    """A queue (running + waiting far above what the token work needs) is not recorded as load."""
    d = dep()
    sig = signals(1_000, 24.0 * 20, serving=2, ptps=PROFILES[d.model].prefill_tokens_per_s, gtps=0.0)
    dec = decide(d, PROFILES[d.model], SLO, sig, EMPTY_MEMORY, 2, 1_000)
    assert dec.proposals["concurrency"] == 20
    assert dec.demand == 1.0 / d.policy.target_token_utilization


def test_a_forecast_within_the_tolerance_band_of_the_current_count_holds_it() -> None:
    """A quantile drifting across an integer (2.0 -> 2.02 -> 1.98) flips nothing."""
    d = dep("llama3-70b-h100x4")
    prof = PROFILES[d.model]
    for need in (1.85, 2.0, 2.02, 2.15):
        f = forecast(need, need, wake_ms=4_000, restart_ms=90_000)
        dec = decide(d, prof, SLO, signals(1_000, 24.0 * 1.6, serving=2), EMPTY_MEMORY, 2, 1_000, f)
        assert dec.target == 2, need
    f = forecast(2.3, 2.3, wake_ms=4_000, restart_ms=90_000)  # beyond the band: raised
    assert decide(d, prof, SLO, signals(1_000, 24.0 * 1.6, serving=2), EMPTY_MEMORY, 2, 1_000, f).target == 3
