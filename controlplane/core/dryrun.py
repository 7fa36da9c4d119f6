"""What applying a deployment spec would do now, without writing anything: ``dry_run(...)``.

Pure: a function of the replicated state, the proposed :class:`Deployment`, the deployment's
filtered signals (the lease holder's, or None: "no load known") and ``now_ms``. Nothing here reads a
clock or changes ``state``.

The outcome holds

* ``changes``: every field that differs, as ``(field, before, after)`` strings, nested policy fields
  as ``policy.<name>`` (for a new deployment every field, with ``before`` empty);
* ``target_before`` / ``target_after``: the scaling decision of the current and of the proposed spec,
  from the same signals, the same replicated memory and the same current replica count (the
  planner's :func:`reconcile.decide`; a new deployment starts from ``min_replicas``, as the planner's
  first decision does; a deployment being deleted decides 0);
* ``notes``: consequences in words, with the numbers:

  - the apply would be refused: unknown tenant, another tenant's deployment, pool or
    ``gpus_per_instance`` changed, the deployment is being deleted;
  - the tenant ceiling (quota + borrowing limit) against ``max_replicas`` and against the target,
    counting the GPUs the tenant's other deployments hold in the pool;
  - GPUs beyond the quota (borrowed, reclaimable by other tenants);
  - ``min_replicas`` and the target against the free GPUs of the schedulable clusters; no
    schedulable cluster with the pool, or none with ``gpus_per_instance`` free GPUs.

It does not run the allocation across tenants: whether a shortfall is met by preemption depends on
every other deployment's demand at the time, which the notes only point at.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.core import placement, reconcile
from controlplane.core.signals import FilteredSignals
from controlplane.domain.instances import Instance, InstanceState
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment

SKIPPED_FIELDS = ("created_ms",)
"""Fields set by the system, never compared."""


@dataclass(frozen=True, slots=True)
class DryRunOutcome:
    exists: bool
    """A deployment of that id exists (else the spec would create one)."""
    changes: tuple[tuple[str, str, str], ...]
    """``(field, before, after)`` for every field that differs, in field order."""
    current_replicas: int
    """Desired serving replicas now (0 for a new deployment)."""
    target_before: int
    """The current spec's decision now (0 for a new deployment)."""
    target_after: int
    """The proposed spec's decision now."""
    warm_pool_after: int
    reason_after: str
    message_after: str
    notes: tuple[str, ...]
    """Refusals, quota, borrowing and capacity consequences, in words."""


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_text(v)}" for k, v in sorted(value.items()))
    return str(value)


def _flat(obj: object, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        if f.name in SKIPPED_FIELDS:
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(_flat(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


_ABSENT = object()


def field_changes(before: Deployment | None, after: Deployment) -> tuple[tuple[str, str, str], ...]:
    """``(field, before, after)`` for each field that differs (all of them when ``before`` is None).
    Values are compared, not their text: ``0`` and ``0.0`` (a float that went through the codec as
    an integer) are the same value."""
    new = _flat(after)
    old = _flat(before) if before is not None else {}
    return tuple(
        (name, _text(old[name]) if name in old else "", _text(value))
        for name, value in new.items() if old.get(name, _ABSENT) != value
    )


def _refusals(state: ControlState, old: Deployment | None, d: Deployment) -> list[str]:
    out = []
    if d.tenant not in state.tenants:
        out.append(f"refused: tenant {d.tenant!r} does not exist")
    if old is None:
        if d.deleting:
            out.append(f"refused: deployment {d.id!r} does not exist; it cannot be created deleting")
        return out
    if old.tenant != d.tenant:
        out.append(f"refused: deployment {d.id!r} belongs to tenant {old.tenant!r}, not {d.tenant!r}")
    if (old.pool, old.gpus_per_instance) != (d.pool, d.gpus_per_instance):
        out.append(
            f"refused: pool and gpus_per_instance cannot change ({old.pool} x {old.gpus_per_instance} -> "
            f"{d.pool} x {d.gpus_per_instance}); create a new deployment"
        )
    if old.deleting and not d.deleting:
        out.append(f"refused: deployment {d.id!r} is being deleted; it cannot be updated")
    return out


def _holds(inst: Instance) -> bool:
    """Counts against its tenant: holds GPUs and is not on its way out."""
    return not inst.state.terminal and inst.state is not InstanceState.DRAINING


def _quota_notes(state: ControlState, d: Deployment, target: int) -> list[str]:
    tenant = state.tenants.get(d.tenant)
    if tenant is None:
        return []
    pool, g = d.pool, d.gpus_per_instance
    quota, ceiling = tenant.quota_in(pool), tenant.ceiling_in(pool)
    others = sum(
        i.gpus for i in state.instances.values()
        if i.tenant == d.tenant and i.pool == pool and i.deployment != d.id and _holds(i)
    )
    head = f"tenant {d.tenant} may hold {ceiling} {pool} GPUs (quota {quota} + borrow {ceiling - quota})"
    out = []
    if d.max_replicas * g > ceiling:
        out.append(
            f"{head}; max_replicas {d.max_replicas} x {g} GPUs = {d.max_replicas * g} exceeds it: "
            f"at most {ceiling // g} replicas can ever be granted"
        )
    room = max(0, ceiling - others)
    if target * g > room:
        out.append(
            f"{head}; its other deployments hold {others}: target {target} x {g} GPUs = {target * g} "
            f"exceeds the {room} left, so at most {max(d.min_replicas, room // g)} replicas would be granted"
            + (" (min_replicas is guaranteed even above the ceiling)" if d.min_replicas * g > room else "")
        )
    total = others + target * g
    borrowed = total - max(quota, others)  # of this deployment's GPUs, the ones above the quota
    if borrowed > 0:
        out.append(
            f"target {target} x {g} GPUs + {others} held by its other deployments = {total} is beyond the "
            f"quota {quota}: {borrowed} GPUs would be borrowed (reclaimable when other tenants need their quota)"
        )
    return out


def _capacity_notes(state: ControlState, d: Deployment, target: int) -> list[str]:
    pool, g = d.pool, d.gpus_per_instance
    open_ = [cl for cl in state.clusters.values() if placement.schedulable(cl, state.zones)]
    with_pool = [cl for cl in open_ if cl.capacity.get(pool, 0) > 0]
    if not with_pool:
        return [f"no schedulable cluster has a {pool} pool: no instance can be placed"]
    free = {cl.id: max(0, state.free_gpus(cl.id, pool)) for cl in with_pool}
    total_free, capacity = sum(free.values()), sum(cl.capacity[pool] for cl in with_pool)
    have = sum(  # what the planner counts: serving-bound, not on a cluster being evacuated
        1 for i in state.instances_of(d.id)
        if i.state in reconcile.SERVING_BOUND and i.cluster in state.clusters
        and not placement.evacuating(state.clusters[i.cluster], state.zones)
    )
    where = f"{total_free} {pool} GPUs are free in {len(with_pool)} schedulable clusters (capacity {capacity})"
    out = []
    if max(free.values()) < g and max(d.min_replicas, target) > have:
        out.append(f"no schedulable cluster has {g} free {pool} GPUs for a new instance ({where})")
    for what, n in (("min_replicas", d.min_replicas), ("target", target)):
        need = max(0, n - have) * g
        if need > total_free:
            out.append(
                f"{what} {n} needs {need} more {pool} GPUs ({max(0, n - have)} new x {g}) but only {where}: "
                f"the rest waits for capacity or preempts lower-priority borrowing"
            )
            break
    return out


def dry_run(
    state: ControlState, proposed: Deployment, signals: FilteredSignals | None, now_ms: int
) -> DryRunOutcome:
    """What applying ``proposed`` would do now (see the module doc). Reads ``state`` only."""
    old = state.deployments.get(proposed.id)
    memory = state.memory_of(proposed.id)
    current = reconcile.current_replicas(state, old if old is not None else proposed)
    after = reconcile.decide(proposed, state, signals, memory, current, now_ms)
    before = reconcile.decide(old, state, signals, memory, current, now_ms) if old is not None else None
    notes = _refusals(state, old, proposed)
    if not proposed.deleting:
        notes += _quota_notes(state, proposed, after.target)
        notes += _capacity_notes(state, proposed, after.target)
    if signals is None:
        notes.append(f"no live signals: the targets assume no load (they keep {current} replicas within bounds)")
    return DryRunOutcome(
        exists=old is not None,
        changes=field_changes(old, proposed),
        current_replicas=current if old is not None else 0,
        target_before=before.target if before is not None else 0,
        target_after=after.target,
        warm_pool_after=after.warm_pool,
        reason_after=after.reason.value,
        message_after=after.message,
        notes=tuple(notes),
    )
