"""Status conditions of deployments, clusters and zones, kubectl-style (issue 18, point 1).

A condition says whether something holds (``True``/``False``/``Unknown``), why (one CamelCase
``reason``), in words with the numbers and names (``message``), and since when
(``last_transition_ms``). They are computed when an object is read, from the replicated
:class:`ControlState`, the lease holder's live facts (is each cluster's adapter delivering) and
the deployment's latest committed decision; nothing is stored or written for them, so reading them
grows no log and wakes no watch.

``last_transition_ms`` is taken from the record that set the status: the decision that set the
desired count (``Desired.at_ms``), a breaker's ``changed_ms``, an instance's ``state_since_ms``,
the object writes (``ObjectMeta.updated_ms``) the status depends on, the adapter stream's start or
last batch. 0 when nothing records it; never the time of the read.

Pure: values in, values out; ``now_ms`` is an argument (only messages use it: "no batch for 12.0 s").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controlplane.core import placement
from controlplane.core.breaker import breaker_key
from controlplane.core.grant_reasons import GrantReason
from controlplane.domain.ids import ClusterId, ZoneId
from controlplane.domain.instances import SERVING_STATES, TERMINAL_STATES, InstanceState
from controlplane.domain.records import BreakerPhase, BreakerRecord
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment
from controlplane.domain.topology import Cluster

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

READY = "Ready"
SCHEDULABLE = "Schedulable"
QUOTA_EXCEEDED = "QuotaExceeded"
PREEMPTED = "Preempted"
BREAKER_OPEN = "BreakerOpen"
ADAPTER_CONNECTED = "AdapterConnected"

_BAD = {READY: FALSE, SCHEDULABLE: FALSE, ADAPTER_CONNECTED: FALSE, QUOTA_EXCEEDED: TRUE, PREEMPTED: TRUE,
        BREAKER_OPEN: TRUE}
"""The status of each type that blocks or degrades the object (what ``tenantctl get`` shows)."""


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_ms: int = 0


@dataclass(frozen=True, slots=True)
class AdapterLink:
    """What the lease holder's control loop knows of one cluster's adapter."""

    connected: bool
    """Its observation batches arrive (the latest is fresh)."""
    since_ms: int
    """Connected: when the current run of batches began; else the latest batch (0: none seen)."""


def blocking(conditions: Sequence[Condition]) -> Condition | None:
    """The first condition (in the order given: the most telling first) whose status blocks or
    degrades the object; None when all are well (or unknown)."""
    return next((c for c in conditions if _BAD.get(c.type) == c.status), None)


# --- deployments ------------------------------------------------------------------------------------------


def deployment_conditions(
    state: ControlState, d: Deployment, decision_message: str = ""
) -> tuple[Condition, ...]:
    """Schedulable, QuotaExceeded, Preempted, BreakerOpen and Ready of ``d``. ``decision_message``
    is the message of the decision that set its desired count (the event log keeps it), when known:
    it names who preempted and the quota numbers."""
    sched = _schedulable(state, d)
    desired = state.desired.get(d.id)
    reason = desired.reason if desired is not None else ""
    at = desired.at_ms if desired is not None else _updated(state, "deployment", d.id)
    quota = _quota(state, d, reason, at, decision_message)
    preempted = _preempted(state, d, reason, at, decision_message)
    breaker = _breakers(state, d)
    ready = _ready(state, d, (sched, preempted, quota, breaker))
    return (ready, sched, quota, preempted, breaker)


def _pool_clusters(state: ControlState, d: Deployment) -> list[Cluster]:
    return [state.clusters[k] for k in sorted(state.clusters) if state.clusters[k].capacity.get(d.pool, 0) > 0]


def _schedulable(state: ControlState, d: Deployment) -> Condition:
    gpus = d.gpus_per_instance
    with_pool = _pool_clusters(state, d)
    fitting = [cl for cl in with_pool if cl.capacity[d.pool] >= gpus]
    what = f"pool {d.pool} (model {d.model}, {gpus} GPUs per instance)"
    if not fitting:
        at = max([_updated(state, "deployment", d.id), *(_updated(state, "cluster", cl.id) for cl in with_pool)])
        if with_pool:
            largest = max(cl.capacity[d.pool] for cl in with_pool)
            msg = f"no cluster has {gpus} {d.pool} GPUs for one instance of model {d.model} (largest: {largest})"
        else:
            msg = f"no registered cluster has capacity in {what}; pools: {_pools(state)}"
        return Condition(SCHEDULABLE, FALSE, "NoCapacityInPool", msg, at)
    open_ = [cl for cl in fitting if placement.schedulable(cl, state.zones)]
    at = max([_updated(state, "deployment", d.id), *(_flags_at(state, cl) for cl in fitting)])
    if not open_:
        why = ", ".join(f"{cl.id} ({_closed_why(state, cl)})" for cl in fitting)
        return Condition(SCHEDULABLE, FALSE, "NoSchedulableCluster",
                         f"every cluster with {what} is cordoned or draining: {why}", at)
    total = sum(cl.capacity[d.pool] for cl in open_)
    return Condition(SCHEDULABLE, TRUE, "ClustersAvailable",
                     f"{len(open_)} schedulable cluster(s) with {what}: {total} GPUs", at)


def _quota(state: ControlState, d: Deployment, reason: str, at: int, message: str) -> Condition:
    tenant = state.tenants.get(d.tenant)
    if tenant is None:
        return Condition(QUOTA_EXCEEDED, UNKNOWN, "TenantUnknown", f"tenant {d.tenant} is not registered", at)
    q, b = tenant.quota_in(d.pool), tenant.borrow_limit.get(d.pool, 0)
    limit = f"tenant {d.tenant}'s {d.pool} quota {q} + borrow limit {b} = {q + b} GPUs"
    if reason == GrantReason.QUOTA.value:
        return Condition(QUOTA_EXCEEDED, TRUE, "TenantCeilingReached", _decided(message, limit), at)
    return Condition(QUOTA_EXCEEDED, FALSE, "WithinQuota", f"{limit}; the latest decision was not held by it", at)


def _preempted(state: ControlState, d: Deployment, reason: str, at: int, message: str) -> Condition:
    leaving = [i for i in state.instances_of(d.id) if i.preempted and i.state not in TERMINAL_STATES]
    if reason == GrantReason.PREEMPTED.value:
        text = message.split("; ", 1)[0] if message.startswith("preempted by") else (
            "its grant was cut for a higher-priority tenant (the decision's message is no longer retained)")
        if leaving:
            text += f"; {len(leaving)} preempted instance(s) draining"
        return Condition(PREEMPTED, TRUE, "PreemptedByTenant", text, at)
    if leaving:
        since = min(i.state_since_ms for i in leaving)
        return Condition(PREEMPTED, TRUE, "PreemptedByTenant",
                         f"{len(leaving)} instance(s) preempted and draining: {', '.join(sorted(i.id for i in leaving))}",
                         since)
    return Condition(PREEMPTED, FALSE, "NotPreempted", "no instance of it is preempted", at)


def _breakers(state: ControlState, d: Deployment) -> Condition:
    clusters = sorted({cl.id for cl in _pool_clusters(state, d)} | {i.cluster for i in state.instances_of(d.id)})
    parts, opened, closed = [], [], []
    for cid in clusters:
        for what, key in ((f"cluster {cid}", breaker_key("cluster", cid)),
                          (f"{cid} for this deployment", breaker_key("deployment", cid, *d.id.split("/")))):
            rec = state.breakers.get(key)
            if rec is None:
                continue
            if rec.phase is BreakerPhase.CLOSED:
                closed.append(rec.changed_ms)
            else:
                parts.append(f"{what} ({_phase(rec)})")
                opened.append(rec.changed_ms)
    if opened:
        return Condition(BREAKER_OPEN, TRUE, "CircuitOpen", "breakers not closed: " + ", ".join(parts), max(opened))
    return Condition(BREAKER_OPEN, FALSE, "AllClosed",
                     f"every breaker of its {len(clusters)} cluster(s) is closed", max(closed, default=0))


_SHORT_REASON = {GrantReason.CAPACITY.value: "PoolFull", GrantReason.QUOTA.value: "QuotaExceeded",
                 GrantReason.PREEMPTED.value: "Preempted", GrantReason.BREAKER.value: "BreakerOpen"}
"""Decision labels that mean the grant is below the target, and the Ready reason each gives."""


def _ready(state: ControlState, d: Deployment, others: Iterable[Condition]) -> Condition:
    desired = state.desired.get(d.id)
    want = desired.replicas if desired is not None else d.min_replicas
    live = [i for i in state.instances_of(d.id) if i.state not in TERMINAL_STATES]
    serving = [i for i in live if i.state in SERVING_STATES]
    # Stable across Ready <-> Busy flips (which move ``state_since_ms``): the decision, or the
    # creation of the newest instance the count needs (serving: the want-th; short: any live one).
    created = sorted(i.created_ms for i in (serving if len(serving) >= want else live))
    needed = created[want - 1] if 0 < want <= len(created) and len(serving) >= want else max(created, default=0)
    at = max(desired.at_ms if desired is not None else 0, needed)
    counts = f"{len(serving)} of {want} desired replicas serving"
    if d.deleting:
        return Condition(READY, FALSE, "Deleting", f"being deleted; {counts}", _updated(state, "deployment", d.id))
    block = next((c for c in others if c.type in (SCHEDULABLE,) and c.status == FALSE), None)
    if block is not None:
        return Condition(READY, FALSE, block.reason, f"{counts}; {block.message}", max(at, block.last_transition_ms))
    short = desired is not None and desired.reason in _SHORT_REASON
    if short and want < d.min_replicas:
        assert desired is not None
        return Condition(READY, FALSE, _SHORT_REASON[desired.reason],
                         f"{counts}; granted below min_replicas {d.min_replicas} ({desired.reason})", at)
    if len(serving) < want:
        starting = sum(1 for i in live if i.state in (InstanceState.PENDING, InstanceState.WARMING))
        return Condition(READY, FALSE, "ReplicasStarting" if starting else "ReplicasNotServing",
                         f"{counts} ({starting} starting)", at)
    if short:
        return Condition(READY, TRUE, "GrantedReplicasServing",
                         f"{counts}; the grant is below the policy's target ({desired.reason})", at)
    return Condition(READY, TRUE, "AllReplicasServing", counts, at)


# --- clusters and zones --------------------------------------------------------------------------------------


def cluster_conditions(
    state: ControlState, cl: Cluster, configured_adapter: str, links: Mapping[ClusterId, AdapterLink] | None,
    now_ms: int,
) -> tuple[Condition, ...]:
    """Ready, AdapterConnected, Schedulable and BreakerOpen of ``cl``. ``configured_adapter`` is the
    adapter address the coordinators' configuration gives it ("" none); ``links`` the lease
    holder's view of every adapter (None: no lease holder could be asked)."""
    adapter = _adapter(state, cl, configured_adapter, links, now_ms)
    sched = _cluster_schedulable(state, cl)
    rec = state.breakers.get(breaker_key("cluster", cl.id))
    if rec is not None and rec.phase is not BreakerPhase.CLOSED:
        breaker = Condition(BREAKER_OPEN, TRUE, "CircuitOpen", f"cluster breaker {_phase(rec)}", rec.changed_ms)
    else:
        breaker = Condition(BREAKER_OPEN, FALSE, "Closed", "cluster breaker closed", rec.changed_ms if rec else 0)
    bad = blocking((adapter, sched, breaker))
    if bad is not None:
        ready = Condition(READY, FALSE, bad.reason, bad.message, bad.last_transition_ms)
    elif adapter.status == UNKNOWN:
        ready = Condition(READY, UNKNOWN, adapter.reason, adapter.message, adapter.last_transition_ms)
    else:
        ready = Condition(READY, TRUE, "AdapterConnectedAndSchedulable", "its adapter delivers and it takes new instances",
                          max(adapter.last_transition_ms, sched.last_transition_ms, breaker.last_transition_ms))
    return (ready, adapter, sched, breaker)


def _adapter(state: ControlState, cl: Cluster, configured: str, links: Mapping[ClusterId, AdapterLink] | None,
             now_ms: int) -> Condition:
    address = cl.adapter_address or configured
    if not address:
        return Condition(ADAPTER_CONNECTED, FALSE, "NoAdapter",
                         "no adapter address: neither spec.adapter_address nor the coordinators' configuration names one",
                         _updated(state, "cluster", cl.id))
    if links is None:
        return Condition(ADAPTER_CONNECTED, UNKNOWN, "NoLeaseHolder",
                         f"adapter {address}: no lease holder could be asked whether it is connected", 0)
    link = links.get(cl.id)
    if link is not None and link.connected:
        return Condition(ADAPTER_CONNECTED, TRUE, "Connected", f"adapter {address} delivers observations", link.since_ms)
    if link is None or not link.since_ms:
        return Condition(ADAPTER_CONNECTED, FALSE, "AdapterDisconnected",
                         f"adapter {address}: the lease holder has received no observation batch from it", 0)
    ago = max(0, now_ms - link.since_ms) / 1000
    return Condition(ADAPTER_CONNECTED, FALSE, "AdapterDisconnected",
                     f"adapter {address}: no observation batch for {ago:.1f} s", link.since_ms)


def _cluster_schedulable(state: ControlState, cl: Cluster) -> Condition:
    at = _flags_at(state, cl)
    if placement.schedulable(cl, state.zones):
        return Condition(SCHEDULABLE, TRUE, "Schedulable", "new instances may be placed here", at)
    why = _closed_why(state, cl)
    reason = {"draining": "Draining", "cordoned": "Cordoned"}.get(why, "ZoneDraining" if "draining" in why else "ZoneCordoned")
    return Condition(SCHEDULABLE, FALSE, reason, f"no new instances: {why}", at)


def zone_conditions(
    state: ControlState, zone_id: ZoneId, clusters: Mapping[ClusterId, Sequence[Condition]]
) -> tuple[Condition, ...]:
    """Ready (a summary of its clusters' Ready) and Schedulable of a zone; ``clusters`` are the
    conditions of its clusters."""
    z = state.zones.get(zone_id)
    at = _updated(state, "zone", zone_id)
    if z is not None and not z.schedulable:
        what = "draining" if z.draining else "cordoned"
        sched = Condition(SCHEDULABLE, FALSE, what.capitalize(), f"zone {what}: no new instances in its clusters", at)
    else:
        sched = Condition(SCHEDULABLE, TRUE, "Schedulable", "the zone takes new instances", at)
    readies = {cid: next((c for c in conds if c.type == READY), None) for cid, conds in sorted(clusters.items())}
    if not readies:
        return (Condition(READY, FALSE, "NoClusters", "no cluster is registered in the zone", at), sched)
    ok = [cid for cid, c in readies.items() if c is not None and c.status == TRUE]
    not_ok = [f"{cid} ({c.reason})" for cid, c in readies.items() if c is not None and c.status != TRUE]
    last = max((c.last_transition_ms for c in readies.values() if c is not None), default=0)
    text = f"{len(ok)} of {len(readies)} clusters ready" + (f"; not ready: {', '.join(not_ok)}" if not_ok else "")
    if sched.status == FALSE:
        return (Condition(READY, FALSE, sched.reason, f"{sched.message}; {text}", max(at, last)), sched)
    if ok:
        return (Condition(READY, TRUE, "ClustersReady", text, last), sched)
    return (Condition(READY, FALSE, "NoClusterReady", text, last), sched)


# --- helpers ------------------------------------------------------------------------------------------------------


def _updated(state: ControlState, kind: str, ident: str) -> int:
    m = state.meta.get(f"{kind}/{ident}")
    return m.updated_ms if m is not None else 0


def _flags_at(state: ControlState, cl: Cluster) -> int:
    """The latest write of the cluster or its zone record (what its cordon and drain state come from)."""
    return max(_updated(state, "cluster", cl.id), _updated(state, "zone", cl.zone))


def _closed_why(state: ControlState, cl: Cluster) -> str:
    if cl.draining:
        return "draining"
    if cl.cordoned:
        return "cordoned"
    z = state.zones.get(cl.zone)
    return f"zone {cl.zone} draining" if z is not None and z.draining else f"zone {cl.zone} cordoned"


def _pools(state: ControlState) -> str:
    per: dict[str, list[int]] = {}
    for cl in state.clusters.values():
        for pool, n in cl.capacity.items():
            if n > 0:
                per.setdefault(pool, []).append(n)
    if not per:
        return "none (no cluster has capacity)"
    return ", ".join(f"{p} ({sum(v)} GPUs in {len(v)} cluster(s))" for p, v in sorted(per.items()))


def _decided(message: str, fallback: str) -> str:
    """The first clause of the decision's message (its label's sentence), else ``fallback``."""
    first = message.split("; ", 1)[0]
    return first if first.startswith("tenant ") else f"{fallback}: the latest decision's grant was held by it"


def _phase(rec: BreakerRecord) -> str:
    if rec.phase is BreakerPhase.OPEN:
        return f"open after {rec.trips} trip(s)"
    return rec.phase.value.replace("_", "-")
