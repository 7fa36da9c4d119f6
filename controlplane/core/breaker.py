"""Circuit breaker (anti-avalanche) as a transition table.

CONTRACT (implemented by a helper; signatures are fixed):

    @dataclass(frozen=True, slots=True)
    class BreakerConfig: failure_threshold=3, base_backoff_ms=2_000, max_backoff_ms=120_000

    class BreakerEvent(enum.Enum): SUCCESS, FAILURE, PROBE
    TRANSITIONS: dict[tuple[BreakerPhase, BreakerEvent], BreakerPhase]

    def allows(rec: BreakerRecord, now_ms) -> bool            # may a request go through now?
    def on_probe(rec, now_ms) -> BreakerRecord                # OPEN & now >= open_until -> HALF_OPEN, probe_in_flight
    def on_success(rec, now_ms) -> BreakerRecord
    def on_failure(rec, now_ms, cfg, rng: random.Random) -> BreakerRecord
    def breaker_key(kind: str, *parts: str) -> str            # "cluster/c1", "deployment/c1/d1", "adapter/c1"
"""
