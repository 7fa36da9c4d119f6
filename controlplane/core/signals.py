"""Signal filtering (anti-jitter): a bucketed sliding window with a time-aware EWMA per signal.

Every deployment's load is sampled once per tick as a :class:`DeploymentSignals` (see
:func:`aggregate`) and fed into a :class:`SignalMemory`: one :class:`WindowFilter` per name in
:data:`SIGNALS`. All five are *demand* signals: a higher value never asks for fewer replicas.

``concurrency``
    running + waiting requests, the gateway's queue included (a deployment total).
``kv_usage``
    KV-cache usage **in instance units**: ``serving x mean kv_usage_perc``, i.e. the sum of the
    serving instances' fractions. The filter averages this *total*, not the per-instance mean: a
    mean taken while the serving count changed (5 instances at 0.9 for 20 s, then 10 at 0.45)
    multiplied by today's serving count would count the same KV twice and scale up on a filter
    artefact. ``total / serving`` gives the mean back.
``prompt_tokens_per_s``, ``generation_tokens_per_s``
    prompt tokens prefilled and tokens generated per second, summed over the deployment (vLLM's
    ``prompt_tokens`` and ``generation_tokens`` counters as rates). They are kept apart because a
    prompt token costs a small fraction of a generated token's GPU time; the scaling decision
    weighs each against the profile's own throughput.
``ttft_p99_ms``
    an upper bound of the deployment's TTFT p99 (see :func:`aggregate`); fed only when some
    request started in the interval (``None`` samples are skipped, not counted as 0).

:class:`WindowFilter` (per signal)

* Samples go into ``BUCKET_MS`` = 250 ms buckets ``(bucket_start_ms, sum, count)``, oldest first,
  where ``bucket_start_ms = t - t % BUCKET_MS``. A sample at time ``t`` is *in the window* of
  length ``W`` at ``now`` when its bucket start lies in ``(now - W, now]``; :func:`observe` drops
  the buckets that left the window of the newest sample, so a filter holds at most
  ``W / BUCKET_MS + 1`` buckets. :func:`window_mean` is the plain mean of the samples in the
  window (sum of sums / sum of counts), exactly what recomputing from the raw samples gives.
* A time-aware EWMA of the raw samples: the first sample initialises it; then each sample ``x``
  taken ``dt`` ms after the previous one moves it by ``alpha = 1 - 2**(-dt / half_life_ms)``:
  ``ewma += alpha * (x - ewma)``. The sample is read as the level of the signal over the ``dt``
  since the previous one, so irregular sampling weighs samples by the time they cover (a sample at
  the same millisecond as the previous one covers no time and does not move the EWMA; a sample
  older than the previous one is ignored by the EWMA). Non-finite values are ignored entirely.

:func:`filtered` reads three views per signal at ``now``:

``stable[s] = max(window mean over policy.stable_window_ms, ewma)``
    The EWMA (half-life 4 s by default) rises within seconds of a load increase, while the
    stable-window mean (30 s) lags behind it; after a decrease the EWMA falls fast and the window
    mean falls linearly over the window. Taking the larger of the two makes the stable signal
    *asymmetric on purpose*: fast to rise (capacity arrives early), slow to fall (no scale-down on
    a lull shorter than the window). This is sound only because every signal here is a demand
    signal, for which the larger value is always the conservative one; a signal where lower means
    "more replicas" must not be added to :data:`SIGNALS` without changing this rule. On steady,
    noisy load the EWMA's spread is small (for white noise of deviation ``sd`` sampled every
    ``dt``: about ``sd * sqrt(a / (2 - a))`` with ``a = 1 - 2**(-dt/half_life)``: 0.15 sd at
    250 ms / 4 s), so the upward bias of the max is well inside the tolerance band.
``panic[s]`` = mean over ``policy.panic_window_ms`` (3 s): fast, but still an average.
``latest[s]`` = mean of the newest bucket that lies in the panic window: the last tick's sample.
    The scaling decision uses it to follow a step burst on the first sample that shows it (its
    panic threshold, 1.6x the current capacity, is what keeps noise out).

Time is integer ms passed in; nothing here reads a clock. The memory is soft state (not
replicated): a new leader rebuilds it from the adapters' sample ring buffers by calling
:func:`update` with each buffered sample's time.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.domain.observations import DeploymentSignals, InstanceSample
from controlplane.domain.tenants import ScalingPolicy

SIGNALS: tuple[str, ...] = (
    "concurrency", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p99_ms", "queue_p95_ms"
)
"""Filtered signal names, in the order of :attr:`SignalMemory.filters`."""
LOAD_SIGNALS: tuple[str, ...] = ("concurrency", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s")
"""The signals summed from the instances' load fields; each may be unknown (``DeploymentSignals``)."""
SIGNAL_FIELDS: Mapping[str, tuple[str, ...]] = {
    "concurrency": ("running", "waiting"), "kv_usage": ("kv_usage",),
    "prompt_tokens_per_s": ("prompt_tokens_per_s",), "generation_tokens_per_s": ("generation_tokens_per_s",),
}
"""The :data:`~controlplane.domain.engines.LOAD_FIELDS` each load signal is summed from."""

BUCKET_MS = 250
"""Width of a window bucket: one decision tick."""


@dataclass(frozen=True, slots=True)
class WindowFilter:
    buckets: tuple[tuple[int, float, int], ...] = ()
    """``(bucket_start_ms, sum, count)``, oldest first, starts strictly increasing."""
    ewma: float | None = None
    """Time-aware EWMA of the raw samples; ``None`` before the first sample."""
    ewma_at_ms: int = 0
    """Time of the newest sample the EWMA has taken in."""


EMPTY_FILTER = WindowFilter()


def _start(bucket: tuple[int, float, int]) -> int:
    return bucket[0]


def _bucket_start(t_ms: int) -> int:
    return t_ms - t_ms % BUCKET_MS


def _add_to_buckets(
    buckets: tuple[tuple[int, float, int], ...], start: int, value: float
) -> tuple[tuple[int, float, int], ...]:
    i = bisect_left(buckets, start, key=_start)
    if i < len(buckets) and buckets[i][0] == start:
        _, total, count = buckets[i]
        return buckets[:i] + ((start, total + value, count + 1),) + buckets[i + 1 :]
    return buckets[:i] + ((start, value, 1),) + buckets[i:]


def _next_ewma(f: WindowFilter, value: float, now_ms: int, half_life_ms: int) -> tuple[float, int]:
    if f.ewma is None:
        return value, now_ms
    dt = now_ms - f.ewma_at_ms
    if dt <= 0:
        return f.ewma, f.ewma_at_ms
    alpha = 1.0 - 2.0 ** (-dt / max(1, half_life_ms))
    return f.ewma + alpha * (value - f.ewma), now_ms


def observe(f: WindowFilter, value: float, now_ms: int, *, window_ms: int, half_life_ms: int) -> WindowFilter:
    """Add the sample ``value`` taken at ``now_ms``; drop buckets that left the window.

    A late sample (older than the newest bucket) still lands in its own bucket if that bucket is in
    the window of the newest sample; otherwise it is dropped. Non-finite values are ignored.
    """
    if not math.isfinite(value):
        return f
    start = _bucket_start(now_ms)
    newest = max(now_ms, f.buckets[-1][0]) if f.buckets else now_ms
    buckets = f.buckets
    if start > newest - window_ms:
        buckets = _add_to_buckets(buckets, start, float(value))
    keep_from = bisect_right(buckets, newest - window_ms, key=_start)
    ewma, ewma_at_ms = _next_ewma(f, float(value), now_ms, half_life_ms)
    return WindowFilter(buckets[keep_from:], ewma, ewma_at_ms)


def _in_window(f: WindowFilter, now_ms: int, window_ms: int) -> tuple[tuple[int, float, int], ...]:
    lo = bisect_right(f.buckets, now_ms - window_ms, key=_start)
    hi = bisect_right(f.buckets, now_ms, key=_start)
    return f.buckets[lo:hi]


def window_mean(f: WindowFilter, now_ms: int, window_ms: int) -> float | None:
    """Mean of the samples whose bucket start lies in ``(now_ms - window_ms, now_ms]``; None if none."""
    inside = _in_window(f, now_ms, window_ms)
    count = sum(b[2] for b in inside)
    if count == 0:
        return None
    return math.fsum(b[1] for b in inside) / count


def latest_mean(f: WindowFilter, now_ms: int, window_ms: int) -> float | None:
    """Mean of the newest bucket inside ``(now_ms - window_ms, now_ms]``; None if there is none."""
    inside = _in_window(f, now_ms, window_ms)
    if not inside:
        return None
    _, total, count = inside[-1]
    return total / count


@dataclass(frozen=True, slots=True)
class SignalMemory:
    """Per-deployment filter state (soft, not replicated)."""

    filters: tuple[tuple[str, WindowFilter], ...] = tuple((name, EMPTY_FILTER) for name in SIGNALS)
    """One filter per :data:`SIGNALS` name, in that order."""
    last_ms: int = -1
    """Time of the newest sample taken in; older samples are ignored by :func:`update`."""


EMPTY_SIGNALS = SignalMemory()


@dataclass(frozen=True, slots=True)
class FilteredSignals:
    """What the scaling decision reads: three views per signal (see the module docstring).

    A mapping holds only the signals that have a sample in its window (``ttft_p99_ms`` is often
    absent). ``kv_usage`` is a total in instance units, not a per-instance fraction.
    """

    at_ms: int
    serving: int
    stable: Mapping[str, float]
    """max(mean over stable_window_ms, EWMA)."""
    panic: Mapping[str, float]
    """Mean over panic_window_ms."""
    ttft_p99_ms: float | None
    """The stable TTFT p99 bound (None when no request started within the stable window)."""
    latest: Mapping[str, float] = field(default_factory=dict)
    """Mean of the newest bucket within the panic window (the last tick's sample)."""
    unknown: frozenset[str] = frozenset()
    """Load signals no serving instance could report at the last tick (``DeploymentSignals``)."""
    partial: frozenset[str] = frozenset()
    """Load signals only some serving instances could report at the last tick (lower bounds)."""

    @property
    def known_load(self) -> tuple[str, ...]:
        """Load signals every serving instance reported at the last tick."""
        if not self.unknown and not self.partial:
            return LOAD_SIGNALS  # the common case, without a scan
        return tuple(n for n in LOAD_SIGNALS if n not in self.unknown and n not in self.partial)


def filter_of(mem: SignalMemory, name: str) -> WindowFilter:
    """The filter of signal ``name`` (an empty one if the memory has none)."""
    for n, f in mem.filters:
        if n == name:
            return f
    return EMPTY_FILTER


def sample_values(sig: DeploymentSignals) -> dict[str, float | None]:
    """The value of each signal in one deployment sample (None: no sample for that signal). A load
    signal that is unknown or only partly known this tick is not fed: the window keeps only values
    that are the whole load, so a lower bound never lowers a later mean."""
    values: dict[str, float | None] = {
        "concurrency": float(sig.running + sig.waiting),
        "kv_usage": sig.kv_usage * sig.serving,
        "prompt_tokens_per_s": sig.prompt_tokens_per_s,
        "generation_tokens_per_s": sig.generation_tokens_per_s,
        "ttft_p99_ms": sig.ttft_p99_ms,
        "queue_p95_ms": sig.queue_p95_ms,
    }
    for name in sig.unknown | sig.partial:
        values[name] = None
    return values


def update(mem: SignalMemory, sig: DeploymentSignals, policy: ScalingPolicy, now_ms: int) -> SignalMemory:
    """Feed the deployment sample ``sig``, taken at ``now_ms``, into every signal's filter.

    Samples older than the newest one taken in (``now_ms < mem.last_ms``) are ignored. The
    filters keep ``max(stable_window_ms, panic_window_ms)`` of history so both windows can be read.
    """
    if now_ms < mem.last_ms:
        return mem
    window_ms = max(policy.stable_window_ms, policy.panic_window_ms)
    values = sample_values(sig)
    filters = []
    for name in SIGNALS:
        f, value = filter_of(mem, name), values[name]
        if value is not None:
            f = observe(f, value, now_ms, window_ms=window_ms, half_life_ms=policy.ewma_half_life_ms)
        filters.append((name, f))
    return SignalMemory(tuple(filters), now_ms)


def filtered(
    mem: SignalMemory, sig: DeploymentSignals, policy: ScalingPolicy, now_ms: int
) -> FilteredSignals | None:
    """The filtered views at ``now_ms``; None when no sample of any signal lies in the stable window
    and the last tick's load was wholly known.

    ``sig`` (the latest sample, already fed by :func:`update`) supplies the serving count.
    """
    stable: dict[str, float] = {}
    panic: dict[str, float] = {}
    latest: dict[str, float] = {}
    for name, f in mem.filters:
        if not f.buckets:
            continue  # never fed or everything left the window (queue time on most engines)
        mean = window_mean(f, now_ms, policy.stable_window_ms)
        if mean is None:
            continue
        stable[name] = mean if f.ewma is None else max(mean, f.ewma)
        fast = window_mean(f, now_ms, policy.panic_window_ms)
        last = latest_mean(f, now_ms, policy.panic_window_ms)
        if fast is not None and last is not None:
            panic[name] = fast
            latest[name] = last
    if not stable and not (sig.unknown or sig.partial):
        return None  # (an unknown load still comes back, so the decision can say why it holds)
    return FilteredSignals(now_ms, sig.serving, stable, panic, stable.get("ttft_p99_ms"), latest,
                           sig.unknown, sig.partial)


def aggregate(
    samples: Sequence[InstanceSample], serving: int, gateway_waiting: int, now_ms: int, *, unsampled: int = 0
) -> DeploymentSignals:
    """One deployment sample from its serving instances' samples and the gateway's queue.

    * running, waiting: sums (waiting includes ``gateway_waiting``).
    * kv_usage: mean over the samples (0 when none), each clamped to [0, 1].
    * prompt_tokens_per_s, generation_tokens_per_s: sums.
    * ttft_p99_ms: the **maximum** of the instances' p99s. The deployment's true p99 cannot be
      computed from per-instance p99s, but it cannot exceed their maximum (at most 1 % of each
      instance's requests lie above its own p99, so at most 1 % of all lie above the largest), so
      the maximum is a conservative bound. None when no instance reported one.
    * gpu_mem_frac: the highest ``used / total`` among samples with a known total.
    * queue_p95_ms: the maximum of the instances' queue-time p95s (the same bound as TTFT).
    * unknown / partial: per load signal, whether no sample or only some samples could report the
      fields it is summed from (``InstanceSample.unknown``; an unhealthy sample reports none, and
      each of the ``unsampled`` serving instances without a sample counts as one that could not).

    Non-finite or negative readings are skipped (a broken exporter must not scale a deployment).
    """
    unknown, partial = _coverage(samples, unsampled)
    kv = [min(1.0, s.kv_usage) for s in samples if _usable(s.kv_usage) and s.healthy and s.knows("kv_usage")]
    queue = [s.queue_p95_ms for s in samples if s.queue_p95_ms is not None and _usable(s.queue_p95_ms)]
    ttfts = [s.ttft_p99_ms for s in samples if s.ttft_p99_ms is not None and _usable(s.ttft_p99_ms)]
    mem = [s.gpu_mem_used_bytes / s.gpu_mem_total_bytes for s in samples if s.gpu_mem_total_bytes > 0]
    return DeploymentSignals(
        at_ms=now_ms,
        serving=serving,
        running=sum(max(0, s.running) for s in samples),
        waiting=sum(max(0, s.waiting) for s in samples) + max(0, gateway_waiting),
        kv_usage=math.fsum(kv) / len(kv) if kv else 0.0,
        prompt_tokens_per_s=math.fsum(s.prompt_tokens_per_s for s in samples if _usable(s.prompt_tokens_per_s)),
        generation_tokens_per_s=math.fsum(
            s.generation_tokens_per_s for s in samples if _usable(s.generation_tokens_per_s)
        ),
        ttft_p99_ms=max(ttfts) if ttfts else None,
        gpu_mem_frac=max(mem) if mem else 0.0,
        queue_p95_ms=max(queue) if queue else None,
        unknown=unknown,
        partial=partial,
    )


_NONE: frozenset[str] = frozenset()


def _coverage(samples: Sequence[InstanceSample], unsampled: int) -> tuple[frozenset[str], frozenset[str]]:
    """(unknown, partial) load signals: reported by no sample / by some but not all."""
    if unsampled <= 0 and all(s.healthy and not s.unknown for s in samples):
        return _NONE, _NONE  # the common case, one pass (nothing serves: the gateway queue is the load)
    total = len(samples) + max(0, unsampled)
    unknown, partial = set(), set()
    for name, fields in SIGNAL_FIELDS.items():
        knowing = sum(1 for s in samples if s.healthy and all(s.knows(f) for f in fields))
        if knowing == 0:
            unknown.add(name)
        elif knowing < total:
            partial.add(name)
    return frozenset(unknown), frozenset(partial)


def _usable(x: float) -> bool:
    return math.isfinite(x) and x >= 0.0
