"""Replicated demand history and the forecast value the scaling decision reads (issue 16).

**History.** Every :data:`BUCKET_MS` the lease holder commits, per deployment, the highest demand
(in replicas, what :func:`controlplane.core.scaling.demand` reads from the non-feedback signals) its
decisions saw during that bucket (``RecordDemand``). Each deployment keeps the last
:data:`HISTORY_BUCKETS` buckets (one hour). The history is replicated, so a new lease holder's
forecast is the same function of the same values as the old one's: a failover forecasts the same.

Values are stored as unsigned 16-bit deci-replicas (0.1 replica resolution, saturating at
:data:`MAX_DECI` = 6,553.5 replicas) packed little-endian in ``bytes``: one hour of 10,000
deployments is 7.2 MB, where a tuple of Python ints would be 30x that.

**Forecast.** Computed outside the pure core (``controlplane.forecast``) from the history, on its
own cadence (once per bucket), and passed into ``scaling.decide`` as a value: the demand the
deployment may reach within the next *wake* horizon (capacity that must already serve: even a warm
start would come too late) and within the next *restart* horizon (capacity that must exist, serving
or asleep: a new instance started later would come too late).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.domain.errors import ValidationError

BUCKET_MS = 10_000
"""Width of one history bucket."""
HISTORY_BUCKETS = 360
"""Buckets kept per deployment: one hour."""
MAX_DECI = 65_535
"""Largest storable value (deci-replicas); larger demands saturate."""
WAKE_REACTION_MS = 500
"""Time from a burst's first requests to a wake command reaching the engine: one or two 250 ms
ticks. Added to a wake for the forecast's wake horizon and for ``scaling.wake_fits``."""


def to_deci(replicas: float) -> int:
    """A demand in replicas as a storable deci-replica count (rounded up, saturating; NaN and
    negatives are 0)."""
    if not replicas > 0:  # NaN, 0 or negative
        return 0
    if replicas >= MAX_DECI / 10:
        return MAX_DECI
    return min(MAX_DECI, math.ceil(replicas * 10 - 1e-9))


@dataclass(frozen=True, slots=True)
class DemandHistory:
    """One deployment's recent demand: ``len(data) // 2`` buckets, the last ending at ``end_ms``."""

    end_ms: int
    """End of the newest bucket (a multiple of :data:`BUCKET_MS`)."""
    data: bytes = b""
    """Little-endian uint16 deci-replicas, oldest first; a bucket with no decision is 0."""

    def __post_init__(self) -> None:
        if not isinstance(self.end_ms, int) or isinstance(self.end_ms, bool) or self.end_ms % BUCKET_MS:
            raise ValidationError("demand.end_ms", f"must be an integer multiple of {BUCKET_MS}, got {self.end_ms!r}")
        if not isinstance(self.data, bytes) or len(self.data) % 2 or len(self.data) > 2 * HISTORY_BUCKETS:
            raise ValidationError(
                "demand.data", f"must be at most {HISTORY_BUCKETS} little-endian uint16 values ({2 * HISTORY_BUCKETS} bytes)"
            )

    @property
    def buckets(self) -> int:
        return len(self.data) // 2


def appended(old: DemandHistory | None, end_ms: int, deci: int) -> DemandHistory:
    """``old`` with the bucket ending at ``end_ms`` added (gaps since ``old.end_ms`` filled with 0,
    the oldest buckets dropped past :data:`HISTORY_BUCKETS`). A bucket not newer than ``old``'s
    newest raises its value instead (max), so a replayed entry changes nothing."""
    value = max(0, min(MAX_DECI, deci)).to_bytes(2, "little")
    if old is None or not old.data:
        return DemandHistory(end_ms, value)
    if end_ms <= old.end_ms:
        back = (old.end_ms - end_ms) // BUCKET_MS
        if back >= old.buckets:
            return old  # older than what is kept
        at = len(old.data) - 2 * (back + 1)
        cur = int.from_bytes(old.data[at:at + 2], "little")
        if cur >= deci:
            return old
        return DemandHistory(old.end_ms, old.data[:at] + value + old.data[at + 2:])
    gap = min(HISTORY_BUCKETS, (end_ms - old.end_ms) // BUCKET_MS - 1)
    data = old.data + b"\x00\x00" * gap + value
    return DemandHistory(end_ms, data[-2 * HISTORY_BUCKETS:])


@dataclass(frozen=True, slots=True)
class Forecast:
    """A deployment's demand over the next start horizons (replicas, unrounded)."""

    at_ms: int
    """End of the newest history bucket it was computed from."""
    ready: float
    """Demand to meet with serving capacity: the ``quantile`` of the peak demand within the wake
    horizon (0 when no history)."""
    total: float
    """Demand to meet with serving or sleeping capacity: the ``quantile`` of the peak demand
    within the restart horizon."""
    expected: float
    """Point forecast (median) of the peak demand within the restart horizon: what ``mape`` scores."""
    wake_ms: int
    """The warm path's start latency the wake horizon was sized for (0: the engine cannot sleep)."""
    restart_ms: int
    """A new instance's start latency the restart horizon was sized for."""
    quantile: float
    buckets: int
    """History buckets it was learned from."""
    mape: float | None = None
    """Mean absolute percentage error of ``expected`` against what happened, over the history's
    scored buckets (those whose actual peak was at least one replica); None when none were."""
    usable: bool = True
    """False when it must not drive decisions (too little history, a failed computation): the
    decision is then reactive, as without a forecast. ``note`` says why."""
    note: str = ""

