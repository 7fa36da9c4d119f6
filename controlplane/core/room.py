"""Making room on one cluster for a granted replica that free GPUs split over clusters cannot hold.

:func:`controlplane.core.preemption.allocate` counts GPUs per pool, but an instance needs all its
``gpus_per_instance`` on one cluster. When a pool's free GPUs are fragmented (2 + 2 over two
clusters for a 4-GPU replica) the allocation grants a replica that placement cannot place, and no
preemption is tried because the pool looks free. :func:`make_room` runs only on a tick where a
create was left unplaced (the steady tick never calls it) and frees ONE cluster for it, by the
allocation's own preemption rules, counted on the allocation's granted totals:

* a replica of *v* (tenant *u*) may be taken for *b* (tenant *s* != *u*) only while *v* keeps its
  guaranteed minimum, and by ``RECLAIM`` (*b*'s tenant is within its quota with the grant,
  ``T(s) <= Q(s)``, and the replica of *v* is borrowed, ``T(u) - gpus(v) >= Q(u)``) or by
  ``PRIORITY`` (``priority(s) > priority(u)`` and (*b* within its quota or the replica borrowed));
* candidates on a cluster are ordered as :func:`~controlplane.core.preemption.choose_victims`
  orders instances (borrowed first, lowest priority, not yet serving, least loaded, newest, id),
  after the instances created in this very tick, which cost nothing to give up (the create is
  withdrawn before any adapter sees it);
* the cluster chosen needs the fewest victims, then the least important ones (their keys), then
  the smallest id; nothing is taken when no cluster can be freed (all or nothing);
* while a cluster already has enough GPUs free plus held by instances being drained as preempted,
  nothing more is drained for that replica: the room is on its way.

Existing victims are drained with ``preempted=True`` and the preemption grace; a withdrawn create
of a weaker deployment is replaced by the beneficiary's create on the same tick.

Why there are no loops: every take is one the allocation could have made itself (same rules, same
totals), so it strictly raises the potential of :mod:`controlplane.core.preemption`; a victim's
replica is of a strictly weaker claim than the beneficiary's, so neither the allocation nor this
function lets the victim take the room back: if the victim's re-create lands on the freed cluster
first (plan order), the next :func:`make_room` call withdraws that create on the same tick.

Pure: no clock, no randomness, every loop over a sorted sequence.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId
from controlplane.domain.instances import Instance, InstanceState
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment

__all__ = ["Planned", "Room", "make_room"]

_SERVING_BOUND = (InstanceState.PENDING, InstanceState.WARMING, InstanceState.READY, InstanceState.BUSY)


@dataclass(frozen=True, slots=True)
class Planned:
    """An instance created earlier in the same tick (a ``CreateInstance`` not yet committed)."""

    instance_id: InstanceId
    deployment_id: DeploymentId
    cluster_id: ClusterId


@dataclass(frozen=True, slots=True)
class Room:
    drains: tuple[tuple[InstanceId, DeploymentId], ...] = ()
    """Existing instances to drain as preempted."""
    withdrawn: tuple[InstanceId, ...] = ()
    """Creates of this tick to withdraw."""
    creates: tuple[tuple[DeploymentId, ClusterId], ...] = ()
    """Beneficiary instances that fit now (in the room of withdrawn creates)."""
    preemptions: tuple[tuple[DeploymentId, DeploymentId, int], ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Candidate:
    key: tuple[int, int, int, int, float, int, str]
    instance_id: InstanceId
    deployment: Deployment
    planned: bool


def make_room(
    state: ControlState,
    unplaced: Sequence[tuple[Deployment, int]],
    granted: Mapping[DeploymentId, int],
    guaranteed: Mapping[DeploymentId, int],
    free: Mapping[tuple[ClusterId, PoolId], int],
    planned: Sequence[Planned],
    allowed: Mapping[DeploymentId, Sequence[ClusterId]],
    moved: Collection[InstanceId],
    leaving: Collection[InstanceId],
    loads: Mapping[InstanceId, float],
) -> Room:
    """Room for the ``unplaced`` creates (deployment, count), strongest first (see the module doc).

    ``granted`` is the allocation's replicas per deployment, ``guaranteed`` each one's
    ``min(min_replicas, target)``, ``free`` the GPUs free per (cluster, pool) after this tick's
    creates, ``allowed`` the clusters each unplaced deployment may be placed on, ``moved`` the
    instances this tick already transitions (never taken) and ``leaving`` those it drains or
    cancels (their GPUs are on their way back)."""
    deps = state.deployments
    tenants = state.tenants
    totals: dict[tuple[TenantId, PoolId], int] = {}
    for did in sorted(granted):
        d = deps[did]
        totals[(d.tenant, d.pool)] = totals.get((d.tenant, d.pool), 0) + granted[did] * d.gpus_per_instance
    live: dict[DeploymentId, int] = {}
    by_cluster: dict[tuple[ClusterId, PoolId], list[tuple[Instance | Planned, Deployment]]] = {}
    pending: dict[tuple[ClusterId, PoolId], int] = {}
    for iid in sorted(state.instances):
        x = state.instances[iid]
        if (x.state is InstanceState.DRAINING and x.preempted) or (iid in leaving and x.state in _SERVING_BOUND):
            pending[(x.cluster, x.pool)] = pending.get((x.cluster, x.pool), 0) + x.gpus
        elif x.state in _SERVING_BOUND and x.deployment in deps and iid not in moved:
            live[x.deployment] = live.get(x.deployment, 0) + 1
            by_cluster.setdefault((x.cluster, x.pool), []).append((x, deps[x.deployment]))
    for p in planned:
        d = deps[p.deployment_id]
        live[d.id] = live.get(d.id, 0) + 1
        by_cluster.setdefault((p.cluster_id, d.pool), []).append((p, d))
    room_free = dict(free)
    drains: list[tuple[InstanceId, DeploymentId]] = []
    withdrawn: list[InstanceId] = []
    creates: list[tuple[DeploymentId, ClusterId]] = []
    pairs: dict[tuple[DeploymentId, DeploymentId], int] = {}
    notes: list[str] = []
    gone: set[InstanceId] = set()
    order = sorted(unplaced, key=lambda u: (-tenants[u[0].tenant].priority, u[0].tenant, u[0].id))
    for b, _count in order:  # one replica per deployment per tick: the room is made one at a time
        need = b.gpus_per_instance
        clusters = sorted(c for c in allowed.get(b.id, ()) if state.clusters[c].capacity.get(b.pool, 0) >= need)
        if any(room_free.get((c, b.pool), 0) + pending.get((c, b.pool), 0) >= need for c in clusters):
            notes.append(f"{b.id}: room is being drained for it; waiting")
            continue
        best: tuple[tuple[int, tuple[object, ...], ClusterId], ClusterId, list[_Candidate]] | None = None
        for cid in clusters:
            picked = _victims_on(state, b, cid, need, room_free, by_cluster, totals, live, guaranteed, gone, loads, pending)
            if picked is None:
                continue
            rank = (sum(0 if v.planned else 1 for v in picked), tuple(v.key for v in picked), cid)
            if best is None or rank < best[0]:
                best = (rank, cid, picked)
        if best is None:
            continue  # nothing may be taken on any single cluster: nothing is drained
        _rank, cid, picked = best
        for v in picked:
            gone.add(v.instance_id)
            live[v.deployment.id] -= 1
            key = (v.deployment.tenant, v.deployment.pool)
            totals[key] -= v.deployment.gpus_per_instance
            room_free[(cid, b.pool)] = room_free.get((cid, b.pool), 0) + (v.deployment.gpus_per_instance if v.planned else 0)
            pending[(cid, b.pool)] = pending.get((cid, b.pool), 0) + (0 if v.planned else v.deployment.gpus_per_instance)
            if v.planned:
                withdrawn.append(v.instance_id)  # held nothing yet: withdrawn, not a preemption
            else:
                drains.append((v.instance_id, v.deployment.id))
                pairs[(b.id, v.deployment.id)] = pairs.get((b.id, v.deployment.id), 0) + 1
        names = ", ".join(str(v.instance_id) for v in picked)
        if room_free.get((cid, b.pool), 0) >= need:
            room_free[(cid, b.pool)] -= need
            creates.append((b.id, cid))
            notes.append(f"{b.id}: placed on {cid} instead of this tick's {names}")
        else:
            notes.append(f"{b.id}: free GPUs fragmented; making room on {cid} (preempting or withdrawing {names})")
    return Room(
        tuple(drains), tuple(withdrawn), tuple(creates), tuple((b, v, n) for (b, v), n in sorted(pairs.items())), tuple(notes)
    )


def _victims_on(
    state: ControlState,
    b: Deployment,
    cid: ClusterId,
    need: int,
    free: Mapping[tuple[ClusterId, PoolId], int],
    by_cluster: Mapping[tuple[ClusterId, PoolId], list[tuple[Instance | Planned, Deployment]]],
    totals: Mapping[tuple[TenantId, PoolId], int],
    live: Mapping[DeploymentId, int],
    guaranteed: Mapping[DeploymentId, int],
    gone: Collection[InstanceId],
    loads: Mapping[InstanceId, float],
    pending: Mapping[tuple[ClusterId, PoolId], int],
) -> list[_Candidate] | None:
    """The fewest victims on ``cid`` that free ``need`` GPUs for ``b``, taken in victim order with
    the rules re-checked after each take; None when that cluster cannot be freed."""
    tenants = state.tenants
    pool = b.pool
    s = tenants[b.tenant]
    t = dict(totals)
    kept = dict(live)
    within = t.get((b.tenant, pool), 0) <= s.quota_in(pool)
    have = max(0, free.get((cid, pool), 0)) + pending.get((cid, pool), 0)
    picked: list[_Candidate] = []
    items = [(x, d) for x, d in by_cluster.get((cid, pool), []) if _iid(x) not in gone and d.tenant != b.tenant]
    while have < need:
        best: _Candidate | None = None
        for x, d in items:
            if any(p.instance_id == _iid(x) for p in picked) or kept.get(d.id, 0) <= guaranteed.get(d.id, 0):
                continue
            u = tenants[d.tenant]
            borrowed = t.get((d.tenant, pool), 0) - d.gpus_per_instance >= u.quota_in(pool)
            if not ((within and borrowed) or (s.priority > u.priority and (within or borrowed))):
                continue
            cand = _candidate(x, d, borrowed, u.priority, loads)
            if best is None or cand.key < best.key:
                best = cand
        if best is None:
            return None
        picked.append(best)
        d = best.deployment
        kept[d.id] = kept.get(d.id, 0) - 1
        t[(d.tenant, pool)] = t.get((d.tenant, pool), 0) - d.gpus_per_instance
        have += d.gpus_per_instance
    return picked


def _iid(x: Instance | Planned) -> InstanceId:
    return x.instance_id if isinstance(x, Planned) else x.id


def _candidate(x: Instance | Planned, d: Deployment, borrowed: bool, priority: int, loads: Mapping[InstanceId, float]) -> _Candidate:
    if isinstance(x, Planned):
        return _Candidate((0, 0 if borrowed else 1, priority, 0, 0.0, 0, x.instance_id), x.instance_id, d, True)
    key = (1, 0 if borrowed else 1, priority, 1 if x.state.serving else 0, loads.get(x.id, 0.0), -x.created_ms, x.id)
    return _Candidate(key, x.id, d, False)
