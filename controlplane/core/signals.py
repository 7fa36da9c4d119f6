"""Signal filtering (anti-jitter): a bucketed sliding window with an EWMA, and a short panic window.

CONTRACT (implemented by a helper; signatures are fixed, other modules depend on them):

    SIGNALS = ("concurrency", "kv_usage", "tokens_per_s", "ttft_p99_ms")

    @dataclass(frozen=True, slots=True)
    class WindowFilter:
        buckets: tuple[tuple[int, float, int], ...]   # (bucket_start_ms, sum, count), oldest first
        ewma: float | None                             # time-aware EWMA of the raw samples
        ewma_at_ms: int

    EMPTY_FILTER: WindowFilter
    BUCKET_MS = 250

    def observe(f, value, now_ms, *, window_ms, half_life_ms) -> WindowFilter
        # adds a sample; drops buckets older than window_ms; EWMA alpha = 1 - 2**(-dt/half_life_ms)
    def window_mean(f, now_ms, window_ms) -> float | None
        # mean of the samples whose bucket lies in (now_ms - window_ms, now_ms]; None if none

    @dataclass(frozen=True, slots=True)
    class SignalMemory:                                # per deployment, soft state (not replicated)
        filters: tuple[tuple[str, WindowFilter], ...]  # one per SIGNALS name, in SIGNALS order
        last_ms: int = -1

    EMPTY_SIGNALS: SignalMemory

    @dataclass(frozen=True, slots=True)
    class FilteredSignals:
        at_ms: int
        serving: int
        stable: Mapping[str, float]   # per signal: window mean over policy.stable_window_ms, then EWMA-smoothed
        panic: Mapping[str, float]    # per signal: mean over policy.panic_window_ms (no EWMA: fast)
        ttft_p99_ms: float | None     # the latest stable TTFT p99 (None when no request started)

    def update(mem, sig: DeploymentSignals, policy: ScalingPolicy, now_ms) -> SignalMemory
    def filtered(mem, sig: DeploymentSignals, policy, now_ms) -> FilteredSignals | None   # None: no samples
    def aggregate(samples: Sequence[InstanceSample], serving: int, gateway_waiting: int, now_ms) -> DeploymentSignals
"""
