"""One tick of the control loop as two pure functions.

* :func:`facts` turns what the adapters reported (lifecycle reports, samples, failed sends) into
  replicated commands: instance transitions and circuit-breaker updates.
* :func:`plan` decides: a scaling decision per deployment -> tenant allocation and preemption ->
  warm-pool sizing -> breaker gating -> placement, and returns an ordered :class:`Plan`.

The shell commits ``facts`` and then ``plan.commands`` through the replicator **before** it sends any
adapter command derived from them (commit, then act). Both functions are deterministic given their
inputs (the injected ``rng`` only draws breaker backoff jitter, whose result is then committed).

Per deployment, with ``grant`` serving replicas allowed by the allocation and ``warm`` Standby
instances allowed from the capacity left over after every serving grant:

1. preemption victims are drained (with a grace period);
2. Standby instances are woken (warm starts) before anything new is created;
3. ``allowance = grant + max(0, warm - standby)``: serving-bound instances above it are removed
   (Pending cancelled, others drained), below it new ones are placed (cold starts);
4. idle Ready instances beyond ``grant`` are put to sleep while the warm pool has room;
5. Standby instances beyond ``warm`` are drained.

A create left unplaced because the pool's free GPUs are split over clusters makes room on one
cluster by the allocation's own preemption rules (:mod:`controlplane.core.room`, after every
deployment is converged; only on such a tick).

**Cordon and drain.** A cluster that is cordoned or draining, or whose zone record is, gets no new
instances (:func:`placement.schedulable`); its existing instances keep serving and the allocation
counts only the GPUs they hold there (``_healthy_capacity``). A cluster that is *draining* (itself
or through its zone, :func:`placement.evacuating`) is evacuated, replace first, then drain:

* its instances are left out of every count above (``have`` in the allocation, ``live``,
  ``standby``, the spread of new placements), so the steps above create (or wake) replacements on
  schedulable clusters: a surge, within the deployment's grant;
* its Standby instances are drained at once, its Pending ones cancelled and its Warming ones
  drained (none of them serves anything);
* its serving (Ready or Busy) instances leave as replacements serve. With ``ready_elsewhere`` the
  deployment's Ready or Busy instances outside evacuating clusters that stay serving this tick and
  ``floor = max(grant, min(min_replicas, target))``: once ``ready_elsewhere >= floor`` all of them
  are drained; before that, only ``max(0, ready_elsewhere + serving_there - max(grant, target))``
  (the ones neither granted nor wanted any more). So one leaves per replacement that serves, the
  serving count never drops below the grant or the guaranteed minimum because of an evacuation,
  and if no replacement can be placed (no capacity elsewhere) the instances stay and a note says so.

**Deletion.** A deployment with ``deleting`` set is decided at 0 replicas and no warm pool, its
``min_replicas`` ignored (reason ``deleting``): its instances are drained (Pending ones cancelled).
Once it has no instance left at all, the plan removes it (``RemoveDeployment``), like a Kubernetes
finalizer.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.core import breaker as br
from controlplane.core import gpu_memory, model_cache, placement, preemption, room, scaling
from controlplane.core.grant_reasons import Labeler, PoolFacts, behind_breakers
from controlplane.core.allocator import AllocationRequest, Allocator, bound_placer
from controlplane.core.signals import FilteredSignals
from controlplane.domain import commands as c
from controlplane.domain.demand import Forecast
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, instance_prefix
from controlplane.domain.instances import (
    SERVING_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    Instance,
    InstanceEvent,
    InstanceState,
)
from controlplane.domain.observations import GpuReport, Observations
from controlplane.domain.profiles import PROFILES
from controlplane.domain.records import (
    CLOSED_BREAKER,
    EMPTY_MEMORY,
    BreakerPhase,
    BreakerRecord,
    ScaleMemory,
)
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment, Slo

S, E = InstanceState, InstanceEvent
SERVING_BOUND = (S.PENDING, S.WARMING, S.READY, S.BUSY)
# Hot-loop lookups: enum members bound once (a class attribute access on an Enum costs ~0.2-0.4 us
# in Python 3.11); state sets stay tuples (see ``instances.SERVING_STATES``).
_SERVING_BOUND = SERVING_BOUND
_PENDING, _WARMING, _READY, _BUSY, _STANDBY = S.PENDING, S.WARMING, S.READY, S.BUSY, S.STANDBY

_NO_ALLOCATION = preemption.Allocation({}, ())
"""Nothing preempted: what :func:`plan` passes to ``choose_victims`` on a tick without preemption
(instead of sorting every grant to find none)."""

MAX_CREATES_PER_TICK = 256
"""Fan-out limit: most new instances one tick may create (all deployments together)."""

UNREPORTED_LOST_MS = 10_000
"""A serving (Ready/Busy) instance that its cluster's adapter has not named in any observation
batch for longer than this, while that adapter *is* delivering batches, is declared lost (see
:func:`unreported`). 40 observation intervals (250 ms): far above the jitter of a healthy stream
(the coordinator holds a sample for 1 s, a broken stream reconnects within 2 s), far below the
Pending timeout (120 s) that catches the same loss before an instance serves."""
ADAPTER_FRESH_MS = 2_000
"""A cluster's adapter counts as delivering when its latest batch (or, for a coordinator that
fences, its latest answered fence with an open observation stream) is at most this old: 8
observation intervals. A cluster silent for longer is unreachable, not empty: its instances are
never declared lost for being unreported (a partition is not a death; the breaker handles it)."""


@dataclass(frozen=True, slots=True)
class ReconcileConfig:
    preemption_grace_ms: int = 30_000
    """Running requests of a preempted instance may finish for this long."""
    scale_in_grace_ms: int = 60_000
    """Running requests of an instance removed by scale-in may finish for this long."""
    breaker: br.BreakerConfig = field(default_factory=br.BreakerConfig)
    max_creates_per_tick: int = MAX_CREATES_PER_TICK
    pending_timeout_ms: int = 120_000
    """A Pending instance whose pod has not started warming after this long is declared lost."""
    warmup_timeout_ms: int = 600_000
    """A warm-up still unfinished after this long counts as failed (and feeds the breaker)."""
    unreported_lost_ms: int = UNREPORTED_LOST_MS
    """A Ready/Busy instance unnamed by its delivering adapter for longer than this is lost."""
    adapter_fresh_ms: int = ADAPTER_FRESH_MS
    """An adapter whose latest batch is older than this is not delivering (see ``ADAPTER_FRESH_MS``)."""
    decider: Callable[[ControlState, Deployment, FilteredSignals | None, int], scaling.ScaleDecision] | None = field(
        default=None, compare=False
    )
    """Replaces :func:`decide` for every deployment (None, the production default: ``core.scaling``).
    The simulator plugs its baseline autoscalers (HPA, KPA, static, oracle) in here; the rest of
    the plan (allocation, preemption, warm pool, placement) is the same for every policy."""
    allocator: Allocator | None = field(default=None, compare=False)
    """Replaces the allocation, the victim choice, the warm grants and the placement of new instances
    (None, the production default: ``core.preemption`` and ``core.placement``); see
    :mod:`controlplane.core.allocator`. The simulator's Kubernetes-scheduler baseline plugs in here."""


@dataclass(frozen=True, slots=True)
class SendFailure:
    """An adapter command that could not be delivered (the adapter was unreachable), or that the
    adapter refused for good (``refused``: e.g. the deployment has no workload on that cluster)."""

    cluster_id: ClusterId
    instance_id: InstanceId
    action: str
    at_ms: int
    refused: bool = False
    """A refusal says nothing about the cluster: it feeds the deployment-on-cluster breaker, so that
    one misconfigured deployment backs off without closing the cluster to the others."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One cluster's observation stream as the lease holder has seen it (soft, per holder)."""

    since_ms: int
    """First batch of the current uninterrupted run of batches (gaps longer than
    ``adapter_fresh_ms`` start a new run): after a failover, an adapter restart or a partition,
    an instance's unreported time is counted from here, never from before."""
    last_ms: int
    """Latest batch."""


@dataclass(frozen=True, slots=True)
class Plan:
    commands: tuple[c.Command, ...]
    """Commit in this order, as one log entry, before any adapter sees them."""
    decisions: tuple[tuple[DeploymentId, scaling.ScaleDecision], ...] = ()
    grants: tuple[tuple[DeploymentId, int, int], ...] = ()
    """Per deployment: (id, serving replicas granted, warm-pool instances granted)."""
    notes: tuple[str, ...] = ()
    """Why something wanted could not be done this tick (no capacity, all clusters blocked...)."""
    preemptions: tuple[tuple[DeploymentId, DeploymentId, int], ...] = ()
    """``(beneficiary, victim, replicas)`` preempted this tick (by the allocation or the allocator)."""


@dataclass(frozen=True, slots=True)
class LiveDecision:
    """The lease holder's latest evaluation of one deployment (made every acting tick, committed or
    not): what ``Scaling.Explain`` shows as *live*."""

    at_ms: int
    current: int
    """Desired serving replicas the decision started from."""
    target: int
    """What the scaling policy asks for."""
    granted: int
    """What the allocation (quotas, priorities, capacity) granted."""
    reason: str
    message: str
    proposals: Mapping[str, int]
    """Per signal, the replica count its stable value asks for."""
    panic: bool
    signals: Mapping[str, float]
    """The filtered signal values the decision read (:func:`signal_values`)."""
    warm_pool: int = 0
    """Warm-pool instances granted."""
    forecast: Forecast | None = None
    """The demand forecast the decision read (None: none computed; ``usable`` False: not used)."""
    reactive: int | None = None
    """The target before the forecast raised it (``ScaleDecision.reactive``)."""
    unknown: tuple[str, ...] = ()
    """Load signals some serving instance could not report at that tick (sorted): scale-downs held."""


# ---------------------------------------------------------------------------------------------
# facts


def cluster_key(cluster_id: str) -> str:
    return br.breaker_key("cluster", cluster_id)


def deployment_key(cluster_id: str, deployment_id: str) -> str:
    # A qualified id's tenant and name are two parts ("deployment/c1/alpha/chat"; no part holds '/'),
    # a legacy id one ("deployment/c1/chat", as before): the part count keeps the two apart.
    return br.breaker_key("deployment", cluster_id, *deployment_id.split("/"))


class _Breakers:
    """Breaker records as of this tick: the replicated ones plus updates made during the tick."""

    def __init__(self, replicated: Mapping[str, BreakerRecord]) -> None:
        self._replicated = replicated
        self.updated: dict[str, BreakerRecord] = {}
        self.tripped = {k for k, r in replicated.items() if r.phase is not BreakerPhase.CLOSED}
        """Keys whose record is not CLOSED now: every other key lets traffic through."""

    def get(self, key: str) -> BreakerRecord:
        return self.updated.get(key) or self._replicated.get(key, CLOSED_BREAKER)

    def put(self, key: str, rec: BreakerRecord) -> None:
        if rec != self.get(key):
            self.updated[key] = rec
            if rec.phase is BreakerPhase.CLOSED:
                self.tripped.discard(key)
            else:
                self.tripped.add(key)

    def commands(self) -> list[c.Command]:
        return [c.PutBreaker(k, r) for k, r in self.updated.items()]


def facts(
    state: ControlState,
    obs: Observations,
    failures: Sequence[SendFailure],
    now_ms: int,
    cfg: ReconcileConfig,
    rng: random.Random,
    *,
    seen: Mapping[InstanceId, int] | None = None,
    delivery: Mapping[ClusterId, Delivery] | None = None,
) -> tuple[c.Command, ...]:
    """Replicated commands for what happened since the last tick.

    ``seen`` (instance -> latest batch that named it, by a sample or a report) and ``delivery``
    (cluster -> its adapter's stream) let :func:`unreported` declare lost the serving instances an
    adapter that is delivering no longer names. Without them (None) nothing is declared lost that
    way."""
    out: list[c.Command] = []
    breakers = _Breakers(state.breakers)
    # The state of each instance as of the transitions emitted so far this tick (``moved``
    # overrides the replicated state of the instances it names). Every ``inst`` passed to ``move``
    # comes from ``state.instances``.
    moved: dict[InstanceId, InstanceState] = {}

    def move(inst: Instance, event: InstanceEvent, at_ms: int) -> bool:
        nxt = TRANSITIONS.get((moved.get(inst.id, inst.state), event))
        if nxt is None:
            return False
        moved[inst.id] = nxt
        out.append(c.TransitionInstance(inst.id, event, at_ms))
        return True

    for rep in obs.reports:
        inst = state.instances.get(rep.instance_id)
        if inst is None or rep.at_ms < inst.state_since_ms:
            continue  # unknown, or older than the state it is in (a replayed report)
        try:
            event = InstanceEvent(rep.event)
        except ValueError:
            continue  # an adapter newer than this coordinator: ignore what we do not know
        if not move(inst, event, rep.at_ms):
            continue
        _feed_breakers(breakers, inst, event, rep.at_ms, cfg, rng)
    for f in failures:
        inst = state.instances.get(f.instance_id)
        if f.refused and inst is not None:
            key = deployment_key(f.cluster_id, inst.deployment)
        else:
            key = cluster_key(f.cluster_id)
        breakers.put(key, br.on_failure(breakers.get(key), f.at_ms, cfg.breaker, rng))
        if inst is not None and f.action in ("create", "wake"):
            move(inst, E.LOST, f.at_ms)
    pending, warming, ready, busy = _PENDING, _WARMING, _READY, _BUSY
    for inst in state.instances.values():
        st = inst.state
        if st is pending or st is warming:  # only these can be stuck (``_stuck_event``)
            stuck = _stuck_event(inst, now_ms, cfg)
            if stuck is not None and move(inst, stuck, now_ms):
                _feed_breakers(breakers, inst, stuck, now_ms, cfg, rng)
    if seen is not None and delivery:
        # Handled exactly like a ``lost`` report (same transition, same breaker feed), after the
        # reports: an instance a report moved this tick has left Ready/Busy, ``move`` refuses it.
        for inst, _unseen_ms in unreported(state, seen, delivery, now_ms, cfg):
            if moved.get(inst.id, inst.state) in (ready, busy) and move(inst, E.LOST, now_ms):
                _feed_breakers(breakers, inst, E.LOST, now_ms, cfg, rng)
    instance_of = state.instances.get
    moved_state = moved.get
    for sample in obs.samples:
        inst = instance_of(sample.instance_id)
        if inst is None:
            continue
        cur = moved_state(inst.id, inst.state) if moved else inst.state
        if cur is ready:
            if sample.running + sample.waiting > 0:
                move(inst, E.WORK, sample.at_ms)
        elif cur is busy and sample.running + sample.waiting == 0:
            move(inst, E.IDLE, sample.at_ms)
    return tuple(out + breakers.commands()) + model_cache.facts(state, obs, now_ms)


def unreported(
    state: ControlState,
    seen: Mapping[InstanceId, int],
    delivery: Mapping[ClusterId, Delivery],
    now_ms: int,
    cfg: ReconcileConfig,
) -> list[tuple[Instance, int]]:
    """The serving instances whose adapter no longer reports them, with for how long (ms).

    The adapter is the authority on what runs in its cluster. A Ready or Busy instance is named in
    every batch while it runs (a sample per interval); one that vanished while its adapter was
    down (the engines of a killed simulated adapter die with it; pods deleted while a Kubernetes
    adapter was down are not tracked after its restart) is never reported ``lost``. So: an instance
    in Ready/Busy whose cluster's adapter is delivering (latest batch within ``adapter_fresh_ms``)
    but that no batch has named for longer than ``unreported_lost_ms`` is lost. Its unreported time
    counts from the latest of: the batch that last named it, the start of the adapter's current run
    of batches (``Delivery.since_ms``: a failover, an adapter restart or a partition restarts the
    clock, so nothing is declared lost at once), and the instance's entry into its state (a report
    replayed by a new holder). An adapter that is silent or unreachable declares nothing.
    Standby, Warming, Pending and Draining instances are untouched: no backend samples them (a
    warm-up can take minutes unnamed), so silence proves nothing; Pending and Warming ones have
    their own timeouts, and a vanished Standby or Draining one needs the adapter to keep an
    inventory (docs/reliability.md, "Bugs found")."""
    out: list[tuple[Instance, int]] = []
    ready, busy = _READY, _BUSY
    bound, fresh = cfg.unreported_lost_ms, cfg.adapter_fresh_ms
    for inst in state.instances.values():  # the replicated order: the same on every replica
        if inst.state is not ready and inst.state is not busy:
            continue
        d = delivery.get(inst.cluster)
        if d is None or now_ms - d.last_ms > fresh:
            continue  # adapter silent or unreachable: no verdict
        since = max(seen.get(inst.id, d.since_ms), d.since_ms, inst.state_since_ms)
        if now_ms - since > bound:
            out.append((inst, now_ms - since))
    return out


def _stuck_event(inst: Instance, now_ms: int, cfg: ReconcileConfig) -> InstanceEvent | None:
    """A Pending instance whose pod never started, or a warm-up that never finished, is given up:
    a lost create (for example sent just before this coordinator was fenced) must not hold GPUs."""
    age = now_ms - inst.state_since_ms
    if inst.state is S.PENDING and age > cfg.pending_timeout_ms:
        return E.LOST
    if inst.state is S.WARMING and age > cfg.warmup_timeout_ms:
        return E.WARMUP_FAILED
    return None


def _feed_breakers(
    breakers: _Breakers, inst: Instance, event: InstanceEvent, at_ms: int, cfg: ReconcileConfig, rng: random.Random
) -> None:
    dkey, ckey = deployment_key(inst.cluster, inst.deployment), cluster_key(inst.cluster)
    if event is E.WARMED:
        breakers.put(dkey, br.on_success(breakers.get(dkey), at_ms))
        breakers.put(ckey, br.on_success(breakers.get(ckey), at_ms))
    elif event is E.WARMUP_FAILED:
        breakers.put(dkey, br.on_failure(breakers.get(dkey), at_ms, cfg.breaker, rng))
    elif event is E.LOST:
        breakers.put(ckey, br.on_failure(breakers.get(ckey), at_ms, cfg.breaker, rng))


# ---------------------------------------------------------------------------------------------
# plan


@dataclass
class _Tick:
    """Mutable scratch space of one plan() call (never escapes it)."""

    state: ControlState
    now_ms: int
    cfg: ReconcileConfig
    breakers: _Breakers
    free: dict[tuple[ClusterId, PoolId], int]
    creates_left: int
    evacuating: frozenset[ClusterId] = frozenset()
    """Clusters being drained (themselves or through their zone): their instances are replaced."""
    commands: list[c.Command] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    memories: list[tuple[DeploymentId, ScaleMemory]] = field(default_factory=list)
    """Scale memories the decisions changed: committed as one ``PutScaleMemories``."""
    place: Callable[..., placement.Placement] = placement.place
    """Chooses the clusters of new instances (an allocator's bindings when one is configured)."""
    unplaced: list[tuple[Deployment, int, tuple[ClusterId, ...]]] = field(default_factory=list)
    """Creates left unplaced: (deployment, count, clusters it may be placed on)."""
    memory: gpu_memory.MemoryView | None = None
    """The reported GPU memory (None: none passed, GPUs are counted)."""


def plan(
    state: ControlState,
    signals: Mapping[DeploymentId, FilteredSignals | None],
    loads: Mapping[InstanceId, float],
    now_ms: int,
    cfg: ReconcileConfig,
    forecasts: Mapping[DeploymentId, Forecast] | None = None,
    gpu_reports: Mapping[ClusterId, GpuReport] | None = None,
) -> Plan:
    """Decide one tick. Pure: reads ``state`` (and the ``forecasts`` computed outside the core from
    its replicated demand history, and the adapters' fresh ``gpu_reports``, which cap placement:
    :mod:`controlplane.core.gpu_memory`), returns the commands to commit."""
    evacuating = frozenset(cid for cid, cl in state.clusters.items() if placement.evacuating(cl, state.zones))
    tick = _Tick(
        state, now_ms, cfg, _Breakers(state.breakers),
        {(cl.id, pool): state.free_gpus(cl.id, pool) for cl in state.clusters.values() for pool in cl.capacity},
        cfg.max_creates_per_tick, evacuating,
        memory=gpu_memory.MemoryView(gpu_reports, state.clusters, state.instances.values()) if gpu_reports else None,
    )
    deployments = [state.deployments[k] for k in sorted(state.deployments)]
    signal_of = signals.get
    if cfg.decider is not None:
        decisions = {d.id: cfg.decider(state, d, signal_of(d.id), now_ms) for d in deployments}
    else:
        decisions = _decide_all(state, deployments, signal_of, now_ms, forecasts or _NO_FORECASTS)
        if forecasts:
            decisions = _ahead_within_quota(state, deployments, decisions)
    # One counting pass over each deployment's instances serves the demand and tells converge which
    # deployments are steady (the state is not changed while planning).
    counts = {d.id: _scan(state, d.id, loads, evacuating) for d in deployments}
    if cfg.allocator is not None:
        return _plan_allocated(tick, cfg.allocator, deployments, decisions, counts, loads)
    capacity = _healthy_capacity(state, tick.breakers, now_ms)
    allocation = preemption.allocate(
        state.tenants, [_demand_of(d, decisions[d.id].target, counts[d.id]) for d in deployments],
        capacity, now_ms, explain=False,
    )
    warm = _warm_grants(state, deployments, decisions, allocation, tick.breakers, now_ms)
    # Allocation counts serving-bound instances outside evacuating clusters only (``_demand``), so
    # victims come from those too; Standby instances are sized separately by the warm grants and
    # drained first when they shrink.
    # Candidates are needed only when some grant preempts (the usual steady tick has none).
    grants_of = allocation.grants
    preempting = any(g.preempted > 0 for g in grants_of.values())
    victims = preemption.choose_victims(
        allocation if preempting else _NO_ALLOCATION,  # (validates the grace either way)
        [i for i in state.instances.values() if i.state in _SERVING_BOUND and i.cluster not in evacuating]
        if preempting else [],
        state.tenants, loads, now_ms, cfg.preemption_grace_ms,
    )
    by_dep: dict[DeploymentId, list[preemption.Victim]] = {}
    for v in victims:
        by_dep.setdefault(v.deployment_id, []).append(v)
    grants = []
    no_victims: list[preemption.Victim] = []
    labels = Labeler(state, lambda: {did: g.replicas for did, g in grants_of.items()}, allocation.preemptions,
                     lambda: PoolFacts(capacity, behind_breakers(state, _cluster_breaker(tick), now_ms)))
    for d in deployments:
        did = d.id
        dec = decisions[did]
        g = grants_of.get(did)
        grant = g.replicas if g is not None else dec.target
        w = warm[did]
        _record_decision(tick, d, dec, grant, w, labels)
        _converge(tick, d, grant, w, by_dep.get(did, no_victims), loads, dec.target, counts[did])
        if d.deleting and next(state.instances_of(did), None) is None:
            tick.commands.append(c.RemoveDeployment(did))  # the finalizer: nothing of it is left
        grants.append((did, grant, w))
    pairs = allocation.preemptions
    if tick.unplaced:  # only when free GPUs did not hold a granted create (never on a steady tick)
        pairs = _make_room(tick, grants, decisions, loads, pairs)
    return _finish(tick, decisions, grants, pairs)


def _make_room(
    tick: _Tick,
    grants: Sequence[tuple[DeploymentId, int, int]],
    decisions: Mapping[DeploymentId, scaling.ScaleDecision],
    loads: Mapping[InstanceId, float],
    pairs: tuple[tuple[DeploymentId, DeploymentId, int], ...],
) -> tuple[tuple[DeploymentId, DeploymentId, int], ...]:
    """Free one cluster per unplaced granted create by the preemption rules (:mod:`room`)."""
    state = tick.state
    deps = state.deployments
    moved = {x.instance_id for x in tick.commands if isinstance(x, c.TransitionInstance)}
    leaving = {x.instance_id for x in tick.commands if isinstance(x, c.TransitionInstance) and x.event in (E.DRAIN, E.CANCEL)}
    # A create of this tick may be withdrawn for the room, except a half-open breaker's probe (its
    # breaker already counts it in flight).
    planned = [
        room.Planned(x.instance_id, x.deployment_id, x.cluster_id) for x in tick.commands
        if isinstance(x, c.CreateInstance) and (not tick.breakers.tripped or all(
            tick.breakers.get(k).phase is BreakerPhase.CLOSED
            for k in (cluster_key(x.cluster_id), deployment_key(x.cluster_id, x.deployment_id))
        ))
    ]
    guaranteed = {did: min(deps[did].min_replicas, dec.target) for did, dec in sorted(decisions.items())}
    free = tick.free if tick.memory is None else tick.memory.cap_pools(tick.free, [d for d, _, _ in tick.unplaced])
    out = room.make_room(
        state, [(d, n) for d, n, _ in tick.unplaced], {did: g for did, g, _ in grants}, guaranteed, free,
        planned, {d.id: allowed for d, _, allowed in tick.unplaced}, moved, leaving, loads,
    )
    tick.notes += out.notes
    if out.withdrawn:
        gone = set(out.withdrawn)
        tick.commands = [x for x in tick.commands if not (isinstance(x, c.CreateInstance) and x.instance_id in gone)]
    deadline = tick.now_ms + tick.cfg.preemption_grace_ms
    for iid, _did in out.drains:
        tick.commands.append(c.TransitionInstance(iid, E.DRAIN, tick.now_ms, drain_deadline_ms=deadline, preempted=True))
    first = tick.cfg.max_creates_per_tick - tick.creates_left
    for k, (did, cid) in enumerate(out.creates, start=first):
        tick.commands.append(c.CreateInstance(InstanceId(f"{instance_prefix(did)}-{tick.now_ms}-{k}"), did, cid, tick.now_ms))
    tick.creates_left -= len(out.creates)
    if not out.preemptions:
        return pairs
    merged: dict[tuple[DeploymentId, DeploymentId], int] = {(b, v): n for b, v, n in pairs}
    for b, v, n in out.preemptions:
        merged[(b, v)] = merged.get((b, v), 0) + n
    return tuple((b, v, n) for (b, v), n in sorted(merged.items()))


def _finish(
    tick: _Tick,
    decisions: Mapping[DeploymentId, scaling.ScaleDecision],
    grants: list[tuple[DeploymentId, int, int]],
    preemptions: tuple[tuple[DeploymentId, DeploymentId, int], ...],
) -> Plan:
    cmds = tick.breakers.commands()
    if tick.memories:
        # One command for every changed memory, ahead of the deployments' other commands (a
        # ``RemoveDeployment`` of this tick comes after its memory, as it did per deployment).
        cmds.append(c.PutScaleMemories(tuple(tick.memories)))
    cmds += tick.commands
    return Plan(tuple(cmds), tuple(decisions.items()), tuple(grants), tuple(tick.notes), preemptions)


def _plan_allocated(
    tick: _Tick,
    allocator: Allocator,
    deployments: Sequence[Deployment],
    decisions: Mapping[DeploymentId, scaling.ScaleDecision],
    counts: Mapping[DeploymentId, _Counts],
    loads: Mapping[InstanceId, float],
) -> Plan:
    """The rest of :func:`plan` with an external allocator: its grants (no warm pool), its victims
    and its bindings (the clusters of the instances created this tick)."""
    state = tick.state
    out = allocator.allocate(AllocationRequest(
        state, tuple(deployments), {d.id: decisions[d.id].target for d in deployments},
        {d.id: counts[d.id][0] for d in deployments}, tick.evacuating, tick.now_ms, tick.cfg.preemption_grace_ms,
    ))
    tick.place = bound_placer(out.bindings)
    by_dep: dict[DeploymentId, list[preemption.Victim]] = {}
    for v in out.victims:
        by_dep.setdefault(v.deployment_id, []).append(v)
    grants = []
    labels = Labeler(state, lambda: {d.id: out.grants.get(d.id, decisions[d.id].target) for d in deployments},
                     tuple(out.preemptions),
                     lambda: PoolFacts(_healthy_capacity(state, tick.breakers, tick.now_ms),
                                       behind_breakers(state, _cluster_breaker(tick), tick.now_ms)))
    for d in deployments:
        dec = decisions[d.id]
        grant = out.grants.get(d.id, dec.target)
        _record_decision(tick, d, dec, grant, 0, labels)
        _converge(tick, d, grant, 0, by_dep.get(d.id, []), loads, dec.target, counts[d.id])
        if d.deleting and next(state.instances_of(d.id), None) is None:
            tick.commands.append(c.RemoveDeployment(d.id))
        grants.append((d.id, grant, 0))
    return _finish(tick, decisions, grants, tuple(out.preemptions))


def current_replicas(state: ControlState, d: Deployment) -> int:
    """The desired serving replicas the next decision starts from (``min_replicas`` before the first)."""
    desired = state.desired.get(d.id)
    return desired.replicas if desired is not None else d.min_replicas


_NO_FORECASTS: Mapping[DeploymentId, Forecast] = {}


def decide(
    d: Deployment, state: ControlState, sig: FilteredSignals | None, memory: ScaleMemory, current: int, now_ms: int,
    forecast: Forecast | None = None,
) -> scaling.ScaleDecision:
    """The scaling decision of ``d`` (a deployment being deleted: 0 replicas, no warm pool)."""
    if d.deleting:
        left = sum(1 for _ in state.instances_of(d.id))
        return scaling.ScaleDecision(
            0, 0, memory, scaling.ScaleReason.DELETING,
            f"deployment is being deleted: target {current} -> 0, min_replicas {d.min_replicas} ignored, "
            f"{left} instances left",
        )
    profile = PROFILES.get(d.model)  # None: no token signal, the others still apply
    tenant = state.tenants.get(d.tenant)  # None only for a dry run naming an unknown tenant
    return scaling.decide(d, profile, tenant.slo if tenant else Slo(), sig, memory, current, now_ms, forecast)


def _decide(state: ControlState, d: Deployment, sig: FilteredSignals | None, now_ms: int) -> scaling.ScaleDecision:
    return decide(d, state, sig, state.memory_of(d.id), current_replicas(state, d), now_ms)


def _decide_all(
    state: ControlState,
    deployments: Sequence[Deployment],
    signal_of: Callable[[DeploymentId], FilteredSignals | None],
    now_ms: int,
    forecasts: Mapping[DeploymentId, Forecast],
) -> dict[DeploymentId, scaling.ScaleDecision]:
    """:func:`_decide` for each deployment, in order, with its lookups inlined (one call per
    deployment into ``scaling.decide`` instead of three frames: this runs 40,000 times a second at
    10,000 deployments)."""
    out: dict[DeploymentId, scaling.ScaleDecision] = {}
    memory_of, desired_of, tenant_of, profile_of = state.memory.get, state.desired.get, state.tenants.get, PROFILES.get
    scale = scaling.decide
    forecast_of = forecasts.get
    no_slo: Slo | None = None
    for d in deployments:
        did = d.id
        memory = memory_of(did, EMPTY_MEMORY)
        desired = desired_of(did)
        current = desired.replicas if desired is not None else d.min_replicas
        if d.deleting:
            out[did] = decide(d, state, signal_of(did), memory, current, now_ms)
            continue
        tenant = tenant_of(d.tenant)  # None only for a dry run naming an unknown tenant
        if tenant is not None:
            slo = tenant.slo
        else:
            slo = no_slo = no_slo or Slo()
        out[did] = scale(d, profile_of(d.model), slo, signal_of(did), memory, current, now_ms, forecast_of(did))
    return out


def _demand(
    state: ControlState, d: Deployment, want: int, loads: Mapping[InstanceId, float], evacuating: frozenset[ClusterId]
) -> preemption.Demand:
    return _demand_of(d, want, _scan(state, d.id, loads, evacuating))


_Counts = tuple[int, float, int]
"""What one pass over a deployment's instances tells the plan (:func:`_scan`): ``(have, load,
others)``."""


def _scan(
    state: ControlState, deployment_id: DeploymentId, loads: Mapping[InstanceId, float], evacuating: frozenset[ClusterId]
) -> _Counts:
    """One pass over a deployment's instances: ``have``, its serving-bound (Pending, Warming, Ready,
    Busy) instances outside evacuating clusters; ``load``, the mean load of the serving (Ready,
    Busy) ones among them (0 when none); ``others``, its Standby instances plus its non-terminal
    ones on evacuating clusters (when both ``others`` is 0 and ``have`` equals the grant, converge
    has nothing to do). Counts only: nothing is kept per instance (a steady tick allocates little)."""
    have = others = 0
    serving: list[float] = []
    instances = state.instances
    load_of = loads.get
    terminal, bound, serving_states, standby_state = TERMINAL_STATES, _SERVING_BOUND, SERVING_STATES, _STANDBY
    for iid in state.by_deployment.get(deployment_id, ()):
        i = instances[iid]
        st = i.state
        if st in terminal:
            continue
        if evacuating and i.cluster in evacuating:
            others += 1
        elif st in bound:
            have += 1
            if st in serving_states:
                serving.append(load_of(iid, 0.0))
        elif st is standby_state:
            others += 1
    return have, sum(serving) / len(serving) if serving else 0.0, others


def _demand_of(d: Deployment, want: int, counts: _Counts) -> preemption.Demand:
    return preemption.Demand(deployment=d, want=want, have=counts[0], load=counts[1])


def _healthy_capacity(state: ControlState, breakers: _Breakers, now_ms: int) -> dict[PoolId, int]:
    """GPUs per pool in clusters whose cluster breaker is closed, half-open, or open with its backoff
    elapsed (the next placement there is its probe). A cluster still inside its backoff is not
    counted, so the allocation does not promise GPUs that nothing may use. Of a cordoned cluster
    only the GPUs its instances hold count (nothing new goes there); an evacuating one counts none
    (its instances are left out of the demands too)."""
    cap: dict[PoolId, int] = {}
    for cid in sorted(state.clusters):
        rec = breakers.get(cluster_key(cid))
        if rec.phase is BreakerPhase.OPEN and not br.probe_due(rec, now_ms):
            continue
        cl = state.clusters[cid]
        if placement.evacuating(cl, state.zones):
            continue
        open_ = placement.schedulable(cl, state.zones)
        for pool, n in sorted(cl.capacity.items()):
            held = n if open_ else min(n, max(0, state.gpus_used.get((cid, pool), 0)))
            cap[pool] = cap.get(pool, 0) + held
    return cap


def _ahead_within_quota(
    state: ControlState, deployments: Sequence[Deployment], decisions: dict[DeploymentId, scaling.ScaleDecision]
) -> dict[DeploymentId, scaling.ScaleDecision]:
    """Forecast raises (``target - reactive``) held within each tenant's quota per pool: a tenant's
    targets together may exceed its quota only by what its present load asks for, never by
    capacity held ahead of a forecast. Raises are kept in deployment order; the rest is dropped."""
    raised = [d for d in deployments if (r := decisions[d.id].reactive) is not None and decisions[d.id].target > r]
    if not raised:
        return decisions
    room: dict[tuple[TenantId, PoolId], int] = {}
    for d in deployments:
        dec = decisions[d.id]
        key = (d.tenant, d.pool)
        if key not in room:
            t = state.tenants.get(d.tenant)
            room[key] = t.quota_in(d.pool) if t is not None else 0
        base = dec.reactive if dec.reactive is not None else dec.target
        room[key] -= base * d.gpus_per_instance
    out = dict(decisions)
    for d in raised:
        dec = decisions[d.id]
        key = (d.tenant, d.pool)
        assert dec.reactive is not None
        extra = dec.target - dec.reactive
        fits = max(0, room[key]) // d.gpus_per_instance
        keep = min(extra, fits)
        room[key] -= keep * d.gpus_per_instance
        if keep < extra:
            target = dec.reactive + keep
            note = (f"; forecast raise held at {target} (tenant {d.tenant}'s {d.pool} quota leaves room for {keep} "
                    f"of {extra} ahead of demand)")
            out[d.id] = dataclasses.replace(dec, target=target, message=dec.message + note)
    return out


def _warm_grants(
    state: ControlState,
    deployments: Sequence[Deployment],
    decisions: Mapping[DeploymentId, scaling.ScaleDecision],
    allocation: preemption.Allocation,
    breakers: _Breakers,
    now_ms: int,
) -> dict[DeploymentId, int]:
    """Warm pools come out of the capacity left after every serving grant, by tenant priority, and
    within what the tenant may hold (quota + borrow limit, minus its serving grants): a Standby
    instance holds GPUs like a serving one, so a warm pool never takes a tenant past its limit."""
    warm: dict[DeploymentId, int] = dict.fromkeys([d.id for d in deployments], 0)
    # A deployment that asks for no warm pool gets 0 and leaves ``left`` as it is, wherever it
    # stands in the order: only the others are ordered and sized (usually none).
    wanting = [d for d in deployments if decisions[d.id].warm_pool != 0]
    if not wanting:
        return warm
    left = _healthy_capacity(state, breakers, now_ms)
    grants = allocation.grants
    tenant_left: dict[tuple[TenantId, PoolId], int] = {}
    for d in deployments:
        g = grants.get(d.id)
        used = (g.replicas if g else 0) * d.gpus_per_instance
        left[d.pool] = left.get(d.pool, 0) - used
        key = (d.tenant, d.pool)
        if key not in tenant_left:
            tenant_left[key] = state.tenants[d.tenant].ceiling_in(d.pool)
        tenant_left[key] -= used
    order = sorted(wanting, key=lambda d: (-state.tenants[d.tenant].priority, d.tenant, d.id))
    for d in order:
        key = (d.tenant, d.pool)
        fits = max(0, min(left.get(d.pool, 0), tenant_left[key])) // d.gpus_per_instance
        warm[d.id] = min(decisions[d.id].warm_pool, fits)
        left[d.pool] = left.get(d.pool, 0) - warm[d.id] * d.gpus_per_instance
        tenant_left[key] -= warm[d.id] * d.gpus_per_instance
    return warm


def _cluster_breaker(tick: _Tick) -> Callable[[ClusterId], BreakerRecord | None]:
    """A cluster's breaker as of this tick; None on a tick without a tripped breaker (nothing to scan)."""
    if not tick.breakers.tripped:
        return lambda cid: None
    return lambda cid: tick.breakers.get(cluster_key(cid))


def _record_decision(
    tick: _Tick, d: Deployment, dec: scaling.ScaleDecision, grant: int, warm: int, labels: Labeler
) -> None:
    old = tick.state.desired.get(d.id)
    if old is None or (old.replicas, old.warm_pool) != (grant, warm):
        # The label names what moved the number (core/grant_reasons.py): the scaling stage when the
        # grant is the target, else what cut it (preempted, quota, capacity, breaker).
        reason, note = labels.label(d, dec.reason.value, dec.target, grant, old.replicas if old is not None else None)
        message = f"{note}; {dec.message}" if note and dec.message else (note or dec.message)
        tick.commands.append(c.SetDesired(d.id, grant, warm, reason, tick.now_ms, message=message))
    memory = dec.memory
    old_memory = tick.state.memory.get(d.id, EMPTY_MEMORY)
    if memory is not old_memory and memory != old_memory:
        tick.memories.append((d.id, memory))


def _converge(
    tick: _Tick,
    d: Deployment,
    grant: int,
    warm: int,
    victims: Sequence[preemption.Victim],
    loads: Mapping[InstanceId, float],
    target: int,
    counts: _Counts | None = None,
) -> None:
    if counts is not None and not victims and counts[2] == 0 and counts[0] == grant and warm <= 0:
        # The steady case (the plan's ``_scan`` counted it): no Standby instance, none evacuating,
        # as many serving-bound ones as granted and no warm pool: nothing to wake, remove, create,
        # sleep, drain or evacuate.
        return
    gone = {v.instance_id for v in victims}
    for v in victims:
        tick.commands.append(
            c.TransitionInstance(v.instance_id, E.DRAIN, tick.now_ms, drain_deadline_ms=v.drain_deadline_ms, preempted=True)
        )
    # One pass over the deployment's instances (in their index order, as the separate filters were).
    staying: list[Instance] = []
    moving: list[Instance] = []
    live: list[Instance] = []
    standby: list[Instance] = []
    evacuating = tick.evacuating
    for i in tick.state.instances_of(d.id):
        st = i.state
        if st in TERMINAL_STATES or i.id in gone:
            continue
        if i.cluster in evacuating:
            moving.append(i)
            continue
        staying.append(i)
        if st in _SERVING_BOUND:
            live.append(i)
        elif st is _STANDBY:
            standby.append(i)
    blocked = _blocked(tick, d)
    wake = [i for i in _newest_first(standby) if i.cluster not in blocked][: max(0, grant - len(live))]
    for i in wake:
        tick.commands.append(c.TransitionInstance(i.id, E.WAKE, tick.now_ms))
    standby = [i for i in standby if i not in wake]
    serving_count = len(live) + len(wake)
    deficit = max(0, warm - len(standby))
    allowance = grant + deficit
    removed: set[InstanceId] = set()
    if serving_count > allowance:
        removed = set(placement.pick_removals(live, serving_count - allowance, loads))
        for i in live:
            if i.id in removed:
                event = E.CANCEL if i.state is S.PENDING else E.DRAIN
                deadline = tick.now_ms + tick.cfg.scale_in_grace_ms
                tick.commands.append(c.TransitionInstance(i.id, event, tick.now_ms, drain_deadline_ms=deadline))
    elif serving_count < allowance:
        _create(tick, d, allowance - serving_count, staying, blocked)
    slept = _sleep_surplus(tick, live, removed, grant, deficit, loads)
    for i in sorted(standby, key=lambda i: (i.cluster not in blocked, i.created_ms, i.id))[: max(0, len(standby) + len(slept) - warm)]:
        tick.commands.append(c.TransitionInstance(i.id, E.DRAIN, tick.now_ms, drain_deadline_ms=tick.now_ms))
    if moving:
        serving = [i for i in live if i.state in SERVING_STATES and i.id not in removed and i.id not in slept]
        _evacuate(tick, d, grant, target, len(serving), moving, loads)


def _evacuate(
    tick: _Tick,
    d: Deployment,
    grant: int,
    target: int,
    ready_elsewhere: int,
    moving: Sequence[Instance],
    loads: Mapping[InstanceId, float],
) -> None:
    """Drain ``d``'s instances on evacuating clusters (see the module doc): the ones that serve
    nothing at once, the serving ones as replacements serve elsewhere."""
    now, deadline = tick.now_ms, tick.now_ms + tick.cfg.scale_in_grace_ms
    serving = [i for i in moving if i.state in SERVING_STATES]
    for i in sorted(moving, key=lambda i: i.id):
        if i.state is S.PENDING:
            tick.commands.append(c.TransitionInstance(i.id, E.CANCEL, now, drain_deadline_ms=deadline))
        elif i.state in (S.WARMING, S.STANDBY):  # no request in flight: no grace needed
            tick.commands.append(c.TransitionInstance(i.id, E.DRAIN, now, drain_deadline_ms=now))
    floor = max(grant, min(d.min_replicas, target))
    leave = len(serving) if ready_elsewhere >= floor else max(0, ready_elsewhere + len(serving) - max(grant, target))
    for iid in placement.pick_removals(serving, leave, loads):
        tick.commands.append(c.TransitionInstance(iid, E.DRAIN, now, drain_deadline_ms=deadline))
    if leave < len(serving):
        tick.notes.append(
            f"{d.id}: {len(serving) - leave} of {len(serving)} serving instances on draining clusters wait for "
            f"replacements ({ready_elsewhere} of {floor} ready elsewhere)"
        )


def _newest_first(instances: Iterable[Instance]) -> list[Instance]:
    return sorted(instances, key=lambda i: (-i.created_ms, i.id))


def _sleep_surplus(
    tick: _Tick, live: Sequence[Instance], removed: set[InstanceId], grant: int, deficit: int, loads: Mapping[InstanceId, float]
) -> set[InstanceId]:
    """Put the least loaded serving instances beyond ``grant`` to sleep while the warm pool has
    room (a Busy one finishes its in-flight requests first). Returns the ids put to sleep."""
    if deficit <= 0 or len(live) - len(removed) <= grant:
        return set()  # nothing may sleep (the cheap checks first: ``serving`` below is a subset of live - removed)
    serving = [i for i in live if i.state in SERVING_STATES and i.id not in removed]
    surplus = len(serving) - grant
    count = max(0, min(deficit, surplus))
    if count == 0:
        return set()
    idle = sorted(serving, key=lambda i: (i.state is not _READY, loads.get(i.id, 0.0), -i.created_ms, i.id))
    chosen = idle[:count]
    for i in chosen:
        tick.commands.append(c.TransitionInstance(i.id, E.SLEEP, tick.now_ms))
    return {i.id for i in chosen}


def _blocked(tick: _Tick, d: Deployment) -> set[ClusterId]:
    blocked: set[ClusterId] = set()
    if not tick.breakers.tripped:  # every breaker is closed (the usual case): nothing is blocked
        return blocked
    for cid in tick.state.clusters:
        for key in (cluster_key(cid), deployment_key(cid, d.id)):
            if not br.allows(tick.breakers.get(key), tick.now_ms):
                blocked.add(cid)
    return blocked


def _probe_cluster(tick: _Tick, d: Deployment, blocked: set[ClusterId]) -> ClusterId | None:
    """A blocked cluster whose open breakers have all waited out their backoff: one probe may go."""
    for cid in sorted(blocked):
        if cid not in tick.state.clusters or not placement.schedulable(tick.state.clusters[cid], tick.state.zones):
            continue
        recs = [tick.breakers.get(k) for k in (cluster_key(cid), deployment_key(cid, d.id))]
        due = all(r.phase is BreakerPhase.CLOSED or br.probe_due(r, tick.now_ms) for r in recs)
        if due and tick.free.get((cid, d.pool), 0) >= d.gpus_per_instance and (
                tick.memory is None or tick.memory.fits(cid, d) != 0):
            return cid
    return None


def _create(tick: _Tick, d: Deployment, count: int, existing: Sequence[Instance], blocked: set[ClusterId]) -> None:
    count = min(count, tick.creates_left)
    if count <= 0:
        return
    clusters = [tick.state.clusters[k] for k in sorted(tick.state.clusters)]
    free = {cl.id: tick.free.get((cl.id, d.pool), 0) for cl in clusters}
    limited: dict[ClusterId, str] = {}
    if tick.memory is not None:
        free, limited = tick.memory.cap(d, free, count)
    # Half-open: a blocked cluster whose backoff has elapsed gets exactly one instance as its probe;
    # its warm-up closes the breakers or re-opens them with a longer backoff.
    probe = _probe_cluster(tick, d, blocked)
    chosen = [] if probe is None else [probe]
    if probe is not None:
        free[probe] -= d.gpus_per_instance
        for key in (cluster_key(probe), deployment_key(probe, d.id)):
            rec = tick.breakers.get(key)
            if rec.phase is not BreakerPhase.CLOSED:
                tick.breakers.put(key, br.on_probe(rec, tick.now_ms, tick.cfg.breaker))
    placed = tick.place(d, count - len(chosen), clusters, free, existing, blocked, tick.state.zones,
                        cached=model_cache.cached_clusters(tick.state, d.model), memory_limited=limited)
    chosen += placed.clusters
    if placed.unplaced:
        tick.notes.append(f"{d.id}: {placed.unplaced} of {count} new instances not placed: {placed.reason}")
        if tick.place is placement.place:  # (an external allocator's bindings are its own affair)
            zones = tick.state.zones
            allowed = tuple(cl.id for cl in clusters if cl.id not in blocked and placement.schedulable(cl, zones))
            tick.unplaced.append((d, placed.unplaced, allowed))
    elif limited:
        tick.notes.append(f"{d.id}: placed around short GPU memory: " + "; ".join(limited[k] for k in sorted(limited)))
    first = tick.cfg.max_creates_per_tick - tick.creates_left
    for k, cid in enumerate(chosen, start=first):
        # Unique: one tick per now_ms, and k counts every creation of the tick.
        iid = InstanceId(f"{instance_prefix(d.id)}-{tick.now_ms}-{k}")
        tick.commands.append(c.CreateInstance(iid, d.id, cid, tick.now_ms))
        tick.free[(cid, d.pool)] = tick.free.get((cid, d.pool), 0) - d.gpus_per_instance
        if tick.memory is not None:
            tick.memory.take(cid, d)
    tick.creates_left -= len(chosen)


# ---------------------------------------------------------------------------------------------
# live decisions


def signal_values(sig: FilteredSignals | None) -> dict[str, float]:
    """The filtered values a decision reads, flat: each stable signal by its name, the panic-window
    means as ``panic.<name>``, and ``serving`` (the serving instances sampled). Empty without data."""
    if sig is None:
        return {}
    out = {name: float(v) for name, v in sorted(sig.stable.items())}
    out.update({f"panic.{name}": float(v) for name, v in sorted(sig.panic.items())})
    out["serving"] = float(sig.serving)
    return out


def _unknown_of(sig: FilteredSignals | None) -> tuple[str, ...]:
    return () if sig is None else tuple(sorted(sig.unknown | sig.partial))


def live_decisions(
    p: Plan, state: ControlState, signals: Mapping[DeploymentId, FilteredSignals | None], now_ms: int
) -> dict[DeploymentId, LiveDecision]:
    """One :class:`LiveDecision` per deployment of ``p``. ``state`` must be the state ``p`` was
    planned from (before its commands are committed): ``current`` is read from it."""
    grants = {did: (grant, warm) for did, grant, warm in p.grants}
    out: dict[DeploymentId, LiveDecision] = {}
    for did, dec in p.decisions:
        d = state.deployments.get(did)
        if d is None:
            continue
        granted, warm = grants.get(did, (dec.target, dec.warm_pool))
        memory = [n.split(": ", 1)[1] for n in p.notes if n.startswith(f"{did}: ") and "GPU memory" in n]
        out[did] = LiveDecision(
            at_ms=now_ms, current=current_replicas(state, d), target=dec.target, granted=granted,
            reason=dec.reason.value, message="; ".join([dec.message, *memory]) if memory else dec.message, proposals=dict(dec.proposals), panic=dec.panic,
            signals=signal_values(signals.get(did)), warm_pool=warm, forecast=dec.forecast, reactive=dec.reactive,
            unknown=_unknown_of(signals.get(did)),
        )
    return out
