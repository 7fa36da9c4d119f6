"""Replicated records owned by the core's decisions: circuit breakers and scaling memory.

They live in the domain (not in ``core``) because they are part of the replicated state: a new
leader reads them back and continues exactly where the old leader stopped (open breakers stay open
until their ``open_until_ms``; a scale-down stabilization window keeps its history).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class BreakerPhase(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    phase: BreakerPhase = BreakerPhase.CLOSED
    failures: int = 0
    """Consecutive failures counted while closed (reset by a success)."""
    trips: int = 0
    """Consecutive times the breaker opened without a successful probe: the backoff exponent."""
    open_until_ms: int = 0
    """While open: when a probe may be let through. Drawn with jitter by the proposer, so ``apply``
    stays deterministic."""
    probe_in_flight: bool = False
    changed_ms: int = 0


CLOSED_BREAKER = BreakerRecord()


@dataclass(frozen=True, slots=True)
class ScaleMemory:
    """What a deployment's scaling decision remembers between ticks (explicit, never hidden state).

    ``recs`` holds the scale-down stabilization window as a monotonic queue: ``(bucket_start_ms,
    replicas)`` pairs in time order whose replica counts strictly decrease, so its head is the
    maximum recommendation of the window. One bucket per second bounds its length by the window in
    seconds.
    """

    recs: tuple[tuple[int, int], ...] = ()
    panic_until_ms: int = 0
    """0 when not in panic; else the panic mode ends at this time unless extended."""
    panic_peak: int = 0
    """Highest replica count decided during the current panic (never lowered while in panic)."""
    last_scale_up_ms: int = -1
    last_scale_down_ms: int = -1


EMPTY_MEMORY = ScaleMemory()


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """Bookkeeping of an API object (tenant, deployment, cluster, zone), kept in ``ControlState.meta``.

    ``resource_version`` is the revision of the object's last write: ``ControlState.applied`` right
    after that command was applied, so it is the same on every replica and grows with every write.
    Clients send it back as ``expect_version`` to update or delete only what they read (optimistic
    concurrency). The times are the writes' ``at_ms`` (stamped by the proposer, 0 for internal
    writes); ``created_ms`` is kept across updates.
    """

    resource_version: int
    created_ms: int = 0
    updated_ms: int = 0
