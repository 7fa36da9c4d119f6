"""Scaling decision (anti-jitter + anti-mis-scaling).

CONTRACT (implemented by a helper; signatures are fixed):

    class ScaleReason(enum.Enum): NO_DATA, WITHIN_TOLERANCE, SCALE_UP, SCALE_DOWN, PANIC,
        STABILIZED, COOLDOWN, STEP_LIMITED, AT_MIN, AT_MAX, SCALE_FROM_ZERO

    @dataclass(frozen=True, slots=True)
    class ScaleDecision:
        target: int                 # desired serving replicas
        warm_pool: int              # desired Standby instances
        memory: ScaleMemory         # the next memory (replicated when it changed)
        reason: ScaleReason
        message: str                # human-readable explanation with the numbers
        proposals: Mapping[str, int]   # per signal the replica count it asked for

    def decide(deployment, profile, slo, signals: FilteredSignals | None, memory: ScaleMemory,
               current: int, now_ms: int) -> ScaleDecision
"""
