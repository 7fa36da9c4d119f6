"""Circuit breaker (transition table, transcript, reference model) and equal-jitter backoff."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core import breaker as br
from controlplane.core.backoff import (
    MAX_SCHEDULE_LEN,
    backoff_bounds,
    backoff_ms,
    backoff_schedule,
    ceiling_ms,
)
from controlplane.core.breaker import (
    IGNORED,
    MAX_TRIPS,
    TRANSITIONS,
    BreakerConfig,
    BreakerEvent,
    IllegalBreakerTransition,
    admit,
    allows,
    breaker_key,
    on_failure,
    on_probe,
    on_success,
    probe_due,
    statistics,
    transition,
)
from controlplane.domain.errors import PermanentError, ValidationError
from controlplane.domain.records import CLOSED_BREAKER, BreakerPhase, BreakerRecord

P, E = BreakerPhase, BreakerEvent
PROPERTY = settings(max_examples=80, deadline=None)


class EdgeRng(random.Random):
    """Draws always the upper (or lower) end of ``randint``: makes jittered times exact in tables."""

    def __init__(self, high: bool = True) -> None:
        super().__init__(0)
        self.high = high
        self.calls = 0

    def randint(self, a: int, b: int) -> int:
        self.calls += 1
        return b if self.high else a


# --------------------------------------------------------------------------------------------------
# The table


EXPECTED_TABLE = [
    (P.CLOSED, E.SUCCESS, P.CLOSED),
    (P.CLOSED, E.FAILURE, P.OPEN),
    (P.OPEN, E.PROBE, P.HALF_OPEN),
    (P.HALF_OPEN, E.SUCCESS, P.CLOSED),
    (P.HALF_OPEN, E.FAILURE, P.OPEN),
    (P.HALF_OPEN, E.PROBE, P.HALF_OPEN),
]
EXPECTED_IGNORED = [(P.CLOSED, E.PROBE), (P.OPEN, E.SUCCESS), (P.OPEN, E.FAILURE)]


@pytest.mark.parametrize(("phase", "event", "to"), EXPECTED_TABLE)
def test_transition_table_rows(phase: BreakerPhase, event: BreakerEvent, to: BreakerPhase) -> None:
    assert transition(phase, event) is to


def test_table_and_ignored_partition_every_combination() -> None:
    every = {(p, e) for p in BreakerPhase for e in BreakerEvent}
    assert set(TRANSITIONS) | set(IGNORED) == every
    assert not set(TRANSITIONS) & set(IGNORED)
    assert len(TRANSITIONS) == len(EXPECTED_TABLE)
    assert sorted(IGNORED, key=str) == sorted(EXPECTED_IGNORED, key=str)


@pytest.mark.parametrize(("phase", "event"), EXPECTED_IGNORED)
def test_strict_lookup_raises_typed_error_for_ignored_combos(phase: BreakerPhase, event: BreakerEvent) -> None:
    with pytest.raises(IllegalBreakerTransition) as info:
        transition(phase, event)
    err = info.value
    assert isinstance(err, PermanentError)
    assert (err.phase, err.event) == (phase, event)
    assert err.why == IGNORED[(phase, event)]
    assert phase.value in str(err) and event.value in str(err)


OPEN_REC = BreakerRecord(phase=P.OPEN, trips=1, open_until_ms=5_000, changed_ms=1_000)


@pytest.mark.parametrize(
    ("rec", "call"),
    [
        (CLOSED_BREAKER, lambda r: on_probe(r, 10_000)),
        (BreakerRecord(failures=2, changed_ms=7), lambda r: on_probe(r, 10_000)),
        (OPEN_REC, lambda r: on_success(r, 2_000)),
        (OPEN_REC, lambda r: on_success(r, 9_000)),  # even after open_until: only a probe closes it
        (OPEN_REC, lambda r: on_failure(r, 2_000, BreakerConfig(), EdgeRng())),
    ],
    ids=["probe-closed", "probe-closed-counting", "late-success", "late-success-after-until", "late-failure"],
)
def test_lenient_functions_absorb_ignored_combos_unchanged(rec: BreakerRecord, call) -> None:  # noqa: ANN001
    assert call(rec) is rec


def test_late_failure_while_open_draws_no_jitter() -> None:
    rng = EdgeRng()
    on_failure(OPEN_REC, 2_000, BreakerConfig(), rng)
    assert rng.calls == 0


# --------------------------------------------------------------------------------------------------
# Transcript: one breaker through time (threshold 3, base 1 s, cap 8 s, probe timeout 5 s, max jitter)

CFG = BreakerConfig(failure_threshold=3, base_backoff_ms=1_000, max_backoff_ms=8_000, probe_timeout_ms=5_000)

# (t_ms, event, phase, failures, trips, open_until_ms, probe_in_flight, allows, changed_ms)
TRANSCRIPT = [
    (0, "failure", P.CLOSED, 1, 0, 0, False, True, 0),  # first failure is only counted
    (10, "failure", P.CLOSED, 2, 0, 0, False, True, 0),
    (20, "success", P.CLOSED, 0, 0, 0, False, True, 0),  # a success resets the count
    (30, "failure", P.CLOSED, 1, 0, 0, False, True, 0),
    (40, "failure", P.CLOSED, 2, 0, 0, False, True, 0),
    (50, "failure", P.OPEN, 0, 1, 1_050, False, False, 50),  # third in a row: open for base 1 s
    (60, "failure", P.OPEN, 0, 1, 1_050, False, False, 50),  # late failure: ignored, no longer backoff
    (70, "success", P.OPEN, 0, 1, 1_050, False, False, 50),  # late success: ignored
    (1_049, "probe", P.OPEN, 0, 1, 1_050, False, False, 50),  # 1 ms early: no probe
    (1_050, "probe", P.HALF_OPEN, 0, 1, 6_050, True, False, 1_050),  # the one probe; deadline +5 s
    (1_100, "probe", P.HALF_OPEN, 0, 1, 6_050, True, False, 1_050),  # a second probe is refused
    (1_200, "failure", P.OPEN, 0, 2, 3_200, False, False, 1_200),  # probe failed: 2 s
    (3_200, "probe", P.HALF_OPEN, 0, 2, 8_200, True, False, 3_200),
    (8_200, "probe", P.HALF_OPEN, 0, 2, 13_200, True, False, 3_200),  # probe lost: another one
    (8_300, "failure", P.OPEN, 0, 3, 12_300, False, False, 8_300),  # 4 s
    (12_300, "probe", P.HALF_OPEN, 0, 3, 17_300, True, False, 12_300),
    (12_400, "failure", P.OPEN, 0, 4, 20_400, False, False, 12_400),  # 8 s = cap
    (20_400, "probe", P.HALF_OPEN, 0, 4, 25_400, True, False, 20_400),
    (20_500, "failure", P.OPEN, 0, 5, 28_500, False, False, 20_500),  # still the 8 s cap
    (28_500, "probe", P.HALF_OPEN, 0, 5, 33_500, True, False, 28_500),
    (28_600, "success", P.CLOSED, 0, 0, 0, False, True, 28_600),  # probe succeeded: fully reset
    (28_700, "probe", P.CLOSED, 0, 0, 0, False, True, 28_600),  # probing a closed breaker: no-op
]


def _step(rec: BreakerRecord, event: str, now_ms: int, cfg: BreakerConfig, rng: random.Random) -> BreakerRecord:
    if event == "success":
        return on_success(rec, now_ms)
    if event == "failure":
        return on_failure(rec, now_ms, cfg, rng)
    return on_probe(rec, now_ms, cfg)


def test_transcript() -> None:
    rec = CLOSED_BREAKER
    rng = EdgeRng(high=True)
    for t, event, phase, failures, trips, until, probe, allowed, changed in TRANSCRIPT:
        rec = _step(rec, event, t, CFG, rng)
        got = (rec.phase, rec.failures, rec.trips, rec.open_until_ms, rec.probe_in_flight, allows(rec, t))
        assert got == (phase, failures, trips, until, probe, allowed), f"t={t} {event}"
        assert rec.changed_ms == changed, f"t={t} {event}"


def test_transcript_with_low_jitter_opens_for_half_the_ceiling() -> None:
    rec = BreakerRecord(failures=2)
    rec = on_failure(rec, 100, CFG, EdgeRng(high=False))
    assert (rec.phase, rec.open_until_ms) == (P.OPEN, 600)
    rec = on_probe(rec, 600, CFG)
    rec = on_failure(rec, 700, CFG, EdgeRng(high=False))
    assert (rec.phase, rec.trips, rec.open_until_ms) == (P.OPEN, 2, 1_700)


def test_trips_saturate_and_backoff_stays_capped() -> None:
    rec = BreakerRecord(phase=P.HALF_OPEN, trips=MAX_TRIPS, open_until_ms=10, probe_in_flight=True)
    out = on_failure(rec, 1_000, CFG, EdgeRng(high=True))
    assert (out.phase, out.trips, out.open_until_ms) == (P.OPEN, MAX_TRIPS, 1_000 + CFG.max_backoff_ms)


def test_no_change_returns_same_object() -> None:
    assert on_success(CLOSED_BREAKER, 5) is CLOSED_BREAKER


def test_admit_gates_and_records_the_probe() -> None:
    assert admit(CLOSED_BREAKER, 0) == (True, CLOSED_BREAKER)
    assert admit(OPEN_REC, 4_999, CFG) == (False, OPEN_REC)
    ok, rec = admit(OPEN_REC, 5_000, CFG)
    assert ok and rec.phase is P.HALF_OPEN and rec.probe_in_flight
    assert admit(rec, 5_001, CFG) == (False, rec)  # the probe is in flight: nothing else
    assert admit(rec, 5_000 + CFG.probe_timeout_ms, CFG)[0]  # the probe was lost: probe again


def test_half_open_without_probe_allows_and_probe_due() -> None:
    rec = BreakerRecord(phase=P.HALF_OPEN, trips=1, open_until_ms=1_000_000, probe_in_flight=False)
    assert allows(rec, 0) and probe_due(rec, 0)
    ok, rec2 = admit(rec, 0, CFG)
    assert ok and rec2.probe_in_flight and rec2.open_until_ms == CFG.probe_timeout_ms


def test_statistics_snapshot() -> None:
    s = statistics(OPEN_REC, 3_000)
    assert (s.phase, s.allows, s.probe_due, s.trips, s.in_phase_ms, s.retry_in_ms) == (
        P.OPEN, False, False, 1, 2_000, 2_000,
    )
    s = statistics(OPEN_REC, 6_000)
    assert (s.probe_due, s.retry_in_ms) == (True, 0)
    s = statistics(BreakerRecord(failures=2, changed_ms=10), 40)
    assert (s.phase, s.allows, s.failures, s.in_phase_ms, s.retry_in_ms) == (P.CLOSED, True, 2, 30, 0)


def test_mermaid_diagram_lists_every_transition() -> None:
    text = br.mermaid_diagram()
    for (src, ev), dst in TRANSITIONS.items():
        assert f"{src.value} --> {dst.value}: {ev.value}" in text
    assert text.count("-->") == len(TRANSITIONS) + 1


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"failure_threshold": 0}, "breaker.failure_threshold"),
        ({"failure_threshold": True}, "breaker.failure_threshold"),
        ({"base_backoff_ms": 1}, "breaker.base_backoff_ms"),
        ({"base_backoff_ms": 5_000, "max_backoff_ms": 4_999}, "breaker.max_backoff_ms"),
        ({"probe_timeout_ms": 0}, "breaker.probe_timeout_ms"),
        ({"max_backoff_ms": 2.5e5}, "breaker.max_backoff_ms"),
    ],
)
def test_config_validation(kwargs: dict, field_name: str) -> None:
    with pytest.raises(ValidationError) as info:
        BreakerConfig(**kwargs)
    assert info.value.field == field_name


# --------------------------------------------------------------------------------------------------
# breaker_key


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (("cluster", "c1"), "cluster/c1"),
        (("deployment", "c1", "d1"), "deployment/c1/d1"),
        (("adapter", "c1"), "adapter/c1"),
    ],
)
def test_breaker_key(args: tuple[str, ...], key: str) -> None:
    assert breaker_key(*args) == key
    assert tuple(key.split("/")) == args


@pytest.mark.parametrize(
    ("args", "field_name"),
    [
        (("cluster",), "breaker_key.parts"),
        (("", "c1"), "breaker_key.kind"),
        (("clu/ster", "c1"), "breaker_key.kind"),
        (("deployment", "c1", ""), "breaker_key.parts[1]"),
        (("deployment", "c1/d1"), "breaker_key.parts[0]"),
        (("cluster", 7), "breaker_key.parts[0]"),
    ],
)
def test_breaker_key_validation(args: tuple, field_name: str) -> None:
    with pytest.raises(ValidationError) as info:
        breaker_key(*args)
    assert info.value.field == field_name


# --------------------------------------------------------------------------------------------------
# Properties: invariants, a naive reference model, replay from a seed


@dataclass
class RefBreaker:
    """Naive mutable reference of the documented behaviour."""

    cfg: BreakerConfig
    rng: random.Random
    phase: BreakerPhase = P.CLOSED
    failures: int = 0
    trips: int = 0
    until: int = 0
    probe: bool = False
    changed: int = 0
    log: list[str] = field(default_factory=list)

    def _open(self, now: int) -> None:
        d = min(self.cfg.max_backoff_ms, self.cfg.base_backoff_ms * 2 ** min(self.trips, MAX_TRIPS))
        self.until = now + d // 2 + self.rng.randint(0, d - d // 2)
        self.phase, self.failures, self.probe, self.changed = P.OPEN, 0, False, now
        self.trips = min(self.trips + 1, MAX_TRIPS)

    def event(self, ev: str, now: int) -> None:
        if ev == "success" and self.phase is not P.OPEN:
            if self.phase is P.HALF_OPEN:
                self.phase, self.trips, self.until, self.probe, self.changed = P.CLOSED, 0, 0, False, now
            self.failures = 0
        elif ev == "failure" and self.phase is P.CLOSED:
            self.failures += 1
            if self.failures >= self.cfg.failure_threshold:
                self._open(now)
        elif ev == "failure" and self.phase is P.HALF_OPEN:
            self._open(now)
        elif ev == "probe" and self.phase is not P.CLOSED and now >= self.until:
            if self.phase is P.OPEN:
                self.changed = now
            self.phase, self.probe, self.until = P.HALF_OPEN, True, now + self.cfg.probe_timeout_ms

    def record(self) -> BreakerRecord:
        return BreakerRecord(self.phase, self.failures, self.trips, self.until, self.probe, self.changed)


configs = st.builds(
    lambda thr, base, mult, pt: BreakerConfig(thr, base, base * mult, pt),
    st.integers(1, 5),
    st.integers(2, 5_000),
    st.integers(1, 100),
    st.integers(1, 100_000),
)
events = st.lists(
    st.tuples(st.sampled_from(["success", "failure", "probe"]), st.integers(0, 200_000)), max_size=60
)


def check_invariants(rec: BreakerRecord, now_ms: int, cfg: BreakerConfig) -> None:
    if rec.phase is P.CLOSED:
        assert 0 <= rec.failures < cfg.failure_threshold
        assert (rec.trips, rec.open_until_ms, rec.probe_in_flight) == (0, 0, False)
        assert allows(rec, now_ms) and not probe_due(rec, now_ms)
        return
    assert rec.failures == 0
    assert 1 <= rec.trips <= MAX_TRIPS
    assert rec.open_until_ms > 0 and rec.open_until_ms > rec.changed_ms
    assert not allows(rec, now_ms)
    if rec.phase is P.OPEN:
        assert not rec.probe_in_flight
        assert rec.open_until_ms - rec.changed_ms <= cfg.max_backoff_ms
        if now_ms < rec.open_until_ms:
            assert admit(rec, now_ms, cfg) == (False, rec)
            assert on_probe(rec, now_ms, cfg) is rec
    else:
        assert rec.probe_in_flight


def run(cfg: BreakerConfig, seq: list[tuple[str, int]], t0: int, seed: int) -> list[BreakerRecord]:
    rng = random.Random(seed)
    rec, now, out = CLOSED_BREAKER, t0, []
    for ev, dt in seq:
        now += dt
        rec = _step(rec, ev, now, cfg, rng)
        out.append(rec)
    return out


@PROPERTY
@given(configs, events, st.integers(0, 10**9), st.integers(0, 2**32))
def test_property_invariants_and_reference_model(cfg: BreakerConfig, seq, t0: int, seed: int) -> None:  # noqa: ANN001
    ref = RefBreaker(cfg, random.Random(seed))
    rng = random.Random(seed)
    rec, now = CLOSED_BREAKER, t0
    for ev, dt in seq:
        now += dt
        rec = _step(rec, ev, now, cfg, rng)
        ref.event(ev, now)
        assert rec == ref.record(), f"{ev} at {now}"
        check_invariants(rec, now, cfg)
        check_invariants(rec, now + 1, cfg)


@PROPERTY
@given(configs, events, st.integers(0, 10**9), st.integers(0, 2**32))
def test_property_same_seed_same_schedule(cfg: BreakerConfig, seq, t0: int, seed: int) -> None:  # noqa: ANN001
    assert run(cfg, seq, t0, seed) == run(cfg, seq, t0, seed)


def test_different_seeds_give_different_schedules() -> None:
    seq = [("failure", 1)] * 3 + [("probe", 200_000), ("failure", 1)] * 10
    cfg = BreakerConfig(failure_threshold=3, base_backoff_ms=1_000, max_backoff_ms=100_000)
    schedules = {tuple(r.open_until_ms for r in run(cfg, seq, 0, seed)) for seed in range(5)}
    assert len(schedules) == 5


# --------------------------------------------------------------------------------------------------
# Backoff


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "ceiling"),
    [
        (0, 100, 1_000, 100),
        (1, 100, 1_000, 200),
        (3, 100, 1_000, 800),
        (4, 100, 1_000, 1_000),
        (10**9, 100, 1_000, 1_000),
        (2**200, 1, 1, 1),
        (70, 1, 2**100, 2**70),  # a cap beyond 64 bits still doubles exactly
        (2**200, 3, 2**300, 2**300),
        (5, 0, 0, 0),
        (5, 0, 7, 0),
        (0, 7, 7, 7),
    ],
)
def test_ceiling_table(attempt: int, base: int, cap: int, ceiling: int) -> None:
    assert ceiling_ms(attempt, base, cap) == ceiling
    assert backoff_bounds(attempt, base, cap) == (ceiling // 2, ceiling)


def test_equal_jitter_edges() -> None:
    assert backoff_ms(3, 100, 1_000, EdgeRng(high=False)) == 400
    assert backoff_ms(3, 100, 1_000, EdgeRng(high=True)) == 800
    assert backoff_ms(0, 3, 3, EdgeRng(high=False)) == 1  # odd ceiling: fixed half rounds down
    assert backoff_ms(0, 3, 3, EdgeRng(high=True)) == 3


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((-1, 100, 1_000), "attempt"),
        ((0, -1, 1_000), "base_ms"),
        ((0, 100, -1), "cap_ms"),
        ((0, 2_000, 1_000), "must not exceed"),
        ((1.5, 100, 1_000), "attempt must be an integer"),
        ((True, 100, 1_000), "attempt must be an integer"),
    ],
)
def test_backoff_validation(args: tuple, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        backoff_ms(*args, random.Random(0))


def test_schedule_limit() -> None:
    assert len(backoff_schedule(MAX_SCHEDULE_LEN, 1, 10, random.Random(0))) == MAX_SCHEDULE_LEN
    with pytest.raises(ValueError, match="at most"):
        backoff_schedule(MAX_SCHEDULE_LEN + 1, 1, 10, random.Random(0))


attempts = st.one_of(st.integers(0, 80), st.integers(0, 10**6), st.integers(0, 2**256))


@PROPERTY
@given(attempts, st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 2**32))
def test_property_backoff_within_bounds(attempt: int, a: int, b: int, seed: int) -> None:
    base, cap = min(a, b), max(a, b)
    # cap < 2**24 here, so from attempt 64 on any base >= 1 is past the cap
    naive = 0 if base == 0 else cap if attempt > 64 else min(cap, base * 2**attempt)
    got = backoff_ms(attempt, base, cap, random.Random(seed))
    assert naive // 2 <= got <= naive <= cap
    assert ceiling_ms(attempt, base, cap) == naive


@PROPERTY
@given(st.integers(0, 40), st.integers(1, 10**4), st.integers(1, 1_000), st.integers(0, 2**32))
def test_property_same_seed_same_backoff_schedule(n: int, base: int, mult: int, seed: int) -> None:
    one = backoff_schedule(n, base, base * mult, random.Random(seed))
    two = backoff_schedule(n, base, base * mult, random.Random(seed))
    assert one == two and len(one) == n
    assert all(backoff_bounds(i, base, base * mult)[0] <= d <= backoff_bounds(i, base, base * mult)[1]
               for i, d in enumerate(one))
