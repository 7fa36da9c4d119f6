"""Signal filters: table tests that narrate time, and properties against a naive reference."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.signals import (
    BUCKET_MS,
    EMPTY_FILTER,
    EMPTY_SIGNALS,
    SIGNALS,
    SignalMemory,
    WindowFilter,
    aggregate,
    filter_of,
    filtered,
    latest_mean,
    observe,
    update,
    window_mean,
)
from controlplane.domain.observations import DeploymentSignals, InstanceSample
from controlplane.domain.tenants import ScalingPolicy

POLICY = ScalingPolicy()  # stable 30 s, panic 3 s, half-life 4 s


def feed(samples: list[tuple[int, float]], *, window_ms: int = 3_000, half_life_ms: int = 1_000) -> WindowFilter:
    f = EMPTY_FILTER
    for t, v in samples:
        f = observe(f, v, t, window_ms=window_ms, half_life_ms=half_life_ms)
    return f


def sig(at_ms: int, running: int = 0, waiting: int = 0, *, serving: int = 1, kv: float = 0.0,
        prompt_tps: float = 0.0, gen_tps: float = 0.0, ttft: float | None = None) -> DeploymentSignals:
    return DeploymentSignals(at_ms, serving, running, waiting, kv, prompt_tps, gen_tps, ttft)


# --- WindowFilter: narrated tables ---------------------------------------------------------------


def test_first_sample_initialises_the_ewma_and_opens_a_bucket() -> None:
    f = feed([(1_100, 8.0)])
    assert f.ewma == 8.0
    assert f.ewma_at_ms == 1_100
    assert f.buckets == ((1_000, 8.0, 1),)


def test_samples_in_the_same_250ms_bucket_merge() -> None:
    f = feed([(1_000, 2.0), (1_100, 4.0), (1_249, 6.0), (1_250, 10.0)])
    assert f.buckets == ((1_000, 12.0, 3), (1_250, 10.0, 1))
    assert window_mean(f, 1_250, 3_000) == pytest.approx(22.0 / 4)


@pytest.mark.parametrize(
    ("dt_ms", "expected"),
    [
        (0, 0.0),  # same instant: covers no time, does not move the EWMA
        (1_000, 5.0),  # one half-life: half way
        (2_000, 7.5),  # two half-lives: three quarters
        (250, 10.0 * (1 - 2 ** -0.25)),
    ],
)
def test_ewma_moves_by_one_minus_two_to_the_minus_dt_over_half_life(dt_ms: int, expected: float) -> None:
    f = feed([(10_000, 0.0), (10_000 + dt_ms, 10.0)], half_life_ms=1_000)
    assert f.ewma == pytest.approx(expected)


def test_a_late_sample_leaves_the_ewma_alone_but_lands_in_its_bucket() -> None:
    f = feed([(5_000, 4.0), (4_300, 100.0)])
    assert f.ewma == 4.0
    assert f.ewma_at_ms == 5_000
    assert f.buckets == ((4_250, 100.0, 1), (5_000, 4.0, 1))


def test_buckets_that_leave_the_window_are_dropped() -> None:
    # t=0..2750 fills 12 buckets of a 3 s window; at t=3000 the bucket starting at 0 is out.
    f = feed([(t, 1.0) for t in range(0, 3_001, BUCKET_MS)])
    assert f.buckets[0][0] == 250
    assert len(f.buckets) == 12
    # a long gap empties the window except for the new sample
    f = observe(f, 7.0, 60_000, window_ms=3_000, half_life_ms=1_000)
    assert f.buckets == ((60_000, 7.0, 1),)


def test_window_mean_counts_buckets_whose_start_lies_in_the_half_open_window() -> None:
    f = feed([(0, 100.0), (1_000, 10.0), (2_000, 20.0)], window_ms=10_000)
    assert window_mean(f, 2_000, 2_000) == pytest.approx(15.0)  # bucket 0 is at now - window: out
    assert window_mean(f, 2_000, 2_001) == pytest.approx(130.0 / 3)  # now it is in
    assert window_mean(f, 1_500, 1_000) == pytest.approx(10.0)  # bucket 2000 is in the future
    assert window_mean(f, 20_000, 1_000) is None
    assert window_mean(EMPTY_FILTER, 0, 1_000) is None


def test_latest_mean_is_the_newest_bucket_in_the_window() -> None:
    f = feed([(0, 1.0), (250, 3.0), (300, 5.0)])
    assert latest_mean(f, 300, 3_000) == pytest.approx(4.0)
    assert latest_mean(f, 3_400, 3_000) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_samples_are_ignored(bad: float) -> None:
    f = feed([(0, 2.0)])
    assert observe(f, bad, 250, window_ms=3_000, half_life_ms=1_000) == f


# --- WindowFilter: properties against recomputation from the raw samples --------------------------

samples_st = st.lists(
    st.tuples(st.integers(0, 1_500), st.floats(0, 1_000, allow_nan=False)), min_size=1, max_size=60
)


def as_timeline(steps: list[tuple[int, float]], start: int) -> list[tuple[int, float]]:
    out, t = [], start
    for dt, v in steps:
        t += dt
        out.append((t, v))
    return out


def naive_window_mean(raw: list[tuple[int, float]], now: int, window: int) -> float | None:
    inside = [v for t, v in raw if now - window < t - t % BUCKET_MS <= now]
    return sum(inside) / len(inside) if inside else None


def naive_ewma(raw: list[tuple[int, float]], half_life: int) -> float:
    e, at = raw[0][1], raw[0][0]
    for t, v in raw[1:]:
        e += (1 - 2 ** (-(t - at) / half_life)) * (v - e)
        at = t
    return e


@settings(max_examples=150)
@given(
    steps=samples_st,
    start=st.integers(-5_000, 5_000),
    window=st.integers(250, 8_000),
    half_life=st.integers(1, 10_000),
    query_back=st.integers(0, 9_000),
    ahead=st.integers(0, 3_000),
)
def test_window_mean_and_ewma_match_the_naive_reference(
    steps: list[tuple[int, float]], start: int, window: int, half_life: int, query_back: int, ahead: int
) -> None:
    raw = as_timeline(steps, start)
    f = feed(raw, window_ms=window, half_life_ms=half_life)
    last = raw[-1][0]
    # any window no longer than the filter's, read at or after the newest sample
    q_window = max(1, window - query_back)
    got = window_mean(f, last + ahead, q_window)
    want = naive_window_mean(raw, last + ahead, q_window)
    assert (got is None) == (want is None)
    if want is not None:
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert f.ewma == pytest.approx(naive_ewma(raw, half_life), rel=1e-9, abs=1e-9)
    assert f.ewma_at_ms == last
    # bounded, ordered, and only what the window needs
    starts = [b[0] for b in f.buckets]
    assert starts == sorted(set(starts))
    assert len(f.buckets) <= window // BUCKET_MS + 1
    assert all(s > last - window for s in starts)
    assert sum(b[2] for b in f.buckets) == sum(1 for t, _ in raw if t - t % BUCKET_MS > last - window)


# --- SignalMemory ---------------------------------------------------------------------------------


def test_update_feeds_every_signal_and_skips_a_missing_ttft() -> None:
    mem = update(
        EMPTY_SIGNALS, sig(1_000, running=10, waiting=5, serving=4, kv=0.5, prompt_tps=700.0, gen_tps=200.0),
        POLICY, 1_000,
    )
    assert SIGNALS == ("concurrency", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p99_ms",
                       "queue_p95_ms")
    assert [name for name, _ in mem.filters] == list(SIGNALS)
    assert mem.last_ms == 1_000
    assert filter_of(mem, "concurrency").ewma == 15.0
    assert filter_of(mem, "kv_usage").ewma == 2.0  # total: 4 serving x 0.5
    assert filter_of(mem, "prompt_tokens_per_s").ewma == 700.0
    assert filter_of(mem, "generation_tokens_per_s").ewma == 200.0
    assert filter_of(mem, "tokens_per_s") == EMPTY_FILTER  # the old combined signal is gone
    assert filter_of(mem, "ttft_p99_ms") == EMPTY_FILTER
    mem = update(mem, sig(1_250, ttft=300.0), POLICY, 1_250)
    assert filter_of(mem, "ttft_p99_ms").buckets == ((1_250, 300.0, 1),)


def test_update_ignores_a_sample_older_than_the_newest() -> None:
    mem = update(EMPTY_SIGNALS, sig(5_000, running=10), POLICY, 5_000)
    assert update(mem, sig(4_000, running=99), POLICY, 4_000) is mem


def test_filter_keeps_the_longer_of_the_two_windows() -> None:
    policy = ScalingPolicy(stable_window_ms=6_000, panic_window_ms=1_000)
    mem = EMPTY_SIGNALS
    for t in range(0, 20_001, 250):
        mem = update(mem, sig(t, running=1), policy, t)
    assert len(filter_of(mem, "concurrency").buckets) == 6_000 // BUCKET_MS


def test_filtered_is_none_without_samples() -> None:
    assert filtered(EMPTY_SIGNALS, sig(0), POLICY, 0) is None
    mem = update(EMPTY_SIGNALS, sig(0, running=3), POLICY, 0)
    assert filtered(mem, sig(0), POLICY, 30_000) is None  # the only sample left the stable window
    assert filtered(SignalMemory(filters=()), sig(0), POLICY, 0) is None


def test_rising_load_reads_the_ewma_falling_load_reads_the_window_mean() -> None:
    """Narrated: 20 s at 10, then 20 s at 50, then 10 s at 10; one sample per 250 ms tick."""
    policy = POLICY
    mem = EMPTY_SIGNALS
    load = [(t, 10) for t in range(0, 20_000, 250)] + [(t, 50) for t in range(20_000, 40_000, 250)]
    load += [(t, 10) for t in range(40_000, 50_000, 250)]
    seen = {}
    for t, c in load:
        mem = update(mem, sig(t, running=c), policy, t)
        seen[t] = filtered(mem, sig(t), policy, t)
    rising = seen[24_000]  # 4 s (one half-life) after the step
    assert rising.stable["concurrency"] == pytest.approx(filter_of_at(load, 24_000, policy)[1])
    assert rising.stable["concurrency"] == pytest.approx(30.0, abs=1.0)  # EWMA half way, mean lags
    assert rising.panic["concurrency"] == pytest.approx(50.0)
    assert rising.latest["concurrency"] == 50.0
    falling = seen[44_000]
    mean, ewma = filter_of_at(load, 44_000, policy)
    assert falling.stable["concurrency"] == pytest.approx(mean)  # the window mean holds it up
    assert mean == pytest.approx((23 * 10 + 80 * 50 + 17 * 10) / 120)
    assert ewma < mean - 5
    assert falling.panic["concurrency"] == pytest.approx(10.0)


def filter_of_at(load: list[tuple[int, int]], now: int, policy: ScalingPolicy) -> tuple[float, float]:
    """(naive stable-window mean, naive EWMA) at ``now``."""
    raw = [(t, float(c)) for t, c in load if t <= now]
    return naive_window_mean(raw, now, policy.stable_window_ms), naive_ewma(raw, policy.ewma_half_life_ms)


def test_filtered_reports_serving_and_the_stable_ttft() -> None:
    mem = EMPTY_SIGNALS
    mem = update(mem, sig(0, running=4, ttft=800.0), POLICY, 0)
    mem = update(mem, sig(250, running=4, ttft=None), POLICY, 250)
    f = filtered(mem, sig(250, serving=3), POLICY, 250)
    assert f is not None
    assert f.serving == 3
    assert f.at_ms == 250
    assert f.ttft_p99_ms == 800.0
    f = filtered(mem, sig(5_000, serving=3), POLICY, 5_000)
    assert "ttft_p99_ms" not in f.panic and "concurrency" not in f.latest  # nothing in the last 3 s
    assert f.stable["ttft_p99_ms"] == 800.0


# --- aggregate ------------------------------------------------------------------------------------


def sample(iid: str, running: int, waiting: int, kv: float, prompt_tps: float, gen_tps: float,
           ttft: float | None, used: int = 0, total: int = 0) -> InstanceSample:
    return InstanceSample(iid, "d", 0, running, waiting, kv, prompt_tps, gen_tps, ttft, used, total)


def test_aggregate_sums_demand_means_kv_and_bounds_ttft_by_the_max() -> None:
    got = aggregate(
        [
            sample("a", 10, 2, 0.5, 1_000.0, 250.0, 400.0, 40, 80),
            sample("b", 20, 0, 0.9, 3_000.0, 0.0, None, 60, 80),
            sample("c", 0, 1, 0.1, 0.0, 125.0, 900.0),
        ],
        serving=3,
        gateway_waiting=7,
        now_ms=1_234,
    )
    assert got == DeploymentSignals(
        at_ms=1_234, serving=3, running=30, waiting=10, kv_usage=0.5,
        prompt_tokens_per_s=4_000.0, generation_tokens_per_s=375.0, ttft_p99_ms=900.0, gpu_mem_frac=0.75,
    )


def test_aggregate_of_nothing_keeps_the_gateway_queue() -> None:
    got = aggregate([], serving=0, gateway_waiting=5, now_ms=9)
    assert got == DeploymentSignals(9, 0, 0, 5, 0.0, 0.0, 0.0, None, 0.0)
    assert got.concurrency == 5


def test_aggregate_skips_broken_readings() -> None:
    got = aggregate(
        [sample("a", 1, 0, math.nan, math.inf, 4.0, -1.0), sample("b", 1, 0, 1.7, 10.0, math.nan, math.nan)],
        serving=2, gateway_waiting=0, now_ms=0,
    )
    assert got.kv_usage == 1.0  # the NaN is skipped, 1.7 clamped to a full cache
    assert got.prompt_tokens_per_s == 10.0  # a's inf skipped
    assert got.generation_tokens_per_s == 4.0  # b's NaN skipped
    assert got.ttft_p99_ms is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -5.0])
def test_aggregate_sums_each_token_rate_and_skips_its_broken_readings_independently(bad: float) -> None:
    got = aggregate(
        [
            sample("a", 0, 0, 0.2, 100.0, 30.0, None),
            sample("b", 0, 0, 0.2, bad, 40.0, None),  # broken prompt rate, usable generation rate
            sample("c", 0, 0, 0.2, 200.0, bad, None),  # usable prompt rate, broken generation rate
            sample("d", 0, 0, 0.2, 0.5, 0.25, None),
        ],
        serving=4, gateway_waiting=0, now_ms=0,
    )
    assert got.prompt_tokens_per_s == 300.5
    assert got.generation_tokens_per_s == 70.25
