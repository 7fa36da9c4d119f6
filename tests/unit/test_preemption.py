"""Tenant allocation and priority preemption: one table test per rule, then Hypothesis properties.

The properties check the result against an independent replay of ``Allocation.steps`` (the rules
re-derived from the tenants and demands, not from the module's helpers), and iterate ``allocate``
with ``have := granted`` to check that preemption happens once and never goes back and forth.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.preemption import (
    Allocation,
    ClaimKind,
    Demand,
    Grant,
    GrantCode,
    Rule,
    Take,
    allocate,
    choose_victims,
)
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import InitMethod, Instance, InstanceState
from controlplane.domain.tenants import Deployment, Engine, Tenant

POOL = PoolId("gpu")
S = InstanceState


def tenant(tid: str, priority: int, quota: int = 0, borrow: int = 0, pool: str = POOL) -> Tenant:
    return Tenant(TenantId(tid), priority, {PoolId(pool): quota}, {PoolId(pool): borrow})


def dep(
    did: str, tid: str, *, gpus: int = 1, min_replicas: int = 0, pool: str = POOL, created_ms: int = 0
) -> Deployment:
    d, t, p = DeploymentId(did), TenantId(tid), PoolId(pool)
    return Deployment(d, t, Engine.VLLM, "m", p, gpus, min_replicas, created_ms=created_ms)


def demand(d: Deployment, want: int, have: int = 0, load: float = 0.0) -> Demand:
    return Demand(d, want, have, load)


def run(tenants: Sequence[Tenant], demands: Sequence[Demand], capacity: int) -> Allocation:
    return allocate({t.id: t for t in tenants}, demands, {POOL: capacity}, now_ms=0)


def replicas(a: Allocation) -> dict[str, int]:
    return {k: g.replicas for k, g in a.grants.items()}


# --------------------------------------------------------------------------------------------
# table tests: one narrated scenario per rule

# (name, tenants, [(deployment, want, have)], capacity, expected replicas, expected preemptions)
TABLE = [
    (
        "guarantee: minimums are served before anybody's quota",
        [tenant("a", 1, quota=0), tenant("b", 5, quota=4, borrow=0)],
        [(dep("da", "a", min_replicas=2), 4, 0), (dep("db", "b"), 4, 0)],
        4,
        {"da": 2, "db": 2},
        (),
    ),
    (
        "quota round: each tenant grows to its quota, no further without borrowing room",
        [tenant("a", 1, quota=4), tenant("b", 1, quota=4)],
        [(dep("da", "a"), 8, 0), (dep("db", "b"), 8, 0)],
        10,
        {"da": 4, "db": 4},
        (),
    ),
    (
        "borrowing round: spare capacity is lent in priority order, up to the ceiling",
        [tenant("a", 2, quota=4, borrow=4), tenant("b", 1, quota=4, borrow=2)],
        [(dep("da", "a"), 8, 0), (dep("db", "b"), 8, 0)],
        10,
        {"da": 6, "db": 4},
        (),
    ),
    (
        "borrowing stops at the ceiling even when capacity is left",
        [tenant("a", 2, quota=2, borrow=1)],
        [(dep("da", "a"), 8, 0)],
        10,
        {"da": 3},
        (),
    ),
    (
        "reclaim: a low-priority tenant takes its quota back from a high-priority borrower",
        [tenant("l", 5, quota=0, borrow=8), tenant("s", 1, quota=4)],
        [(dep("dl", "l"), 8, 8), (dep("ds", "s"), 4, 0)],
        8,
        {"dl": 4, "ds": 4},
        (("ds", "dl", 4),),
    ),
    (
        "reclaim takes only the borrowed part: the victim keeps its own quota",
        [tenant("v", 5, quota=3, borrow=5), tenant("s", 1, quota=8)],
        [(dep("dv", "v"), 8, 8), (dep("ds", "s"), 8, 0)],
        8,
        {"dv": 3, "ds": 5},
        (("ds", "dv", 5),),
    ),
    (
        "priority preemption: a higher priority growing within its quota takes lower-priority quota",
        [tenant("h", 5, quota=4), tenant("l", 1, quota=8)],
        [(dep("dh", "h"), 4, 0), (dep("dl", "l"), 8, 8)],
        8,
        {"dh": 4, "dl": 4},
        (("dh", "dl", 4),),
    ),
    (
        "priority among borrowers: a higher-priority borrower takes lower-priority borrowed GPUs",
        [tenant("h", 5, quota=0, borrow=8), tenant("l", 1, quota=0, borrow=8)],
        [(dep("dh", "h"), 3, 0), (dep("dl", "l"), 8, 8)],
        8,
        {"dh": 3, "dl": 5},
        (("dh", "dl", 3),),
    ),
    (
        "a borrowing tenant never takes another tenant's quota, even at higher priority (no loop)",
        [tenant("h", 9, quota=0, borrow=8), tenant("l", 1, quota=8)],
        [(dep("dh", "h"), 8, 0), (dep("dl", "l"), 8, 8)],
        8,
        {"dh": 0, "dl": 8},
        (),
    ),
    (
        "equal priority: no preemption of an incumbent within its quota",
        [tenant("a", 3, quota=8), tenant("b", 3, quota=4)],
        [(dep("da", "a"), 8, 8), (dep("db", "b"), 4, 0)],
        8,
        {"da": 8, "db": 0},
        (),
    ),
    (
        "equal priority: only borrowed GPUs are reclaimed",
        [tenant("a", 3, quota=4, borrow=4), tenant("b", 3, quota=4)],
        [(dep("da", "a"), 8, 8), (dep("db", "b"), 4, 0)],
        8,
        {"da": 4, "db": 4},
        (("db", "da", 4),),
    ),
    (
        "lower priority never preempts higher priority within its quota",
        [tenant("h", 5, quota=8), tenant("l", 1, quota=8)],
        [(dep("dh", "h"), 8, 8), (dep("dl", "l"), 8, 0)],
        8,
        {"dh": 8, "dl": 0},
        (),
    ),
    (
        "min never violated: preemption stops at the victim's guaranteed minimum",
        [tenant("h", 9, quota=8), tenant("l", 1, quota=8)],
        [(dep("dh", "h"), 8, 0), (dep("dl", "l", min_replicas=2), 8, 8)],
        8,
        {"dh": 6, "dl": 2},
        (("dh", "dl", 6),),
    ),
    (
        "capacity shortage for minimums: served in priority order",
        [tenant("a", 1, quota=8), tenant("b", 5, quota=8)],
        [(dep("da", "a", min_replicas=3), 3, 0), (dep("db", "b", min_replicas=3), 3, 0)],
        4,
        {"da": 1, "db": 3},
        (),
    ),
    (
        "capacity shortage for minimums: a smaller replica further down uses what is left",
        [tenant("a", 1), tenant("b", 5)],
        [(dep("da", "a", min_replicas=2), 2, 0), (dep("db", "b", gpus=4, min_replicas=2), 2, 0)],
        5,
        {"da": 1, "db": 1},
        (),
    ),
    (
        "free capacity is used before any preemption",
        [tenant("l", 1, quota=0, borrow=8), tenant("h", 9, quota=4)],
        [(dep("dl", "l"), 8, 8), (dep("dh", "h"), 2, 0)],
        10,
        {"dl": 8, "dh": 2},
        (),
    ),
    (
        "incumbency: an equal-priority newcomer's minimum does not displace quota holders",
        [tenant("a", 3, quota=8), tenant("b", 3, quota=0)],
        [(dep("da", "a"), 8, 8), (dep("db", "b", min_replicas=1), 1, 0)],
        8,
        {"da": 8, "db": 0},
        (),
    ),
    (
        "a minimum within its quota reclaims borrowed GPUs",
        [tenant("a", 9, quota=0, borrow=8), tenant("b", 1, quota=2)],
        [(dep("da", "a"), 8, 8), (dep("db", "b", min_replicas=1), 1, 0)],
        8,
        {"da": 7, "db": 1},
        (("db", "da", 1),),
    ),
    (
        "a guaranteed minimum goes before equal-strength growth when victims are scarce",
        [tenant("l", 1, quota=8), tenant("b", 5, quota=4), tenant("z", 5, quota=4)],
        [
            (dep("dl", "l", min_replicas=6), 8, 8),
            (dep("db", "b"), 4, 0),
            (dep("dz", "z", gpus=2, min_replicas=1), 1, 0),
        ],
        8,
        {"dl": 6, "db": 0, "dz": 1},
        (("dz", "dl", 2),),
    ),
    (
        "a blocked strong claim does not stop a weaker one that fits",
        [tenant("x", 9, quota=4), tenant("h", 5, quota=4), tenant("l", 1, quota=1)],
        [(dep("dx", "x"), 4, 4), (dep("dh", "h", gpus=2), 1, 0), (dep("dl", "l"), 1, 0)],
        5,
        {"dx": 4, "dh": 0, "dl": 1},
        (),
    ),
    (
        "a large victim replica frees more than needed; the rest is not wasted",
        [tenant("l", 1, quota=0, borrow=8), tenant("s", 2, quota=4)],
        [(dep("dl", "l", gpus=4), 2, 2), (dep("ds", "s"), 3, 0)],
        8,
        {"dl": 1, "ds": 3},
        (("ds", "dl", 1),),
    ),
]


@pytest.mark.parametrize(
    ("tenants", "rows", "capacity", "expected", "preemptions"),
    [pytest.param(*row[1:], id=row[0]) for row in TABLE],
)
def test_rules_table(
    tenants: list[Tenant],
    rows: list[tuple[Deployment, int, int]],
    capacity: int,
    expected: dict[str, int],
    preemptions: tuple[tuple[str, str, int], ...],
) -> None:
    a = run(tenants, [demand(d, want, have) for d, want, have in rows], capacity)
    assert replicas(a) == expected
    assert a.preemptions == preemptions
    assert a.settled
    for b, v, n in preemptions:
        assert a.grants[v].preempted == n
        assert a.grants[v].code is GrantCode.PREEMPTED
        assert b in a.grants[v].reason


def test_preemption_steps_name_the_rule() -> None:
    a = run(
        [tenant("h", 5, quota=4), tenant("l", 1, quota=0, borrow=8), tenant("m", 3, quota=8)],
        [demand(dep("dh", "h"), 4), demand(dep("dl", "l"), 2, 2), demand(dep("dm", "m"), 6, 6)],
        8,
    )
    rules = [(t.victim, t.rule) for s in a.steps for t in s.takes]
    # borrowed replicas go first (by reclaim), then lower-priority quota (by priority)
    assert rules == [("dl", Rule.RECLAIM)] * 2 + [("dm", Rule.PRIORITY)] * 2
    assert replicas(a) == {"dh": 4, "dl": 0, "dm": 4}


def test_victim_order_in_allocate_prefers_lowest_priority_then_least_loaded() -> None:
    tenants = [tenant("h", 9, quota=2), tenant("x", 1, quota=4), tenant("y", 1, quota=4), tenant("z", 2, quota=4)]
    demands = [
        demand(dep("dh", "h"), 2),
        demand(dep("dx", "x"), 4, 4, load=0.9),
        demand(dep("dy", "y"), 4, 4, load=0.1),
        demand(dep("dz", "z"), 4, 4, load=0.0),
    ]
    a = run(tenants, demands, 12)
    assert a.preemptions == (("dh", "dy", 2),)


def test_scale_down_and_ceiling_trim_are_not_preemptions() -> None:
    a = run(
        [tenant("a", 1, quota=2, borrow=1), tenant("b", 1, quota=4)],
        [demand(dep("da", "a", min_replicas=1), 8, 6), demand(dep("db", "b"), 1, 3)],
        16,
    )
    assert replicas(a) == {"da": 3, "db": 1}
    assert a.preemptions == ()
    assert (a.grants["da"].code, a.grants["da"].preempted) == (GrantCode.TRIMMED, 0)
    assert "ceiling" in a.grants["da"].reason
    assert (a.grants["db"].code, a.grants["db"].preempted) == (GrantCode.FULL, 0)
    assert "scales down from 3" in a.grants["db"].reason


def test_guaranteed_minimums_exceed_the_ceiling_but_nothing_else_does() -> None:
    a = run(
        [tenant("a", 1, quota=1, borrow=1)],
        [demand(dep("d1", "a", min_replicas=3), 5), demand(dep("d2", "a"), 2)],
        9,
    )
    assert replicas(a) == {"d1": 3, "d2": 0}
    assert a.grants["d2"].code is GrantCode.SHORT
    assert "ceiling" in a.grants["d2"].reason


def test_over_committed_pool_keeps_incumbents_and_grows_nothing_from_free() -> None:
    # capacity shrank to 4 under 6 running GPUs: nobody is evicted without a beneficiary
    a = run(
        [tenant("a", 1, quota=8), tenant("b", 1, quota=8), tenant("h", 9, quota=4)],
        [
            demand(dep("da", "a"), 6, 4, load=0.9),
            demand(dep("db", "b"), 4, 2, load=0.1),
            demand(dep("dh", "h"), 2),
        ],
        4,
    )
    assert replicas(a) == {"da": 4, "db": 0, "dh": 2}
    assert sum(replicas(a).values()) == 6
    assert a.preemptions == (("dh", "db", 2),)


def test_pools_are_independent() -> None:
    t = Tenant(TenantId("a"), 1, {PoolId("p1"): 2, PoolId("p2"): 3})
    a = allocate(
        {t.id: t},
        [demand(dep("x", "a", pool="p1"), 5), demand(dep("y", "a", pool="p2"), 5)],
        {PoolId("p1"): 9, PoolId("p2"): 1},
        now_ms=0,
    )
    assert replicas(a) == {"x": 2, "y": 1}
    assert {s.pool for s in a.steps} == {"p1", "p2"}


def test_unknown_pool_has_no_capacity() -> None:
    a = allocate({TenantId("a"): tenant("a", 1, quota=4)}, [demand(dep("x", "a", pool="z"), 2)], {}, now_ms=0)
    assert replicas(a) == {"x": 0}
    assert a.grants["x"].code is GrantCode.SHORT


def test_validation() -> None:
    d = dep("x", "a")
    with pytest.raises(ValidationError, match="unknown tenant"):
        allocate({}, [demand(d, 1)], {POOL: 1}, now_ms=0)
    with pytest.raises(ValidationError, match="repeats"):
        run([tenant("a", 1)], [demand(d, 1), demand(d, 2)], 4)
    with pytest.raises(ValidationError, match="want"):
        Demand(d, -1, 0, 0.0)
    with pytest.raises(ValidationError, match="have"):
        Demand(d, 1, -1, 0.0)
    with pytest.raises(ValidationError, match="load"):
        Demand(d, 1, 0, float("nan"))
    with pytest.raises(ValidationError, match="grace_ms"):
        choose_victims(Allocation({}, ()), [], {}, {}, now_ms=0, grace_ms=-1)


# --------------------------------------------------------------------------------------------
# choose_victims tables


def inst(
    iid: str,
    did: str,
    tid: str,
    state: InstanceState = S.READY,
    *,
    created_ms: int = 0,
    gpus: int = 1,
    pool: str = POOL,
) -> Instance:
    return Instance(
        InstanceId(iid),
        DeploymentId(did),
        TenantId(tid),
        ClusterId("c1"),
        ZoneId("z1"),
        PoolId(pool),
        gpus,
        state,
        InitMethod.COLD,
        created_ms,
        created_ms,
    )


def owing(**preempted: int) -> Allocation:
    grants = {DeploymentId(k): Grant(DeploymentId(k), 0, n, "test") for k, n in sorted(preempted.items())}
    pairs = tuple((DeploymentId("winner"), DeploymentId(k), n) for k, n in sorted(preempted.items()))
    return Allocation(grants, pairs)


def test_choose_victims_within_a_deployment() -> None:
    instances = [
        inst("busy-idle", "d", "t", S.BUSY, created_ms=1),
        inst("ready-loaded", "d", "t", S.READY, created_ms=9),
        inst("ready-idle-old", "d", "t", S.READY, created_ms=1),
        inst("ready-idle-new", "d", "t", S.READY, created_ms=5),
        inst("standby", "d", "t", S.STANDBY, created_ms=0),
        inst("warming", "d", "t", S.WARMING, created_ms=0),
        inst("pending", "d", "t", S.PENDING, created_ms=3),
        inst("draining", "d", "t", S.DRAINING, created_ms=99),
        inst("failed", "d", "t", S.FAILED, created_ms=99),
        inst("other", "e", "t", S.PENDING, created_ms=99),
    ]
    loads = {InstanceId("ready-loaded"): 0.8, InstanceId("busy-idle"): 0.0, InstanceId("warming"): 0.3}
    tenants = {TenantId("t"): tenant("t", 1, quota=8)}
    picked = choose_victims(owing(d=6), instances, tenants, loads, now_ms=1_000, grace_ms=500)
    # not-yet-serving first (least loaded, newest), then serving by load, then newest, then id;
    # "ready-loaded" (0.8) stays
    assert [v.instance_id for v in picked] == [
        "pending",
        "standby",
        "warming",
        "ready-idle-new",
        "busy-idle",
        "ready-idle-old",
    ]
    assert {v.drain_deadline_ms for v in picked} == {1_500}
    assert {v.deployment_id for v in picked} == {"d"}
    assert all("winner" in v.reason and "gives up 6" in v.reason for v in picked)


def test_choose_victims_orders_borrowers_then_lowest_priority() -> None:
    tenants = {
        TenantId("q"): tenant("q", 1, quota=8),  # within quota, lowest priority
        TenantId("b"): tenant("b", 5, quota=1),  # borrowing (holds 2 > 1)
        TenantId("m"): tenant("m", 3, quota=8),  # within quota
    }
    instances = [
        inst("q1", "dq", "q", S.READY),
        inst("b1", "db", "b", S.BUSY),
        inst("b2", "db", "b", S.READY),
        inst("m1", "dm", "m", S.PENDING),
    ]
    picked = choose_victims(owing(dq=1, db=1, dm=1), instances, tenants, {InstanceId("b2"): 0.5}, 0, 0)
    assert [v.instance_id for v in picked] == ["b1", "q1", "m1"]
    assert "borrowing" in picked[0].reason and "within quota" in picked[1].reason


def test_choose_victims_gives_what_exists_when_short() -> None:
    instances = [inst("x1", "d", "t"), inst("x2", "d", "t", S.DRAINING)]
    picked = choose_victims(owing(d=3), instances, {}, {}, 0, 10)
    assert [v.instance_id for v in picked] == ["x1"]


# --------------------------------------------------------------------------------------------
# Hypothesis: random tenants, deployments and capacities

POOLS = (PoolId("p1"), PoolId("p2"))
Scenario = tuple[dict[TenantId, Tenant], list[Demand], dict[PoolId, int]]
Fleet = tuple[
    dict[TenantId, Tenant], list[Demand], dict[PoolId, int], list[Instance], dict[InstanceId, float]
]


@st.composite
def scenarios(draw: st.DrawFn, *, from_scratch: bool = False) -> Scenario:
    pools = POOLS[: draw(st.sampled_from([1, 1, 2]))]
    tenants: dict[TenantId, Tenant] = {}
    for k in range(draw(st.integers(1, 4))):
        tid = TenantId(f"t{k}")
        quota = {p: draw(st.integers(0, 12)) for p in pools}
        borrow = {p: draw(st.integers(0, 12)) for p in pools}
        tenants[tid] = Tenant(tid, draw(st.integers(0, 3)), quota, borrow)
    demands = []
    for k in range(draw(st.integers(1, 7))):
        m = draw(st.integers(0, 3))
        d = Deployment(
            DeploymentId(f"d{k}"),
            draw(st.sampled_from(sorted(tenants))),
            Engine.VLLM,
            "m",
            draw(st.sampled_from(pools)),
            draw(st.sampled_from([1, 1, 1, 2, 4])),
            m,
            created_ms=draw(st.integers(0, 3)) * 1_000,
        )
        want = max(0, m + draw(st.integers(-1, 5)))  # want < min_replicas now and then
        # newcomers (0), steady incumbents (want) and anything in between
        have = 0 if from_scratch else draw(st.one_of(st.just(0), st.just(want), st.integers(0, want + 2)))
        demands.append(Demand(d, want, have, draw(st.integers(0, 10)) / 10))
    capacity = {p: draw(st.integers(0, 24)) for p in pools}
    if not from_scratch and draw(st.booleans()):
        # contended: incumbents fill the pool (give or take a little), newcomers must preempt
        for p in pools:
            held = sum(min(d.have, d.want) * d.deployment.gpus_per_instance for d in in_pool(demands, p))
            capacity[p] = max(0, held + draw(st.integers(-2, 2)))
    return tenants, demands, capacity


@st.composite
def contended(draw: st.DrawFn) -> Scenario:
    """One pool filled by incumbents that hold what they want, plus newcomers that want more."""
    pool = POOLS[0]
    tenants: dict[TenantId, Tenant] = {}
    for k in range(draw(st.integers(2, 4))):
        tid = TenantId(f"t{k}")
        quota, borrow = draw(st.integers(0, 10)), draw(st.integers(0, 10))
        tenants[tid] = Tenant(tid, draw(st.integers(0, 3)), {pool: quota}, {pool: borrow})
    demands = []
    for k in range(draw(st.integers(3, 7))):
        m = draw(st.integers(0, 2))
        d = Deployment(
            DeploymentId(f"d{k}"),
            draw(st.sampled_from(sorted(tenants))),
            Engine.VLLM,
            "m",
            pool,
            draw(st.sampled_from([1, 1, 2, 3])),
            m,
            created_ms=k,
        )
        want = m + draw(st.integers(0, 5))
        demands.append(Demand(d, want, draw(st.sampled_from([0, want])), draw(st.integers(0, 4)) / 4))
    held = sum(min(d.have, d.want) * d.deployment.gpus_per_instance for d in demands)
    return tenants, demands, {pool: max(0, held + draw(st.integers(-1, 3)))}


def any_scenario() -> st.SearchStrategy[Scenario]:
    return st.one_of(scenarios(), contended())


def guaranteed(d: Demand) -> int:
    return min(d.deployment.min_replicas, d.want)


def in_pool(demands: Sequence[Demand], pool: PoolId) -> list[Demand]:
    return [d for d in demands if d.deployment.pool == pool]


def gpus_by_tenant(demands: Sequence[Demand], count: Mapping[DeploymentId, int]) -> Counter[TenantId]:
    out: Counter[TenantId] = Counter()
    for d in demands:
        out[d.deployment.tenant] += count[d.deployment.id] * d.deployment.gpus_per_instance
    return out


def reconstruct_kept(demands: Sequence[Demand], a: Allocation) -> dict[DeploymentId, int]:
    gains = Counter(s.deployment_id for s in a.steps)
    losses = Counter(t.victim for s in a.steps for t in s.takes)
    ids = [d.deployment.id for d in demands]
    return {i: a.grants[i].replicas - gains[i] + losses[i] for i in ids}


def extra_budget(t: Tenant, pool: PoolId, demands: Sequence[Demand]) -> int:
    minimums = sum(guaranteed(d) * d.deployment.gpus_per_instance for d in demands if d.deployment.tenant == t.id)
    return max(0, t.ceiling_in(pool) - minimums)


def check_kept(
    tenants: Mapping[TenantId, Tenant],
    demands: Sequence[Demand],
    kept: Mapping[DeploymentId, int],
    pool: PoolId,
) -> None:
    """Start state: what each deployment holds and still wants, cut back only by the ceiling."""
    for d in demands:
        start = min(d.have, d.want)
        k = kept[d.deployment.id]
        assert k <= start
        if k < start:
            t = tenants[d.deployment.tenant]
            assert k >= guaranteed(d)
            mine = [e for e in demands if e.deployment.tenant == t.id]
            over = sum(max(0, min(e.have, e.want) - guaranteed(e)) * e.deployment.gpus_per_instance for e in mine)
            assert over > extra_budget(t, pool, demands), "trimmed a tenant that was within its ceiling"


def check_take(
    tenants: Mapping[TenantId, Tenant],
    by_id: Mapping[DeploymentId, Demand],
    alloc: Mapping[DeploymentId, int],
    b: DeploymentId,
    take: Take,
) -> None:
    db, dv = by_id[b], by_id[take.victim]
    tb, tv = tenants[db.deployment.tenant], tenants[dv.deployment.tenant]
    assert tb.id != tv.id, "a tenant preempted itself"
    assert alloc[take.victim] > guaranteed(dv), "preempted below a guaranteed minimum"
    totals = gpus_by_tenant(list(by_id.values()), alloc)
    pool = db.deployment.pool
    within = totals[tb.id] + db.deployment.gpus_per_instance <= tb.quota_in(pool)
    borrowed = totals[tv.id] - dv.deployment.gpus_per_instance >= tv.quota_in(pool)
    if take.rule is Rule.RECLAIM:
        assert within and borrowed
    else:
        assert tb.priority > tv.priority and (within or borrowed)


def replay_pool(
    tenants: Mapping[TenantId, Tenant], demands: list[Demand], capacity: int, a: Allocation, pool: PoolId
) -> None:
    """Re-derive every step of one pool from the rules and land on the grants."""
    by_id = {d.deployment.id: d for d in demands}
    kept = reconstruct_kept(demands, a)
    check_kept(tenants, demands, kept, pool)
    alloc = dict(kept)
    effective = max(capacity, sum(kept[i] * by_id[i].deployment.gpus_per_instance for i in kept))
    for step in (s for s in a.steps if s.pool == pool):
        d = by_id[step.deployment_id]
        g = d.deployment.gpus_per_instance
        t = tenants[d.deployment.tenant]
        assert alloc[d.deployment.id] < d.want
        totals = gpus_by_tenant(demands, alloc)
        if step.claim is ClaimKind.MINIMUM:
            assert alloc[d.deployment.id] < guaranteed(d)
        else:
            assert alloc[d.deployment.id] >= guaranteed(d)
            extra = sum(
                max(0, alloc[e.deployment.id] - guaranteed(e)) * e.deployment.gpus_per_instance
                for e in demands
                if e.deployment.tenant == t.id
            )
            assert extra + g <= extra_budget(t, pool, demands)
            assert (step.claim is ClaimKind.QUOTA) == (totals[t.id] + g <= t.quota_in(pool))
        free = effective - sum(totals.values())
        if step.takes:
            assert free < g, "preempted while free capacity fitted the replica"
        for k, take in enumerate(step.takes):
            check_take(tenants, by_id, alloc, step.deployment_id, take)
            # strongest claims first: what a claim created is never taken by a later one
            assert alloc[take.victim] <= kept[take.victim], "took a replica granted in this same call"
            alloc[take.victim] -= 1
            free += by_id[take.victim].deployment.gpus_per_instance
            assert (free >= g) == (k == len(step.takes) - 1), "took more victims than needed"
        assert free >= g
        alloc[d.deployment.id] += 1
    assert alloc == {i: a.grants[i].replicas for i in alloc}
    check_work_conserving(tenants, demands, effective, alloc, pool)


def check_work_conserving(
    tenants: Mapping[TenantId, Tenant],
    demands: list[Demand],
    effective: int,
    alloc: Mapping[DeploymentId, int],
    pool: PoolId,
) -> None:
    """Nothing that may still grow fits in the free capacity left over."""
    free = effective - sum(alloc[d.deployment.id] * d.deployment.gpus_per_instance for d in demands)
    for d in demands:
        g = d.deployment.gpus_per_instance
        a = alloc[d.deployment.id]
        t = tenants[d.deployment.tenant]
        extra = sum(
            max(0, alloc[e.deployment.id] - guaranteed(e)) * e.deployment.gpus_per_instance
            for e in demands
            if e.deployment.tenant == t.id
        )
        may_grow = a < d.want and (a < guaranteed(d) or extra + g <= extra_budget(t, pool, demands))
        assert not (may_grow and free >= g), f"{d.deployment.id} could still grow into {free} free GPUs"


def check_preemptions(demands: Sequence[Demand], a: Allocation) -> None:
    kept = reconstruct_kept(demands, a)
    by_victim: Counter[DeploymentId] = Counter()
    took = {(s.deployment_id, t.victim) for s in a.steps for t in s.takes}
    pairs = {(b, v) for b, v, _ in a.preemptions}
    for b, v, n in a.preemptions:
        assert n > 0 and (b, v) in took
        assert (v, b) not in pairs, f"{b} and {v} preempt each other"
        by_victim[v] += n
    for d in demands:
        i = d.deployment.id
        assert a.grants[i].preempted == by_victim[i] == max(0, kept[i] - a.grants[i].replicas)
        assert (a.grants[i].code is GrantCode.PREEMPTED) == (a.grants[i].preempted > 0)


@settings(max_examples=80, deadline=None)
@given(any_scenario())
def test_every_step_follows_the_rules(scenario: Scenario) -> None:
    """(v) preemption only along the allowed rules, free capacity first, never below a minimum."""
    tenants, demands, capacity = scenario
    a = allocate(tenants, demands, capacity, now_ms=0)
    assert a.settled
    assert sorted(a.grants) == sorted(d.deployment.id for d in demands)
    for pool, cap in capacity.items():
        replay_pool(tenants, in_pool(demands, pool), cap, a, pool)
    check_preemptions(demands, a)


@settings(max_examples=80, deadline=None)
@given(any_scenario())
def test_capacity_want_ceiling_and_minimum_bounds(scenario: Scenario) -> None:
    """(i) capacity, (ii) minimums of incumbents, (iii) want and ceiling."""
    tenants, demands, capacity = scenario
    a = allocate(tenants, demands, capacity, now_ms=0)
    kept = reconstruct_kept(demands, a)
    for pool, cap in capacity.items():
        mine = in_pool(demands, pool)
        granted = {d.deployment.id: a.grants[d.deployment.id].replicas for d in mine}
        start = sum(min(d.have, d.want) * d.deployment.gpus_per_instance for d in mine)
        effective = max(cap, sum(kept[d.deployment.id] * d.deployment.gpus_per_instance for d in mine))
        used = sum(granted[d.deployment.id] * d.deployment.gpus_per_instance for d in mine)
        # (i) within capacity; an over-committed start (held > capacity) never grows
        assert used <= max(cap, start)
        totals = gpus_by_tenant(mine, granted)
        for tid, total in totals.items():
            minimums = sum(guaranteed(d) * d.deployment.gpus_per_instance for d in mine if d.deployment.tenant == tid)
            # (iii) the ceiling binds everything above the guaranteed minimums
            assert total <= max(tenants[tid].ceiling_in(pool), minimums)
        for d in mine:
            r = granted[d.deployment.id]
            assert r <= d.want  # (iii) never above want
            assert r >= min(guaranteed(d), d.have)  # (ii) an incumbent's minimum is never taken
            if r < guaranteed(d):  # (ii) below its minimum only when no replica fits
                assert effective - used < d.deployment.gpus_per_instance


@settings(max_examples=60, deadline=None)
@given(scenarios(from_scratch=True))
def test_minimums_are_served_when_they_fit(scenario: Scenario) -> None:
    """(ii) starting empty, every guaranteed minimum is granted whenever the minimums fit."""
    tenants, demands, capacity = scenario
    a = allocate(tenants, demands, capacity, now_ms=0)
    for pool, cap in capacity.items():
        mine = in_pool(demands, pool)
        if sum(guaranteed(d) * d.deployment.gpus_per_instance for d in mine) <= cap:
            assert all(a.grants[d.deployment.id].replicas >= guaranteed(d) for d in mine)
        else:  # shortage: a higher priority never goes without while a lower one has its minimum
            prio = {d.deployment.id: tenants[d.deployment.tenant].priority for d in mine}
            short = [d for d in mine if a.grants[d.deployment.id].replicas < guaranteed(d)]
            for d in short:
                g = d.deployment.gpus_per_instance
                for e in mine:
                    if prio[e.deployment.id] < prio[d.deployment.id] and e.deployment.gpus_per_instance >= g:
                        assert a.grants[e.deployment.id].replicas == 0


@settings(max_examples=60, deadline=None)
@given(any_scenario())
def test_no_loops_fixpoint(scenario: Scenario) -> None:
    """(iv) with constant wants, have := granted reaches a fixpoint after one call: preemptions only
    in the first call, and never both A -> B and B -> A."""
    tenants, demands, capacity = scenario
    first = allocate(tenants, demands, capacity, now_ms=0)
    seen = {(b, v) for b, v, _ in first.preemptions}
    current = first
    for round_ in range(2, 5):
        granted = replicas(current)
        demands = [Demand(d.deployment, d.want, granted[d.deployment.id], d.load) for d in demands]
        current = allocate(tenants, demands, capacity, now_ms=round_)
        assert current.preemptions == (), f"round {round_} preempted again"
        assert replicas(current) == replicas(first), f"round {round_} moved replicas"
        assert all(s.takes == () for s in current.steps)
        seen |= {(b, v) for b, v, _ in current.preemptions}
    assert not any((v, b) in seen for b, v in seen)


@settings(max_examples=40, deadline=None)
@given(any_scenario(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_input_order(scenario: Scenario, rnd: random.Random) -> None:
    tenants, demands, capacity = scenario
    shuffled = list(demands)
    rnd.shuffle(shuffled)
    assert allocate(tenants, shuffled, capacity, now_ms=0) == allocate(tenants, demands, capacity, now_ms=0)


def without_reasons(a: Allocation) -> Allocation:
    return dataclasses.replace(a, grants={k: dataclasses.replace(g, reason="") for k, g in a.grants.items()})


@settings(max_examples=80, deadline=None)
@given(any_scenario(), st.booleans())
def test_explain_false_changes_nothing_but_the_reasons(scenario: Scenario, settle: bool) -> None:
    """``explain=False`` (the planner's call, with its shortcut for a pool where nothing moves)
    grants exactly what the full search grants, also on the steady fleet (``have`` = ``want``)."""
    tenants, demands, capacity = scenario
    if settle:  # the steady fleet: everyone holds what it wants (where the shortcut may apply)
        demands = [Demand(d.deployment, d.want, d.want, d.load) for d in demands]
    full = allocate(tenants, demands, capacity, now_ms=0)
    quick = allocate(tenants, demands, capacity, now_ms=0, explain=False)
    assert quick == without_reasons(full)
    assert all(g.reason == "" for g in quick.grants.values())


# --------------------------------------------------------------------------------------------
# Hypothesis: choose_victims on real allocations

LIVE = (S.PENDING, S.WARMING, S.READY, S.BUSY, S.STANDBY)
DEAD = (S.DRAINING, S.TERMINATED, S.FAILED)


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    tenants, demands, capacity = draw(scenarios())
    instances: list[Instance] = []
    loads: dict[InstanceId, float] = {}
    for d in demands:
        states = [draw(st.sampled_from(LIVE)) for _ in range(d.have)]
        states += draw(st.lists(st.sampled_from(DEAD), max_size=2))
        for k, state in enumerate(states):
            iid = InstanceId(f"{d.deployment.id}-i{k}")
            instances.append(
                inst(
                    iid,
                    d.deployment.id,
                    d.deployment.tenant,
                    state,
                    created_ms=draw(st.integers(0, 4)) * 100,
                    gpus=d.deployment.gpus_per_instance,
                    pool=d.deployment.pool,
                )
            )
            if draw(st.booleans()):
                loads[iid] = draw(st.integers(0, 4)) / 4
    return tenants, demands, capacity, instances, loads


@settings(max_examples=80, deadline=None)
@given(fleets(), st.integers(0, 10**9), st.integers(0, 60_000))
def test_choose_victims_counts_states_and_order(fleet: Fleet, now_ms: int, grace_ms: int) -> None:
    """(vi) exactly the requested counts, never Draining or terminal, in the documented order."""
    tenants, demands, capacity, instances, loads = fleet
    a = allocate(tenants, demands, capacity, now_ms=now_ms)
    picked = choose_victims(a, instances, tenants, loads, now_ms, grace_ms)
    by_id = {x.id: x for x in instances}
    live = [x for x in instances if x.state in LIVE]
    held: Counter[tuple[TenantId, PoolId]] = Counter()
    for x in live:
        held[(x.tenant, x.pool)] += x.gpus

    def key(x: Instance) -> tuple[bool, int, bool, float, int, str]:
        borrower = held[(x.tenant, x.pool)] > tenants[x.tenant].quota_in(x.pool)
        load = loads.get(x.id, 0.0)
        return (not borrower, tenants[x.tenant].priority, x.state.serving, load, -x.created_ms, x.id)

    assert Counter(v.deployment_id for v in picked) == +Counter({i: g.preempted for i, g in a.grants.items()})
    assert len({v.instance_id for v in picked}) == len(picked)
    chosen = [by_id[v.instance_id] for v in picked]
    assert all(x.state in LIVE for x in chosen)
    assert all(v.drain_deadline_ms == now_ms + grace_ms and v.reason for v in picked)
    assert [key(x) for x in chosen] == sorted(key(x) for x in chosen)
    for i, g in a.grants.items():
        mine = sorted((x for x in live if x.deployment == i), key=key)
        assert [x.id for x in chosen if x.deployment == i] == [x.id for x in mine[: g.preempted]]
