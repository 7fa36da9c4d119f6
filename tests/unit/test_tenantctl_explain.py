"""``tenantctl explain``'s forecast block against the fake API (tests/unit/test_tenantctl_fake.py):
a forecast that started capacity ahead of demand, one that fell back to reactive scaling, one whose
wake does not fit the SLO, none at all, and the same in ``-o json``."""

from __future__ import annotations

import json

import pytest

from controlplane.api.v1 import api_pb2
from tests.unit.test_tenantctl_cli import Ctl, write_config
from tests.unit.test_tenantctl_fake import ADMIN_TOKEN, FakeGroup

TENANTS = """
apiVersion: controlplane.io/v1
kind: Tenant
metadata: {name: team-a}
spec: {priority: 1, quota: {h100: 8}}
---
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {name: chat}
spec: {tenant: team-a, engine: vllm, model: llama3-8b-h100, pool: h100}
"""


@pytest.fixture
def group():
    g = FakeGroup(1)
    yield g
    g.stop()


@pytest.fixture
def ctl(tmp_path, group) -> Ctl:
    cfg = write_config(tmp_path / "tenantctl.yaml", [
        {"name": "local", "endpoints": group.addresses, "insecure": True, "token": ADMIN_TOKEN}], "local")
    c = Ctl(cfg)
    f = tmp_path / "o.yaml"
    f.write_text(TENANTS)
    assert c("apply", "-f", str(f))[0] == 0
    return c


def forecast(**kw: object) -> api_pb2.Forecast:
    base = dict(usable=True, ready=3.2, total=7.5, expected=2.4, wake_ms=1_000, restart_ms=30_000, quantile=0.9,
                buckets=120, bucket_ms=10_000, mape=0.184, at_ms=1_700_000_000_000, wake_fits=True)
    return api_pb2.Forecast(**{**base, **kw})  # type: ignore[arg-type]


def live(f: api_pb2.Forecast | None, **kw: object) -> api_pb2.LiveDecision:
    base = dict(at_ms=1_700_000_001_000, current=1, target=4, granted=4, reason="forecast", warm_pool=4,
                target_before_forecast=1, message="forecast: demand may reach 3.20 ... 1 -> 4 ahead of demand",
                proposals={"concurrency": 1}, signals={"concurrency": 24.0})
    out = api_pb2.LiveDecision(**{**base, **kw})  # type: ignore[arg-type]
    if f is not None:
        out.forecast.CopyFrom(f)
    return out


def block(out: str) -> list[str]:
    """The lines of the forecast block (its header to the decision history)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Forecast"))
    end = next(i for i, line in enumerate(lines) if line.startswith("Decisions"))
    return [line.rstrip() for line in lines[start:end]]


def test_capacity_started_ahead_of_demand(ctl, group) -> None:
    group.store.live = live(forecast())
    rc, out, err = ctl("explain", "chat")
    assert rc == 0, err
    assert "target:         4 (policy; the load alone asks for 1)" in out
    assert "warm pool:      4 Standby granted" in out
    lines = block(out)
    assert lines[0].startswith("Forecast (history to ")
    assert lines[1:] == [
        "  status:         usable",
        "  ready:          3.20 replicas serving within the wake horizon 1 s",
        "  total:          7.50 replicas serving or asleep within the restart horizon 30 s",
        "  expected:       2.40 replicas (median peak within the restart horizon 30 s)",
        "  quantile:       p90",
        "  history:        120 buckets x 10 s (20 min)",
        "  MAPE:           18.4 %",
        "  warm path:      capacity beyond 3.20 may sleep (a wake of 1 s fits the TTFT SLO)",
        "  ahead:          capacity started ahead of demand: target 1 -> 4 (the load asks for 1); "
        "the warm pool holds 4 Standby for the restart horizon 30 s",
    ]


def test_a_wake_that_does_not_fit_keeps_everything_serving(ctl, group) -> None:
    group.store.live = live(forecast(wake_ms=4_000, wake_fits=False, mape=None), target=8, target_before_forecast=2,
                            warm_pool=0)
    lines = block(ctl("explain", "chat")[1])
    assert "  warm path:      all of it serves (a wake of 4 s does not fit the TTFT SLO)" in lines
    assert ("  ahead:          capacity started ahead of demand: target 2 -> 8 (the load asks for 2); "
            "no Standby: everything the forecast needs serves") in lines
    assert not any("MAPE" in line for line in lines)  # none scored yet


def test_a_raise_the_quota_held_starts_nothing_ahead(ctl, group) -> None:
    group.store.live = live(forecast(), target=2, target_before_forecast=2, warm_pool=0)
    lines = block(ctl("explain", "chat")[1])
    assert "  ahead:          none started: the tenant's quota held the forecast's raise (target stays 2)" in lines


def test_an_engine_that_cannot_sleep_has_no_wake_horizon(ctl, group) -> None:
    group.store.live = live(forecast(wake_ms=0, wake_fits=False), warm_pool=0)
    lines = block(ctl("explain", "chat")[1])
    assert not any(line.lstrip().startswith("ready:") for line in lines)
    assert "  horizons:       no wake horizon: the engine cannot sleep; restart horizon 30 s" in lines
    assert "  warm path:      all of it serves (the engine cannot sleep)" in lines


def test_a_forecast_that_fell_back_says_why_and_nothing_ahead(ctl, group) -> None:
    f = forecast(usable=False, note="too little history (12 of 60 buckets)", ready=0, total=0, expected=0, buckets=12,
                 mape=None, wake_fits=True)
    group.store.live = live(f, reason="stable", target=1, warm_pool=1, message="")
    group.store.live.ClearField("target_before_forecast")
    rc, out, _ = ctl("explain", "chat")
    assert rc == 0 and "target:         1 (policy)\n" in out
    assert block(out)[1:] == [
        "  status:         not used, scaling is reactive: too little history (12 of 60 buckets)",
        "  horizons:       wake horizon 1 s; restart horizon 30 s",
        "  quantile:       p90",
        "  history:        12 buckets x 10 s (2 min)",
    ]


def test_no_forecast_is_said_so(ctl, group) -> None:
    group.store.live = live(None, reason="scale_up", target=3, warm_pool=1, message="")
    group.store.live.ClearField("target_before_forecast")
    out = ctl("explain", "chat")[1]
    assert "Forecast: none computed (reactive scaling)" in out and "ahead" not in out and "(policy)" in out


def test_json_output_carries_the_forecast(ctl, group) -> None:
    group.store.live = live(forecast())
    rc, out, _ = ctl("explain", "chat", "-o", "json")
    data = json.loads(out)["live"]
    assert rc == 0 and (data["target"], data["target_before_forecast"], data["warm_pool"]) == (4, 1, 4)
    f = data["forecast"]
    assert f["usable"] and f["wake_fits"] and (f["ready"], f["total"], f["restart_ms"], f["buckets"]) == (3.2, 7.5, 30_000, 120)
    assert f["mape"] == pytest.approx(0.184)


def test_an_unknown_load_is_named_with_what_it_holds(ctl, group) -> None:
    group.store.live = live(None, reason="unknown_load", target=6, current=6, granted=6, warm_pool=0,
                            message="scale-down to 4 held at 6: no load signal is known (concurrency, kv_usage)",
                            unknown_signals=["concurrency", "kv_usage"])
    group.store.live.ClearField("target_before_forecast")
    out = ctl("explain", "chat")[1]
    assert ("  load unknown:   concurrency, kv_usage (not reported by every serving instance: no scale-down "
            "while so)") in out.replace("\n    ", " ")
    group.store.live.ClearField("unknown_signals")
    assert "load unknown" not in ctl("explain", "chat")[1]
