"""Tenant allocation and priority preemption (pure, loop-free).

:func:`allocate` decides, for every GPU pool independently, how many replicas each deployment may
hold; :func:`choose_victims` turns the replicas a deployment must give up into the instances to
drain. Nothing here reads a clock, does I/O, logs or draws random numbers, and every loop runs over
an explicitly sorted sequence, so equal inputs give equal outputs on every coordinator.

Terms (one pool *P*, deployment *d* of tenant *t*)
---------------------------------------------------
``gpus(d)`` is ``gpus_per_instance``; replicas x ``gpus(d)`` is what *d* occupies.
``guaranteed(d) = min(min_replicas, want)``. ``T(t)`` is the tenant's GPUs in *P*, ``Q(t)`` its
``quota_in(P)`` and ``C(t)`` its ``ceiling_in(P)`` (quota + borrowing limit). A replica is
*borrowed* when its tenant would still hold at least its quota without it: ``T(t) - gpus(d) >= Q(t)``.
*Serve order* is tenant priority descending, then tenant id, then deployment id.

Algorithm (per pool)
--------------------
0. **Keep.** Every deployment starts at ``kept = min(have, want)``: incumbents keep what they hold
   and still want. The ceiling is hard except for guaranteed minimums: the GPUs a tenant holds above
   its deployments' guaranteed minimums may not exceed ``C(t) - sum(guaranteed(d) x gpus(d))``. A
   tenant over that budget (its quota was lowered) gives up replicas above the minimums, highest
   deployment id first; that is a *trim* (``GrantCode.TRIMMED``), not a preemption. The pool's
   effective capacity is ``max(capacity, GPUs kept)``: an over-committed pool (the capacity shrank
   under running instances) is never evicted without a beneficiary; nothing grows from free capacity
   until attrition brings it back under its capacity, and preemption there only swaps GPUs.
1. **Minimums from free capacity**, in serve order: each deployment grows toward ``guaranteed``
   while one more replica fits in the free GPUs. When the minimums do not all fit, higher priority
   is served first, and a smaller replica further down the order still uses what is left.
2. **Claims, strongest first.** A *claim* asks for one more replica of a deployment below ``want``:
   ``MINIMUM`` while below ``guaranteed`` (ignores the ceiling); otherwise ``QUOTA`` when
   ``T(t) + gpus(d) <= Q(t)``, or ``BORROW`` while the ceiling budget of step 0 has room. Strength
   is (grows within its quota, tenant priority, minimum first, tenant id, deployment id), so the
   quota round runs in priority order before the borrowing round, and borrowed capacity is lent in
   priority order. Repeat: grant one replica to the strongest claim that can be satisfied; stop
   when none can. A claim uses free capacity when a replica fits. Only when it does not fit does it
   preempt: it takes replicas one at a time, in the victim order below, until the free GPUs plus the
   taken ones fit the replica, and it takes nothing if all allowed victims together are not enough.

**Preemption rules.** A claim of *b* (tenant *s*) may take a replica of *v* (tenant *u*, *u* != *s*)
only when *v* keeps at least ``guaranteed(v)`` and one of these holds:

* ``RECLAIM`` (quota reclaim): *b* grows within its quota (``T(s) + gpus(b) <= Q(s)``) and the
  replica of *v* is borrowed. Priorities do not matter: a quota beats anybody's borrowing, and only
  the borrowed part of a tenant can be reclaimed this way.
* ``PRIORITY``: ``priority(s) > priority(u)`` and (*b* grows within its quota or the replica of *v*
  is borrowed). The bracket is stricter than "higher priority wins": a tenant that is itself
  borrowing takes only borrowed GPUs, never a lower-priority tenant's quota. Without it, a borrowing
  H could take L's quota, and L, now under its quota, would reclaim H's borrowed GPUs: a loop.

Equal-priority tenants therefore preempt each other only by ``RECLAIM``; a tenant never preempts
itself; guaranteed minimums are never taken.

**Victim order inside** :func:`allocate` (whose replica a claim takes): borrowed replicas first, then
the lowest tenant priority, the least loaded deployment (``Demand.load``), the newest deployment
(``created_ms`` descending), then deployment id.

**Result.** ``Grant.replicas`` is what the deployment may hold. ``Grant.preempted`` is
``max(0, kept - replicas)``: held replicas it gives up to other tenants (a voluntary scale-down and
a trim are not preemptions). ``Allocation.preemptions`` attributes each of them to the claim that
took it; when a victim grows back in the same call (free capacity left over by a large victim), its
latest loss is cancelled first, so the pairs add up to ``Grant.preempted`` exactly.
``Allocation.steps`` lists every granted replica in order with the rule of each take: it is the
explanation of the decision, and the tests replay it against the rules.

Victim order in :func:`choose_victims`
--------------------------------------
For every deployment with ``preempted > 0`` it drains that many of its instances that are neither
terminal nor already Draining, ordered by:

1. borrower first: the tenant holds more GPUs in the pool than its quota (counted over the live,
   not Draining instances it is given);
2. lowest tenant priority;
3. not yet serving first: Pending, Warming and Standby before Ready and Busy;
4. least loaded (``loads[instance_id]``, missing = 0);
5. newest (``created_ms`` descending);
6. instance id.

The allocation fixes how many replicas each deployment gives up, so keys 1 and 2, which are the
same for all instances of a deployment, only order the output (the order the drains are issued);
the choice within a deployment is made by keys 3 to 6. Key 3 ranks above the load because an
instance that serves no traffic loses no in-flight request when drained, whatever its load reads.

Why there are no loops
----------------------
* **Termination.** Each granted replica strictly increases, lexicographically, the potential
  (GPUs in guaranteed minimums per priority level, highest first; then ``sum min(T, Q)`` per level;
  then ``sum max(0, T - Q)`` per level). A ``MINIMUM`` step adds minimum GPUs at its level and takes
  none. A ``QUOTA`` step adds quota GPUs at its level and takes quota GPUs only from lower levels
  (``RECLAIM`` takes borrowed GPUs only). A ``BORROW`` step takes only borrowed GPUs, of lower
  levels. The potential has finitely many values, so the search ends; :data:`STEP_LIMIT_PER_REPLICA`
  bounds it anyway, and ``Allocation.settled`` is False if that bound ever cut it short.
* **Fixpoint.** The search stops only when no claim can be satisfied. Feed the result back
  (``have := replicas``, same wants): the grants are within ``want`` and the ceiling budget, so
  ``kept`` equals them; the effective capacity can only shrink, so there is no more free capacity;
  and whether a claim can be satisfied depends on nothing but that state. The second call grants
  the same replicas and preempts nothing: with constant demands, preemption happens in one call.
* **No two-way preemption.** Claims are served strongest first, and a replica a claim creates is
  held at a strength no later claim exceeds: a ``QUOTA`` replica of priority p can fall only to a
  quota claim of priority > p, and a ``BORROW`` replica of priority p only to a quota claim or a
  borrowing claim of priority > p; all of those are stronger than the claim that created it, so
  they ran first. Hence a deployment loses replicas only before it gains any in a call, a
  beneficiary is never a victim afterwards, and a victim that grows back (into capacity a large
  victim left over) cancels its own latest loss instead of taking from its taker. Within one call
  no pair is reported in both directions; across calls the fixpoint leaves nothing to take back.
  The unit tests replay every step against the rules and check all of this on random fleets.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId, PoolId, TenantId
from controlplane.domain.instances import Instance, InstanceState
from controlplane.domain.tenants import Deployment, Tenant

__all__ = [
    "STEP_LIMIT_PER_REPLICA",
    "Allocation",
    "ClaimKind",
    "Demand",
    "Grant",
    "GrantCode",
    "Rule",
    "Step",
    "Take",
    "Victim",
    "allocate",
    "choose_victims",
]

STEP_LIMIT_PER_REPLICA = 8
"""Safety bound on the claim search of one pool: ``8 x (sum of wants + deployments) + 16`` steps.
The potential argument above guarantees termination; this makes the bound explicit."""


class ClaimKind(enum.Enum):
    MINIMUM = "minimum"
    """Growing toward ``min(min_replicas, want)``; ignores the tenant ceiling."""
    QUOTA = "quota"
    """Growing with the tenant staying within its quota."""
    BORROW = "borrow"
    """Growing beyond the tenant's quota, within its ceiling."""


class Rule(enum.Enum):
    PRIORITY = "priority"
    """Rule (a): the beneficiary's tenant has strictly higher priority."""
    RECLAIM = "reclaim"
    """Rule (b): the beneficiary grows within its quota and takes a borrowed replica."""


class GrantCode(enum.Enum):
    FULL = "full"
    """Granted everything it wants."""
    SHORT = "short"
    """Granted less than it wants, but lost nothing it held."""
    TRIMMED = "trimmed"
    """Gave up held replicas above its tenant's ceiling (not a preemption)."""
    PREEMPTED = "preempted"
    """Gives up held replicas to other tenants."""


@dataclass(frozen=True, slots=True)
class Demand:
    deployment: Deployment
    want: int
    """Replicas the scaling decision asks for (normally >= ``deployment.min_replicas``)."""
    have: int
    """Replicas holding GPUs now (non-terminal, not Draining)."""
    load: float
    """Mean utilisation 0..1 of its serving replicas (victim ordering)."""

    def __post_init__(self) -> None:
        for name, value in (("want", self.want), ("have", self.have)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError(f"demand.{name}", f"must be an integer >= 0, got {value!r}")
        if not math.isfinite(self.load) or self.load < 0:
            raise ValidationError("demand.load", f"must be a finite number >= 0, got {self.load!r}")


@dataclass(frozen=True, slots=True)
class Grant:
    deployment_id: DeploymentId
    replicas: int
    """What it may hold."""
    preempted: int
    """Held replicas it must give up to other tenants (0 if none)."""
    reason: str
    code: GrantCode = GrantCode.FULL


@dataclass(frozen=True, slots=True)
class Take:
    victim: DeploymentId
    rule: Rule


@dataclass(frozen=True, slots=True)
class Step:
    """One replica granted during the claim search, in order."""

    pool: PoolId
    deployment_id: DeploymentId
    claim: ClaimKind
    takes: tuple[Take, ...] = ()
    """One entry per victim replica taken (empty: it fitted in free capacity)."""


@dataclass(frozen=True, slots=True)
class Allocation:
    grants: Mapping[DeploymentId, Grant]
    preemptions: tuple[tuple[DeploymentId, DeploymentId, int], ...]
    """``(beneficiary, victim, replicas)``, sorted; per victim they add up to ``Grant.preempted``."""
    steps: tuple[Step, ...] = ()
    settled: bool = True
    """False only if :data:`STEP_LIMIT_PER_REPLICA` cut a pool's search short."""


@dataclass(frozen=True, slots=True)
class Victim:
    instance_id: InstanceId
    deployment_id: DeploymentId
    drain_deadline_ms: int
    reason: str


# --------------------------------------------------------------------------------------------
# allocate


@dataclass(slots=True, eq=False)
class _Spec:
    """A deployment's demand as one pool sees it (private to one :func:`allocate` call and never
    changed: not frozen only because a frozen dataclass is about twice as slow to build)."""

    id: DeploymentId
    tenant: TenantId
    priority: int
    gpus: int
    guaranteed: int
    want: int
    have: int
    load: float
    created_ms: int


@dataclass(frozen=True, slots=True)
class _Budget:
    quota: int
    ceiling: int
    extra: int
    """GPUs the tenant may hold above its deployments' guaranteed minimums."""


@dataclass(frozen=True, slots=True)
class _Pool:
    """Working state of one pool during one :func:`allocate` call. The container is frozen; the
    dicts are its scratch state, private to the call and never returned."""

    id: PoolId
    capacity: int
    """Effective capacity: ``max(capacity, GPUs kept)``."""
    order: tuple[DeploymentId, ...]
    specs: Mapping[DeploymentId, _Spec]
    budgets: Mapping[TenantId, _Budget]
    kept: Mapping[DeploymentId, int]
    alloc: dict[DeploymentId, int]
    totals: dict[TenantId, int]
    """GPUs per tenant."""
    extras: dict[TenantId, int]
    """GPUs per tenant above guaranteed minimums."""
    owed: dict[DeploymentId, list[DeploymentId]]
    """Per victim, the beneficiary of each held replica it has lost (a stack)."""


def allocate(
    tenants: Mapping[TenantId, Tenant],
    demands: Sequence[Demand],
    capacity: Mapping[PoolId, int],
    now_ms: int,
    *,
    explain: bool = True,
) -> Allocation:
    """Grant replicas per deployment, pool by pool (see the module docstring for the rules).

    ``now_ms`` is accepted for the uniform core signature; the allocation depends on the demands
    alone. ``explain`` False leaves every ``Grant.reason`` empty (the planner, which reads only the
    numbers, saves building one sentence per deployment per tick); nothing else changes. Raises
    :class:`ValidationError` for an unknown tenant or a repeated deployment.
    """
    del now_ms
    _validate(tenants, demands)
    grants: dict[DeploymentId, Grant] = {}
    pairs: list[tuple[DeploymentId, DeploymentId, int]] = []
    steps: list[Step] = []
    settled = True
    for pool_id, group in _by_pool(demands):
        quiet = None if explain else _quiet_grants(pool_id, group, tenants)
        if quiet is not None:
            grants.update(quiet)
            continue
        pool = _open_pool(pool_id, group, tenants, capacity.get(pool_id, 0))
        steps += _serve_minimums(pool)
        done, more = _settle(pool)
        steps += more
        settled = settled and done
        grants.update(_pool_grants(pool, done, explain))
        pairs += _pool_preemptions(pool)
    return Allocation(dict(sorted(grants.items())), tuple(sorted(pairs)), tuple(steps), settled)


def _validate(tenants: Mapping[TenantId, Tenant], demands: Sequence[Demand]) -> None:
    seen: dict[DeploymentId, int] = {}
    for k, demand in enumerate(demands):
        dep = demand.deployment
        if dep.tenant not in tenants:
            raise ValidationError(f"demands[{k}].deployment.tenant", f"unknown tenant {dep.tenant!r}")
        if dep.id in seen:
            where = f"demands[{k}].deployment.id"
            raise ValidationError(where, f"{dep.id!r} repeats demands[{seen[dep.id]}]")
        seen[dep.id] = k


def _by_pool(demands: Sequence[Demand]) -> list[tuple[PoolId, list[Demand]]]:
    groups: dict[PoolId, list[Demand]] = {}
    for demand in demands:
        groups.setdefault(demand.deployment.pool, []).append(demand)
    return sorted(groups.items())


def _quiet_grants(
    pool_id: PoolId, demands: list[Demand], tenants: Mapping[TenantId, Tenant]
) -> dict[DeploymentId, Grant] | None:
    """The grants of a pool where nothing moves, without the search; None when something may.

    When every deployment holds at least what it wants (``have >= want``) and no tenant's replicas
    above the guaranteed minimums exceed its ceiling budget, the full algorithm keeps everyone at
    ``want`` (nothing is trimmed), serves no minimum (each already holds it) and finds no claim
    (none is below ``want``): every grant is ``want``, FULL, nothing preempted, no step. That is
    the steady tick of a fleet, and this gives the same grants for a fraction of the cost. The
    reasons are left empty: only used with ``explain`` False."""
    extras: dict[TenantId, int] = {}
    minimums: dict[TenantId, int] = {}
    for demand in demands:
        want = demand.want
        if demand.have < want:
            return None
        dep = demand.deployment
        guaranteed = min(dep.min_replicas, want)
        tid, gpus = dep.tenant, dep.gpus_per_instance
        minimums[tid] = minimums.get(tid, 0) + guaranteed * gpus
        extras[tid] = extras.get(tid, 0) + (want - guaranteed) * gpus
    for tid, extra in extras.items():
        if extra > max(0, tenants[tid].ceiling_in(pool_id) - minimums[tid]):
            return None  # the tenant is over its ceiling budget: some replicas are trimmed
    full = GrantCode.FULL
    return {d.deployment.id: Grant(d.deployment.id, d.want, 0, "", full) for d in demands}


def _open_pool(
    pool_id: PoolId, demands: list[Demand], tenants: Mapping[TenantId, Tenant], capacity: int
) -> _Pool:
    specs = {d.deployment.id: _spec(d, tenants[d.deployment.tenant]) for d in demands}
    order = tuple(sorted(specs, key=lambda i: (-specs[i].priority, specs[i].tenant, i)))
    minimums: dict[TenantId, int] = {}
    for s in specs.values():
        minimums[s.tenant] = minimums.get(s.tenant, 0) + s.guaranteed * s.gpus
    budgets: dict[TenantId, _Budget] = {}
    for i in order:
        tid = specs[i].tenant
        if tid not in budgets:
            tenant = tenants[tid]
            ceiling = tenant.ceiling_in(pool_id)
            budgets[tid] = _Budget(tenant.quota_in(pool_id), ceiling, max(0, ceiling - minimums[tid]))
    kept = _trim_to_ceiling(order, specs, budgets)
    totals = {tid: 0 for tid in budgets}
    extras = {tid: 0 for tid in budgets}
    for i in order:
        totals[specs[i].tenant] += kept[i] * specs[i].gpus
        extras[specs[i].tenant] += max(0, kept[i] - specs[i].guaranteed) * specs[i].gpus
    effective = max(capacity, sum(totals.values()))
    owed: dict[DeploymentId, list[DeploymentId]] = {i: [] for i in order}
    return _Pool(pool_id, effective, order, specs, budgets, kept, dict(kept), totals, extras, owed)


def _spec(demand: Demand, tenant: Tenant) -> _Spec:
    dep = demand.deployment
    return _Spec(
        id=dep.id,
        tenant=dep.tenant,
        priority=tenant.priority,
        gpus=dep.gpus_per_instance,
        guaranteed=min(dep.min_replicas, demand.want),
        want=demand.want,
        have=demand.have,
        load=demand.load,
        created_ms=dep.created_ms,
    )


def _trim_to_ceiling(
    order: tuple[DeploymentId, ...], specs: Mapping[DeploymentId, _Spec], budgets: Mapping[TenantId, _Budget]
) -> dict[DeploymentId, int]:
    """``min(have, want)``, then replicas above the minimums cut back to the tenant's ceiling budget,
    highest deployment id first."""
    kept = {i: min(specs[i].have, specs[i].want) for i in order}
    by_tenant: dict[TenantId, list[DeploymentId]] = {}
    for i in order:  # in ``order``, grouped by tenant once (not one scan of ``order`` per tenant)
        by_tenant.setdefault(specs[i].tenant, []).append(i)
    for tid, budget in budgets.items():
        mine = by_tenant.get(tid, [])
        extra = sum(max(0, kept[i] - specs[i].guaranteed) * specs[i].gpus for i in mine)
        for i in reversed(mine):
            while extra > budget.extra and kept[i] > specs[i].guaranteed:
                kept[i] -= 1
                extra -= specs[i].gpus
    return kept


def _free(pool: _Pool) -> int:
    return pool.capacity - sum(pool.totals.values())


def _grow(pool: _Pool, i: DeploymentId) -> None:
    s = pool.specs[i]
    if pool.alloc[i] < pool.kept[i]:
        pool.owed[i].pop()  # growing back cancels its latest loss
    if pool.alloc[i] >= s.guaranteed:
        pool.extras[s.tenant] += s.gpus
    pool.alloc[i] += 1
    pool.totals[s.tenant] += s.gpus


def _shrink(pool: _Pool, v: DeploymentId, beneficiary: DeploymentId) -> None:
    s = pool.specs[v]
    pool.alloc[v] -= 1
    pool.totals[s.tenant] -= s.gpus
    pool.extras[s.tenant] -= s.gpus  # victims are always above their guaranteed minimum
    if pool.alloc[v] < pool.kept[v]:
        pool.owed[v].append(beneficiary)


def _serve_minimums(pool: _Pool) -> list[Step]:
    steps: list[Step] = []
    for i in pool.order:
        s = pool.specs[i]
        while pool.alloc[i] < s.guaranteed and _free(pool) >= s.gpus:
            _grow(pool, i)
            steps.append(Step(pool.id, i, ClaimKind.MINIMUM))
    return steps


def _settle(pool: _Pool) -> tuple[bool, list[Step]]:
    """Grant the strongest satisfiable claim until none is left (True) or the step limit is hit."""
    specs = pool.specs.values()
    limit = STEP_LIMIT_PER_REPLICA * (sum(s.want for s in specs) + len(pool.order)) + 16
    steps: list[Step] = []
    for _ in range(limit):
        step = _next_step(pool)
        if step is None:
            return True, steps
        steps.append(step)
    return False, steps


def _next_step(pool: _Pool) -> Step | None:
    for _key, kind, i in sorted(_claims(pool)):
        step = _try_claim(pool, i, kind)
        if step is not None:
            return step
    return None


_ClaimKey = tuple[int, int, int, TenantId, DeploymentId]


def _claims(pool: _Pool) -> list[tuple[_ClaimKey, ClaimKind, DeploymentId]]:
    """Pending claims with their sort key (strongest first)."""
    out: list[tuple[_ClaimKey, ClaimKind, DeploymentId]] = []
    for i in pool.order:
        s = pool.specs[i]
        a = pool.alloc[i]
        if a >= s.want:
            continue  # no claim (checked first: the usual case, and the cheapest test)
        budget = pool.budgets[s.tenant]
        within = pool.totals[s.tenant] + s.gpus <= budget.quota
        if a < s.guaranteed:
            kind = ClaimKind.MINIMUM
        elif pool.extras[s.tenant] + s.gpus <= budget.extra:
            kind = ClaimKind.QUOTA if within else ClaimKind.BORROW
        else:
            continue
        key = (0 if within else 1, -s.priority, 0 if kind is ClaimKind.MINIMUM else 1, s.tenant, i)
        out.append((key, kind, i))
    return out


def _try_claim(pool: _Pool, i: DeploymentId, kind: ClaimKind) -> Step | None:
    """One more replica for ``i``: from free capacity, else by preemption, else nothing at all."""
    need = pool.specs[i].gpus
    takes: list[Take] = []
    while _free(pool) < need:
        pick = _best_victim(pool, i)
        if pick is None:
            for take in reversed(takes):
                _grow(pool, take.victim)  # roll back: the victim regains what it just lost
            return None
        _shrink(pool, pick.victim, i)
        takes.append(pick)
    _grow(pool, i)
    return Step(pool.id, i, kind, tuple(takes))


def _best_victim(pool: _Pool, i: DeploymentId) -> Take | None:
    best: tuple[tuple[int, int, float, int, DeploymentId], Take] | None = None
    for v in pool.order:
        rule = _rule(pool, i, v)
        if rule is None:
            continue
        s = pool.specs[v]
        key = (0 if _borrowed(pool, v) else 1, s.priority, s.load, -s.created_ms, v)
        if best is None or key < best[0]:
            best = (key, Take(v, rule))
    return None if best is None else best[1]


def _borrowed(pool: _Pool, v: DeploymentId) -> bool:
    """Would the tenant of ``v`` still hold at least its quota without one replica of ``v``?"""
    s = pool.specs[v]
    return pool.totals[s.tenant] - s.gpus >= pool.budgets[s.tenant].quota


def _rule(pool: _Pool, b: DeploymentId, v: DeploymentId) -> Rule | None:
    """The rule that lets a claim of ``b`` take one replica of ``v`` now, or None."""
    sb, sv = pool.specs[b], pool.specs[v]
    if sb.tenant == sv.tenant or pool.alloc[v] <= sv.guaranteed:
        return None
    within = pool.totals[sb.tenant] + sb.gpus <= pool.budgets[sb.tenant].quota
    borrowed = _borrowed(pool, v)
    if within and borrowed:
        return Rule.RECLAIM
    if sb.priority > sv.priority and (within or borrowed):
        return Rule.PRIORITY
    return None


def _pool_grants(pool: _Pool, settled: bool, explain: bool = True) -> dict[DeploymentId, Grant]:
    grants = {}
    for i in pool.order:
        s = pool.specs[i]
        a = pool.alloc[i]
        preempted = len(pool.owed[i])
        trimmed = min(s.have, s.want) - pool.kept[i]
        if preempted:
            code = GrantCode.PREEMPTED
        elif trimmed:
            code = GrantCode.TRIMMED
        else:
            code = GrantCode.SHORT if a < s.want else GrantCode.FULL
        grants[i] = Grant(i, a, preempted, _reason(pool, i, trimmed, settled) if explain else "", code)
    return grants


def _reason(pool: _Pool, i: DeploymentId, trimmed: int, settled: bool) -> str:
    s = pool.specs[i]
    a = pool.alloc[i]
    budget = pool.budgets[s.tenant]
    parts = [
        f"{a}/{s.want} replicas x {s.gpus} GPUs in pool {pool.id}; tenant {s.tenant} (priority {s.priority}) "
        f"holds {pool.totals[s.tenant]} GPUs, quota {budget.quota}, ceiling {budget.ceiling}"
    ]
    if pool.owed[i]:
        to = ", ".join(dict.fromkeys(sorted(pool.owed[i])))
        parts.append(f"gives up {len(pool.owed[i])} held replica(s) to {to}")
    if trimmed:
        parts.append(f"trims {trimmed} replica(s) above the tenant ceiling")
    if s.have > s.want:
        parts.append(f"scales down from {s.have}")
    if a < s.guaranteed:
        parts.append(f"below its guaranteed minimum {s.guaranteed}: pool full, nothing preemptible")
    elif a < s.want and pool.extras[s.tenant] + s.gpus > budget.extra:
        parts.append("tenant ceiling reached")
    elif a < s.want:
        parts.append("pool full and nothing it may preempt")
    if not settled:
        parts.append("step limit reached")
    return "; ".join(parts)


def _pool_preemptions(pool: _Pool) -> list[tuple[DeploymentId, DeploymentId, int]]:
    counts: dict[tuple[DeploymentId, DeploymentId], int] = {}
    for v in pool.order:
        for b in pool.owed[v]:
            counts[(b, v)] = counts.get((b, v), 0) + 1
    return [(b, v, n) for (b, v), n in sorted(counts.items())]


# --------------------------------------------------------------------------------------------
# choose_victims


_VictimKey = tuple[int, int, int, float, int, InstanceId]


def choose_victims(
    allocation: Allocation,
    instances: Sequence[Instance],
    tenants: Mapping[TenantId, Tenant],
    loads: Mapping[InstanceId, float],
    now_ms: int,
    grace_ms: int,
) -> tuple[Victim, ...]:
    """The instances to drain so every deployment gives up ``Grant.preempted`` replicas, in the
    documented order, each with ``drain_deadline_ms = now_ms + grace_ms``.

    Only non-terminal, not Draining instances are chosen; a deployment with fewer of them than it
    owes gives up all it has. An unknown tenant orders as priority 0 with no quota.
    """
    if isinstance(grace_ms, bool) or not isinstance(grace_ms, int) or grace_ms < 0:
        raise ValidationError("grace_ms", f"must be an integer >= 0, got {grace_ms!r}")
    live = sorted(
        (x for x in instances if not x.state.terminal and x.state is not InstanceState.DRAINING),
        key=lambda x: x.id,
    )
    borrowers = _borrowers(live, tenants)

    def key(x: Instance) -> _VictimKey:
        tenant = tenants.get(x.tenant)
        return (
            0 if (x.tenant, x.pool) in borrowers else 1,
            tenant.priority if tenant is not None else 0,
            1 if x.state.serving else 0,
            loads.get(x.id, 0.0),
            -x.created_ms,
            x.id,
        )

    chosen: list[Instance] = []
    for dep_id, grant in sorted(allocation.grants.items()):
        if grant.preempted > 0:
            mine = sorted((x for x in live if x.deployment == dep_id), key=key)
            chosen += mine[: grant.preempted]
    chosen.sort(key=key)
    to = _beneficiaries(allocation)
    deadline_ms = now_ms + grace_ms
    return tuple(
        Victim(x.id, x.deployment, deadline_ms, _victim_reason(x, allocation, to, key(x)[0] == 0, loads))
        for x in chosen
    )


def _borrowers(
    live: Sequence[Instance], tenants: Mapping[TenantId, Tenant]
) -> dict[tuple[TenantId, PoolId], None]:
    """(tenant, pool) pairs whose live instances hold more GPUs than the tenant's quota there."""
    held: dict[tuple[TenantId, PoolId], int] = {}
    for x in live:
        held[(x.tenant, x.pool)] = held.get((x.tenant, x.pool), 0) + x.gpus
    out: dict[tuple[TenantId, PoolId], None] = {}
    for (tid, pool), gpus in sorted(held.items()):
        tenant = tenants.get(tid)
        if gpus > (tenant.quota_in(pool) if tenant is not None else 0):
            out[(tid, pool)] = None
    return out


def _beneficiaries(allocation: Allocation) -> dict[DeploymentId, str]:
    names: dict[DeploymentId, list[str]] = {}
    for b, v, n in allocation.preemptions:
        names.setdefault(v, []).append(f"{b} x{n}")
    return {v: ", ".join(parts) for v, parts in names.items()}


def _victim_reason(
    x: Instance,
    allocation: Allocation,
    to: Mapping[DeploymentId, str],
    borrower: bool,
    loads: Mapping[InstanceId, float],
) -> str:
    grant = allocation.grants[x.deployment]
    return (
        f"preempted: deployment {x.deployment} gives up {grant.preempted} replica(s) to "
        f"{to.get(x.deployment, 'other tenants')}; instance is {x.state.value}, load "
        f"{loads.get(x.id, 0.0):.2f}, tenant {'borrowing' if borrower else 'within quota'}"
    )
