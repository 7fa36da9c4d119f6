"""One tick as pure functions: ``facts()`` (reports -> replicated facts) and ``plan()`` (decide).

Every test builds a :class:`ControlState` through ``apply()`` only, gives filtered signals directly
(or None: "no data", the target stays at the desired count) and asserts the exact commands. The
multi-tick tests narrate time: plan, commit the plan, let the fake "world" move instances, plan again.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

from controlplane.core import reconcile as r
from controlplane.core.backoff import backoff_ms
from controlplane.core.breaker import BreakerConfig
from controlplane.core.signals import FilteredSignals
from controlplane.domain import commands as c
from controlplane.domain.ids import (
    ClusterId,
    DeploymentId,
    InstanceId,
    PoolId,
    TenantId,
    ZoneId,
)
from controlplane.domain.instances import InitMethod, InstanceEvent, InstanceState
from controlplane.domain.observations import (
    InstanceReport,
    InstanceSample,
    Observations,
)
from controlplane.domain.records import EMPTY_MEMORY, BreakerPhase, BreakerRecord, ScaleMemory
from controlplane.domain.state import ControlState, apply, snapshot
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.topology import Cluster

S, E, P = InstanceState, InstanceEvent, BreakerPhase
H100 = PoolId("h100")
MODEL = "llama3-8b-h100"
T0 = 1_000_000
"""A round second, so the stabilization bucket of a decision at T0 starts at T0."""
CFG = r.ReconcileConfig()

# --- builders -------------------------------------------------------------------------------------


def cluster(cid: str, zone: str, gpus: int = 4) -> c.PutCluster:
    return c.PutCluster(Cluster(ClusterId(cid), ZoneId(zone), capacity={H100: gpus}))


def tenant(tid: str = "acme", priority: int = 10, quota: int = 16, borrow: int = 0) -> c.PutTenant:
    return c.PutTenant(Tenant(TenantId(tid), priority, {H100: quota}, {H100: borrow}))


def deployment(
    did: str = "chat", tid: str = "acme", *, min_replicas: int = 1, warm_pool: int = 0, max_replicas: int = 16,
    model: str = MODEL,
) -> c.PutDeployment:
    return c.PutDeployment(
        Deployment(
            DeploymentId(did), TenantId(tid), Engine.VLLM, model, H100, 1,
            min_replicas=min_replicas, max_replicas=max_replicas, warm_pool=warm_pool,
        )
    )


def desired(did: str, replicas: int, warm_pool: int = 0) -> c.SetDesired:
    return c.SetDesired(DeploymentId(did), replicas, warm_pool, "set by test", T0 - 60_000)


THREE_ZONES = (cluster("c1", "z1"), cluster("c2", "z2"), cluster("c3", "z3"))


def build(*commands: c.Command) -> ControlState:
    state = ControlState()
    commit(state, commands)
    return state


def commit(state: ControlState, commands: Iterable[c.Command]) -> None:
    for cmd in commands:
        result = apply(state, cmd)
        assert result.ok, f"{cmd}: {result.error}"


PATH: dict[InstanceState, tuple[InstanceEvent, ...]] = {
    S.PENDING: (),
    S.WARMING: (E.START_WARMUP,),
    S.READY: (E.START_WARMUP, E.WARMED),
    S.BUSY: (E.START_WARMUP, E.WARMED, E.WORK),
    S.STANDBY: (E.START_WARMUP, E.WARMED, E.SLEEP),
    S.DRAINING: (E.START_WARMUP, E.WARMED, E.DRAIN),
}
"""Legal event sequences that bring a new (Pending) instance into each state."""


def add(
    state: ControlState, iid: str, cid: str, st: InstanceState = S.READY, *, did: str = "chat", at_ms: int = T0 - 60_000
) -> None:
    """An instance created at ``at_ms`` and moved to ``st`` through legal transitions (1 ms apart)."""
    commit(state, [c.CreateInstance(InstanceId(iid), DeploymentId(did), ClusterId(cid), at_ms)])
    commit(state, [c.TransitionInstance(InstanceId(iid), ev, at_ms + k) for k, ev in enumerate(PATH[st], 1)])
    assert state.instances[InstanceId(iid)].state is st


def load(conc: float, at_ms: int = T0, serving: int = 1) -> FilteredSignals:
    """Filtered signals with the same concurrency in the stable, panic and latest views."""
    view = {"concurrency": float(conc)}
    return FilteredSignals(at_ms, serving, view, dict(view), None, dict(view))


def run_plan(
    state: ControlState,
    signals: Mapping[str, FilteredSignals | None] | None = None,
    loads: Mapping[str, float] | None = None,
    now_ms: int = T0,
    cfg: r.ReconcileConfig = CFG,
) -> r.Plan:
    sig = signals if signals is not None else {d: None for d in state.deployments}
    return r.plan(state, sig, loads or {}, now_ms, cfg)  # type: ignore[arg-type]


def no_data(replicas: int) -> str:
    """The message of a decision without signals (it keeps the desired count)."""
    return f"no signal samples in the stable window; keeping {replicas} replicas"


def instance_commands(p: r.Plan) -> list[c.Command]:
    return [x for x in p.commands if isinstance(x, (c.CreateInstance, c.TransitionInstance))]


def of_type(p: r.Plan | Sequence[c.Command], kind: type) -> list:
    cmds = p.commands if isinstance(p, r.Plan) else p
    return [x for x in cmds if isinstance(x, kind)]


def move(iid: str, event: InstanceEvent, at_ms: int = T0, **kw: object) -> c.TransitionInstance:
    return c.TransitionInstance(InstanceId(iid), event, at_ms, **kw)  # type: ignore[arg-type]


def states_of(state: ControlState, did: str = "chat") -> dict[str, InstanceState]:
    return {i.id: i.state for i in state.instances_of(DeploymentId(did))}


def count(state: ControlState, st: InstanceState, did: str = "chat") -> int:
    return sum(1 for s in states_of(state, did).values() if s is st)


# --- scale-up -------------------------------------------------------------------------------------


def test_scale_up_spreads_new_instances_over_zones_and_records_the_grant() -> None:
    # Three empty clusters in three zones (4 GPUs each). 144 requests at a target of 24 per replica
    # ask for 6 replicas (a burst from 1: panic mode, which scales up at once).
    state = build(*THREE_ZONES, tenant(), deployment(min_replicas=1))
    p = run_plan(state, {"chat": load(144)})

    assert p.grants == (("chat", 6, 0),)
    (dec,) = [d for _, d in p.decisions]
    assert dec.target == 6
    memory = ScaleMemory(recs=((T0, 6),), panic_until_ms=T0 + 30_000, panic_peak=6, last_scale_up_ms=T0)
    assert dec.memory == memory
    ids = [f"chat-{T0}-{k}" for k in range(6)]
    assert p.commands == (
        c.PutScaleMemories((("chat", memory),)),
        c.SetDesired("chat", 6, 0, "panic", T0, message=dec.message),
        *[c.CreateInstance(iid, "chat", cid, T0) for iid, cid in zip(ids, ["c1", "c2", "c3"] * 2)],
    )
    assert len(set(ids)) == 6
    assert p.notes == ()

    commit(state, p.commands)
    assert {cl: state.free_gpus(ClusterId(cl), H100) for cl in ("c1", "c2", "c3")} == {"c1": 2, "c2": 2, "c3": 2}
    assert state.desired["chat"].replicas == 6 and state.memory["chat"] == memory


def test_scale_up_never_exceeds_free_gpus_and_says_what_was_not_placed() -> None:
    # 2 GPUs per cluster; c1's two are still held by Draining instances (not counted as replicas).
    state = build(cluster("c1", "z1", 2), cluster("c2", "z2", 2), cluster("c3", "z3", 2), tenant(), deployment())
    add(state, "old-1", "c1", S.DRAINING)
    add(state, "old-2", "c1", S.DRAINING)
    p = run_plan(state, {"chat": load(144)})

    assert p.grants == (("chat", 6, 0),)
    creates = of_type(p, c.CreateInstance)
    assert creates == [
        c.CreateInstance(f"chat-{T0}-{k}", "chat", cid, T0) for k, cid in enumerate(["c2", "c3", "c2", "c3"])
    ]
    assert p.notes == (
        ("chat: 2 of 6 new instances not placed: placed 4 of 6, 2 unplaced: "
        "no capacity: none of the 3 unblocked clusters has 1 free GPUs (0 blocked by open breakers)"),
    )
    result = apply(state, c.Batch(p.commands))
    assert result.ok and all(x.ok for x in result.results)
    assert [state.free_gpus(ClusterId(cl), H100) for cl in ("c1", "c2", "c3")] == [0, 0, 0]


def test_creates_share_one_fan_out_limit_and_unique_ids_across_deployments() -> None:
    state = build(*THREE_ZONES, tenant(), deployment("chat", min_replicas=2), deployment("code", min_replicas=2))
    p = run_plan(state, cfg=r.ReconcileConfig(max_creates_per_tick=3))
    creates = of_type(p, c.CreateInstance)
    assert [(x.instance_id, x.deployment_id) for x in creates] == [
        (f"chat-{T0}-0", "chat"), (f"chat-{T0}-1", "chat"), (f"code-{T0}-2", "code"),
    ]


def test_scale_memory_is_emitted_only_when_it_changes() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(min_replicas=2), desired("chat", 2))
    add(state, "a", "c1")
    add(state, "b", "c2")
    assert run_plan(state).commands == ()  # no data: target kept, memory untouched

    # 48 requests = exactly 2 replicas: within tolerance, but the stabilization window records it.
    p = run_plan(state, {"chat": load(48)})
    assert p.commands == (c.PutScaleMemories((("chat", ScaleMemory(recs=((T0, 2),))),)),)
    commit(state, p.commands)
    assert run_plan(state, {"chat": load(48)}).commands == ()  # the same second: nothing new to remember


def test_the_changed_scale_memories_of_a_tick_are_one_command() -> None:
    # Three deployments, two of them with data: one PutScaleMemories carries both changed memories
    # (in deployment order), however many deployments change (not one command per deployment).
    state = build(*THREE_ZONES, tenant(), deployment("a", min_replicas=2), deployment("b", min_replicas=2),
                  deployment("c", min_replicas=2), desired("a", 2), desired("b", 2), desired("c", 2))
    for did in ("a", "b", "c"):
        add(state, f"{did}-1", "c1", did=did)
        add(state, f"{did}-2", "c2", did=did)
    p = run_plan(state, {"a": load(48), "c": load(48)})
    memory = ScaleMemory(recs=((T0, 2),))
    assert p.commands == (c.PutScaleMemories((("a", memory), ("c", memory))),)
    commit(state, p.commands)
    assert (state.memory_of("a"), state.memory_of("b"), state.memory_of("c")) == (memory, EMPTY_MEMORY, memory)


# --- warm pool: wake before create ----------------------------------------------------------------


def test_standby_instances_are_woken_before_anything_is_created() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(warm_pool=1), desired("chat", 1, 1))
    add(state, "r1", "c1")
    add(state, "s-old", "c2", S.STANDBY, at_ms=T0 - 50_000)
    add(state, "s-new", "c3", S.STANDBY, at_ms=T0 - 40_000)
    commit(state, [desired("chat", 3, 1)])  # two more replicas wanted

    p = run_plan(state)
    # Both sleeping instances are woken (newest first), then one new instance refills the warm pool.
    assert p.commands == (
        move("s-new", E.WAKE),
        move("s-old", E.WAKE),
        c.CreateInstance(f"chat-{T0}-0", "chat", "c1", T0),
    )
    commit(state, p.commands)
    assert state.instances["s-new"].init_method is InitMethod.WARM
    assert state.instances[f"chat-{T0}-0"].init_method is InitMethod.COLD


def test_standby_in_a_blocked_cluster_is_not_woken() -> None:
    opened = BreakerRecord(P.OPEN, trips=1, open_until_ms=T0 + 5_000, changed_ms=T0 - 1_000)
    state = build(*THREE_ZONES, tenant(), deployment(warm_pool=1), desired("chat", 2, 1))
    add(state, "r1", "c1")
    add(state, "s-c2", "c2", S.STANDBY, at_ms=T0 - 50_000)
    add(state, "s-c3", "c3", S.STANDBY, at_ms=T0 - 40_000)  # newer: it would be woken first
    commit(state, [c.PutBreaker(r.deployment_key("c3", "chat"), opened)])

    p = run_plan(state)
    assert p.commands == (move("s-c2", E.WAKE),)
    assert p.grants == (("chat", 2, 1),)


# --- scale-in -------------------------------------------------------------------------------------


def test_scale_in_cancels_pending_before_draining_serving_instances() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(min_replicas=1), desired("chat", 6))
    add(state, "r1", "c1")
    add(state, "r2", "c2")
    add(state, "r3", "c3")
    add(state, "b3", "c3", S.BUSY)
    add(state, "p1", "c1", S.PENDING)
    add(state, "p2", "c2", S.PENDING)
    commit(state, [desired("chat", 2)])
    loads = {"r1": 0.5, "r2": 0.2, "r3": 0.1, "b3": 0.9}

    p = run_plan(state, loads=loads)
    deadline = T0 + CFG.scale_in_grace_ms
    got = {x.instance_id: x for x in instance_commands(p)}
    # Pending first (they have done nothing yet), then the zone with most instances (z3: r3, b3),
    # least loaded first (r3), then the least loaded of the even zones (r2).
    assert set(got) == {"p1", "p2", "r3", "r2"}
    assert [(got[i].event, got[i].at_ms) for i in ("p1", "p2")] == [(E.CANCEL, T0)] * 2
    assert got["r3"] == move("r3", E.DRAIN, drain_deadline_ms=deadline)
    assert got["r2"] == move("r2", E.DRAIN, drain_deadline_ms=deadline)

    commit(state, p.commands)
    assert states_of(state) == {"r1": S.READY, "r2": S.DRAINING, "r3": S.DRAINING, "b3": S.BUSY}
    assert state.instances["r2"].drain_deadline_ms == deadline
    assert not state.instances["r2"].preempted


def test_scale_in_of_pending_only_cancels() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(min_replicas=1), desired("chat", 3))
    add(state, "r1", "c1")
    add(state, "p1", "c2", S.PENDING)
    add(state, "p2", "c3", S.PENDING)
    commit(state, [desired("chat", 1)])
    p = run_plan(state)
    assert sorted((x.instance_id, x.event) for x in instance_commands(p)) == [("p1", E.CANCEL), ("p2", E.CANCEL)]
    commit(state, p.commands)
    assert states_of(state) == {"r1": S.READY}


def test_surplus_serving_instances_sleep_ready_before_busy() -> None:
    # 4 serving, 2 granted, warm pool of 2 empty: the surplus sleeps instead of being drained. The two
    # Ready ones go (least loaded first), although a Busy one is even less loaded.
    state = build(*THREE_ZONES, tenant(), deployment(warm_pool=2), desired("chat", 4, 2))
    add(state, "r1", "c1")
    add(state, "r2", "c2")
    add(state, "b1", "c3", S.BUSY)
    add(state, "b2", "c1", S.BUSY)
    commit(state, [desired("chat", 2, 2)])
    p = run_plan(state, loads={"r1": 0.4, "r2": 0.3, "b1": 0.0, "b2": 0.1})
    assert p.grants == (("chat", 2, 2),)
    assert p.commands == (move("r2", E.SLEEP), move("r1", E.SLEEP))


def test_busy_instance_sleeps_when_no_ready_one_is_left() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(warm_pool=1), desired("chat", 2, 1))
    add(state, "b1", "c1", S.BUSY)
    add(state, "b2", "c2", S.BUSY)
    commit(state, [desired("chat", 1, 1)])
    p = run_plan(state, loads={"b1": 0.7, "b2": 0.6})
    assert p.commands == (move("b2", E.SLEEP),)
    commit(state, p.commands)
    assert states_of(state) == {"b1": S.BUSY, "b2": S.STANDBY}


def test_sleep_only_while_the_warm_pool_has_room_the_rest_is_drained() -> None:
    # 3 serving + 1 Standby; 1 granted, warm pool 2: one drained, one put to sleep.
    state = build(*THREE_ZONES, tenant(), deployment(warm_pool=2), desired("chat", 3, 2))
    add(state, "r1", "c1")
    add(state, "r2", "c2")
    add(state, "r3", "c3")
    add(state, "s1", "c1", S.STANDBY)
    commit(state, [desired("chat", 1, 2)])
    p = run_plan(state, loads={"r1": 0.9, "r2": 0.5, "r3": 0.1})
    assert p.grants == (("chat", 1, 2),)
    # Only serving-bound instances are scaled (s1 is not), one per zone: the least loaded (r3) is
    # drained, then the least loaded of the rest (r2) sleeps into the pool's free slot.
    assert p.commands == (
        move("r3", E.DRAIN, drain_deadline_ms=T0 + CFG.scale_in_grace_ms),
        move("r2", E.SLEEP),
    )
    commit(state, p.commands)
    assert count(state, S.READY) == 1 and count(state, S.STANDBY) == 2
    assert instance_commands(run_plan(state)) == []


def test_standby_beyond_the_warm_grant_is_drained_oldest_first() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(warm_pool=3), desired("chat", 1, 3))
    add(state, "r1", "c1")
    add(state, "s1", "c1", S.STANDBY, at_ms=T0 - 30_000)
    add(state, "s2", "c2", S.STANDBY, at_ms=T0 - 20_000)
    add(state, "s3", "c3", S.STANDBY, at_ms=T0 - 10_000)
    commit(state, [deployment(warm_pool=1)])  # the warm pool shrinks to 1
    p = run_plan(state)
    assert p.grants == (("chat", 1, 1),)
    assert p.commands == (
        c.SetDesired("chat", 1, 1, "no_data", T0, message=no_data(1)),
        move("s1", E.DRAIN, drain_deadline_ms=T0),
        move("s2", E.DRAIN, drain_deadline_ms=T0),
    )


# --- the warm-pool cycle converges ----------------------------------------------------------------


def world_step(state: ControlState, at_ms: int) -> None:
    """The clusters between two ticks: every start finishes warming, every drain finishes."""
    moves = []
    for inst in list(state.instances.values()):
        if inst.state is S.PENDING:
            moves += [move(inst.id, E.START_WARMUP, at_ms), move(inst.id, E.WARMED, at_ms + 1)]
        elif inst.state is S.WARMING:
            moves.append(move(inst.id, E.WARMED, at_ms))
        elif inst.state is S.DRAINING:
            moves.append(move(inst.id, E.DRAINED, at_ms))
    commit(state, moves)


def converge(state: ControlState, start_ms: int, ticks: int = 6) -> tuple[list[c.Command], r.Plan]:
    """Tick ``ticks`` times (250 ms apart); return every instance command planned and the last plan."""
    seen: list[c.Command] = []
    last = None
    for k in range(ticks):
        now = start_ms + 250 * k
        last = run_plan(state, now_ms=now)
        seen += instance_commands(last)
        commit(state, last.commands)
        world_step(state, now + 100)
    assert last is not None
    return seen, last


def kinds(cmds: Sequence[c.Command]) -> list[str]:
    return ["create" if isinstance(x, c.CreateInstance) else x.event.value for x in cmds]  # type: ignore[union-attr]


def test_warm_pool_cycle_reaches_a_fixpoint_without_flip_flop() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(min_replicas=1, warm_pool=1), desired("chat", 2, 1))

    # From nothing: 2 serving + 1 warm are created cold, then the surplus one goes to sleep.
    seen, last = converge(state, T0)
    assert kinds(seen) == ["create", "create", "create", "sleep"]
    assert (count(state, S.READY), count(state, S.STANDBY), len(state.instances)) == (2, 1, 3)
    assert instance_commands(last) == [] and last.grants == (("chat", 2, 1),)

    # Scale up to 3: the sleeper is woken (warm start) and one cold start refills the pool.
    commit(state, [desired("chat", 3, 1)])
    seen, last = converge(state, T0 + 10_000)
    assert kinds(seen) == ["wake", "create", "sleep"]
    assert (count(state, S.READY), count(state, S.STANDBY), len(state.instances)) == (3, 1, 4)
    assert instance_commands(last) == []

    # Scale down to 1 with a full warm pool: two serving instances are drained, nothing re-created.
    commit(state, [desired("chat", 1, 1)])
    seen, last = converge(state, T0 + 20_000)
    assert kinds(seen) == ["drain", "drain"]
    assert (count(state, S.READY), count(state, S.STANDBY), len(state.instances)) == (1, 1, 2)
    assert instance_commands(last) == [] and last.grants == (("chat", 1, 1),)
    assert run_plan(state, now_ms=T0 + 30_000).commands == ()


# --- preemption -----------------------------------------------------------------------------------


def preemption_state() -> ControlState:
    """One 4-GPU cluster. 'lo' (priority 1, no quota) borrows 3 GPUs; 'hi' (priority 10, quota 4)
    needs 3 replicas (its guaranteed minimum) and only 1 GPU is free."""
    state = build(
        cluster("c1", "z1", 4),
        tenant("lo", priority=1, quota=0, borrow=4),
        tenant("hi", priority=10, quota=4),
        deployment("lo-chat", "lo", min_replicas=1),
        deployment("hi-chat", "hi", min_replicas=3),
        desired("lo-chat", 3),
    )
    for iid in ("lo-1", "lo-2", "lo-3"):
        add(state, iid, "c1", did="lo-chat")
    return state


LO_LOADS = {"lo-1": 0.5, "lo-2": 0.2, "lo-3": 0.8}


def test_high_priority_demand_preempts_borrowed_instances_with_grace() -> None:
    state = preemption_state()
    p = run_plan(state, loads=LO_LOADS)
    deadline = T0 + CFG.preemption_grace_ms
    assert p.grants == (("hi-chat", 3, 0), ("lo-chat", 1, 0))
    assert p.commands == (
        c.SetDesired("hi-chat", 3, 0, "no_data", T0, message=no_data(3)),
        c.CreateInstance(f"hi-chat-{T0}-0", "hi-chat", "c1", T0),  # the one free GPU
        c.SetDesired("lo-chat", 1, 0, "preempted", T0,
                     message="preempted by tenant hi (priority 10): granted 1 of 3 replicas x 1 GPUs; " + no_data(3)),
        move("lo-2", E.DRAIN, drain_deadline_ms=deadline, preempted=True),  # least loaded first
        move("lo-1", E.DRAIN, drain_deadline_ms=deadline, preempted=True),
    )
    commit(state, p.commands)
    assert states_of(state, "lo-chat") == {"lo-1": S.DRAINING, "lo-2": S.DRAINING, "lo-3": S.READY}
    assert state.instances["lo-1"].preempted and state.instances["lo-1"].drain_deadline_ms == deadline

    # Next tick, the victims are still draining: nothing more is preempted, nothing placed (no GPUs),
    # lo keeps its guaranteed minimum.
    p2 = run_plan(state, loads=LO_LOADS, now_ms=T0 + 250)
    assert instance_commands(p2) == []
    assert {d: g for d, g, _ in p2.grants} == {"hi-chat": 3, "lo-chat": 1}

    # Once drained, hi gets the freed GPUs.
    commit(state, [move("lo-1", E.DRAINED, T0 + 5_000), move("lo-2", E.DRAINED, T0 + 5_000)])
    p3 = run_plan(state, loads=LO_LOADS, now_ms=T0 + 5_250)
    assert [x.cluster_id for x in of_type(p3, c.CreateInstance)] == ["c1", "c1"]
    assert of_type(p3, c.TransitionInstance) == []
    commit(state, p3.commands)
    assert len(states_of(state, "hi-chat")) == 3 and states_of(state, "lo-chat") == {"lo-3": S.READY}


def test_guaranteed_minimums_are_never_preempted() -> None:
    # lo's minimum is 3: all it holds is guaranteed, so hi waits for capacity instead.
    state = preemption_state()
    commit(state, [deployment("lo-chat", "lo", min_replicas=3)])
    p = run_plan(state, loads=LO_LOADS)
    assert not [x for x in of_type(p, c.TransitionInstance) if x.event is E.DRAIN]
    assert {d: g for d, g, _ in p.grants} == {"hi-chat": 1, "lo-chat": 3}


# --- facts ----------------------------------------------------------------------------------------


def facts(state: ControlState, obs: Observations, failures: Sequence[r.SendFailure] = (), *, seed: int = 7,
          now_ms: int = T0, cfg: r.ReconcileConfig = CFG) -> tuple[c.Command, ...]:
    return r.facts(state, obs, failures, now_ms, cfg, random.Random(seed))


def sample(iid: str, at_ms: int, running: int = 0, waiting: int = 0, did: str = "chat") -> InstanceSample:
    return InstanceSample(InstanceId(iid), DeploymentId(did), at_ms, running, waiting, 0.1, 0.0, 0.0)


def report(iid: str, event: InstanceEvent | str, at_ms: int) -> InstanceReport:
    return InstanceReport(InstanceId(iid), event.value if isinstance(event, InstanceEvent) else event, at_ms)


def small_state() -> ControlState:
    state = build(*THREE_ZONES, tenant(), deployment(min_replicas=2), desired("chat", 4))
    add(state, "ready", "c1")
    add(state, "busy", "c2", S.BUSY)
    add(state, "warming", "c3", S.WARMING)
    add(state, "pending", "c1", S.PENDING)
    return state


def test_samples_move_ready_to_busy_and_busy_to_ready() -> None:
    state = small_state()
    obs = Observations(T0, samples=(
        sample("ready", T0 - 10, running=3),
        sample("busy", T0 - 20),  # idle
        sample("warming", T0 - 30, running=5),  # not serving yet: no move
        sample("ghost", T0, running=1),  # unknown instance
    ))
    assert facts(state, obs) == (move("ready", E.WORK, T0 - 10), move("busy", E.IDLE, T0 - 20))
    # Nothing changes when the samples agree with the state.
    agree = Observations(T0, samples=(sample("ready", T0, running=0), sample("busy", T0, waiting=2)))
    assert facts(state, agree) == ()


def test_waiting_requests_count_as_work() -> None:
    state = small_state()
    assert facts(state, Observations(T0, samples=(sample("ready", T0, waiting=1),))) == (move("ready", E.WORK, T0),)


def test_reports_become_transitions_illegal_and_unknown_ones_are_ignored() -> None:
    state = small_state()
    obs = Observations(T0, reports=(
        report("pending", E.START_WARMUP, T0 - 300),
        report("pending", E.START_WARMUP, T0 - 200),  # a duplicate: no longer legal
        report("ready", E.WARMED, T0 - 100),  # illegal from Ready
        report("busy", E.DRAINED, T0 - 100),  # illegal from Busy
        report("ghost", E.WARMED, T0 - 100),  # unknown instance
        report("pending", E.WARMED, T0 - 50),  # legal after the first report of this tick
    ))
    got = facts(state, obs)
    # (A success on closed, clean breakers changes nothing: no PutBreaker.)
    assert got == (move("pending", E.START_WARMUP, T0 - 300), move("pending", E.WARMED, T0 - 50))
    commit(state, got)
    assert states_of(state) == {"ready": S.READY, "busy": S.BUSY, "warming": S.WARMING, "pending": S.READY}


def test_a_sample_after_a_report_of_the_same_tick_sees_the_reported_state() -> None:
    state = small_state()
    obs = Observations(T0, samples=(sample("warming", T0, running=2),), reports=(report("warming", E.WARMED, T0 - 5),))
    assert facts(state, obs) == (move("warming", E.WARMED, T0 - 5), move("warming", E.WORK, T0))


def test_a_report_with_an_unknown_event_is_ignored() -> None:
    state = small_state()
    obs = Observations(T0, reports=(report("pending", "evicted", T0), report("warming", E.WARMED, T0)))
    assert facts(state, obs) == (move("warming", E.WARMED, T0),)


# --- instances no longer reported by a delivering adapter -----------------------------------------

LOST_MS, FRESH_MS = CFG.unreported_lost_ms, CFG.adapter_fresh_ms


def every_state() -> ControlState:
    """One instance in each non-terminal state on c1 (created a minute ago), a Ready one on c2."""
    state = build(cluster("c1", "z1", 8), cluster("c2", "z2"), tenant(), deployment(min_replicas=2), desired("chat", 4))
    for st in (S.PENDING, S.WARMING, S.READY, S.BUSY, S.STANDBY, S.DRAINING):
        add(state, st.value.lower(), "c1", st)
    add(state, "ready2", "c2")
    return state


def delivering(*cids: str, since_ms: int = T0 - 60_000, last_ms: int = T0) -> dict[ClusterId, r.Delivery]:
    return {ClusterId(cid): r.Delivery(since_ms, last_ms) for cid in cids}


def unreported_facts(state: ControlState, seen: Mapping[str, int], delivery: Mapping[ClusterId, r.Delivery],
                     now_ms: int = T0, obs: Observations | None = None) -> tuple[c.Command, ...]:
    return r.facts(state, obs or Observations(now_ms), (), now_ms, CFG, random.Random(7),
                   seen={InstanceId(k): v for k, v in seen.items()}, delivery=delivery)


def test_a_serving_instance_its_delivering_adapter_stopped_naming_is_lost_after_the_bound_not_before() -> None:
    assert (LOST_MS, FRESH_MS) == (r.UNREPORTED_LOST_MS, r.ADAPTER_FRESH_MS) == (10_000, 2_000)
    state = every_state()
    # Ready last named exactly LOST_MS ago (not yet), Busy 1 ms longer (lost); c2's Ready just now.
    seen = {"ready": T0 - LOST_MS, "busy": T0 - LOST_MS - 1, "ready2": T0}
    got = unreported_facts(state, seen, delivering("c1", "c2"))
    rec = r.facts(state, Observations(T0, reports=(report("busy", E.LOST, T0),)), (), T0, CFG, random.Random(7))
    assert got == rec  # exactly what a ``lost`` report at the same moment does: Failed + cluster breaker
    assert got[0] == move("busy", E.LOST, T0)
    assert [type(x) for x in got] == [c.TransitionInstance, c.PutBreaker]
    assert [(i.id, ms) for i, ms in r.unreported(state, {InstanceId(k): v for k, v in seen.items()},
                                                  delivering("c1", "c2"), T0, CFG)] == [("busy", LOST_MS + 1)]
    # One millisecond later the Ready one goes too; nothing else ever does (see below).
    got = unreported_facts(state, seen, delivering("c1", "c2", last_ms=T0 + 1), now_ms=T0 + 1)
    assert of_type(got, c.TransitionInstance) == [move("ready", E.LOST, T0 + 1), move("busy", E.LOST, T0 + 1)]
    commit(state, got)
    assert "ready" not in state.instances and "busy" not in state.instances  # Failed: GPUs released
    assert state.instances[InstanceId("ready2")].state is S.READY


def test_standby_warming_pending_and_draining_instances_are_never_declared_unreported() -> None:
    state = every_state()
    # Nothing named for a minute on a delivering c1: only the serving ones are lost; the others have
    # their own timeouts (Pending 120 s, warm-up 600 s, drain deadline) or are never sampled (Standby).
    got = unreported_facts(state, {}, delivering("c1", "c2"), now_ms=T0)
    lost = [x.instance_id for x in of_type(got, c.TransitionInstance)]
    assert lost == ["ready", "busy", "ready2"]


def test_an_adapter_that_is_silent_or_unreachable_declares_nothing_lost() -> None:
    state = every_state()
    stale = {"ready": T0 - 60_000, "busy": T0 - 60_000, "ready2": T0 - 60_000}
    assert unreported_facts(state, stale, {}) == ()  # no batch from any cluster: all unreachable
    # c1's latest batch is older than the freshness window: a partition, not a death.
    assert unreported_facts(state, stale, delivering("c1", last_ms=T0 - FRESH_MS - 1)) == ()
    # At the edge of the window c1 still counts as delivering; c2 (no entry) stays untouched.
    got = unreported_facts(state, stale, delivering("c1", last_ms=T0 - FRESH_MS))
    assert [x.instance_id for x in of_type(got, c.TransitionInstance)] == ["ready", "busy"]
    # Without the inputs (callers that do not track batches) nothing is declared lost this way.
    assert facts(state, Observations(T0)) == ()


def test_the_unreported_clock_starts_at_the_current_run_of_batches_so_a_failover_declares_nothing_at_once() -> None:
    state = every_state()
    old = {"ready": T0 - 60_000, "busy": T0 - 60_000, "ready2": T0 - 60_000}
    # A new holder (or an adapter back after a restart or a partition): its run of batches started
    # 5 s ago: nobody is lost yet, however old the last sighting.
    assert unreported_facts(state, old, delivering("c1", "c2", since_ms=T0 - 5_000)) == ()
    assert unreported_facts(state, {}, delivering("c1", "c2", since_ms=T0 - LOST_MS)) == ()
    # Still unnamed LOST_MS after the run began: lost.
    got = unreported_facts(state, {}, delivering("c1", "c2", since_ms=T0 - LOST_MS - 1))
    assert [x.instance_id for x in of_type(got, c.TransitionInstance)] == ["ready", "busy", "ready2"]


def test_an_instance_that_entered_its_state_recently_is_not_yet_unreported() -> None:
    state = every_state()
    commit(state, [move("warming", E.WARMED, T0 - 3_000)])  # e.g. a report replayed by a new holder
    got = unreported_facts(state, {"ready": T0, "busy": T0, "ready2": T0}, delivering("c1", "c2"))
    assert got == ()
    got = unreported_facts(state, {"ready": T0 + 8_000, "busy": T0 + 8_000, "ready2": T0 + 8_000},
                           delivering("c1", "c2", last_ms=T0 + 8_000), now_ms=T0 + 8_000)
    assert of_type(got, c.TransitionInstance) == [move("warming", E.LOST, T0 + 8_000)]


def test_a_report_of_the_same_tick_wins_over_the_unreported_rule() -> None:
    state = every_state()
    obs = Observations(T0, reports=(report("busy", E.DRAIN, T0 - 5),  # left Busy this tick: no longer serving
                                    report("ready", E.LOST, T0 - 7)))  # reported lost: once, at its time
    got = unreported_facts(state, {"ready2": T0}, delivering("c1", "c2"), obs=obs)
    assert of_type(got, c.TransitionInstance) == [move("busy", E.DRAIN, T0 - 5), move("ready", E.LOST, T0 - 7)]


# --- breakers -------------------------------------------------------------------------------------


def opened(at_ms: int, seed_rng: random.Random, trips: int = 1, cfg: BreakerConfig = CFG.breaker) -> BreakerRecord:
    delay = backoff_ms(trips - 1, cfg.base_backoff_ms, cfg.max_backoff_ms, seed_rng)
    return BreakerRecord(P.OPEN, 0, trips, at_ms + delay, False, at_ms)


def test_warmup_failures_open_the_deployment_breaker_then_one_probe_then_closed() -> None:
    state = build(cluster("c1", "z1", 4), tenant(), deployment(min_replicas=3), desired("chat", 3))
    for k in (1, 2, 3):
        add(state, f"w{k}", "c1", S.WARMING)
    dkey = r.deployment_key("c1", "chat")

    # t=T0: three warm-ups fail: the third consecutive failure opens the deployment breaker.
    obs = Observations(T0, reports=tuple(report(f"w{k}", E.WARMUP_FAILED, T0 + k) for k in (1, 2, 3)))
    got = facts(state, obs, seed=7)
    rec = opened(T0 + 3, random.Random(7))
    assert got == (
        move("w1", E.WARMUP_FAILED, T0 + 1),
        move("w2", E.WARMUP_FAILED, T0 + 2),
        move("w3", E.WARMUP_FAILED, T0 + 3),
        c.PutBreaker(dkey, rec),
    )
    assert T0 + 3 + 1_000 <= rec.open_until_ms <= T0 + 3 + 2_000
    commit(state, got)
    assert state.instances == {}
    assert r.cluster_key("c1") not in state.breakers  # a bad deployment does not condemn the cluster

    # While open: 3 replicas granted, nothing placed.
    p = run_plan(state, now_ms=T0 + 250)
    assert of_type(p, c.CreateInstance) == [] and of_type(p, c.PutBreaker) == []
    assert p.notes == (("chat: 3 of 3 new instances not placed: placed 0 of 3, 3 unplaced: "
                       "all 1 clusters are blocked by open breakers"),)

    # At open_until: exactly one probe instance, and the breaker records it (HALF_OPEN).
    now = rec.open_until_ms
    p = run_plan(state, now_ms=now)
    half = BreakerRecord(P.HALF_OPEN, 0, 1, now + CFG.breaker.probe_timeout_ms, True, now)
    probe = f"chat-{now}-0"
    assert p.commands == (c.PutBreaker(dkey, half), c.CreateInstance(probe, "chat", "c1", now))
    commit(state, p.commands)

    # The probe is in flight: no second one.
    assert instance_commands(run_plan(state, now_ms=now + 250)) == []

    # The probe warms up: its WARMED report closes the breaker; then the rest is placed.
    obs = Observations(
        now + 30_000, reports=(report(probe, E.START_WARMUP, now + 100), report(probe, E.WARMED, now + 29_000))
    )
    got = facts(state, obs, now_ms=now + 30_000)
    assert got == (
        move(probe, E.START_WARMUP, now + 100),
        move(probe, E.WARMED, now + 29_000),
        c.PutBreaker(dkey, BreakerRecord(P.CLOSED, changed_ms=now + 29_000)),
    )
    commit(state, got)
    p = run_plan(state, now_ms=now + 30_000)
    assert [x.cluster_id for x in of_type(p, c.CreateInstance)] == ["c1", "c1"]


def test_lost_instances_and_failed_sends_count_against_the_cluster_breaker() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(min_replicas=1), desired("chat", 3))
    add(state, "ready", "c1")
    add(state, "pending", "c1", S.PENDING)
    add(state, "r2", "c2")
    ckey = r.cluster_key("c1")

    obs = Observations(T0, reports=(report("ready", E.LOST, T0 + 1),))
    failures = [
        r.SendFailure(ClusterId("c1"), InstanceId("pending"), "create", T0 + 2),  # the create never arrived
        r.SendFailure(ClusterId("c1"), InstanceId("r2x"), "drain", T0 + 3),  # unknown instance: breaker only
    ]
    got = facts(state, obs, failures, seed=11)
    rec = opened(T0 + 3, random.Random(11))
    assert got == (
        move("ready", E.LOST, T0 + 1),
        move("pending", E.LOST, T0 + 2),
        c.PutBreaker(ckey, rec),
    )
    commit(state, got)
    assert states_of(state) == {"r2": S.READY}

    # While open, new instances go to the other clusters only.
    p = run_plan(state, now_ms=T0 + 250)
    assert p.grants == (("chat", 3, 0),)
    assert [x.cluster_id for x in of_type(p, c.CreateInstance)] == ["c3", "c2"]
    assert of_type(p, c.PutBreaker) == []

    # Past open_until (nothing committed meanwhile): the first new instance is c1's one probe.
    now = rec.open_until_ms
    p = run_plan(state, now_ms=now)
    half = BreakerRecord(P.HALF_OPEN, 0, 1, now + CFG.breaker.probe_timeout_ms, True, now)
    assert p.commands == (
        c.PutBreaker(ckey, half),
        c.CreateInstance(f"chat-{now}-0", "chat", "c1", now),
        c.CreateInstance(f"chat-{now}-1", "chat", "c3", now),
    )


def test_a_failed_drain_send_feeds_the_breaker_without_a_transition() -> None:
    state = build(*THREE_ZONES, tenant(), deployment(), desired("chat", 1))
    add(state, "d1", "c2", S.DRAINING)
    got = facts(state, Observations(T0), [r.SendFailure(ClusterId("c2"), InstanceId("d1"), "drain", T0)])
    assert got == (c.PutBreaker(r.cluster_key("c2"), BreakerRecord(failures=1)),)


def test_an_open_cluster_breaker_gets_one_probe_after_its_backoff() -> None:
    state = build(cluster("c1", "z1", 4), tenant(), deployment(min_replicas=1), desired("chat", 1))
    ckey = r.cluster_key("c1")
    rec = BreakerRecord(P.OPEN, trips=1, open_until_ms=T0 + 1_500, changed_ms=T0)
    commit(state, [c.PutBreaker(ckey, rec)])

    early = run_plan(state, now_ms=T0 + 1_000)
    assert of_type(early, c.CreateInstance) == []

    now = T0 + 1_500
    p = run_plan(state, now_ms=now)
    assert p.grants == (("chat", 1, 0),)
    half = BreakerRecord(P.HALF_OPEN, 0, 1, now + CFG.breaker.probe_timeout_ms, True, now)
    assert p.commands == (c.PutBreaker(ckey, half), c.CreateInstance(f"chat-{now}-0", "chat", "c1", now))


def test_a_probe_without_an_outcome_is_replaced_after_the_probe_timeout() -> None:
    # HALF_OPEN with its probe deadline passed (the probe was lost, cancelled, or its create never
    # arrived): another probe may go, with a new deadline.
    state = build(cluster("c1", "z1", 4), tenant(), deployment(min_replicas=1), desired("chat", 1))
    dkey = r.deployment_key("c1", "chat")
    started = T0 - CFG.breaker.probe_timeout_ms - 1
    lapsed = BreakerRecord(P.HALF_OPEN, 0, 1, started + CFG.breaker.probe_timeout_ms, True, started)
    commit(state, [c.PutBreaker(dkey, lapsed)])
    p = run_plan(state, now_ms=T0)
    half = BreakerRecord(P.HALF_OPEN, 0, 1, T0 + CFG.breaker.probe_timeout_ms, True, started)
    assert p.commands == (c.PutBreaker(dkey, half), c.CreateInstance(f"chat-{T0}-0", "chat", "c1", T0))
    commit(state, p.commands)
    assert instance_commands(run_plan(state, now_ms=T0 + 250)) == []  # in flight again: no second one


# --- robustness and determinism -------------------------------------------------------------------


def test_a_deployment_without_a_model_profile_is_still_planned() -> None:
    state = build(*THREE_ZONES, tenant(), deployment("custom", model="my-finetune"), deployment("chat"))
    p = run_plan(state)
    assert [x.deployment_id for x in of_type(p, c.CreateInstance)] == ["chat", "custom"]


def determinism_state() -> ControlState:
    state = build(
        *THREE_ZONES,
        tenant("lo", priority=1, quota=2, borrow=8),
        tenant("hi", priority=10, quota=8),
        deployment("lo-chat", "lo", min_replicas=1, warm_pool=1),
        deployment("hi-chat", "hi", min_replicas=2, warm_pool=2),
        desired("lo-chat", 6, 1),
        c.PutBreaker(
            r.deployment_key("c2", "hi-chat"), BreakerRecord(P.OPEN, trips=1, open_until_ms=T0 - 1, changed_ms=T0 - 2_000)
        ),
    )
    for k in range(6):
        st = S.BUSY if k % 2 else S.READY
        add(state, f"lo-{k}", ("c1", "c2", "c3")[k % 3], st, did="lo-chat", at_ms=T0 - 9_000 + k)
    add(state, "hi-s", "c3", S.STANDBY, did="hi-chat")
    return state


def test_plan_is_deterministic_and_does_not_touch_the_state() -> None:
    a, b = determinism_state(), determinism_state()
    sig = {"hi-chat": load(200), "lo-chat": load(100)}
    loads = {f"lo-{k}": k / 10 for k in range(6)}
    before = snapshot(a)
    pa = r.plan(a, sig, loads, T0, CFG)  # type: ignore[arg-type]
    assert snapshot(a) == before
    # The same mappings built in another order.
    sig_b, loads_b = dict(reversed(list(sig.items()))), dict(reversed(list(loads.items())))
    pb = r.plan(b, sig_b, loads_b, T0, CFG)  # type: ignore[arg-type]
    assert pa == pb
    assert pa == r.plan(a, sig, loads, T0, CFG)  # type: ignore[arg-type]
    # The scenario decides a bit of everything: a probe, a wake, creates, a preemption, a scale-in.
    assert {type(x).__name__ for x in pa.commands} >= {"PutBreaker", "CreateInstance", "TransitionInstance"}
    assert any(isinstance(x, c.TransitionInstance) and x.preempted for x in pa.commands)
    result = apply(a, c.Batch(pa.commands))
    assert result.ok, [x.error for x in result.results if not x.ok]


def test_facts_is_deterministic_for_a_seed() -> None:
    obs = Observations(T0, reports=tuple(report(f"w{k}", E.WARMUP_FAILED, T0 + k) for k in range(3)))

    def once() -> tuple[c.Command, ...]:
        state = build(cluster("c1", "z1"), tenant(), deployment())
        for k in range(3):
            add(state, f"w{k}", "c1", S.WARMING)
        return facts(state, obs, seed=3)

    assert once() == once()


def test_stuck_pending_is_lost_and_stuck_warmup_fails_into_the_breaker() -> None:
    """A create that never reached its pod (sent just before a fence, say) must not hold GPUs, and a
    warm-up that never finishes counts as a failed one."""
    state = build(*THREE_ZONES, tenant(), deployment("chat"))
    add(state, "p", "c1", S.PENDING, at_ms=T0 - CFG.pending_timeout_ms)
    add(state, "w", "c2", S.WARMING, at_ms=T0 - CFG.warmup_timeout_ms - 5)
    add(state, "young", "c3", S.PENDING, at_ms=T0 - 1_000)
    got = facts(state, Observations(T0), now_ms=T0)
    lost = [x for x in got if isinstance(x, c.TransitionInstance)]
    assert lost == [c.TransitionInstance(InstanceId("w"), E.WARMUP_FAILED, T0)]
    later = facts(state, Observations(T0 + 1), now_ms=T0 + 1)
    assert c.TransitionInstance(InstanceId("p"), E.LOST, T0 + 1) in later
    assert all(getattr(x, "instance_id", None) != "young" for x in later)
    breaker = {x.key: x.record for x in got if isinstance(x, c.PutBreaker)}
    assert breaker["deployment/c2/chat"].failures == 1
