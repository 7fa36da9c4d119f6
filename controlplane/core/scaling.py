"""Scaling decision (anti-jitter + anti-mis-scaling): ``decide(...) -> ScaleDecision``.

One call per deployment per tick (250 ms). It is a pure function of the deployment's policy, its
model profile and SLO, the filtered signals (:mod:`controlplane.core.signals`), the replicated
:class:`ScaleMemory`, the current desired replica count and ``now_ms``; everything it must remember
comes back in ``ScaleDecision.memory``. "No decision" is a value: reason ``NO_DATA``, target kept.

**Demand per signal** (in replicas, unrounded; the largest wins, as in the Kubernetes HPA, so the
deployment is sized for whichever resource runs out first; ``proposals`` holds them rounded up)::

    concurrency   concurrency / target_concurrency
    kv_usage      kv_total / target_kv_usage          kv_total = serving x mean KV fraction
    tokens        (prompt_tps / prefill_tps + generation_tps / capacity) / target_token_utilization
    ttft_p99_ms   min(serving x (1 + w x (ttft/slo - 1)), 2 x serving)   only when ttft > slo,
                  0 < serving >= current and w = ttft_slo_weight > 0

``tokens`` is work, not a raw rate: prompt tokens and generated tokens cost very different GPU time,
so each rate (vLLM's ``prompt_tokens`` and ``generation_tokens`` counters) is divided by what one
instance sustains for it, giving the number of fully busy instances. ``prefill_tps`` is the
profile's prefill throughput; ``capacity`` (:func:`instance_token_capacity`) its decode throughput
at the batch limit ``max_num_seqs`` (llama3-8b-h100: 256 sequences at a 33.8 ms step = 7,580
tokens/s). TTFT is a *feedback* signal (it falls once capacity arrives), so it must be over the SLO
both persistently and now: the decision uses ``min(stable, panic-window)`` TTFT, which keeps a stale
window mean from compounding scale-ups once the new replicas serve; and it proposes nothing while
capacity is still on its way (fewer serving replicas than ``current``): requests that queued during
a cold start report long TTFTs after the new replicas already serve them, and acting on those would
overshoot (the HPA's rule for unready pods, applied to TTFT). The ``kv_usage`` signal is filtered as a total for the same reason (see
``signals``).

The tolerance band compares the *unrounded* stable demand with ``current`` (as the HPA compares
its usage ratio); ``ceil`` allows 1e-9 of float slack (10.000000001 replicas is 10).

**Pipeline** (each stage may change the target; ``reason`` names the last stage that did)::

    1. base      current == 0 and demand > 0      -> ceil(max demand), at least 1  SCALE_FROM_ZERO
                 panic (see below)                 -> max(ceil stable, ceil panic, panic_peak,
                                                          current): never down      PANIC
                 demand/current in [1-tol, 1+tol]  -> current                       WITHIN_TOLERANCE
                 (or ceil(demand) == current)
                 otherwise                         -> ceil(stable demand)           SCALE_UP/DOWN
    2. stabilize a scale-down goes only to the highest recommendation of the last
                 scale_down_stabilization_ms (HPA behaviour); scale-up is never delayed STABILIZED
    3. cooldown  at most one scale-down per scale_down_cooldown_ms                 COOLDOWN
    4. step      at most +max_step_up / -max_step_down per decision                STEP_LIMITED
    5. unknown   no scale-down while no load signal is known, or one is known       UNKNOWN_LOAD
                 for only some serving instances, this tick (see below)
    6. clamp     [min_replicas, max_replicas], a hard bound that overrides 2-5     AT_MIN/AT_MAX

**Unknown load.** An engine that cannot report a metric (DeepSpeed-MII has no metrics endpoint;
plain Triton exports no KV use or token counts), a failed scrape, an unhealthy instance or one
that sent no sample leave a load signal *unknown* (no instance reported it) or *partial* (only
some did; ``signals.aggregate``). Neither is fed into the filters, an unknown one proposes
nothing, and stage 5 holds any scale-down: a 0 that means "cannot tell" never takes replicas
away. Scale-ups still follow the known signals, TTFT and the queue time.

``queue_p95_ms`` (``policy.target_queue_p95_ms`` > 0; Triton defaults to 120 ms) is a feedback
signal like TTFT: ``min(serving x p95 / target, 2 x serving)`` when ``min(stable, panic)`` p95 is
over the target and capacity is not on its way; it never asks for fewer replicas.

**Panic** (bursts). Two panic demands are computed (TTFT is excluded: it lags and feeds back): one
from concurrency, kv and tokens on the panic-window means, one from the *level* signals
(:data:`LEVEL_SIGNALS`: concurrency and kv) in the latest tick's sample.
Panic is entered, or extended to ``now + panic_hold_ms``, on every tick where the larger of the two
is ``>= panic_threshold x max(current, 1)`` (an *over* tick); it ends when ``memory.panic_until_ms``
passes without one. On an over tick the panic target uses the larger demand, so a step burst is
followed on the first tick that observes it (Knative waits for its 6 s panic-window average to
cross 2x); on the other ticks of the hold it uses the panic-window mean only, so ``panic_peak``
does not ratchet up to the noisiest single sample. The 1.6x threshold keeps noise from entering
panic at all. In panic the target never goes down and ``memory.panic_peak`` (the highest target of
this panic) ratchets up, so a burst that recedes for a tick does not take capacity away.

**Stabilization memory.** ``memory.recs`` is a monotonic queue of ``(bucket_start_ms, replicas)``
with 1 s buckets and strictly decreasing replica counts: pushing a recommendation first drops the
tail entries it dominates (no larger, not newer); one that is smaller than the tail of its own
second is dominated and not stored. The head is then the maximum of the window. A bucket leaves
once its whole second is older than the window (``bucket_start + 1000 <= now - window``), so a
recommendation counts for at least the window (and less than a second longer) and the queue holds
at most ``ceil(window / 1 s) + 1`` entries. The recommendation stored is the stable path's (stage 1
without panic), also during a panic, so the window reflects the load when the panic ends.

**Forecast** (issue 16; ``forecast`` passed in as a value, see :mod:`controlplane.domain.demand`).
Without one, or with one that is not ``usable``, the decision is the reactive pipeline above. With
a usable one:

7. ahead     target = max(target, ceil(need)), at most max_replicas, where need is
             ``forecast.ready`` when a Standby instance's wake fits the TTFT SLO
             (:func:`wake_fits`: wake + 0.5 s <= SLO), so the capacity the next wake horizon may
             need serves already and the rest may sleep; otherwise ``forecast.total``: everything
             the restart horizon may need serves (a 70B model waking in 4 s cannot catch a burst's
             first requests within a 2 s SLO, and DeepSpeed-MII cannot sleep)      FORECAST
   The raise is speculative capacity: the planner keeps it within the tenant's guaranteed quota
   (what the raise would add beyond it is dropped), so a forecast never holds borrowed GPUs that
   another tenant's present load could use.
   The stabilization window of stage 2 is the restart horizon (at least 60 s) instead of
   ``scale_down_stabilization_ms``: what the long window held "in case the next burst comes" the
   forecast now holds, sized from the bursts actually seen.

Warm pool: ``deployment.warm_pool``, raised to ``ceil(forecast.total) - target`` with a usable
forecast whose wake fits the SLO and whose ``total`` is beyond the tolerance band above the target, within ``max_replicas - target``, never negative; 0 for an engine
that cannot sleep (DeepSpeed-MII). Instances beyond the serving target that the restart horizon may
need are so put to sleep instead of terminated (``reconcile``), and capacity the restart horizon may
need is started one restart ahead.

``ScaleDecision.demand`` is what the replicated demand history records for this tick: the largest of
the stable ``tokens`` (work rate) and ``kv_usage`` demands and the concurrency capped at the serving
replicas; never TTFT or the queue (both are feedback, see :func:`_load_demand`).

Compared with the baselines (``BENCHMARKS.md`` B): the HPA needs 15 s for a first decision and
doubles at most per 15 s; Knative's panic reacts to a 6 s average every 2 s. Here a burst moves the
target on the next 250 ms tick by up to ``max_step_up``; moderate rises follow the 4 s EWMA. The
HPA holds scale-downs for 300 s; here 600 s of stabilization (an LLM replica released between bursts
takes a cold start to come back: on the bursty Azure code trace 60 s gave back capacity between
bursts, missed the SLO on the next one and reversed 9x as often), a 30 s stable window, a 5 s
cooldown and a 2-replica step, with a tolerance band, keep noisy load from flapping.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.core.signals import FilteredSignals
from controlplane.domain.demand import WAKE_REACTION_MS, Forecast
from controlplane.domain.profiles import ModelProfile
from controlplane.domain.records import ScaleMemory
from controlplane.domain.tenants import Deployment, ScalingPolicy, Slo

REC_BUCKET_MS = 1_000
"""Width of a stabilization-window bucket."""

_EPS = 1e-9
"""Rounding slack: a demand of 10.000000001 replicas (float noise) is 10, not 11."""

class ScaleReason(enum.Enum):
    NO_DATA = "no_data"
    WITHIN_TOLERANCE = "within_tolerance"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    PANIC = "panic"
    STABILIZED = "stabilized"
    COOLDOWN = "cooldown"
    STEP_LIMITED = "step_limited"
    AT_MIN = "at_min"
    AT_MAX = "at_max"
    SCALE_FROM_ZERO = "scale_from_zero"
    FORECAST = "forecast"
    """Raised ahead of demand to what the forecast says the next wake horizon may need."""
    UNKNOWN_LOAD = "unknown_load"
    """A scale-down was held: a load signal is unknown or only partly known this tick (the engine
    cannot report it, a scrape failed, an instance sent no sample), so the load may be higher."""
    DELETING = "deleting"
    """Set by the planner, not by :func:`decide`: the deployment is being deleted (target 0)."""


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    target: int
    """Desired serving replicas, always within [min_replicas, max_replicas]."""
    warm_pool: int
    """Desired Standby instances."""
    memory: ScaleMemory
    """The next memory (replicate it when it differs from the input)."""
    reason: ScaleReason
    """The last pipeline stage that set the target."""
    message: str
    """Human-readable explanation with the numbers."""
    proposals: Mapping[str, int] = field(default_factory=dict)
    """Per signal, the replica count its stable value asks for."""
    panic: bool = False
    """True while the deployment is in panic mode (this decision included)."""
    demand: float | None = None
    """The load of this tick in replicas, what the demand history records (:func:`_load_demand`);
    None without signal samples."""
    forecast: Forecast | None = None
    """The forecast the decision read (usable or not), for ``explain``."""
    reactive: int | None = None
    """The target before the forecast raised it (stage 7); None: the same as ``target``. The
    planner holds a raise within the tenant's quota (``reconcile``)."""


@dataclass(frozen=True, slots=True)
class _Panic:
    """The panic state of this tick."""

    active: bool
    over: bool
    """This tick's panic demand crossed the threshold (entering or extending the panic)."""
    until_ms: int
    """``memory.panic_until_ms`` to store: 0 when not in panic."""
    peak: int
    """Highest target of the current panic before this tick (0 when it starts now)."""
    demand: float
    """The panic demand that drives the target this tick."""


@dataclass(frozen=True, slots=True)
class _Stage:
    """The target as it moves through the pipeline, with the stage that last set it."""

    target: int
    reason: ScaleReason
    notes: tuple[str, ...]


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS))


_CAPACITY: dict[int, tuple[ModelProfile, float]] = {}
"""``instance_token_capacity`` per profile object (by identity; the profile is kept alive with its
value so its id is never reused). Profiles are frozen, so the value never goes stale."""


def instance_token_capacity(profile: ModelProfile) -> float:
    """Tokens/s one instance sustains: decode throughput at the batch limit ``max_num_seqs``."""
    hit = _CAPACITY.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    value = profile.decode_tokens_per_s(profile.max_num_seqs)
    if len(_CAPACITY) < 1024:  # a bounded cache: profiles are a handful of module constants
        _CAPACITY[id(profile)] = (profile, value)
    return value


def demand(policy: ScalingPolicy, profile: ModelProfile | None, values: Mapping[str, float]) -> dict[str, float]:
    """Replicas each demand signal asks for (unrounded). ``profile`` None: no tokens signal."""
    out: dict[str, float] = {}
    if "concurrency" in values:
        out["concurrency"] = max(0.0, values["concurrency"]) / policy.target_concurrency
    if "kv_usage" in values:
        out["kv_usage"] = max(0.0, values["kv_usage"]) / policy.target_kv_usage
    if profile is not None and ("prompt_tokens_per_s" in values or "generation_tokens_per_s" in values):
        # Busy instances: prefill time plus decode time needed per second of wall time.
        busy = max(0.0, values.get("prompt_tokens_per_s", 0.0)) / profile.prefill_tokens_per_s
        busy += max(0.0, values.get("generation_tokens_per_s", 0.0)) / instance_token_capacity(profile)
        out["tokens"] = busy / policy.target_token_utilization
    return out


LEVEL_SIGNALS = ("concurrency", "kv_usage")
"""Signals that are levels (requests in the system, KV blocks held), not rates. Only these may
trigger panic from a single sample: a 250 ms token rate is dominated by arrival noise (a few long
prompts landing in one interval), a level is not."""


def ttft_demand(policy: ScalingPolicy, slo: Slo, ttft_p99_ms: float | None, serving: int) -> float | None:
    """Replicas a TTFT p99 above the SLO asks for; None when it is within the SLO (no proposal)."""
    if ttft_p99_ms is None or serving <= 0 or policy.ttft_slo_weight <= 0:
        return None
    ratio = ttft_p99_ms / slo.ttft_p99_ms
    if ratio <= 1.0:
        return None
    return min(serving * (1.0 + policy.ttft_slo_weight * (ratio - 1.0)), 2.0 * serving)


def queue_demand(policy: ScalingPolicy, queue_p95_ms: float | None, serving: int) -> float | None:
    """Replicas an engine queue-time p95 above ``policy.target_queue_p95_ms`` asks for
    (``serving x p95 / target``, at most twice ``serving``); None within the target or disabled."""
    if queue_p95_ms is None or serving <= 0 or policy.target_queue_p95_ms <= 0:
        return None
    ratio = queue_p95_ms / policy.target_queue_p95_ms
    if ratio <= 1.0:
        return None
    return min(serving * ratio, 2.0 * serving)


def _feedback(signals: FilteredSignals, name: str) -> float | None:
    """A feedback signal over its target persistently *and* now: min(stable, panic-window mean)."""
    stable, fresh = signals.stable.get(name), signals.panic.get(name)
    return None if stable is None or fresh is None else min(stable, fresh)


def _stable_demand(
    policy: ScalingPolicy, profile: ModelProfile | None, slo: Slo, signals: FilteredSignals, current: int
) -> dict[str, float]:
    stable = signals.stable if not signals.unknown else {k: v for k, v in signals.stable.items() if k not in signals.unknown}
    out = demand(policy, profile, stable)
    if signals.serving >= current:  # not while capacity is on its way (module doc)
        t = ttft_demand(policy, slo, _feedback(signals, "ttft_p99_ms"), signals.serving)
        if t is not None:
            out["ttft_p99_ms"] = t
        q = queue_demand(policy, _feedback(signals, "queue_p95_ms"), signals.serving)
        if q is not None:
            out["queue_p95_ms"] = q
    return out


def _hold_unknown(stage: _Stage, signals: FilteredSignals, current: int) -> _Stage:
    """No scale-down on a load that is not wholly known: with no load signal known, or one known
    only in part, this tick, the load may be higher than what was counted (the 0 of an engine that
    cannot report a metric is not "idle")."""
    if stage.target >= current or (not signals.partial and signals.known_load):
        return stage
    if not signals.known_load:
        why = f"no load signal is known ({', '.join(sorted(signals.unknown)) or 'none reported'})"
    else:
        why = f"{', '.join(sorted(signals.partial))} known for only some instances"
    note = f"scale-down to {stage.target} held at {current}: {why}"
    return _Stage(current, ScaleReason.UNKNOWN_LOAD, stage.notes + (note,))


def _panic_demand(
    policy: ScalingPolicy, profile: ModelProfile | None, signals: FilteredSignals
) -> tuple[float, float]:
    """(largest demand on the panic-window means, largest demand on the latest samples)."""
    window = demand(policy, profile, signals.panic)
    latest = demand(policy, profile, {k: v for k, v in signals.latest.items() if k in LEVEL_SIGNALS})
    return max(window.values(), default=0.0), max(latest.values(), default=0.0)


def _panic_state(
    policy: ScalingPolicy,
    profile: ModelProfile | None,
    signals: FilteredSignals,
    memory: ScaleMemory,
    current: int,
    now_ms: int,
) -> _Panic:
    window, latest = _panic_demand(policy, profile, signals)
    over = max(window, latest) >= policy.panic_threshold * max(current, 1)
    ongoing = memory.panic_until_ms != 0 and now_ms < memory.panic_until_ms
    peak = memory.panic_peak if ongoing else 0
    if over:
        # The latest sample drives the target only on a tick that crosses the threshold (to follow
        # a burst at once); while the panic merely holds, the panic-window mean does, so the peak
        # does not ratchet up to the noisiest single sample of the hold.
        return _Panic(True, True, now_ms + policy.panic_hold_ms, peak, max(window, latest))
    if ongoing:
        return _Panic(True, False, memory.panic_until_ms, peak, window)
    return _Panic(False, False, 0, 0, window)


def _recommend(policy: ScalingPolicy, stable: float, current: int) -> tuple[int, ScaleReason, str]:
    """Stage 1 without panic: the stable recommendation (also what the stabilization window stores)."""
    want = _ceil(stable)
    if current <= 0:
        if stable > 0:
            return max(1, want), ScaleReason.SCALE_FROM_ZERO, f"demand {stable:.2f} at 0 replicas"
        return 0, ScaleReason.WITHIN_TOLERANCE, "no demand at 0 replicas"
    ratio = stable / current
    lo, hi = 1.0 - policy.tolerance, 1.0 + policy.tolerance
    if lo <= ratio <= hi:
        return current, ScaleReason.WITHIN_TOLERANCE, (
            f"demand {stable:.2f} is {ratio:.3f}x current {current}, within [{lo:.2f}, {hi:.2f}]"
        )
    if want == current:
        return current, ScaleReason.WITHIN_TOLERANCE, f"demand {stable:.2f} rounds up to current {current}"
    reason = ScaleReason.SCALE_UP if want > current else ScaleReason.SCALE_DOWN
    return want, reason, f"demand {stable:.2f} is {ratio:.3f}x current {current} -> {want}"


def push_rec(
    recs: tuple[tuple[int, int], ...], replicas: int, now_ms: int, window_ms: int
) -> tuple[tuple[int, int], ...]:
    """Add a recommendation to the monotonic queue and drop what left the window (see module doc)."""
    if window_ms <= 0:
        return ()
    bucket = now_ms - now_ms % REC_BUCKET_MS
    if recs and recs[-1][0] > bucket:
        bucket = recs[-1][0]  # the clock went back: never reorder the queue
    kept = list(recs)
    while kept and kept[-1][1] <= replicas:
        kept.pop()
    if not kept or kept[-1][0] != bucket:
        kept.append((bucket, replicas))
    expired = now_ms - window_ms - REC_BUCKET_MS
    return tuple((b, r) for b, r in kept if b > expired)


def _base(
    policy: ScalingPolicy,
    current: int,
    stable: float,
    recommended: tuple[int, ScaleReason, str],
    panic: _Panic,
    now_ms: int,
) -> _Stage:
    rec, reason, note = recommended
    if current <= 0 and (stable > 0 or panic.demand > 0):
        target = max(1, _ceil(stable), _ceil(panic.demand))
        return _Stage(target, ScaleReason.SCALE_FROM_ZERO, (f"demand {max(stable, panic.demand):.2f} at 0 replicas",))
    if panic.active:
        target = max(_ceil(stable), _ceil(panic.demand), panic.peak, current)
        note = (
            f"panic held {_seconds(panic.until_ms - now_ms)} more (threshold {policy.panic_threshold}x of {max(current, 1)}): "
            f"max(stable {_ceil(stable)}, panic {_ceil(panic.demand)}, peak {panic.peak}, "
            f"current {current}) = {target}"
        )
        return _Stage(target, ScaleReason.PANIC, (note,))
    return _Stage(rec, reason, (note,))


def _seconds(ms: int) -> str:
    """A duration for people: ``12.0 s`` (decision messages never print epoch milliseconds)."""
    return f"{max(0, ms) / 1000:.1f} s"


def _stabilize(window_ms: int, stage: _Stage, recs: tuple[tuple[int, int], ...], current: int) -> _Stage:
    if stage.target >= current or not recs:
        return stage
    highest = max(stage.target, recs[0][1])
    if highest == stage.target:
        return stage
    held = min(highest, current)
    note = (
        f"scale-down held at {held}: highest recommendation in the last "
        f"{window_ms}ms is {highest} (raw {stage.target})"
    )
    return _Stage(held, ScaleReason.STABILIZED, stage.notes + (note,))


def _cooldown(policy: ScalingPolicy, stage: _Stage, memory: ScaleMemory, current: int, now_ms: int) -> _Stage:
    last = memory.last_scale_down_ms
    if stage.target >= current or last < 0 or now_ms - last >= policy.scale_down_cooldown_ms:
        return stage
    note = (
        f"scale-down to {stage.target} deferred: last scale-down {_seconds(now_ms - last)} ago, "
        f"cooldown {_seconds(policy.scale_down_cooldown_ms)}, {_seconds(last + policy.scale_down_cooldown_ms - now_ms)} left"
    )
    return _Stage(current, ScaleReason.COOLDOWN, stage.notes + (note,))


def _step(policy: ScalingPolicy, stage: _Stage, current: int) -> _Stage:
    bounded = min(max(stage.target, current - policy.max_step_down), current + policy.max_step_up)
    if bounded == stage.target:
        return stage
    note = (
        f"step limited {current} -> {bounded} instead of {stage.target} "
        f"(at most +{policy.max_step_up}/-{policy.max_step_down} per decision)"
    )
    return _Stage(bounded, ScaleReason.STEP_LIMITED, stage.notes + (note,))


def _clamp(deployment: Deployment, stage: _Stage) -> _Stage:
    lo, hi = deployment.min_replicas, deployment.max_replicas
    if stage.target > hi:
        return _Stage(hi, ScaleReason.AT_MAX, stage.notes + (f"{stage.target} capped at max_replicas {hi}",))
    if stage.target < lo:
        return _Stage(lo, ScaleReason.AT_MIN, stage.notes + (f"{stage.target} raised to min_replicas {lo}",))
    return stage


def _load_demand(proposals: Mapping[str, float], serving: int) -> float:
    """What the demand history records: the largest of the work rate (``tokens``), the KV cache in
    use and the concurrency, the concurrency capped at the serving replicas. Not the queue: requests
    waiting because capacity was short are a consequence of the provisioning, and a forecast learned
    from them would provision for its own backlog (a positive feedback loop: on the Azure code trace
    with a 60 s window, recording the uncapped concurrency held 37 GPU-hours where the work rate held
    21). Capped, a saturated deployment records "all that served was needed", no more."""
    out = max(proposals.get("tokens", 0.0), proposals.get("kv_usage", 0.0))
    return max(out, min(proposals.get("concurrency", 0.0), float(serving)))


FORECAST_MIN_WINDOW_MS = 60_000
"""Shortest stabilization window with a usable forecast (module doc, stage 7)."""


def wake_fits(deployment: Deployment, slo: Slo, forecast: Forecast) -> bool:
    """A Standby instance may stand in for a serving one when its wake (plus one reaction) fits in
    the TTFT SLO: a burst's first requests then wait for it and still meet the SLO. A 70B model
    waking in 4 s against a 2 s SLO does not; an 8B one waking in 1 s does."""
    return deployment.engine.can_sleep and 0 < forecast.wake_ms <= slo.ttft_p99_ms - WAKE_REACTION_MS


def _warm_pool(deployment: Deployment, slo: Slo, target: int, forecast: Forecast | None = None) -> int:
    if not deployment.engine.can_sleep:
        return 0
    want = deployment.warm_pool
    if forecast is not None and wake_fits(deployment, slo, forecast):
        # Within the tolerance band of the serving target the restart horizon asks for nothing more
        # (as for the target itself: noise around an integer must not create and drain Standbys).
        if forecast.total > target * (1.0 + deployment.policy.tolerance):
            want = max(want, _ceil(forecast.total) - target)
    return max(0, min(want, deployment.max_replicas - target))


def _ahead(deployment: Deployment, slo: Slo, stage: _Stage, forecast: Forecast, current: int) -> _Stage:
    fits = wake_fits(deployment, slo, forecast)
    need = forecast.ready if fits else forecast.total
    want = min(_ceil(need), deployment.max_replicas)
    tol = deployment.policy.tolerance
    if current > 0 and current * (1.0 - tol) <= need <= current * (1.0 + tol):
        # The tolerance band, as for the load: a forecast within it of the current count holds it
        # (a quantile drifting across an integer would otherwise flip it every bucket).
        want = min(current, deployment.max_replicas)
    if want <= stage.target:
        return stage
    if fits:
        why = f"within its wake horizon ({forecast.wake_ms}ms; the rest of the restart horizon's need sleeps)"
    elif deployment.engine.can_sleep:
        why = (f"within its restart horizon ({forecast.restart_ms}ms), all serving: a wake of {forecast.wake_ms}ms "
               f"does not fit the {slo.ttft_p99_ms}ms TTFT SLO")
    else:
        why = f"within its restart horizon ({forecast.restart_ms}ms), all serving: the engine cannot sleep"
    note = f"forecast: demand may reach {need:.2f} {why} at p{forecast.quantile:g}: {stage.target} -> {want} ahead of demand"
    return _Stage(want, ScaleReason.FORECAST, stage.notes + (note,))


def _no_data(
    deployment: Deployment, slo: Slo, memory: ScaleMemory, current: int, forecast: Forecast | None,
    signals: FilteredSignals | None = None,
) -> ScaleDecision:
    target = min(max(current, deployment.min_replicas), deployment.max_replicas)
    message = f"no signal samples in the stable window; keeping {current} replicas"
    if signals is not None and (signals.unknown or signals.partial):
        message = (f"load unknown ({', '.join(sorted(signals.unknown | signals.partial))} not reported by every "
                   f"serving instance); keeping {current} replicas")
    if target != current:
        message += f", clamped to {target} (bounds [{deployment.min_replicas}, {deployment.max_replicas}])"
    usable = forecast if forecast is not None and forecast.usable else None
    return ScaleDecision(target, _warm_pool(deployment, slo, target, usable), memory, ScaleReason.NO_DATA, message,
                         forecast=forecast)


def decide(
    deployment: Deployment,
    profile: ModelProfile | None,
    slo: Slo,
    signals: FilteredSignals | None,
    memory: ScaleMemory,
    current: int,
    now_ms: int,
    forecast: Forecast | None = None,
) -> ScaleDecision:
    """The desired replica count and warm pool of ``deployment`` at ``now_ms`` (see the module doc)."""
    current = max(0, current)
    if signals is None or not signals.stable:
        return _no_data(deployment, slo, memory, current, forecast, signals)
    policy = deployment.policy
    usable = forecast if forecast is not None and forecast.usable else None
    window = policy.scale_down_stabilization_ms
    if usable is not None:
        window = min(window, max(FORECAST_MIN_WINDOW_MS, usable.restart_ms))
    proposals = _stable_demand(policy, profile, slo, signals, current)
    stable = max(proposals.values(), default=0.0)
    panic = _panic_state(policy, profile, signals, memory, current, now_ms)
    recommended = _recommend(policy, stable, current)
    recs = push_rec(memory.recs, recommended[0], now_ms, window)
    stage = _base(policy, current, stable, recommended, panic, now_ms)
    stage = _stabilize(window, stage, recs, current)
    stage = _cooldown(policy, stage, memory, current, now_ms)
    stage = _step(policy, stage, current)
    stage = _hold_unknown(stage, signals, current)
    stage = _clamp(deployment, stage)
    reactive = stage.target
    if usable is not None:
        stage = _ahead(deployment, slo, stage, usable, current)
    target = stage.target
    # A load not wholly known is not recorded: the forecast would learn a lower bound as demand.
    recorded = _load_demand(proposals, signals.serving) if not signals.partial and signals.known_load else None
    next_memory = ScaleMemory(
        recs=recs,
        panic_until_ms=panic.until_ms,
        panic_peak=max(panic.peak, target) if panic.active else 0,
        last_scale_up_ms=now_ms if target > current else memory.last_scale_up_ms,
        last_scale_down_ms=now_ms if target < current else memory.last_scale_down_ms,
    )
    asked = ", ".join(f"{name} {value:.2f}" for name, value in proposals.items())
    message = (
        f"{'; '.join(stage.notes)}; target {current} -> {target}; demand by signal: {asked}; "
        f"panic demand {panic.demand:.2f}{' (over threshold)' if panic.over else ''}"
    )
    return ScaleDecision(
        target=target,
        warm_pool=_warm_pool(deployment, slo, target, usable),
        memory=next_memory,
        reason=stage.reason,
        message=message,
        proposals={name: _ceil(value) for name, value in proposals.items()},
        panic=panic.active,
        demand=recorded,
        forecast=forecast,
        reactive=reactive,
    )
