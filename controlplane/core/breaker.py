"""Circuit breaker (anti-avalanche) as a transition table plus one lookup that raises a typed error.

A breaker guards one target (a cluster, a deployment in a cluster, an adapter; see
:func:`breaker_key`). Its state is a replicated :class:`~controlplane.domain.records.BreakerRecord`,
so a new leader continues exactly where the old one stopped. Every function here is pure: it takes
the record, ``now_ms`` and, where jitter is drawn, an injected ``random.Random``, and returns the
next record (the *same object* when nothing changed, so the shell replicates only real changes).

::

    CLOSED --failure (the failure_threshold-th in a row)--> OPEN
    OPEN   --probe (now >= open_until_ms)--> HALF_OPEN      one probe request is let through
    HALF_OPEN --success--> CLOSED                           failures = trips = 0
    HALF_OPEN --failure--> OPEN                             longer backoff: trips + 1 (capped)
    HALF_OPEN --probe (probe deadline passed)--> HALF_OPEN  the probe in flight is presumed lost

Phases:

* ``CLOSED``: every request goes through (:func:`allows` is True). Failures are counted; a success
  resets the count. The ``failure_threshold``-th consecutive failure opens the breaker until
  ``now + backoff_ms(trips, base, cap, rng)`` (:mod:`controlplane.core.backoff`, equal jitter) and
  increments ``trips``.
* ``OPEN``: nothing goes through. At or after ``open_until_ms`` the caller asks for a probe with
  :func:`on_probe` (or :func:`admit`, which does both steps) and sends exactly that one request.
* ``HALF_OPEN``: the probe is in flight and nothing else goes through. Its success closes the
  breaker; its failure re-opens it with the next, longer backoff (the exponent ``trips`` grows up
  to :data:`MAX_TRIPS`, the delay up to ``max_backoff_ms``). ``open_until_ms`` is now the probe's
  deadline (``probe_timeout_ms``): a probe whose outcome never arrives (lost command, leader
  failover) would otherwise wedge the replicated breaker forever, so after the deadline another
  probe may be granted.

The table (:data:`TRANSITIONS`) names the phase an event leads to when its *guard* holds:

* ``(CLOSED, FAILURE)``: the failure is the ``failure_threshold``-th in a row; else it is counted.
* ``(OPEN, PROBE)``: ``now_ms >= open_until_ms``; else nothing changes (too early).
* ``(HALF_OPEN, PROBE)``: ``now_ms >= open_until_ms``; else nothing changes (one probe at a time).

The three remaining combinations are not transitions; :data:`IGNORED` lists each with the reason
why the ``on_*`` functions absorb it as a no-op (they happen in normal operation: late outcomes of
requests sent before the breaker opened, probes asked of a closed breaker). :func:`transition`, the
strict lookup, raises :class:`IllegalBreakerTransition` for them. A late outcome that arrives while
``HALF_OPEN`` cannot be told apart from the probe's (records carry no request ids) and is taken as
the probe's outcome.

Records keep these invariants (checked by the property tests):

* ``CLOSED``: ``0 <= failures < failure_threshold``, ``trips == 0``, ``open_until_ms == 0``, no probe.
* ``OPEN``: ``failures == 0``, ``1 <= trips <= MAX_TRIPS``, ``open_until_ms > changed_ms``, no probe.
* ``HALF_OPEN``: ``failures == 0``, ``1 <= trips <= MAX_TRIPS``, a probe in flight until
  ``open_until_ms``.
* ``changed_ms`` is the time of the last *phase* change.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, replace

from controlplane.core.backoff import backoff_ms
from controlplane.domain.errors import PermanentError, ValidationError
from controlplane.domain.records import BreakerPhase, BreakerRecord

MAX_TRIPS = 32
"""Cap on ``trips`` (the backoff exponent). The delay saturates at ``max_backoff_ms`` long before."""

CLUSTER = "cluster"
DEPLOYMENT = "deployment"
ADAPTER = "adapter"
"""Conventional breaker kinds: ``cluster/c1``, ``deployment/c1/d1`` (of a qualified deployment id
``alpha/chat``: ``deployment/c1/alpha/chat``), ``adapter/c1``."""


class BreakerEvent(enum.Enum):
    SUCCESS = "success"
    """A guarded request (or the probe) succeeded."""
    FAILURE = "failure"
    """A guarded request (or the probe) failed."""
    PROBE = "probe"
    """The caller asks to let one probe request through an open breaker."""


P, E = BreakerPhase, BreakerEvent

TRANSITIONS: dict[tuple[BreakerPhase, BreakerEvent], BreakerPhase] = {
    (P.CLOSED, E.SUCCESS): P.CLOSED,
    (P.CLOSED, E.FAILURE): P.OPEN,
    (P.OPEN, E.PROBE): P.HALF_OPEN,
    (P.HALF_OPEN, E.SUCCESS): P.CLOSED,
    (P.HALF_OPEN, E.FAILURE): P.OPEN,
    (P.HALF_OPEN, E.PROBE): P.HALF_OPEN,
}
"""``(phase, event) -> phase`` when the event's guard holds (see the module docstring)."""

IGNORED: dict[tuple[BreakerPhase, BreakerEvent], str] = {
    (P.CLOSED, E.PROBE): "the breaker is closed: every request goes through, there is nothing to probe",
    (P.OPEN, E.SUCCESS): "a late success of a request sent before the breaker opened; only a probe closes it",
    (P.OPEN, E.FAILURE): (
        "a late failure of a request sent before the breaker opened; the breaker is already backing off "
        "and counting it again would compound the backoff"
    ),
}
"""The combinations that are not transitions, each with why the ``on_*`` functions absorb it."""


class IllegalBreakerTransition(PermanentError):
    """:data:`TRANSITIONS` has no entry for ``(phase, event)``; ``why`` says what that combination means."""

    def __init__(self, phase: BreakerPhase, event: BreakerEvent, why: str) -> None:
        super().__init__(f"breaker: no transition from {phase.value} on {event.value}: {why}")
        self.phase = phase
        self.event = event
        self.why = why


def transition(phase: BreakerPhase, event: BreakerEvent) -> BreakerPhase:
    """Look ``(phase, event)`` up in :data:`TRANSITIONS`; raise :class:`IllegalBreakerTransition` if absent."""
    try:
        return TRANSITIONS[(phase, event)]
    except KeyError:
        why = IGNORED.get((phase, event), "unknown phase or event")
        raise IllegalBreakerTransition(phase, event, why) from None


def _check_int(field_name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field_name, f"must be an integer, got {type(value).__name__}")
    if value < lo:
        raise ValidationError(field_name, f"must be >= {lo}, got {value}")


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int = 3
    """Consecutive failures that open a closed breaker."""
    base_backoff_ms: int = 2_000
    """Ceiling of the first open period; it doubles with every failed probe. At least 2 ms, so the
    fixed half of the equal jitter keeps every open period at least 1 ms long."""
    max_backoff_ms: int = 120_000
    """Ceiling of any open period."""
    probe_timeout_ms: int = 60_000
    """A probe without an outcome after this long is presumed lost and another may be granted."""

    def __post_init__(self) -> None:
        _check_int("breaker.failure_threshold", self.failure_threshold, 1)
        _check_int("breaker.base_backoff_ms", self.base_backoff_ms, 2)
        _check_int("breaker.max_backoff_ms", self.max_backoff_ms, self.base_backoff_ms)
        _check_int("breaker.probe_timeout_ms", self.probe_timeout_ms, 1)


DEFAULT_CONFIG = BreakerConfig()


def allows(rec: BreakerRecord, now_ms: int) -> bool:
    """May an ordinary request go through now? CLOSED: yes; OPEN: no; HALF_OPEN: not while a probe
    is in flight. An OPEN breaker whose ``open_until_ms`` has passed still says no: the caller asks
    for the one probe with :func:`on_probe` (see :func:`probe_due`, :func:`admit`). ``now_ms`` is
    part of the contract; the answer depends only on the record."""
    del now_ms
    if rec.phase is P.CLOSED:
        return True
    if rec.phase is P.HALF_OPEN:
        return not rec.probe_in_flight
    return False


def probe_due(rec: BreakerRecord, now_ms: int) -> bool:
    """Would :func:`on_probe` grant a probe now? (OPEN past ``open_until_ms``, or HALF_OPEN past the
    probe deadline or without a probe in flight.)"""
    if rec.phase is P.CLOSED:
        return False
    return now_ms >= rec.open_until_ms or (rec.phase is P.HALF_OPEN and not rec.probe_in_flight)


def on_probe(rec: BreakerRecord, now_ms: int, cfg: BreakerConfig = DEFAULT_CONFIG) -> BreakerRecord:
    """Grant the one probe when due: OPEN -> HALF_OPEN with ``probe_in_flight`` and the probe deadline
    ``now + probe_timeout_ms`` in ``open_until_ms``. Too early, or CLOSED: the record unchanged."""
    if (rec.phase, E.PROBE) in IGNORED or not probe_due(rec, now_ms):
        return rec
    to = transition(rec.phase, E.PROBE)
    return replace(
        rec,
        phase=to,
        probe_in_flight=True,
        open_until_ms=now_ms + cfg.probe_timeout_ms,
        changed_ms=now_ms if to is not rec.phase else rec.changed_ms,
    )


def on_success(rec: BreakerRecord, now_ms: int) -> BreakerRecord:
    """A success: CLOSED resets its failure count; HALF_OPEN (the probe) closes; OPEN ignores it."""
    if (rec.phase, E.SUCCESS) in IGNORED:
        return rec
    to = transition(rec.phase, E.SUCCESS)
    if to is rec.phase:  # CLOSED -> CLOSED
        return rec if rec.failures == 0 else replace(rec, failures=0)
    return BreakerRecord(phase=to, changed_ms=now_ms)


def on_failure(rec: BreakerRecord, now_ms: int, cfg: BreakerConfig, rng: random.Random) -> BreakerRecord:
    """A failure: CLOSED counts it and opens at the threshold; HALF_OPEN (the probe) re-opens with a
    longer backoff; OPEN ignores it. ``rng`` is drawn from (once) only when the breaker opens."""
    if (rec.phase, E.FAILURE) in IGNORED:
        return rec
    to = transition(rec.phase, E.FAILURE)
    if rec.phase is P.CLOSED and rec.failures + 1 < cfg.failure_threshold:
        return replace(rec, failures=rec.failures + 1)
    attempt = min(rec.trips, MAX_TRIPS)
    delay = backoff_ms(attempt, cfg.base_backoff_ms, cfg.max_backoff_ms, rng)
    return BreakerRecord(
        phase=to,
        failures=0,
        trips=min(rec.trips + 1, MAX_TRIPS),
        open_until_ms=now_ms + delay,
        probe_in_flight=False,
        changed_ms=now_ms,
    )


def admit(rec: BreakerRecord, now_ms: int, cfg: BreakerConfig = DEFAULT_CONFIG) -> tuple[bool, BreakerRecord]:
    """Gate one request: ``(True, rec)`` when the breaker allows it, ``(True, rec')`` when it is
    the probe (``rec'`` records it), ``(False, rec)`` otherwise."""
    if rec.phase is P.CLOSED:
        return True, rec
    if probe_due(rec, now_ms):
        return True, on_probe(rec, now_ms, cfg)
    return False, rec


@dataclass(frozen=True, slots=True)
class BreakerStatistics:
    """An immutable snapshot of one breaker, for ``statistics()`` endpoints and logs."""

    phase: BreakerPhase
    allows: bool
    probe_due: bool
    failures: int
    trips: int
    probe_in_flight: bool
    in_phase_ms: int
    """How long the breaker has been in its phase."""
    retry_in_ms: int
    """CLOSED: 0. Otherwise how long until a probe may be granted (0 when one may be now)."""


def statistics(rec: BreakerRecord, now_ms: int) -> BreakerStatistics:
    """Snapshot of ``rec`` as seen at ``now_ms``."""
    due = probe_due(rec, now_ms)
    return BreakerStatistics(
        phase=rec.phase,
        allows=allows(rec, now_ms),
        probe_due=due,
        failures=rec.failures,
        trips=rec.trips,
        probe_in_flight=rec.probe_in_flight,
        in_phase_ms=max(0, now_ms - rec.changed_ms),
        retry_in_ms=0 if rec.phase is P.CLOSED or due else rec.open_until_ms - now_ms,
    )


def breaker_key(kind: str, *parts: str) -> str:
    """``"kind/part1/part2"``: ``breaker_key("deployment", "c1", "d1") == "deployment/c1/d1"``.

    ``kind`` and at least one part are required; each must be a non-empty string without ``/``
    (so a key splits back unambiguously). Raises :class:`ValidationError` naming the bad piece.
    """
    if not parts:
        raise ValidationError("breaker_key.parts", f"a {kind!r} key needs at least one part")
    pieces = (kind, *parts)
    for i, piece in enumerate(pieces):
        name = "breaker_key.kind" if i == 0 else f"breaker_key.parts[{i - 1}]"
        if not isinstance(piece, str):
            raise ValidationError(name, f"must be a string, got {type(piece).__name__}")
        if not piece:
            raise ValidationError(name, "must not be empty")
        if "/" in piece:
            raise ValidationError(name, f"{piece!r} must not contain '/'")
    return "/".join(pieces)


def mermaid_diagram() -> str:
    """The breaker as a Mermaid state diagram, generated from :data:`TRANSITIONS`."""
    lines = ["stateDiagram-v2", "    [*] --> closed"]
    for (src, ev), dst in sorted(TRANSITIONS.items(), key=lambda kv: (kv[0][0].value, kv[0][1].value)):
        lines.append(f"    {src.value} --> {dst.value}: {ev.value}")
    return "\n".join(lines) + "\n"
