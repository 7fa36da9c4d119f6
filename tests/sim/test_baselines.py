"""The baseline autoscalers (``controlplane.sim.baselines``) on hand-computed scenarios.

Pure: virtual time passed in, no sleeps, no simulation (the run-level check, the clairvoyant bound
below every policy's GPU-hours, is in ``test_bench_policies.py``).
"""

from __future__ import annotations

import pytest

from controlplane.domain.ids import DeploymentId, InstanceId, PoolId, TenantId
from controlplane.domain.instances import InstanceState
from controlplane.domain.profiles import PROFILES
from controlplane.domain.tenants import Deployment, Engine
from controlplane.sim.baselines import (
    HpaAutoscaler,
    HpaConfig,
    KpaAutoscaler,
    OraclePolicy,
    PodView,
    PolicyView,
    RequestShape,
    StaticPolicy,
    hpa_proposal,
    oracle_schedule,
    required_replicas,
)

S = InstanceState
DEP = DeploymentId("d")


def deployment(lo: int = 1, hi: int = 64) -> Deployment:
    return Deployment(DEP, TenantId("t"), Engine.VLLM, "llama3-8b-h100", PoolId("h100"), 1,
                      min_replicas=lo, max_replicas=hi, warm_pool=0)


def ready(n: int, concurrency: float) -> tuple[PodView, ...]:
    return tuple(PodView(InstanceId(f"p{i:03d}"), S.READY, concurrency) for i in range(n))


# --- HPA ---------------------------------------------------------------------------------------


def _hpa_burst(behavior: bool) -> list[int]:
    """Load 100x the target from t=0; every replica asked for serves at once (instant pods): the
    path is limited only by the HPA's rate rules. Returns the desired count after each sync."""
    hpa = HpaAutoscaler(HpaConfig(target_per_pod=24.0, behavior=behavior))
    d, current, path = deployment(), 1, [1]
    for t in range(0, 120_001, 250):
        current = hpa.target(d, PolicyView(current, ready(current, 2400.0)), t)
        if current != path[-1]:
            path.append(current)
            assert t % 15_000 == 0, "the HPA acts only on its 15 s sync"
    return path


def test_hpa_default_behavior_needs_five_15s_steps_from_1_to_64() -> None:
    # max(Pods 4, Percent 100) per 15 s: 1+4=5, then doubling: 10, 20, 40, then the 64 cap.
    assert _hpa_burst(behavior=True) == [1, 5, 10, 20, 40, 64]


def test_hpa_without_behavior_doubles_with_a_floor_of_4() -> None:
    # Legacy path: scale-up limit max(2 x current, 4).
    assert _hpa_burst(behavior=False) == [1, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("behavior", [True, False])
def test_hpa_scale_down_waits_300s(behavior: bool) -> None:
    hpa = HpaAutoscaler(HpaConfig(target_per_pod=24.0, behavior=behavior))
    d, current = deployment(), 10
    assert hpa.target(d, PolicyView(current, ready(10, 24.0)), 0) == 10  # at target: stays
    history = {}
    for t in range(15_000, 330_001, 15_000):  # load gone from t=15 s on
        current = hpa.target(d, PolicyView(current, ready(current, 0.0)), t)
        history[t] = current
    # The recommendation 10 made at t=0 holds every scale-down for 300 s.
    assert all(history[t] == 10 for t in history if t < 300_000)
    if behavior:
        assert history[300_000] == 1  # strictly older than the window: Percent 100 lets it go at once
    else:
        assert history[300_000] == 10 and history[315_000] == 1  # the legacy window includes its edge


def test_hpa_tolerance_and_pod_rules() -> None:
    t = 24.0
    assert hpa_proposal(ready(4, 26.0), 4, t, 0.1) == 4  # ratio 1.083: within tolerance
    assert hpa_proposal(ready(4, 36.0), 4, t, 0.1) == 6  # ratio 1.5: ceil(1.5 x 4)
    # Unready (Pending) pods during a scale-up count as 0: [48, 48, 0] -> ratio 32/24 -> ceil(1.333 x 3) = 4.
    pods = ready(2, 48.0) + (PodView(InstanceId("new"), S.PENDING, None),)
    assert hpa_proposal(pods, 3, t, 0.1) == 4
    # Missing pods (running, no metric) during a scale-down count as the target: [12, 24] -> 0.75 -> 2.
    pods = ready(1, 12.0) + (PodView(InstanceId("warming"), S.WARMING, None),)
    assert hpa_proposal(pods, 3, t, 0.1) == 2
    # ...and as 0 during a scale-up: [48, 0] -> ratio 1.0: within tolerance -> keep current.
    pods = ready(1, 48.0) + (PodView(InstanceId("warming"), S.WARMING, None),)
    assert hpa_proposal(pods, 2, t, 0.1) == 2
    # Draining (deleted) pods are ignored; no sample at all: invalid metric.
    assert hpa_proposal(ready(2, 24.0) + (PodView(InstanceId("x"), S.DRAINING, None),), 3, t, 0.1) == 3
    assert hpa_proposal((PodView(InstanceId("w"), S.WARMING, None),), 1, t, 0.1) is None


# --- KPA ---------------------------------------------------------------------------------------


def _kpa_feed(kpa: KpaAutoscaler, until_ms: int, start_ms: int, pods: int, per_pod: float) -> dict[int, int | None]:
    """Scrape every 1 s (per-pod concurrency x pods) and tick every 2 s; returns tick -> desired."""
    out = {}
    for t in range(start_ms, until_ms + 1, 1000):
        kpa.record(DEP, t, per_pod * pods)
        if t % 2000 == 0:
            out[t] = kpa.tick(DEP, t, pods, 24.0)
    return out


def test_kpa_enters_panic_at_2x_and_holds_60s() -> None:
    below = KpaAutoscaler()
    _kpa_feed(below, 10_000, 0, 4, 41.0)  # 164 / 24 -> 7 pods: 1.75x the 4 ready
    assert not below.in_panic(DEP)
    kpa = KpaAutoscaler()
    ticks = _kpa_feed(kpa, 10_000, 0, 4, 48.0)  # 192 / 24 -> 8 pods: exactly 2x the 4 ready
    assert kpa.in_panic(DEP) and ticks[0] == 8
    # The load stops at t=11 s. The 6 s panic window averages 192 until t=10 s; at t=12 s it holds
    # four buckets of 192 and two of 0 (128 -> 6 pods, 1.5x): t=10 s is the last over-threshold tick.
    after = _kpa_feed(kpa, 120_000, 11_000, 4, 0.0)
    assert kpa.memory[DEP].panic_time_ms == 0
    for t, desired in sorted(after.items()):
        if t <= 70_000:
            assert desired == 8, (t, desired)  # panic: never below its peak, for 60 s after t=10 s
    # Out of panic on the first tick after 10 s + 60 s: the stable window is all zeros, so the
    # target is the scale-down floor, 4 ready / 2.
    assert after[72_000] == 2
    assert not kpa.in_panic(DEP)


def test_kpa_scale_down_at_most_half_per_tick() -> None:
    kpa = KpaAutoscaler()
    ready_pods, path = 16, []
    for t in range(0, 12_001, 1000):
        kpa.record(DEP, t, 0.0)  # no load at all
        if t % 2000 == 0:
            desired = kpa.tick(DEP, t, ready_pods, 24.0)
            path.append(desired)
            ready_pods = desired  # instant scale-down
    assert path[:5] == [8, 4, 2, 1, 0]


def test_kpa_follows_the_simulator_view_on_its_2s_tick() -> None:
    kpa = KpaAutoscaler(seed=1)
    d, current = deployment(), 4
    seen = []
    for t in range(0, 8_001, 250):
        current = kpa.target(d, PolicyView(current, ready(4, 48.0)), t)
        seen.append((t, current))
    assert dict(seen)[0] == 8  # panic on the first tick: 192 / 24 = 8 pods
    changes = [t for (t, c), (_, prev) in zip(seen[1:], seen) if c != prev]
    assert all(t % 2000 == 0 for t in changes)


def test_kpa_scraper_samples_a_subset_of_many_pods_and_scales_to_all() -> None:
    kpa = KpaAutoscaler(seed=3)
    assert kpa.scrape(ready(3, 10.0)) == 30.0
    assert kpa.scrape(ready(12, 10.0)) == pytest.approx(120.0)  # 7 of 12 sampled, averaged, x 12


# --- static and oracle -------------------------------------------------------------------------


def test_static_never_changes() -> None:
    pol, d = StaticPolicy({DEP: 6}), deployment()
    assert pol.initial_replicas(d) == 6
    for t, load in ((0, 0.0), (1000, 500.0), (600_000, 0.0)):
        assert pol.target(d, PolicyView(6, ready(6, load)), t) == 6


def test_oracle_starts_each_instance_one_cold_start_ahead() -> None:
    need = [1.0] * 100 + [3.2] * 10 + [1.0] * 100
    sched = oracle_schedule(need, lead_ms=30_000, lo=1, hi=8)
    assert sched[69] == 1 and sched[70] == 4  # 30 s before the second-100 need
    assert sched[109] == 4 and sched[110] == 1  # released when it is no longer needed
    pol = OraclePolicy({DEP: sched})
    assert pol.initial_replicas(deployment()) == 1
    assert pol.target(deployment(), PolicyView(1, ()), 70_500) == 4


def test_required_replicas_counts_prefill_work_over_the_slo_window() -> None:
    p = PROFILES["llama3-8b-h100"]  # 24,000 prompt tokens/s
    reqs = [RequestShape(0, 48_000, 1), RequestShape(1_000, 48_000, 1)]
    need = required_replicas(reqs, p, slo_ms=2_000, duration_s=4)
    assert need[0] == pytest.approx(1.0)  # 2 s of prefill over a 2 s window
    assert need[1] == pytest.approx(2.0)
    assert need[3] < 0.01  # only the one-token decodes
