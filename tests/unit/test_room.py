"""Making room on one cluster when a pool's free GPUs are fragmented (``core.room`` through
``reconcile.plan``): 2 + 2 free GPUs over two clusters cannot hold a 4-GPU replica."""

from __future__ import annotations

from controlplane.domain import commands as c
from controlplane.domain.ids import DeploymentId, TenantId
from controlplane.domain.instances import InstanceState
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment, Engine
from tests.unit.test_reconcile import (
    CFG,
    H100,
    E,
    T0,
    add,
    build,
    cluster,
    commit,
    deployment,
    desired,
    move,
    of_type,
    run_plan,
    states_of,
    tenant,
    world_step,
)

S = InstanceState
LOADS = {"lo-1": 0.5, "lo-2": 0.6, "lo-3": 0.1, "lo-4": 0.2}


def big(did: str = "hi-code", tid: str = "hi", min_replicas: int = 1) -> c.PutDeployment:
    return c.PutDeployment(Deployment(
        DeploymentId(did), TenantId(tid), Engine.VLLM, "llama3-70b-h100x4", H100, 4,
        min_replicas=min_replicas, max_replicas=4,
    ))


def fragmented(lo_min: int = 1, lo_priority: int = 1, lo_quota: int = 0, hi_quota: int = 4) -> ControlState:
    """Two 4-GPU clusters; 'lo' borrows 2 GPUs on each (1-GPU replicas), so 4 GPUs are free, 2 + 2;
    'hi' (priority 10) wants one 4-GPU replica."""
    state = build(
        cluster("c1", "z1", 4), cluster("c2", "z2", 4),
        tenant("lo", priority=lo_priority, quota=lo_quota, borrow=8), tenant("hi", priority=10, quota=hi_quota),
        deployment("lo-chat", "lo", min_replicas=lo_min), big(), desired("lo-chat", 4), desired("hi-code", 1),
    )
    for iid, cid in (("lo-1", "c1"), ("lo-2", "c1"), ("lo-3", "c2"), ("lo-4", "c2")):
        add(state, iid, cid, did="lo-chat")
    return state


def drains(p) -> list[c.TransitionInstance]:
    return [x for x in of_type(p, c.TransitionInstance) if x.event is E.DRAIN]


def test_fragmented_free_gpus_make_room_on_one_cluster_and_the_replica_is_placed_after() -> None:
    state = fragmented()
    p = run_plan(state, loads=LOADS)
    assert not of_type(p, c.CreateInstance)  # 2 + 2 free: the granted replica fits nowhere
    deadline = T0 + CFG.preemption_grace_ms
    # c2 holds the less important victims (lower load): both of them drain, preempted, with grace.
    assert drains(p) == [
        move("lo-3", E.DRAIN, drain_deadline_ms=deadline, preempted=True),
        move("lo-4", E.DRAIN, drain_deadline_ms=deadline, preempted=True),
    ]
    assert p.preemptions == (("hi-code", "lo-chat", 2),)
    assert any("making room on c2" in n for n in p.notes)
    commit(state, p.commands)

    # While they drain, nothing more is drained for it (the room is on its way), and lo's re-create
    # that would land in the room on c2 is withdrawn (it held nothing: not a preemption).
    p2 = run_plan(state, loads=LOADS, now_ms=T0 + 250)
    assert drains(p2) == [] and p2.preemptions == ()
    assert [(x.deployment_id, x.cluster_id) for x in of_type(p2, c.CreateInstance)] == [("lo-chat", "c1")]
    commit(state, p2.commands)

    # Once they are gone, the replica is placed on c2, and the fleet is at a fixpoint: no victim
    # takes the room back, nothing more is preempted.
    commit(state, [move("lo-3", E.DRAINED, T0 + 5_000), move("lo-4", E.DRAINED, T0 + 5_000)])
    seen = []
    for k in range(8):
        now = T0 + 5_250 + 250 * k
        p3 = run_plan(state, loads=LOADS, now_ms=now)
        seen.append(p3)
        commit(state, p3.commands)
        world_step(state, now + 100)
    hi = [i for i in state.instances.values() if i.deployment == "hi-code" and not i.state.terminal]
    assert [(i.cluster, i.state) for i in hi] == [("c2", S.READY)]
    assert all(p.preemptions == () and drains(p) == [] for p in seen)
    lo = [i for i in state.instances.values() if i.deployment == "lo-chat" and not i.state.terminal]
    assert sorted(i.cluster for i in lo) == ["c1"] * 4  # lo regrew its 4 replicas in the other cluster


def test_a_victims_create_on_the_freed_cluster_is_withdrawn_for_the_beneficiary() -> None:
    # 'lo' re-creates into the room on the same tick (its id sorts first in the plan): the create is
    # withdrawn and the beneficiary placed there instead; nothing serving is drained.
    state = fragmented()
    commit(state, [move("lo-3", E.DRAIN, T0 - 1000, drain_deadline_ms=T0), move("lo-4", E.DRAIN, T0 - 1000, drain_deadline_ms=T0)])
    commit(state, [move("lo-3", E.DRAINED, T0 - 500), move("lo-4", E.DRAINED, T0 - 500)])
    commit(state, [deployment("a-lo", "lo", min_replicas=0), desired("a-lo", 4)])  # sorts before hi-code
    p = run_plan(state, loads=LOADS)
    creates = [(x.deployment_id, x.cluster_id) for x in of_type(p, c.CreateInstance)]
    assert ("hi-code", "c2") in creates
    assert drains(p) == []
    commit(state, p.commands)  # the plan commits: withdrawn creates never reach the state
    assert all(i.cluster != "c2" or i.deployment == "hi-code" for i in state.instances.values() if not i.state.terminal)


def test_nothing_is_drained_when_no_cluster_can_be_freed() -> None:
    # lo's replicas are its guaranteed minimum: never taken; hi stays unplaced, nothing drains.
    for state in (
        fragmented(lo_min=4),
        # lo has higher priority and holds within its quota: hi (borrowing nothing, quota 0) may take nothing.
        fragmented(lo_priority=20, lo_quota=4, hi_quota=0),
    ):
        p = run_plan(state, loads=LOADS)
        assert drains(p) == [] and p.preemptions == ()
        assert not [x for x in of_type(p, c.CreateInstance) if x.deployment_id == "hi-code"]


def random_fleet(rng) -> ControlState:
    """2-3 clusters of 4-8 GPUs; tenant t0 (priority 10, quota 8) asks for 1-2 4-GPU replicas; 1-2
    other tenants of random priority, quota and borrowing limit run 1- and 2-GPU deployments whose
    instances are dealt round-robin over the clusters (so the free GPUs are often fragmented)."""
    n_clusters = rng.randint(2, 3)
    cmds: list[c.Command] = [cluster(f"c{k}", f"z{k}", rng.choice((4, 6, 8))) for k in range(n_clusters)]
    cmds += [tenant("t0", priority=10, quota=8), big("d0", "t0", min_replicas=0), desired("d0", rng.randint(1, 2))]
    tids = [f"t{k}" for k in range(1, rng.randint(2, 3) + 1)]
    for tid in tids:
        cmds.append(tenant(tid, priority=rng.choice((1, 10, 20)), quota=rng.choice((0, 2, 4)), borrow=rng.choice((4, 8, 16))))
    deps: list[tuple[str, int]] = []
    for k in range(1, rng.randint(2, 4) + 1):
        tid, gpus = rng.choice(tids), rng.choice((1, 2))
        did = f"d{k}"
        cmds.append(c.PutDeployment(Deployment(
            DeploymentId(did), TenantId(tid), Engine.VLLM, "llama3-8b-h100", H100, gpus,
            min_replicas=rng.randint(0, 2), max_replicas=8,
        )))
        cmds.append(desired(did, rng.randint(1, 5)))
        deps.append((did, gpus))
    state = build(*cmds)
    n = 0
    clusters = sorted(state.clusters)
    for did, gpus in deps:
        for _ in range(rng.randint(1, 5)):
            cid = clusters[n % len(clusters)]
            if state.free_gpus(cid, H100) >= gpus:
                add(state, f"x{n}", cid, did=did)
            n += 1
    return state


def test_random_fleets_reach_a_fixpoint_without_taking_room_back() -> None:
    import random

    for seed in range(100):
        rng = random.Random(seed)
        state = random_fleet(rng)
        plans = []
        for k in range(40):
            now = T0 + 250 * k
            p = run_plan(state, now_ms=now)
            plans.append(p)
            commit(state, p.commands)
            world_step(state, now + 100)
        tail = plans[-10:]
        assert all(drains(p) == [] and p.preemptions == () for p in tail), seed
        # No pair of deployments preempts each other in both directions, over the whole run.
        pairs = {(b, v) for p in plans for b, v, _n in p.preemptions}
        assert not {(v, b) for b, v in pairs} & pairs, (seed, pairs)
