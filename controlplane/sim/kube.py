"""What the Kubernetes scheduler does when GPUs run out: an :class:`~controlplane.core.allocator.Allocator`
for the fleet benchmark's ``hpa+k8s`` / ``kpa+k8s`` baselines.

The fleet is modelled as **one multi-zone Kubernetes cluster** whose nodes are the fleet's clusters
(one node, or node pool, per cluster; a cluster's GPUs of one pool are that node's allocatable
``nvidia.com/gpu``). A pod needs ``gpus_per_instance`` GPUs of its pool on ONE node, so fragmentation
matters. Each tenant is a namespace; each deployment a Deployment/ReplicaSet whose replica count the
baseline autoscaler (HPA, KPA) sets. Per tick, in this order (docs/baselines-k8s.md has the sources):

1. **ReplicaSet controller.** ``pods = bound + pending`` is brought to the target. Too many: the
   unscheduled (Pending) pods go first, newest first (``ActivePodsWithRanks``: unassigned < assigned,
   then newer < older); bound pods above the target are removed by the plan (``placement.pick_removals``
   stands in for the rest of that ranking). Too few: new pods are created, each admitted by the
   namespace's **ResourceQuota** (``requests.nvidia.com/gpu``, one resource name per pool) or
   rejected at creation; the quota counts every pod that is not terminal, unscheduled ones included,
   and terminating ones until their deletion grace has passed (``QuotaV1Pod``). A rejected creation
   is retried on the next tick, as the controller does.
2. **Scheduling queue** (``PrioritySort``): pending pods by priority descending, then queue timestamp
   (the time the pod was created), then creation sequence.
3. **Scheduling cycle** per pod: a pod with a nominated node tries that node first; otherwise the
   nodes where it fits (``NodeResourcesFit`` filter, counting the pods *nominated* to the node with
   equal or higher priority, ``addGENominatedPods``) are scored (``LeastAllocated`` weight 1 +
   ``PodTopologySpread`` system defaults weight 2) and the best one is bound (ties: lowest cluster
   id; kube picks at random among ties).
4. **DefaultPreemption** (PostFilter) when it fits nowhere, for a pod whose PriorityClass has
   ``preemptionPolicy: PreemptLowerPriority``: not eligible while a lower-priority pod preempted for
   it is still terminating on its nominated node. Per node (``SelectVictimsOnNode``): remove every
   pod of strictly lower priority; no fit -> not a candidate; else add them back most important first
   (priority desc, then longest running) while the pod still fits: the rest are the victims. The node
   is chosen by ``pickOneNodeForPreemption``: fewest PDB violations (no PDBs here), lowest highest
   victim priority, lowest sum of victim priorities, fewest victims, latest start of the highest
   priority victims, then the first candidate (cluster id order). Victims are deleted with their
   termination grace (drained, ``preempted=True``, deadline ``now + grace``), the pod is *nominated*
   to the node and binds once they are gone; the lower-priority pods nominated there lose their
   nomination. Until then nothing of lower priority can take the capacity (step 3's accounting).

Victims in Draining still hold their GPUs (the simulator's instances free them when they finish),
exactly as a terminating pod holds its node's resources in the scheduler's cache.

The allocator keeps the unscheduled pods (their queue timestamps and nominations) across ticks; it is
deterministic: every loop runs over sorted keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controlplane.core import breaker as br
from controlplane.core import placement
from controlplane.core.allocator import AllocationRequest, ExternalAllocation
from controlplane.core.preemption import Victim
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId
from controlplane.domain.instances import Instance, InstanceState
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment

__all__ = ["KubeScheduler", "KubeStatistics", "KubeTick", "PREEMPT_LOWER_PRIORITY", "NEVER", "QUOTA_MODES"]

PREEMPT_LOWER_PRIORITY, NEVER = "PreemptLowerPriority", "Never"
QUOTA_MODES = ("ceiling", "quota", "none")
"""ResourceQuota ``requests.nvidia.com/gpu`` of a namespace per pool: the tenant's quota plus its
borrowing limit (default), its quota only, or no ResourceQuota at all."""
MAX_NODE_SCORE = 100
FIT_WEIGHT, SPREAD_WEIGHT = 1, 2
"""Default score-plugin weights of kube-scheduler's profile: NodeResourcesFit 1, PodTopologySpread 2
(NodeResourcesBalancedAllocation, also 1, scores every node alike with one resource: left out)."""
ZONE_MAX_SKEW, HOST_MAX_SKEW = 5, 3
"""PodTopologySpread's system default constraints (ScheduleAnyway): zone skew 5, hostname skew 3."""
_DRAINING = InstanceState.DRAINING

Node = tuple[ClusterId, PoolId]


@dataclass(slots=True)
class _Pod:
    """An unscheduled (Pending) pod: created and admitted, bound to no node yet."""

    seq: int
    deployment: DeploymentId
    queued_ms: int
    nominated: ClusterId | None = None


@dataclass(frozen=True, slots=True)
class KubeTick:
    """What the scheduler did in its latest tick (for the benchmark's reports and the tests)."""

    at_ms: int
    pending: Mapping[DeploymentId, int]
    """Unscheduled pods left per deployment (not serving: the simulator shows them as missing)."""
    nominated: Mapping[DeploymentId, tuple[ClusterId, ...]]
    """Nominated nodes of the pending pods, per deployment (pods waiting for their victims)."""
    quota_rejected: Mapping[DeploymentId, int]
    """Pod creations the ResourceQuota rejected this tick."""
    bound: Mapping[DeploymentId, tuple[ClusterId, ...]]
    """Pods bound this tick, per deployment, with their nodes."""


@dataclass(frozen=True, slots=True)
class KubeStatistics:
    """Cumulative counts since the scheduler was made."""

    ticks: int = 0
    pods_created: int = 0
    """Pods the ReplicaSets created (admitted by the ResourceQuota)."""
    quota_rejections: int = 0
    """Pod creations the ResourceQuota rejected (each retried creation counts again)."""
    pods_bound: int = 0
    pods_deleted_pending: int = 0
    """Unscheduled pods deleted by a ReplicaSet scale-down."""
    preemptions: int = 0
    """Preemption decisions (one per preemptor pod and node)."""
    victims: int = 0
    """Pods deleted by preemption."""
    pending_pod_ticks: int = 0
    """Sum over ticks of the pods left Pending at the end of the tick."""


class KubeScheduler:
    """kube-scheduler + ReplicaSet controller + ResourceQuota admission as a plan allocator.

    ``priority_classes``: one PriorityClass per tenant with the tenant's priority (False: every pod
    priority 0, so nothing is ever preempted and the queue is FIFO). ``preemption_policy``: the
    PriorityClasses' ``preemptionPolicy`` (``"PreemptLowerPriority"``, the default, or ``"Never"``).
    ``quota``: see :data:`QUOTA_MODES`. ``termination_grace_ms``: the victims' grace period (None: the
    plan's ``preemption_grace_ms``, the scenario's; Kubernetes' own default is 30 s)."""

    def __init__(
        self,
        *,
        priority_classes: bool = True,
        preemption_policy: str = PREEMPT_LOWER_PRIORITY,
        quota: str = "ceiling",
        termination_grace_ms: int | None = None,
    ) -> None:
        if preemption_policy not in (PREEMPT_LOWER_PRIORITY, NEVER):
            raise ValidationError("preemption_policy", f"must be {PREEMPT_LOWER_PRIORITY!r} or {NEVER!r}, got {preemption_policy!r}")
        if quota not in QUOTA_MODES:
            raise ValidationError("quota", f"must be one of {', '.join(QUOTA_MODES)}, got {quota!r}")
        if termination_grace_ms is not None and (
            isinstance(termination_grace_ms, bool) or not isinstance(termination_grace_ms, int) or termination_grace_ms < 0
        ):
            raise ValidationError("termination_grace_ms", f"must be an integer >= 0 or None, got {termination_grace_ms!r}")
        self.priority_classes = priority_classes
        self.preemption_policy = preemption_policy
        self.quota = quota
        self.termination_grace_ms = termination_grace_ms
        self._pending: dict[DeploymentId, list[_Pod]] = {}
        self._seq = 0
        self.last: KubeTick | None = None
        self._stats: dict[str, int] = dict.fromkeys(KubeStatistics.__slots__, 0)  # type: ignore[arg-type]

    def statistics(self) -> KubeStatistics:
        return KubeStatistics(**self._stats)

    # -- the seam ---------------------------------------------------------------------------
    def allocate(self, request: AllocationRequest) -> ExternalAllocation:
        cycle = _Cycle(self, request)
        self._sync_replicasets(cycle)
        cycle.schedule(self._queue(cycle))
        out = cycle.result()
        st = self._stats
        st["ticks"] += 1
        st["quota_rejections"] += sum(cycle.rejected.values())
        st["pods_bound"] += sum(len(n) for n in cycle.bindings.values())
        st["preemptions"] += cycle.preemptions
        st["victims"] += len(cycle.victims)
        st["pending_pod_ticks"] += sum(len(p) for p in self._pending.values())
        self.last = KubeTick(
            request.now_ms,
            {did: len(pods) for did, pods in sorted(self._pending.items()) if pods},
            {did: tuple(p.nominated for p in pods if p.nominated is not None)
             for did, pods in sorted(self._pending.items()) if any(p.nominated for p in pods)},
            dict(sorted(cycle.rejected.items())),
            {did: tuple(nodes) for did, nodes in sorted(cycle.bindings.items())},
        )
        return out

    def priority(self, state: ControlState, tenant: TenantId) -> int:
        """The PriorityClass value of a tenant's pods."""
        t = state.tenants.get(tenant)
        return t.priority if (self.priority_classes and t is not None) else 0

    # -- ReplicaSet controller and ResourceQuota admission -----------------------------------
    def _sync_replicasets(self, cycle: _Cycle) -> None:
        req = cycle.req
        for did in [k for k in self._pending if k not in req.targets]:
            del self._pending[did]  # the deployment is gone: so are its pods
        for d in req.deployments:
            pods = self._pending.setdefault(d.id, [])
            excess = req.have.get(d.id, 0) + len(pods) - req.targets[d.id]
            if excess > 0:
                self._stats["pods_deleted_pending"] += min(excess, len(pods))
                del pods[max(0, len(pods) - excess):]  # unscheduled first, newest first
        usage = self._quota_usage(req.state, req.now_ms)
        for d in req.deployments:
            pods = self._pending[d.id]
            missing = req.targets[d.id] - req.have.get(d.id, 0) - len(pods)
            if missing <= 0:
                continue
            key = (d.tenant, d.pool)
            hard = self._hard(req.state, d.tenant, d.pool)
            for k in range(missing):
                if hard is not None and usage.get(key, 0) + d.gpus_per_instance > hard:
                    cycle.rejected[d.id] = missing - k
                    break
                usage[key] = usage.get(key, 0) + d.gpus_per_instance
                self._stats["pods_created"] += 1
                self._seq += 1
                pods.append(_Pod(self._seq, d.id, req.now_ms))

    def _hard(self, state: ControlState, tenant: TenantId, pool: PoolId) -> int | None:
        """The namespace's ResourceQuota on the pool's GPUs (None: no ResourceQuota)."""
        t = state.tenants.get(tenant)
        if self.quota == "none" or t is None or (pool not in t.quota and pool not in t.borrow_limit):
            return None
        return t.quota_in(pool) if self.quota == "quota" else t.ceiling_in(pool)

    def _quota_usage(self, state: ControlState, now_ms: int) -> dict[tuple[TenantId, PoolId], int]:
        """GPUs charged per (namespace, pool): every pod that is not terminal (``QuotaV1Pod``), a
        terminating one until its grace has passed, and the unscheduled pods."""
        usage: dict[tuple[TenantId, PoolId], int] = {}
        for iid in sorted(state.instances):
            i = state.instances[iid]
            if i.state.terminal or (i.state is _DRAINING and now_ms > i.drain_deadline_ms):
                continue
            usage[(i.tenant, i.pool)] = usage.get((i.tenant, i.pool), 0) + i.gpus
        for did in sorted(self._pending):
            d = state.deployments.get(did)
            if d is not None:
                key = (d.tenant, d.pool)
                usage[key] = usage.get(key, 0) + d.gpus_per_instance * len(self._pending[did])
        return usage

    def _queue(self, cycle: _Cycle) -> list[_Pod]:
        """PrioritySort: priority descending, then queue timestamp, then creation order."""
        pods = [p for did in sorted(self._pending) for p in self._pending[did]]
        return sorted(pods, key=lambda p: (-cycle.prio_of[p.deployment], p.queued_ms, p.seq))


class _Cycle:
    """One tick's scheduling: the nodes' free GPUs as the scheduler's cache sees them, with the
    bindings and evictions made so far this tick."""

    def __init__(self, sched: KubeScheduler, req: AllocationRequest) -> None:
        self.sched = sched
        self.req = req
        state = req.state
        self.deps: dict[DeploymentId, Deployment] = {d.id: d for d in req.deployments}
        self.prio_of = {d.id: sched.priority(state, d.tenant) for d in req.deployments}
        self.nodes: list[Node] = []
        self.free: dict[Node, int] = {}
        self.capacity: dict[Node, int] = {}
        self.zone: dict[ClusterId, str] = {}
        for cid in sorted(state.clusters):
            cl = state.clusters[cid]
            if not _ready(state, cid, req.evacuating, req.now_ms):
                continue
            self.zone[cid] = cl.zone
            for pool in sorted(cl.capacity):
                node = (cid, pool)
                self.nodes.append(node)
                self.capacity[node] = cl.capacity[pool]
                self.free[node] = state.free_gpus(cid, pool)
        self.pods_on: dict[Node, list[Instance]] = {n: [] for n in self.nodes}
        for iid in sorted(state.instances):
            i = state.instances[iid]
            if not i.state.terminal and (i.cluster, i.pool) in self.pods_on:
                self.pods_on[(i.cluster, i.pool)].append(i)
        self.terminating: set[InstanceId] = {i for i, x in state.instances.items() if x.state is _DRAINING}
        self.victims: list[Victim] = []
        self.evicted: set[InstanceId] = set()
        self.pairs: dict[tuple[DeploymentId, DeploymentId], int] = {}
        self.bindings: dict[DeploymentId, list[ClusterId]] = {}
        self.rejected: dict[DeploymentId, int] = {}
        self.preemptions = 0
        self.grace = sched.termination_grace_ms if sched.termination_grace_ms is not None else req.grace_ms
        self.nominees: dict[Node, dict[int, tuple[int, int, _Pod]]] = {}
        """Per node, the pending pods nominated to it: seq -> (priority, GPUs, pod)."""
        for did in sorted(sched._pending):
            for q in sched._pending[did]:
                if q.nominated is not None:
                    self._nominate(q, q.nominated)
        self.hopeless: set[DeploymentId] = set()
        """Deployments one of whose un-nominated pods fitted nowhere and could preempt nothing this
        tick: the next ones fare the same (every later step of the cycle only takes capacity away
        from them), so they are not tried again."""

    # -- helpers ----------------------------------------------------------------------------
    def _prio(self, inst: Instance) -> int:
        return self.sched.priority(self.req.state, inst.tenant)

    def _nominate(self, pod: _Pod, cid: ClusterId) -> None:
        self._unnominate(pod)
        pod.nominated = cid
        d = self.deps[pod.deployment]
        self.nominees.setdefault((cid, d.pool), {})[pod.seq] = (self.prio_of[d.id], d.gpus_per_instance, pod)

    def _unnominate(self, pod: _Pod) -> None:
        if pod.nominated is not None:
            self.nominees.get((pod.nominated, self.deps[pod.deployment].pool), {}).pop(pod.seq, None)
            pod.nominated = None

    def _nominated_ge(self, node: Node, pod: _Pod) -> int:
        """GPUs of the pods nominated to ``node`` with priority >= ``pod``'s (``addGENominatedPods``)."""
        prio = self.prio_of[pod.deployment]
        return sum(g for seq, (p, g, _) in self.nominees.get(node, {}).items() if p >= prio and seq != pod.seq)

    def _fits(self, node: Node, pod: _Pod, freed: int = 0) -> bool:
        need = self.deps[pod.deployment].gpus_per_instance
        return self.free[node] + freed - self._nominated_ge(node, pod) >= need

    # -- the cycle --------------------------------------------------------------------------
    def schedule(self, queue: Sequence[_Pod]) -> None:
        for pod in queue:
            d = self.deps[pod.deployment]
            nominated = (pod.nominated, d.pool)
            if pod.nominated is not None and nominated in self.free and self._fits(nominated, pod):
                self._bind(pod, nominated)
                continue
            if pod.nominated is None and d.id in self.hopeless:
                continue
            feasible = [n for n in self.nodes if n[1] == d.pool and self._fits(n, pod)]
            if feasible:
                self._bind(pod, self._best(d, feasible))
            elif self.sched.preemption_policy != PREEMPT_LOWER_PRIORITY or not self._preempt(pod, d):
                if pod.nominated is None:
                    self.hopeless.add(d.id)

    def _bind(self, pod: _Pod, node: Node) -> None:
        d = self.deps[pod.deployment]
        self.free[node] -= d.gpus_per_instance
        self.bindings.setdefault(d.id, []).append(node[0])
        self._unnominate(pod)
        self.sched._pending[d.id].remove(pod)

    def _best(self, d: Deployment, feasible: list[Node]) -> Node:
        """The highest weighted score (LeastAllocated x1 + PodTopologySpread x2), then cluster id."""
        spread = self._spread_scores(d, feasible)
        best, best_score = feasible[0], -1
        for n in feasible:
            cap = self.capacity[n]
            left = self.free[n] - d.gpus_per_instance
            fit = left * MAX_NODE_SCORE // cap if cap > 0 else 0
            score = FIT_WEIGHT * fit + SPREAD_WEIGHT * spread[n]
            if score > best_score:
                best, best_score = n, score
        return best

    def _spread_scores(self, d: Deployment, feasible: list[Node]) -> dict[Node, int]:
        """PodTopologySpread scoring with the system default constraints: per node, the matching
        (same-deployment, not terminating) pods in its zone and on it, each weighted by
        ``log(domains + 2)`` plus ``maxSkew - 1``; normalised ``100 x (max + min - s) / max``."""
        per_zone: dict[str, int] = {}
        per_node: dict[ClusterId, int] = {}
        for i in self.req.state.instances_of(d.id):
            if i.state.terminal or i.state is _DRAINING or i.id in self.terminating:
                continue
            per_zone[i.zone] = per_zone.get(i.zone, 0) + 1
            per_node[i.cluster] = per_node.get(i.cluster, 0) + 1
        for cid in self.bindings.get(d.id, ()):
            per_zone[self.zone[cid]] = per_zone.get(self.zone[cid], 0) + 1
            per_node[cid] = per_node.get(cid, 0) + 1
        zones = {self.zone[n[0]] for n in feasible}
        wz, wh = math.log(len(zones) + 2), math.log(len(feasible) + 2)
        raw = {
            n: round(per_zone.get(self.zone[n[0]], 0) * wz + ZONE_MAX_SKEW - 1 + per_node.get(n[0], 0) * wh + HOST_MAX_SKEW - 1)
            for n in feasible
        }
        hi, lo = max(raw.values()), min(raw.values())
        return {n: MAX_NODE_SCORE if hi == 0 else MAX_NODE_SCORE * (hi + lo - s) // hi for n, s in raw.items()}

    def _eligible(self, pod: _Pod) -> bool:
        """``PodEligibleToPreemptOthers``: not while a lower-priority pod preempted by the scheduler
        is still terminating on the pod's nominated node."""
        if pod.nominated is None:
            return True
        prio = self.prio_of[pod.deployment]
        for node in self.nodes:
            if node[0] != pod.nominated:
                continue
            for i in self.pods_on[node]:
                if i.id in self.terminating and self._prio(i) < prio and (i.preempted or i.id in self.evicted):
                    return False
        return True

    def select_victims(self, pod: _Pod, node: Node) -> list[Instance] | None:
        """``SelectVictimsOnNode``: the fewest lower-priority pods whose removal lets ``pod`` fit on
        ``node``, most important first; None when even removing all of them is not enough."""
        prio = self.prio_of[pod.deployment]
        potential = [i for i in self.pods_on[node] if self._prio(i) < prio]
        if not potential:
            return None
        freed = sum(i.gpus for i in potential)
        if not self._fits(node, pod, freed):
            return None
        potential.sort(key=lambda i: (-self._prio(i), i.created_ms, i.id))  # MoreImportantPod
        victims: list[Instance] = []
        for i in potential:  # reprieve the most important first
            if self._fits(node, pod, freed - i.gpus):
                freed -= i.gpus
            else:
                victims.append(i)
        return victims or None

    def _preempt(self, pod: _Pod, d: Deployment) -> bool:
        """Preempt for ``pod`` if it may and some node would help; False when nothing was done."""
        if not self._eligible(pod):
            return False  # waits for its victims
        candidates: list[tuple[Node, list[Instance]]] = []
        for node in self.nodes:
            if node[1] != d.pool:
                continue
            victims = self.select_victims(pod, node)
            if victims:
                candidates.append((node, victims))
        if not candidates:
            self._unnominate(pod)  # preemption would not help: the nomination is cleared
            return False
        node, victims = pick_one_node(candidates, self._prio)
        now = self.req.now_ms
        for i in victims:
            if i.id in self.terminating:
                continue  # already being deleted: no second deletion
            self.terminating.add(i.id)
            self.evicted.add(i.id)
            self.victims.append(Victim(
                i.id, i.deployment, now + self.grace,
                f"preempted by kube-scheduler for a pod of {d.id} (priority {self.prio_of[d.id]}) on {node[0]}",
            ))
            key = (d.id, i.deployment)
            self.pairs[key] = self.pairs.get(key, 0) + 1
        prio = self.prio_of[d.id]
        for seq in sorted(self.nominees.get(node, {})):  # lower-priority pods nominated there lose it
            p, _, q = self.nominees[node][seq]
            if p < prio:
                self._unnominate(q)
        self._nominate(pod, node[0])
        self.preemptions += 1
        return True

    def result(self) -> ExternalAllocation:
        lost: dict[DeploymentId, int] = {}
        for v in self.victims:
            lost[v.deployment_id] = lost.get(v.deployment_id, 0) + 1
        grants = {}
        for d in self.req.deployments:
            held = self.req.have.get(d.id, 0) - lost.get(d.id, 0) + len(self.bindings.get(d.id, ()))
            grants[d.id] = max(0, min(self.req.targets[d.id], held))
        return ExternalAllocation(
            grants, tuple(self.victims), tuple((b, v, n) for (b, v), n in sorted(self.pairs.items())),
            {did: tuple(nodes) for did, nodes in sorted(self.bindings.items())},
        )


def pick_one_node(
    candidates: Sequence[tuple[Node, Sequence[Instance]]], prio: Callable[[Instance], int]
) -> tuple[Node, Sequence[Instance]]:
    """``pickOneNodeForPreemption``: each criterion keeps the best candidates, the next breaks ties.
    ``candidates`` are in cluster-id order, each node's victims most important first; ``prio`` maps
    an instance to its pod priority."""
    p = prio
    criteria = (
        lambda v: 0,  # fewest PDB violations: the simulator has no PodDisruptionBudgets
        lambda v: -p(v[0]),  # lowest highest-priority victim
        lambda v: -sum(p(i) + 2**31 for i in v),  # lowest sum of priorities
        lambda v: -len(v),  # fewest victims
        lambda v: min(i.created_ms for i in v if p(i) == max(p(j) for j in v)),  # latest start
    )
    left = list(candidates)
    for score in criteria:
        best = max(score(v) for _, v in left)
        left = [(n, v) for n, v in left if score(v) == best]
        if len(left) == 1:
            break
    return left[0]


def _ready(state: ControlState, cid: ClusterId, evacuating: frozenset[ClusterId], now_ms: int) -> bool:
    """The node accepts pods: not cordoned (unschedulable), not being drained, and reachable (a
    cluster whose breaker is open inside its backoff is a NotReady node, tainted unreachable)."""
    cl = state.clusters[cid]
    if cid in evacuating or not placement.schedulable(cl, state.zones):
        return False
    rec = state.breakers.get(br.breaker_key("cluster", cid))
    return rec is None or br.allows(rec, now_ms) or br.probe_due(rec, now_ms)
