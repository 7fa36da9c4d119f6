"""The forecast: the model's numbers against brute force, the service's cadence, fallbacks,
scoring, and that a new lease holder forecasts the same from the replicated history."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain import commands as c
from controlplane.domain.demand import BUCKET_MS, to_deci
from controlplane.domain.ids import DeploymentId, PoolId, TenantId
from controlplane.domain.state import ControlState, apply
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.forecast import model
from controlplane.forecast.service import ForecastConfig, HistoryForecaster
from raft.codec import decode_state, encode_state
from raft.lease import LeaseRecord

DID = DeploymentId("acme/chat")


@given(st.lists(st.floats(0, 50), min_size=3, max_size=40), st.integers(1, 10))
def test_horizon_peaks_are_the_maxima_of_the_next_k_buckets(xs: list[float], k: int) -> None:
    if len(xs) <= k:
        return
    got = model.horizon_peaks(np.array([xs]), k)[0]
    assert list(got) == [max(xs[i + 1:i + k + 1]) for i in range(len(xs) - k)]


@given(st.lists(st.floats(-100, 100), min_size=2, max_size=60))
def test_slope_is_the_least_squares_fit_of_the_newest_buckets(xs: list[float]) -> None:
    tail = xs[-model.TREND_BUCKETS:]
    want = np.polyfit(np.arange(len(tail)), tail, 1)[0]
    assert math.isclose(model.slopes(np.array([xs]))[0], want, rel_tol=1e-6, abs_tol=1e-6)


def test_bursts_every_few_minutes_keep_what_a_burst_needs_and_quiet_keeps_nothing() -> None:
    bursty = np.zeros(360)
    bursty[::18] = 6.0  # a 6-replica burst every 3 minutes (one 10 s bucket)
    quiet = np.zeros(360)
    p = model.peaks(np.stack([bursty, quiet]), 1, 9, 0.9)
    assert p.total[0] == pytest.approx(6.0)  # half the 90 s horizons hold a burst: p90 covers it
    assert p.ready[0] == 0.0  # one 10 s bucket in 18 bursts: the next bucket rarely does
    assert (p.ready[1], p.total[1], p.expected[1]) == (0.0, 0.0, 0.0)


def test_a_rising_load_is_met_one_horizon_ahead() -> None:
    ramp = np.arange(100, dtype=float) * 0.1  # +0.1 replica per bucket
    p = model.peaks(ramp[None, :], 1, 9, 0.9)
    assert p.total[0] == pytest.approx(ramp[-1] + 0.9, abs=1e-9)  # the newest level + 9 buckets of rise
    assert p.ready[0] == pytest.approx(ramp[-1] + 0.1, abs=1e-9)
    falling = ramp[::-1].copy()
    assert model.peaks(falling[None, :], 1, 9, 0.9).total[0] >= falling[-1]  # never below now, no negative trend


# --- the service --------------------------------------------------------------------------------


def fleet(model_name: str = "llama3-70b-h100x4", engine: Engine = Engine.VLLM) -> ControlState:
    state = ControlState()
    assert apply(state, c.PutTenant(Tenant(TenantId("acme"), 1))).ok
    d = Deployment(DID, TenantId("acme"), engine, model_name, PoolId("h100"), 4)
    assert apply(state, c.PutDeployment(d)).ok
    return state


def record(state: ControlState, series: list[float], start_bucket: int = 1) -> int:
    """Record ``series`` (replicas per bucket); returns the end of the newest bucket."""
    end = 0
    for k, v in enumerate(series, start=start_bucket):
        end = k * BUCKET_MS
        assert apply(state, c.RecordDemand(end, ((DID, to_deci(v)),))).ok
    return end


def bursts(n: int) -> list[float]:
    return [6.0 if k % 18 == 0 else 0.5 for k in range(n)]


def test_too_little_history_is_reactive_with_a_reason_and_a_count() -> None:
    state = fleet()
    end = record(state, bursts(20))
    reasons: list[str] = []
    f = HistoryForecaster(on_fallback=reasons.append).forecasts(state, end)[DID]
    assert not f.usable and "too little history (20 of 60 buckets)" in f.note
    assert reasons == ["history"]


def test_a_history_that_stopped_is_not_used() -> None:
    state = fleet()
    end = record(state, bursts(100))
    f = HistoryForecaster().forecasts(state, end + 4 * BUCKET_MS)[DID]
    assert not f.usable and "history stopped" in f.note


def test_usable_forecast_has_the_profile_horizons_and_is_computed_once_per_bucket() -> None:
    state = fleet()
    end = record(state, bursts(100))
    svc = HistoryForecaster()
    f = svc.forecasts(state, end + 1)[DID]
    assert f.usable and (f.wake_ms, f.restart_ms) == (4_000, 90_000)
    assert f.total == pytest.approx(6.0) and f.ready >= 0.5 and f.buckets == 100
    record(state, [50.0], start_bucket=101)  # a new bucket, but the cadence has not come round
    assert svc.forecasts(state, end + 2)[DID] is f
    assert svc.forecasts(state, end + BUCKET_MS + 1)[DID].total >= 50.0  # the newest bucket (and its trend)


def test_an_engine_that_cannot_sleep_gets_no_wake_horizon() -> None:
    state = fleet("llama3-8b-h100", Engine.DEEPSPEED_MII)
    end = record(state, bursts(100))
    f = HistoryForecaster().forecasts(state, end)[DID]
    assert f.usable and f.wake_ms == 0 and f.ready == f.total


def test_a_failing_computation_costs_the_forecasts_not_the_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    state = fleet()
    end = record(state, bursts(100))
    reasons: list[str] = []
    svc = HistoryForecaster(on_fallback=reasons.append)

    def boom(*args: object) -> None:
        raise FloatingPointError("overflow")

    monkeypatch.setattr("controlplane.forecast.service.peaks", boom)
    assert svc.forecasts(state, end) == {}
    assert reasons == ["error"]


def test_a_non_finite_result_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    state = fleet()
    end = record(state, bursts(100))
    nan = np.array([math.nan])
    monkeypatch.setattr("controlplane.forecast.service.peaks", lambda *a: model.Peaks(nan, nan, nan))
    reasons: list[str] = []
    f = HistoryForecaster(on_fallback=reasons.append).forecasts(state, end)[DID]
    assert not f.usable and f.note == "forecast is not finite" and reasons == ["nan"]


def test_mape_scores_the_median_forecast_against_the_peak_that_came() -> None:
    state = fleet()
    end = record(state, [2.0] * 100)
    svc = HistoryForecaster()
    scores: list[float] = []
    svc = HistoryForecaster(on_score=scores.append)
    assert svc.forecasts(state, end)[DID].expected == pytest.approx(2.0)
    for k in range(1, 12):  # the load doubles: the forecast made at `end` was half the peak
        record(state, [4.0], start_bucket=100 + k)
        svc.forecasts(state, end + k * BUCKET_MS)
    assert scores and scores[0] == pytest.approx(0.5)
    assert svc.mape(DID) is not None and 0 < svc.mape(DID) <= 0.5


def test_a_new_lease_holder_forecasts_the_same_from_the_replicated_history() -> None:
    """The follower's state comes from a snapshot (as after a restart) plus the same log."""
    state = fleet()
    end = record(state, bursts(120))
    follower, _ = decode_state(encode_state(state, LeaseRecord()))
    old, new = HistoryForecaster(), HistoryForecaster()
    assert old.forecasts(state, end) == new.forecasts(follower, end)
    series = bursts(7)
    record(state, series, start_bucket=121)
    record(follower, series, start_bucket=121)
    later = end + 7 * BUCKET_MS
    a, b = old.forecasts(state, later)[DID], new.forecasts(follower, later)[DID]
    assert (a.ready, a.total, a.expected, a.usable) == (b.ready, b.total, b.expected, b.usable)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 200), min_size=61, max_size=360), st.sampled_from([0.5, 0.9, 0.99]))
def test_forecasts_are_finite_ordered_and_never_below_the_newest_bucket(series: list[float], q: float) -> None:
    state = fleet()
    end = record(state, series)
    f = HistoryForecaster(ForecastConfig(quantile=q)).forecasts(state, end)[DID]
    newest = to_deci(series[-1]) / 10
    assert f.usable and all(math.isfinite(v) for v in (f.ready, f.total, f.expected))
    assert newest - 1e-9 <= f.ready <= f.total
