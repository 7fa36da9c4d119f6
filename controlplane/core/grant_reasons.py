"""Honest labels of a committed decision: what moved the number (issue 18, point 4).

The scaling decision (:mod:`controlplane.core.scaling`) proposes a target; the allocation
(:mod:`controlplane.core.preemption`, or an external allocator) grants at most that. When the grant
is the target, the decision's own stage names it (``scale_up``, ``panic``, ``forecast``...). When it
is less, the stage did not set the number: the label says what cut it, and the message names the
numbers:

* ``preempted``: held replicas were given up to other tenants (the allocation's preemption pairs):
  "preempted by tenant gold (priority 100): granted 4 of 7";
* ``quota``: the tenant's quota plus borrowing limit in the pool does not hold more (or was lowered
  under what it held);
* ``breaker``: GPUs that would fit it sit in clusters whose circuit breaker is open;
* ``capacity``: the pool is full (or no schedulable cluster has the pool at all).

A label never says ``scale_up`` for a decrease or ``scale_down`` for an increase. Pure and
deterministic: values in, strings out; nothing here changes a target, a grant or a command.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.core import breaker as br
from controlplane.core import placement
from controlplane.domain.ids import ClusterId, DeploymentId, PoolId, TenantId
from controlplane.domain.records import BreakerPhase, BreakerRecord
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment


class GrantReason(enum.Enum):
    PREEMPTED = "preempted"
    QUOTA = "quota"
    CAPACITY = "capacity"
    BREAKER = "breaker"


SHORTFALL_REASONS = frozenset(r.value for r in GrantReason)
"""Decision reasons that mean: the grant is below what the scaling policy asked for."""


@dataclass(frozen=True, slots=True)
class PoolFacts:
    """What the allocation of one tick had to work with."""

    capacity: Mapping[PoolId, int]
    """GPUs per pool the allocation could use (healthy, schedulable clusters)."""
    behind_breakers: Mapping[PoolId, tuple[int, tuple[ClusterId, ...]]] = field(default_factory=dict)
    """GPUs per pool left out because their cluster's breaker is open, and those clusters."""


@dataclass
class Labeler:
    """Labels the decisions of one tick. ``grants_of`` gives every deployment's granted replicas;
    ``preemptions`` the tick's ``(beneficiary, victim, replicas)`` pairs; ``facts`` gives the
    pools' capacity. The facts and the per-pool and per-tenant sums are built once, on the first
    shortfall (a steady tick builds nothing)."""

    state: ControlState
    grants_of: Callable[[], Mapping[DeploymentId, int]]
    preemptions: Sequence[tuple[DeploymentId, DeploymentId, int]]
    facts_of: Callable[[], PoolFacts]
    _pool_use: dict[PoolId, dict[TenantId, int]] | None = None
    _facts: PoolFacts | None = None

    @property
    def facts(self) -> PoolFacts:
        if self._facts is None:
            self._facts = self.facts_of()
        return self._facts

    def label(self, d: Deployment, stage: str, target: int, grant: int, old: int | None) -> tuple[str, str]:
        """``(reason, note)`` of ``d``'s decision: ``stage`` is the scaling stage's reason, ``old``
        the desired replicas before (None: first decision). ``note`` is "" when the stage stands,
        else the sentence to put ahead of the decision's message."""
        if grant >= target:
            return _direction(stage, grant, old), ""
        reason, note = self._shortfall(d, target, grant)
        return reason.value, note

    def _shortfall(self, d: Deployment, target: int, grant: int) -> tuple[GrantReason, str]:
        granted = f"granted {grant} of {target} replicas x {d.gpus_per_instance} GPUs"
        by = [(b, n) for b, v, n in self.preemptions if v == d.id]
        if by:
            return GrantReason.PREEMPTED, f"preempted by {self._takers(by)}: {granted}"
        tenant = self.state.tenants.get(d.tenant)
        use = self._uses().get(d.pool, {})
        held = use.get(d.tenant, 0)
        gpus = d.gpus_per_instance
        if tenant is not None and held + gpus > tenant.ceiling_in(d.pool):
            q, b = tenant.quota_in(d.pool), tenant.borrow_limit.get(d.pool, 0)
            return GrantReason.QUOTA, (
                f"tenant {d.tenant}'s {d.pool} quota {q} + borrow limit {b} = {q + b} GPUs, "
                f"{held} granted to its deployments: {granted}"
            )
        cap = self.facts.capacity.get(d.pool, 0)
        behind, clusters = self.facts.behind_breakers.get(d.pool, (0, ()))
        if behind and sum(use.values()) + gpus <= cap + behind:
            return GrantReason.BREAKER, (
                f"{behind} {d.pool} GPUs sit behind open breakers (clusters {', '.join(clusters)}): {granted}"
            )
        if cap == 0:
            pools = sorted({p for cl in self.state.clusters.values() for p, n in cl.capacity.items() if n > 0})
            return GrantReason.CAPACITY, (
                f"no schedulable cluster has {d.pool} GPUs (pools with capacity: {', '.join(pools) or 'none'}): {granted}"
            )
        # Other tenants are not named here: a tenant reads its decisions (only a preemption names
        # the tenant that took its GPUs, as the issue asks).
        return GrantReason.CAPACITY, f"pool {d.pool} full: {sum(use.values())} of {cap} GPUs granted: {granted}"

    def _takers(self, by: Sequence[tuple[DeploymentId, int]]) -> str:
        counts: dict[TenantId, int] = {}
        for b, n in by:
            dep = self.state.deployments.get(b)
            t = dep.tenant if dep is not None else TenantId(str(b))
            counts[t] = counts.get(t, 0) + n
        parts = []
        for t, n in sorted(counts.items()):
            rec = self.state.tenants.get(t)
            prio = f" (priority {rec.priority})" if rec is not None else ""
            parts.append(f"tenant {t}{prio}" + (f" x{n}" if len(counts) > 1 else ""))
        return ", ".join(parts)

    def _uses(self) -> dict[PoolId, dict[TenantId, int]]:
        if self._pool_use is None:
            use: dict[PoolId, dict[TenantId, int]] = {}
            for did, n in sorted(self.grants_of().items()):
                dep = self.state.deployments.get(did)
                if dep is None or n <= 0:
                    continue
                per = use.setdefault(dep.pool, {})
                per[dep.tenant] = per.get(dep.tenant, 0) + n * dep.gpus_per_instance
            self._pool_use = use
        return self._pool_use


def behind_breakers(
    state: ControlState, breaker_of: Callable[[ClusterId], BreakerRecord | None], now_ms: int
) -> dict[PoolId, tuple[int, tuple[ClusterId, ...]]]:
    """GPUs per pool of schedulable clusters the allocation left out because their cluster breaker
    is open (inside its backoff), and those clusters: what a ``breaker`` label names."""
    out: dict[PoolId, tuple[int, tuple[ClusterId, ...]]] = {}
    for cid in sorted(state.clusters):
        rec = breaker_of(cid)
        cl = state.clusters[cid]
        if rec is None or rec.phase is not BreakerPhase.OPEN or br.probe_due(rec, now_ms):
            continue
        if not placement.schedulable(cl, state.zones):
            continue
        for pool, n in sorted(cl.capacity.items()):
            gpus, names = out.get(pool, (0, ()))
            out[pool] = (gpus + n, (*names, cid))
    return out


def _direction(stage: str, grant: int, old: int | None) -> str:
    """``stage``, unless it names the wrong direction for ``old -> grant``."""
    if old is not None and stage == "scale_up" and grant < old:
        return "scale_down"
    if old is not None and stage == "scale_down" and grant > old:
        return "scale_up"
    return stage
