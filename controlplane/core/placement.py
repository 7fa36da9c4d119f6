"""Placement of new instances across zones and clusters, and the order of removals on scale-in.

:func:`place` puts ``count`` new instances of one deployment, one at a time (greedy water-filling):

1. Candidates are the clusters that are **schedulable** (:func:`schedulable`: neither the cluster
   nor its zone record is cordoned or draining; a zone without a record is schedulable), **not
   blocked** (their breaker is open) and have at least ``deployment.gpus_per_instance`` **free
   GPUs** (``free_gpus``, already for the deployment's pool; a cluster missing from it has none).
   Each placement consumes the GPUs it takes, so the result never exceeds the free capacity.
2. Among them it picks, by this key, smallest first:

   * the **zone** holding the fewest instances of this deployment (existing non-terminal ones plus
     the ones placed so far): spreading over availability zones is what survives a zone outage;
   * then a cluster whose **node-local model cache holds the model** (``cached``, from the
     replicated ``ModelCacheRecord``s): its start is ``cached`` instead of ``cold`` (30 s instead of
     86 s for 8B, :mod:`controlplane.domain.start_tiers`). It ranks below the zone spread and never
     beats the filters of step 1 (schedulable, breakers, free GPUs), but above the spread over the
     clusters of one zone: a start three times faster is worth more than that spread;
   * then the **cluster** holding the fewest of them;
   * then the cluster with the **most free GPUs** (keeps headroom even across clusters);
   * then the cluster id (deterministic).

   With ample capacity the zone counts therefore end up within one of each other (every zone that
   received an instance ends at most one above the emptiest candidate zone).
3. When no candidate is left, the rest is ``unplaced`` and the :class:`PlacementOutcome` says why:
   no clusters at all, every cluster cordoned (or draining), every schedulable cluster blocked by
   an open breaker, or no capacity in the schedulable unblocked ones. The loop ends at the latest when capacity runs out, so it is bounded by the free GPUs,
   not by ``count``.

:func:`pick_removals` orders the instances to remove on scale-in. Only non-terminal instances that
are not already ``Draining`` are eligible. They are picked one at a time by this key, smallest first:

1. **state**, cheapest to lose first: ``Pending`` (has done nothing yet), ``Warming`` (loses only its
   warm-up), ``Standby`` (serves nothing; callers that keep a warm pool pass only the instances they
   mean to scale), then the serving ones (``Ready`` and ``Busy`` alike: their load decides below);
2. the **zone** holding the most eligible instances of the instance's deployment, recounted after
   every pick, so scale-in keeps the spread that :func:`place` built;
3. the **least loaded** (``loads.get(id, 0)``; an unknown or NaN load counts as 0);
4. the **newest** (``created_ms`` descending: the oldest have proven themselves);
5. the instance id.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, ZoneId
from controlplane.domain.instances import Instance, InstanceState
from controlplane.domain.tenants import Deployment
from controlplane.domain.topology import Cluster, Zone


class PlacementOutcome(enum.Enum):
    PLACED = "placed"
    """Every requested instance was placed (also for ``count == 0``)."""
    NO_CLUSTERS = "no_clusters"
    """No cluster was given at all."""
    ALL_CORDONED = "all_cordoned"
    """Every cluster is cordoned or draining (itself or through its zone)."""
    ALL_BLOCKED = "all_blocked"
    """Every schedulable cluster is blocked by an open breaker."""
    NO_CAPACITY = "no_capacity"
    """The schedulable unblocked clusters have too few free GPUs for (the rest of) the instances."""
    NO_GPU_MEMORY = "no_gpu_memory"
    """As ``NO_CAPACITY``, and on some of them the reported GPU memory, not the GPU count, was short
    (:mod:`controlplane.core.gpu_memory`): the reason names those clusters and why."""


@dataclass(frozen=True, slots=True)
class Placement:
    clusters: tuple[ClusterId, ...]
    """One entry per placed instance, in placement order."""
    unplaced: int
    reason: str
    """Human-readable explanation with the numbers."""
    outcome: PlacementOutcome = PlacementOutcome.PLACED


def schedulable(cluster: Cluster, zones: Mapping[ZoneId, Zone]) -> bool:
    """New instances may go to ``cluster``: neither it nor its zone record is cordoned or draining
    (a zone without a record is schedulable)."""
    zone = zones.get(cluster.zone)
    return cluster.schedulable and (zone is None or zone.schedulable)


def evacuating(cluster: Cluster, zones: Mapping[ZoneId, Zone]) -> bool:
    """``cluster``'s instances are to be replaced elsewhere, then drained: the cluster or its zone
    record is draining."""
    zone = zones.get(cluster.zone)
    return cluster.draining or (zone is not None and zone.draining)


def _check_count(count: object) -> int:
    if isinstance(count, bool) or not isinstance(count, int):
        raise ValidationError("count", f"must be an integer, got {type(count).__name__}")
    if count < 0:
        raise ValidationError("count", f"must be >= 0, got {count}")
    return count


def _unique_clusters(clusters: Sequence[Cluster]) -> list[Cluster]:
    by_id: dict[ClusterId, Cluster] = {}
    for cl in clusters:
        if cl.id in by_id:
            raise ValidationError("clusters", f"cluster {cl.id!r} is listed twice")
        by_id[cl.id] = cl
    return [by_id[k] for k in sorted(by_id)]


def _spread_counts(
    deployment_id: DeploymentId, existing: Sequence[Instance]
) -> tuple[dict[ZoneId, int], dict[ClusterId, int]]:
    per_zone: dict[ZoneId, int] = {}
    per_cluster: dict[ClusterId, int] = {}
    for inst in existing:
        if inst.deployment == deployment_id and not inst.state.terminal:
            per_zone[inst.zone] = per_zone.get(inst.zone, 0) + 1
            per_cluster[inst.cluster] = per_cluster.get(inst.cluster, 0) + 1
    return per_zone, per_cluster


def _shortfall(placed: int, count: int, n_clusters: int, n_cordoned: int, n_blocked: int, need: int,
               memory: Mapping[ClusterId, str]) -> Placement:
    unplaced = count - placed
    if unplaced == 0:
        return Placement((), 0, f"placed {count} of {count}", PlacementOutcome.PLACED)
    head = f"placed {placed} of {count}, {unplaced} unplaced: "
    if n_clusters == 0:
        return Placement((), unplaced, head + "no clusters", PlacementOutcome.NO_CLUSTERS)
    if n_cordoned == n_clusters:
        why = f"all {n_clusters} clusters are cordoned or draining"
        return Placement((), unplaced, head + why, PlacementOutcome.ALL_CORDONED)
    cordoned = f", {n_cordoned} cordoned or draining" if n_cordoned else ""
    if n_blocked == n_clusters - n_cordoned:
        why = f"all {n_blocked} {'schedulable ' if n_cordoned else ''}clusters are blocked by open breakers{cordoned}"
        return Placement((), unplaced, head + why, PlacementOutcome.ALL_BLOCKED)
    why = (
        f"no capacity: none of the {n_clusters - n_cordoned - n_blocked} unblocked clusters has {need} free GPUs"
        f" ({n_blocked} blocked by open breakers{cordoned})"
    )
    if memory:
        why += "; GPU memory: " + "; ".join(memory[k] for k in sorted(memory))
        return Placement((), unplaced, head + why, PlacementOutcome.NO_GPU_MEMORY)
    return Placement((), unplaced, head + why, PlacementOutcome.NO_CAPACITY)


def place(
    deployment: Deployment,
    count: int,
    clusters: Sequence[Cluster],
    free_gpus: Mapping[ClusterId, int],
    existing: Sequence[Instance],
    blocked: Collection[ClusterId],
    zones: Mapping[ZoneId, Zone] | None = None,
    cached: Collection[ClusterId] = frozenset(),
    memory_limited: Mapping[ClusterId, str] | None = None,
) -> Placement:
    """Choose a cluster for each of ``count`` new instances of ``deployment`` (see the module doc).

    ``existing`` may hold instances of other deployments; only this deployment's non-terminal ones
    count toward the spread. ``blocked`` and ``cached`` (the clusters whose model cache holds the
    deployment's model: ``core.model_cache.cached_clusters``) are only tested for membership.
    ``zones`` holds the zone records (cordon state); a zone missing from it is schedulable.
    ``memory_limited``: clusters whose ``free_gpus`` the reported GPU memory lowered, with why
    (:meth:`controlplane.core.gpu_memory.MemoryView.cap`); named in the reason of a shortfall. Raises
    :class:`ValidationError` for a negative ``count`` or a cluster listed twice.
    """
    _check_count(count)
    need = deployment.gpus_per_instance
    ordered = _unique_clusters(clusters)
    open_ = [cl for cl in ordered if schedulable(cl, zones or {})]
    unblocked = [cl for cl in open_ if cl.id not in blocked]
    free = {cl.id: max(0, free_gpus.get(cl.id, 0)) for cl in unblocked}
    per_zone, per_cluster = _spread_counts(deployment.id, existing)
    chosen: list[ClusterId] = []
    while len(chosen) < count:
        fits = [cl for cl in unblocked if free[cl.id] >= need]
        if not fits:
            break
        best = min(
            fits,
            key=lambda cl: (per_zone.get(cl.zone, 0), cl.id not in cached, per_cluster.get(cl.id, 0), -free[cl.id], cl.id),
        )
        chosen.append(best.id)
        free[best.id] -= need
        per_zone[best.zone] = per_zone.get(best.zone, 0) + 1
        per_cluster[best.id] = per_cluster.get(best.id, 0) + 1
    verdict = _shortfall(
        len(chosen), count, len(ordered), len(ordered) - len(open_), len(open_) - len(unblocked), need,
        {k: v for k, v in (memory_limited or {}).items() if k in free},
    )
    return Placement(tuple(chosen), verdict.unplaced, verdict.reason, verdict.outcome)


REMOVAL_RANK: dict[InstanceState, int] = {
    InstanceState.PENDING: 0,
    InstanceState.WARMING: 1,
    InstanceState.STANDBY: 2,
    InstanceState.READY: 3,
    InstanceState.BUSY: 3,
}
"""Removal order by state (smaller first). Draining and terminal states are never picked."""


def removable(inst: Instance) -> bool:
    """Eligible for scale-in: non-terminal and not already Draining."""
    return inst.state in REMOVAL_RANK


def _load(loads: Mapping[InstanceId, float], instance_id: InstanceId) -> float:
    value = float(loads.get(instance_id, 0.0))
    return 0.0 if math.isnan(value) else value


def pick_removals(
    instances: Sequence[Instance], count: int, loads: Mapping[InstanceId, float]
) -> tuple[InstanceId, ...]:
    """The ids of ``min(count, eligible)`` instances to remove, in removal order (see the module doc).

    Raises :class:`ValidationError` for a negative ``count`` or an instance id listed twice.
    """
    _check_count(count)
    seen: set[InstanceId] = set()  # membership only, never iterated
    left: dict[InstanceId, Instance] = {}
    for inst in instances:
        if inst.id in seen:
            raise ValidationError("instances", f"instance {inst.id!r} is listed twice")
        seen.add(inst.id)
        if removable(inst):
            left[inst.id] = inst
    per_zone: dict[tuple[DeploymentId, ZoneId], int] = {}
    for inst in left.values():
        key = (inst.deployment, inst.zone)
        per_zone[key] = per_zone.get(key, 0) + 1
    picked: list[InstanceId] = []
    while left and len(picked) < count:
        victim = min(
            left.values(),
            key=lambda i: (
                REMOVAL_RANK[i.state],
                -per_zone[(i.deployment, i.zone)],
                _load(loads, i.id),
                -i.created_ms,
                i.id,
            ),
        )
        picked.append(victim.id)
        del left[victim.id]
        per_zone[(victim.deployment, victim.zone)] -= 1
    return tuple(picked)
