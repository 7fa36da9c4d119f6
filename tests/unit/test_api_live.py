"""The lease holder's live decision as an ``Explain`` message (``convert.live_to_proto``): the
forecast the decision read (usable or not), whether a Standby wake fits the SLO, and the target
before the forecast raised it."""

from __future__ import annotations

import dataclasses
import math

from controlplane.api import convert as cv
from controlplane.core.reconcile import LiveDecision
from controlplane.core.scaling import ScaleReason, decide
from controlplane.domain.demand import BUCKET_MS, Forecast
from controlplane.domain.profiles import PROFILES
from controlplane.domain.records import EMPTY_MEMORY
from controlplane.domain.tenants import Engine, Slo
from tests.unit.test_scaling import signals
from tests.unit.test_scaling_forecast import dep

SLO = Slo(ttft_p99_ms=2_000)


def fc(**kw: object) -> Forecast:
    base = dict(at_ms=1_700_000_000_000, ready=3.2, total=7.5, expected=2.4, wake_ms=1_000, restart_ms=30_000,
                quantile=0.9, buckets=120, mape=0.184)
    return Forecast(**{**base, **kw})  # type: ignore[arg-type]


def live(forecast: Forecast | None, **kw: object) -> LiveDecision:
    base = dict(at_ms=1_700_000_001_000, current=1, target=4, granted=4, reason="forecast", message="m",
                proposals={"concurrency": 1}, panic=False, signals={"concurrency": 24.0}, warm_pool=4, forecast=forecast)
    return LiveDecision(**{**base, **kw})  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class _WithReactive:
    """A live decision that carries the target before the forecast (``ScaleDecision.reactive``)."""

    target: int
    reactive: int | None
    reason: str = "forecast"
    warm_pool: int = 4
    forecast: Forecast | None = None


def test_a_live_decision_without_a_forecast_has_none() -> None:
    out = cv.live_to_proto(live(None, reason="scale_up", warm_pool=1), dep(), SLO)
    assert not out.HasField("forecast") and not out.HasField("target_before_forecast")
    assert (out.target, out.granted, out.warm_pool, out.reason, dict(out.proposals)) == (4, 4, 1, "scale_up", {"concurrency": 1})


def test_a_usable_forecast_carries_every_field_and_the_wake_fit() -> None:
    out = cv.live_to_proto(live(fc()), dep(), SLO)
    f = out.forecast
    assert out.HasField("forecast") and f.usable and f.note == ""
    assert (f.ready, f.total, f.expected, f.wake_ms, f.restart_ms) == (3.2, 7.5, 2.4, 1_000, 30_000)
    assert (f.quantile, f.buckets, f.bucket_ms, f.at_ms) == (0.9, 120, BUCKET_MS, 1_700_000_000_000)
    assert f.HasField("mape") and math.isclose(f.mape, 0.184)
    assert f.wake_fits  # vLLM, 1 s wake + 0.5 s reaction within a 2 s SLO


def test_the_wake_fit_follows_the_engine_and_the_slo() -> None:
    slow = cv.live_to_proto(live(fc(wake_ms=4_000)), dep(), SLO).forecast
    mii = cv.live_to_proto(live(fc()), dep(engine=Engine.DEEPSPEED_MII), SLO).forecast
    tight = cv.live_to_proto(live(fc()), dep(), Slo(ttft_p99_ms=1_000)).forecast
    assert (slow.wake_fits, mii.wake_fits, tight.wake_fits) == (False, False, False)


def test_an_unusable_forecast_keeps_its_reason_and_no_mape() -> None:
    f = cv.live_to_proto(live(fc(ready=0.0, total=0.0, expected=0.0, mape=None, usable=False,
                                 note="too little history (12 of 60 buckets)"), reason="stable"), dep(), SLO).forecast
    assert not f.usable and f.note == "too little history (12 of 60 buckets)"
    assert not f.HasField("mape") and (f.ready, f.total, f.buckets) == (0.0, 0.0, 120)


def test_the_target_before_the_forecast_is_set_only_when_the_forecast_raised_it() -> None:
    raised = cv.live_to_proto(_WithReactive(target=4, reactive=1, forecast=fc()), dep(), SLO)
    assert raised.HasField("target_before_forecast") and (raised.target_before_forecast, raised.target) == (1, 4)
    held = cv.live_to_proto(_WithReactive(target=1, reactive=1, forecast=fc()), dep(), SLO)  # quota held the raise
    assert held.HasField("target_before_forecast") and held.target_before_forecast == held.target == 1
    reactive = cv.live_to_proto(_WithReactive(target=3, reactive=3, reason="scale_up", forecast=fc()), dep(), SLO)
    none = cv.live_to_proto(_WithReactive(target=3, reactive=None, reason="scale_up"), dep(), SLO)
    plain = cv.live_to_proto(live(fc()), dep(), SLO)  # a holder whose live decision has no ``reactive``
    assert not any(m.HasField("target_before_forecast") for m in (reactive, none, plain))


def test_a_real_forecast_decision_converts_with_its_numbers() -> None:
    d = dep()
    dec = decide(d, PROFILES[d.model], SLO, signals(1_000, 24.0, serving=1), EMPTY_MEMORY, 1, 1_000, fc())
    assert dec.reason is ScaleReason.FORECAST and dec.reactive is not None and dec.reactive < dec.target
    out = cv.live_to_proto(_WithReactive(target=dec.target, reactive=dec.reactive, warm_pool=dec.warm_pool,
                                         forecast=dec.forecast), d, SLO)
    assert (out.target_before_forecast, out.target, out.warm_pool) == (dec.reactive, dec.target, dec.warm_pool)
    assert out.forecast.wake_fits and out.forecast.ready == 3.2


def test_the_unknown_load_signals_reach_the_explain_message() -> None:
    from controlplane.core import reconcile
    from controlplane.core.signals import FilteredSignals

    out = cv.live_to_proto(live(None, reason="unknown_load", unknown=("concurrency", "kv_usage")), dep(), SLO)
    assert list(out.unknown_signals) == ["concurrency", "kv_usage"]
    assert list(cv.live_to_proto(live(None), dep(), SLO).unknown_signals) == []
    sig = FilteredSignals(0, 2, {"ttft_p99_ms": 10.0}, {}, 10.0, unknown=frozenset({"kv_usage"}),
                          partial=frozenset({"concurrency"}))
    assert reconcile._unknown_of(sig) == ("concurrency", "kv_usage") and reconcile._unknown_of(None) == ()
