"""Replicated records owned by the core's decisions: circuit breakers, scaling memory and the clusters'
model caches.

They live in the domain (not in ``core``) because they are part of the replicated state: a new
leader reads them back and continues exactly where the old leader stopped (open breakers stay open
until their ``open_until_ms``; a scale-down stabilization window keeps its history).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from controlplane.domain.errors import ValidationError


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


MAX_CACHED_MODELS = 1_000
"""Most model names one cluster's model-cache record may hold."""


@dataclass(frozen=True, slots=True)
class ModelCacheRecord:
    """Which models the node-local model cache of one cluster holds (its adapter reports it; see
    ``controlplane/domain/start_tiers.py``). A new instance of a model the cache holds is a
    ``cached`` start, else a ``cold`` one; placement prefers such clusters. Put by the lease holder
    from the observations (``core/model_cache.py``), so a new holder reads the same."""

    models: tuple[str, ...] = ()
    """Model names (``Deployment.model``), sorted, without duplicates."""
    at_ms: int = 0
    """When the holder last changed it (stamped by the proposer)."""

    def __post_init__(self) -> None:
        if not isinstance(self.models, tuple) or not all(isinstance(m, str) and m for m in self.models):
            raise ValidationError("models", "must be a tuple of non-empty model names")
        if len(self.models) > MAX_CACHED_MODELS:
            raise ValidationError("models", f"{len(self.models)} models exceed the limit of {MAX_CACHED_MODELS}")
        if list(self.models) != sorted(set(self.models)):
            raise ValidationError("models", "must be sorted and without duplicates")
        if isinstance(self.at_ms, bool) or not isinstance(self.at_ms, int) or self.at_ms < 0:
            raise ValidationError("at_ms", f"must be an integer >= 0, got {self.at_ms!r}")

    def holds(self, model: str) -> bool:
        return model in self.models
