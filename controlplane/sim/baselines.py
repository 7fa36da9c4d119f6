"""Baseline autoscalers for the simulator, faithful to ``shared/design/BENCHMARKS.md`` section B.

Each baseline is an object with its own explicit memory (per deployment) and ``now_ms`` passed in;
nothing reads a clock. The simulator (:class:`controlplane.sim.engine.Simulation` with ``policy=``)
asks it, every control-loop tick (250 ms), for a deployment's replica target through
:meth:`ReplicaPolicy.target`, giving it a :class:`PolicyView`: the desired replica count
(``spec.replicas``), every pod with its lifecycle state and its per-instance concurrency sample
(``running + waiting`` of the simulated engine, the same samples this project's policy reads), and
the gateway's queue. A baseline acts only on its own period (HPA 15 s, KPA 2 s) and returns the
current count in between. The rest of the loop (allocation, placement, lifecycle) is shared.

* :class:`HpaAutoscaler`: Kubernetes HPA (autoscaling/v2), a Pods metric with an AverageValue
  target: replica calculator with tolerance 0.1 and the missing/unready pod rules, then either the
  default ``behavior`` (scale-up ``max(Pods 4, Percent 100)`` per 15 s, scale-down ``Percent 100``
  per 15 s with a 300 s stabilization window; the default here) or the legacy no-behavior path
  (300 s stabilization, scale-up limit ``max(2 x current, 4)``). Sync every 15 s.
* :class:`KpaAutoscaler`: Knative KPA: scrape every 1 s into 1 s buckets (a random sample of the
  ready pods, ``n = N if N <= 3 else ceil(N X / (N + X - 1))``, scaled to the population, plus
  the activator's queue), 60 s stable / 6 s panic windows, decision every 2 s, panic at 2x the
  ready pods held 60 s, scale-up at most x1000 and scale-down at most /2 per tick.
* :class:`StaticPolicy`: a fixed replica count from the start (peak provisioning).
* :class:`OraclePolicy`: a clairvoyant schedule (:func:`oracle_schedule`): the least replicas the
  known future needs, each started one cold start ahead of need.

Pods in the HPA's terms (``replica_calculator.go``'s ``groupPods``): Draining = being deleted
(ignored); Pending = unready; Warming or Standby, or serving without a sample = running without a
metric (missing); Ready/Busy with a sample = ready.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.instances import InstanceState
from controlplane.domain.profiles import ModelProfile
from controlplane.domain.tenants import Deployment
from controlplane.sim.traffic import TrafficWindow

S = InstanceState


@dataclass(frozen=True, slots=True)
class PodView:
    id: InstanceId
    state: InstanceState
    concurrency: float | None
    """running + waiting of the instance's sample this tick; None: no sample (not serving)."""


@dataclass(frozen=True, slots=True)
class PolicyView:
    current: int
    """The deployment's desired replica count (the scale subresource's ``spec.replicas``)."""
    pods: tuple[PodView, ...]
    gateway_waiting: int = 0
    """Requests queued at the gateway (Knative's activator) because no instance serves."""
    traffic: TrafficWindow | None = None
    """The deployment's traffic since the previous call and its engines' load now; filled only for
    a policy whose ``wants_traffic`` attribute is true (:mod:`controlplane.sim.traffic`)."""


class ReplicaPolicy(Protocol):
    name: str
    wants_traffic: bool
    """True: the simulator fills :attr:`PolicyView.traffic` for it (built only then)."""

    def initial_replicas(self, d: Deployment) -> int:
        """Instances already serving when the simulation starts."""
        ...

    def target(self, d: Deployment, view: PolicyView, now_ms: int) -> int:
        """The replica target at ``now_ms`` (clamped to the deployment's bounds by the caller)."""
        ...

    def close(self) -> None:
        """Release what the policy holds (Dynamo's planners own event loops); called after a run."""
        ...


class StatelessPolicy:
    """What every port here shares: no traffic window, nothing to release."""

    wants_traffic = False

    def close(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# Kubernetes HPA


@dataclass(frozen=True, slots=True)
class ScalingRule:
    kind: str
    """``Pods`` or ``Percent``."""
    value: int
    period_ms: int


@dataclass(frozen=True, slots=True)
class HpaConfig:
    target_per_pod: float = 24.0
    """Pods metric AverageValue target (here: running + waiting per pod = ``target_concurrency``)."""
    sync_period_ms: int = 15_000
    tolerance: float = 0.10
    behavior: bool = True
    """True: the default ``behavior`` policies (autoscaling/v2); False: the legacy no-behavior path."""
    scale_up_stabilization_ms: int = 0
    scale_down_stabilization_ms: int = 300_000
    scale_up_rules: tuple[ScalingRule, ...] = (ScalingRule("Pods", 4, 15_000), ScalingRule("Percent", 100, 15_000))
    scale_down_rules: tuple[ScalingRule, ...] = (ScalingRule("Percent", 100, 15_000),)
    select_policy: str = "Max"


def _milli(x: float) -> int:
    return round(x * 1000)


def hpa_proposal(pods: Sequence[PodView], current: int, target: float, tolerance: float) -> int | None:
    """The replica calculator for a Pods metric (``calcPlainMetricReplicas``); None: no valid metric."""
    ready: list[int] = []
    missing = unready = 0
    for p in pods:
        if p.state is S.DRAINING or p.state.terminal:
            continue  # being deleted or failed: ignored
        if p.state is S.PENDING:
            unready += 1
        elif p.concurrency is None:
            missing += 1
        else:
            ready.append(_milli(p.concurrency))
    if not ready:
        return None
    target_m = _milli(target)
    ratio = (sum(ready) // len(ready)) / target_m

    def within(r: float) -> bool:
        return 1.0 - tolerance <= r <= 1.0 + tolerance

    scale_up_with_unready = unready > 0 and ratio > 1.0
    if not scale_up_with_unready and missing == 0:
        return current if within(ratio) else math.ceil(ratio * len(ready))
    values = list(ready)
    if missing:
        if ratio < 1.0:
            values += [target_m] * missing
        elif ratio > 1.0:
            values += [0] * missing
    if scale_up_with_unready:
        values += [0] * unready
    new_ratio = (sum(values) // len(values)) / target_m
    if within(new_ratio) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current
    new = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and new > current) or (new_ratio > 1.0 and new < current):
        return current
    return new


@dataclass
class HpaMemory:
    last_sync_ms: int | None = None
    recommendations: list[tuple[int, int]] = field(default_factory=list)
    """(at_ms, raw proposal) of past syncs."""
    scale_up_events: list[tuple[int, int]] = field(default_factory=list)
    """(at_ms, replicas added)."""
    scale_down_events: list[tuple[int, int]] = field(default_factory=list)
    desired: int | None = None


class HpaAutoscaler(StatelessPolicy):
    name = "hpa"

    def __init__(self, config: HpaConfig | None = None, *, targets: Mapping[DeploymentId, float] | None = None,
                 initial: Mapping[DeploymentId, int] | None = None) -> None:
        """``targets``: per-deployment AverageValue targets overriding ``config.target_per_pod``."""
        self.config = config or HpaConfig()
        self.memory: dict[DeploymentId, HpaMemory] = {}
        self._targets = dict(targets or {})
        self._initial = dict(initial or {})

    def initial_replicas(self, d: Deployment) -> int:
        return self._initial.get(d.id, d.min_replicas)

    def target(self, d: Deployment, view: PolicyView, now_ms: int) -> int:
        mem = self.memory.setdefault(d.id, HpaMemory())
        if mem.last_sync_ms is not None and now_ms - mem.last_sync_ms < self.config.sync_period_ms:
            return view.current
        mem.last_sync_ms = now_ms
        target = self._targets.get(d.id, self.config.target_per_pod)
        proposal = hpa_proposal(view.pods, view.current, target, self.config.tolerance)
        return self.sync(d.id, view.current, proposal, d.min_replicas, d.max_replicas, now_ms)

    def sync(self, dep: DeploymentId, current: int, proposal: int | None, lo: int, hi: int, now_ms: int) -> int:
        """``reconcileAutoscaler`` after the metric: normalize ``proposal`` and remember the change."""
        mem = self.memory.setdefault(dep, HpaMemory())
        if current == 0 and lo != 0:
            return current  # autoscaling disabled
        if current > hi:
            desired = hi
        elif current < lo:
            desired = lo
        elif proposal is None:
            return current  # invalid metric: no scaling, no recommendation
        elif self.config.behavior:
            desired = self._with_behavior(mem, current, proposal, lo, hi, now_ms)
        else:
            desired = self._without_behavior(mem, current, proposal, lo, hi, now_ms)
        if desired > current:
            mem.scale_up_events.append((now_ms, desired - current))
        elif desired < current:
            mem.scale_down_events.append((now_ms, current - desired))
        longest = max((r.period_ms for r in self.config.scale_up_rules + self.config.scale_down_rules), default=0)
        mem.scale_up_events = [e for e in mem.scale_up_events if e[0] > now_ms - longest]
        mem.scale_down_events = [e for e in mem.scale_down_events if e[0] > now_ms - longest]
        mem.desired = desired
        return desired

    def _without_behavior(self, mem: HpaMemory, current: int, proposal: int, lo: int, hi: int, now_ms: int) -> int:
        cutoff = now_ms - self.config.scale_down_stabilization_ms
        mem.recommendations = [r for r in mem.recommendations if r[0] >= cutoff]
        rec = max([proposal] + [r for _, r in mem.recommendations])
        mem.recommendations.append((now_ms, proposal))
        limit = min(hi, max(2 * current, 4))
        return min(max(rec, lo), limit)

    def _with_behavior(self, mem: HpaMemory, current: int, proposal: int, lo: int, hi: int, now_ms: int) -> int:
        cfg = self.config
        up_cut, down_cut = now_ms - cfg.scale_up_stabilization_ms, now_ms - cfg.scale_down_stabilization_ms
        up = min([proposal] + [r for t, r in mem.recommendations if t > up_cut])
        down = max([proposal] + [r for t, r in mem.recommendations if t > down_cut])
        rec = current
        rec = max(rec, up)
        rec = min(rec, down)
        keep = min(up_cut, down_cut)
        mem.recommendations = [(t, r) for t, r in mem.recommendations if t > keep] + [(now_ms, proposal)]
        if rec > current:
            limits = []
            for rule in cfg.scale_up_rules:
                start = current - self._changed(mem.scale_up_events, rule, now_ms) + self._changed(
                    mem.scale_down_events, rule, now_ms)
                limits.append(start + rule.value if rule.kind == "Pods" else math.ceil(start * (1 + rule.value / 100)))
            limit = max(limits) if cfg.select_policy == "Max" else min(limits)
            limit = max(limit, current)
            return min(rec, hi, limit)
        if rec < current:
            limits = []
            for rule in cfg.scale_down_rules:
                start = current - self._changed(mem.scale_up_events, rule, now_ms) + self._changed(
                    mem.scale_down_events, rule, now_ms)
                limits.append(start - rule.value if rule.kind == "Pods" else int(start * (1 - rule.value / 100)))
            limit = min(limits) if cfg.select_policy == "Max" else max(limits)
            limit = min(limit, current)
            return max(rec, lo, limit)
        return rec

    @staticmethod
    def _changed(events: Sequence[tuple[int, int]], rule: ScalingRule, now_ms: int) -> int:
        return sum(n for t, n in events if t > now_ms - rule.period_ms)


# ---------------------------------------------------------------------------------------------
# Knative KPA


@dataclass(frozen=True, slots=True)
class KpaConfig:
    container_concurrency: float = 24.0 / 0.7
    """The concurrency "total"; the per-pod target is ``total x target_utilization``."""
    target_utilization: float = 0.7
    tick_ms: int = 2_000
    scrape_ms: int = 1_000
    stable_window_ms: int = 60_000
    panic_window_pct: float = 10.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    sample_x: float = 15.37
    """The scraper's sample-size constant (``n = ceil(N X / (N + X - 1))`` of N > 3 ready pods)."""

    @property
    def target(self) -> float:
        # Rounded to 1e-9 so that total = 24 / 0.7 gives the target 24 exactly, not 23.999999999999996.
        return max(0.01, round(self.container_concurrency * self.target_utilization, 9))

    @property
    def panic_window_ms(self) -> int:
        return max(6_000, int(self.stable_window_ms * self.panic_window_pct / 100))


@dataclass
class KpaMemory:
    buckets: dict[int, float] = field(default_factory=dict)
    """1 s bucket (seconds) -> recorded concurrency total."""
    first_write_s: int | None = None
    last_write_s: int | None = None
    next_scrape_ms: int = 0
    next_tick_ms: int = 0
    panic_time_ms: int = 0
    """0: not in panic; else the time of the last over-threshold tick."""
    max_panic_pods: int = 0
    desired: int | None = None


class KpaAutoscaler(StatelessPolicy):
    name = "kpa"

    def __init__(self, config: KpaConfig | None = None, *, seed: int = 0, targets: Mapping[DeploymentId, float] | None = None,
                 initial: Mapping[DeploymentId, int] | None = None) -> None:
        """``targets``: per-deployment per-pod concurrency targets (``total x target_utilization``)
        overriding ``config.target``."""
        self.config = config or KpaConfig()
        self.memory: dict[DeploymentId, KpaMemory] = {}
        self._targets = dict(targets or {})
        self._rng = random.Random(f"{seed}:kpa-scraper")
        self._initial = dict(initial or {})

    def initial_replicas(self, d: Deployment) -> int:
        return self._initial.get(d.id, d.min_replicas)

    def target(self, d: Deployment, view: PolicyView, now_ms: int) -> int:
        mem = self.memory.setdefault(d.id, KpaMemory())
        ready = [p for p in view.pods if p.state.serving and p.concurrency is not None]
        if now_ms >= mem.next_scrape_ms:
            mem.next_scrape_ms = now_ms - now_ms % self.config.scrape_ms + self.config.scrape_ms
            self.record(d.id, now_ms, self.scrape(ready) + view.gateway_waiting)
        if now_ms >= mem.next_tick_ms:
            mem.next_tick_ms = now_ms - now_ms % self.config.tick_ms + self.config.tick_ms
            desired = self.tick(d.id, now_ms, len(ready), self._targets.get(d.id))
            if desired is not None:
                mem.desired = min(max(desired, d.min_replicas), d.max_replicas)
        return view.current if mem.desired is None else mem.desired

    def scrape(self, ready: Sequence[PodView]) -> float:
        """Total concurrency estimated from a sample of the ready pods (``stats_scraper.go``)."""
        n_all = len(ready)
        if n_all == 0:
            return 0.0
        x = self.config.sample_x
        n = n_all if n_all <= 3 else min(n_all, math.ceil(n_all * x / (n_all + x - 1)))
        chosen = ready if n == n_all else self._rng.sample(list(ready), n)
        return sum(p.concurrency or 0.0 for p in chosen) / n * n_all

    def record(self, dep: DeploymentId, now_ms: int, total: float) -> None:
        mem = self.memory.setdefault(dep, KpaMemory())
        sec = now_ms // 1000
        mem.buckets[sec] = mem.buckets.get(sec, 0.0) + total
        if mem.first_write_s is None:
            mem.first_write_s = sec
        mem.last_write_s = sec
        horizon = sec - self.config.stable_window_ms // 1000
        for old in [k for k in mem.buckets if k <= horizon]:
            del mem.buckets[old]

    def window_average(self, dep: DeploymentId, now_ms: int, window_ms: int) -> float | None:
        """``TimedFloat64Buckets.WindowAverage`` (linear): None without any data."""
        mem = self.memory.get(dep)
        if mem is None or mem.last_write_s is None or mem.first_write_s is None:
            return None
        w = window_ms // 1000
        now_s = now_ms // 1000
        if now_s - mem.last_write_s >= w:
            return 0.0
        total = sum(v for s, v in mem.buckets.items() if now_s - w < s <= now_s)
        buckets = min(mem.last_write_s - mem.first_write_s + 1, w)
        return total / buckets

    def in_panic(self, dep: DeploymentId) -> bool:
        mem = self.memory.get(dep)
        return mem is not None and mem.panic_time_ms != 0

    def tick(self, dep: DeploymentId, now_ms: int, ready_raw: int, target: float | None = None) -> int | None:
        """One ``Scale`` call (``autoscaler.go``); None: no data (no change)."""
        cfg = self.config
        target = cfg.target if target is None else target
        mem = self.memory.setdefault(dep, KpaMemory())
        stable = self.window_average(dep, now_ms, cfg.stable_window_ms)
        panic = self.window_average(dep, now_ms, cfg.panic_window_ms)
        if stable is None or panic is None:
            return None
        ready = max(1, ready_raw)
        max_up = math.ceil(cfg.max_scale_up_rate * ready)
        max_down = math.floor(ready / cfg.max_scale_down_rate)
        dspc = math.ceil(stable / target)
        dppc = math.ceil(panic / target)
        d_stable = min(max(dspc, max_down), max_up)
        d_panic = min(max(dppc, max_down), max_up)
        over = dppc / ready >= cfg.panic_threshold
        if over:
            mem.panic_time_ms = now_ms  # enter or extend
        elif mem.panic_time_ms != 0 and now_ms > mem.panic_time_ms + cfg.stable_window_ms:
            mem.panic_time_ms = 0
            mem.max_panic_pods = 0
        desired = d_stable
        if mem.panic_time_ms != 0:
            desired = max(desired, d_panic)
            mem.max_panic_pods = max(mem.max_panic_pods, desired)
            desired = mem.max_panic_pods
        return desired


# ---------------------------------------------------------------------------------------------
# static peak and the clairvoyant bound


class StaticPolicy(StatelessPolicy):
    name = "static"

    def __init__(self, replicas: Mapping[DeploymentId, int]) -> None:
        self.replicas = dict(replicas)

    def initial_replicas(self, d: Deployment) -> int:
        return min(max(self.replicas.get(d.id, d.max_replicas), d.min_replicas), d.max_replicas)

    def target(self, d: Deployment, view: PolicyView, now_ms: int) -> int:
        return self.initial_replicas(d)


@dataclass(frozen=True, slots=True)
class RequestShape:
    arrival_ms: int
    prompt_tokens: int
    output_tokens: int


def required_replicas(
    requests: Sequence[RequestShape], profile: ModelProfile, *, slo_ms: int, duration_s: int
) -> list[float]:
    """Per second, the least serving instances the known load needs (fluid model of the service
    model, optimistic everywhere so that it is a lower bound):

    * prefill work: prompt tokens / ``prefill_tokens_per_s`` of the arrivals, averaged over a window
      as long as the TTFT SLO (a request may wait that long for its prefill);
    * batch slots: requests in the system (prefill, then ``output x step_ms(1)``, the fastest decode)
      / ``max_num_seqs``;
    * KV cache: their prompt + output tokens / ``kv_capacity_tokens``.
    """
    n = max(1, duration_s + 1)
    prefill = [0.0] * n
    busy = [0.0] * (n + 1)  # request-seconds in the system, per second (difference array of time)
    kv = [0.0] * (n + 1)
    for r in requests:
        s = min(n - 1, r.arrival_ms // 1000)
        prefill[s] += r.prompt_tokens / profile.prefill_tokens_per_s
        start = r.arrival_ms / 1000
        end = start + r.prompt_tokens / profile.prefill_tokens_per_s + r.output_tokens * profile.step_ms(1) / 1000
        _spread(busy, start, end, 1.0)
        _spread(kv, start, end, float(r.prompt_tokens + r.output_tokens))
    window = max(1, round(slo_ms / 1000))
    out = []
    acc = 0.0
    for s in range(n):
        acc += prefill[s]
        if s >= window:
            acc -= prefill[s - window]
        out.append(max(acc / window, busy[s] / profile.max_num_seqs, kv[s] / profile.kv_capacity_tokens))
    return out


def _spread(acc: list[float], start_s: float, end_s: float, weight: float) -> None:
    """Add ``weight`` x (time in [start, end) that falls in each second) to ``acc``."""
    s = int(start_s)
    while s < len(acc) and s < end_s:
        overlap = min(end_s, s + 1) - max(start_s, s)
        if overlap > 0:
            acc[s] += weight * overlap
        s += 1


def oracle_schedule(required: Sequence[float], *, lead_ms: int, lo: int, hi: int) -> list[int]:
    """Per second, the replica target of a clairvoyant policy: the most replicas needed during the
    next ``lead_ms`` (an instance must be created one cold start before it serves, and one released
    now could not come back sooner), within [lo, hi]."""
    need = [min(hi, max(lo, math.ceil(x - 1e-9))) for x in required]
    lead = max(1, math.ceil(lead_ms / 1000))
    out = []
    window: list[int] = []  # monotonic deque of indices with decreasing need
    j = 0
    for s in range(len(need)):
        while j < len(need) and j <= s + lead:
            while window and need[window[-1]] <= need[j]:
                window.pop()
            window.append(j)
            j += 1
        while window[0] < s:
            window.pop(0)
        out.append(need[window[0]])
    return out


class OraclePolicy(StatelessPolicy):
    name = "oracle"

    def __init__(self, schedules: Mapping[DeploymentId, Sequence[int]]) -> None:
        self.schedules = {k: list(v) for k, v in schedules.items()}

    def initial_replicas(self, d: Deployment) -> int:
        sched = self.schedules.get(d.id)
        return sched[0] if sched else d.min_replicas

    def target(self, d: Deployment, view: PolicyView, now_ms: int) -> int:
        sched = self.schedules.get(d.id)
        if not sched:
            return d.min_replicas
        return sched[min(len(sched) - 1, now_ms // 1000)]
