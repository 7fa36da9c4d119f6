"""The planner with cordoned and draining clusters and zones, deployment deletion, and the live
decision records. Pure: states are built through ``apply()``, each tick is one ``plan()`` call, and
the "world" between ticks is narrated by the test (see ``test_reconcile``)."""

from __future__ import annotations

import dataclasses

from controlplane.core import reconcile as r
from controlplane.core.scaling import ScaleReason
from controlplane.core.signals import FilteredSignals
from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, ZoneId
from controlplane.domain.state import ControlState
from controlplane.domain.topology import Cluster, Zone
from tests.unit.test_reconcile import (
    CFG,
    H100,
    T0,
    E,
    S,
    add,
    build,
    cluster,
    commit,
    count,
    deployment,
    desired,
    instance_commands,
    load,
    move,
    no_data,
    of_type,
    run_plan,
    states_of,
    tenant,
)

GRACE = T0 + CFG.scale_in_grace_ms


def cordon(cid: str, zone: str, gpus: int = 4, *, draining: bool = False) -> c.PutCluster:
    return c.PutCluster(Cluster(ClusterId(cid), ZoneId(zone), capacity={H100: gpus}, cordoned=True, draining=draining))


def deleting(state: ControlState, did: str = "chat") -> c.PutDeployment:
    return c.PutDeployment(dataclasses.replace(state.deployments[DeploymentId(did)], deleting=True))


def serving(state: ControlState, did: str = "chat") -> int:
    return count(state, S.READY, did) + count(state, S.BUSY, did)


def clusters_of(state: ControlState, did: str = "chat") -> set[str]:
    return {i.cluster for i in state.instances_of(DeploymentId(did))}


def warm_up(state: ControlState, *iids: str, at_ms: int) -> None:
    """The named instances finish their start (Pending -> Warming -> Ready)."""
    for iid in iids:
        inst = state.instances[InstanceId(iid)]
        events = [E.START_WARMUP, E.WARMED] if inst.state is S.PENDING else [E.WARMED]
        commit(state, [move(iid, ev, at_ms + k) for k, ev in enumerate(events)])


def drained(state: ControlState, at_ms: int) -> None:
    commit(state, [move(i.id, E.DRAINED, at_ms) for i in list(state.instances.values()) if i.state is S.DRAINING])


# --- cordon -------------------------------------------------------------------------------------


def test_a_cordoned_cluster_keeps_its_instances_but_gets_no_new_ones() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2"), cluster("c3", "z3"), tenant(), deployment(), desired("chat", 1))
    add(state, "r1", "c1")
    commit(state, [cordon("c1", "z1")])
    p = run_plan(state, {"chat": load(144)})  # 6 replicas wanted

    assert p.grants == (("chat", 6, 0),)
    creates = of_type(p, c.CreateInstance)
    assert [x.cluster_id for x in creates] == ["c2", "c3", "c2", "c3", "c2"]
    assert of_type(p, c.TransitionInstance) == []  # r1 keeps serving


def test_the_allocation_counts_only_the_gpus_a_cordoned_cluster_already_holds() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2", 2), tenant(), deployment(), desired("chat", 1))
    add(state, "r1", "c1")
    commit(state, [cordon("c1", "z1")])
    p = run_plan(state, {"chat": load(144)})

    # c1: 1 GPU held (not its 4); c2: 2 free. 3 granted of the 6 wanted, both new ones on c2.
    assert p.grants == (("chat", 3, 0),)
    assert [x.cluster_id for x in of_type(p, c.CreateInstance)] == ["c2", "c2"]
    (sd,) = of_type(p, c.SetDesired)
    assert sd.reason == "capacity"
    assert sd.message.startswith("pool h100 full: 3 of 3 GPUs granted: granted 3 of 6 replicas x 1 GPUs; panic held")


def test_a_cordoned_zone_record_cordons_every_cluster_in_it() -> None:
    state = build(cluster("a1", "z1"), cluster("a2", "z1"), cluster("b1", "z2"), tenant(), deployment(min_replicas=0),
                  desired("chat", 0))
    commit(state, [c.PutZone(Zone(ZoneId("z1"), cordoned=True))])
    p = run_plan(state, {"chat": load(72)})  # 3 replicas
    assert [x.cluster_id for x in of_type(p, c.CreateInstance)] == ["b1", "b1", "b1"]

    commit(state, [c.PutZone(Zone(ZoneId("z2"), cordoned=True))])
    p = run_plan(state, {"chat": load(72)}, now_ms=T0 + 250)
    assert of_type(p, c.CreateInstance) == [] and p.grants == (("chat", 0, 0),)


def test_nothing_is_granted_or_placed_when_every_cluster_is_cordoned() -> None:
    state = build(cordon("c1", "z1"), cordon("c2", "z2"), tenant(), deployment(min_replicas=2))
    p = run_plan(state)
    assert of_type(p, c.CreateInstance) == []
    # Nothing is granted (no capacity counts), so nothing is attempted either.
    assert p.grants == (("chat", 0, 0),)


# --- drain: replace first, then drain -----------------------------------------------------------


def test_draining_a_cluster_replaces_its_instances_before_draining_them() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2"), cluster("c3", "z3"), tenant(),
                  deployment(min_replicas=2, warm_pool=1), desired("chat", 2, 1))
    add(state, "r1", "c1")
    add(state, "r2", "c1", at_ms=T0 - 50_000)
    add(state, "s1", "c1", S.STANDBY)
    commit(state, [cordon("c1", "z1", draining=True)])

    # Tick 1: 2 serving + 1 warm are created elsewhere (a surge); the Standby one goes at once; the
    # serving ones wait for their replacements.
    p = run_plan(state)
    new = [f"chat-{T0}-{k}" for k in range(3)]
    assert p.grants == (("chat", 2, 1),)
    assert instance_commands(p) == [
        *[c.CreateInstance(iid, "chat", cid, T0) for iid, cid in zip(new, ["c2", "c3", "c2"])],
        move("s1", E.DRAIN, drain_deadline_ms=T0),
    ]
    assert p.notes == ("chat: 2 of 2 serving instances on draining clusters wait for replacements (0 of 2 ready elsewhere)",)
    commit(state, p.commands)

    # Tick 2: the new ones are warming: nothing moves.
    commit(state, [move(iid, E.START_WARMUP, T0 + 100) for iid in new])
    assert instance_commands(run_plan(state, now_ms=T0 + 250)) == []

    # Tick 3: one replacement serves: one old instance leaves (the newest of equal load), 2 serve.
    warm_up(state, new[0], at_ms=T0 + 400)
    p = run_plan(state, now_ms=T0 + 500)
    assert instance_commands(p) == [move("r2", E.DRAIN, T0 + 500, drain_deadline_ms=T0 + 500 + CFG.scale_in_grace_ms)]
    commit(state, p.commands)
    assert serving(state) == 2

    # Tick 4: all three serve: the surplus one sleeps (the warm pool), the last old one leaves.
    warm_up(state, new[1], new[2], at_ms=T0 + 600)
    p = run_plan(state, now_ms=T0 + 750)
    assert instance_commands(p) == [
        move(new[0], E.SLEEP, T0 + 750),  # equal load and age: the id decides
        move("r1", E.DRAIN, T0 + 750, drain_deadline_ms=T0 + 750 + CFG.scale_in_grace_ms),
    ]
    commit(state, p.commands)
    drained(state, T0 + 800)

    assert clusters_of(state) == {"c2", "c3"}
    assert (serving(state), count(state, S.STANDBY)) == (2, 1)
    assert instance_commands(run_plan(state, now_ms=T0 + 1_000)) == []  # a fixpoint


def test_draining_a_zone_moves_every_instance_to_other_zones() -> None:
    state = build(cluster("a1", "z1"), cluster("a2", "z1"), cluster("b1", "z2"), cluster("c1", "z3"), tenant(),
                  deployment(min_replicas=3), desired("chat", 3))
    add(state, "r1", "a1")
    add(state, "r2", "a2")
    add(state, "r3", "b1")
    commit(state, [c.PutZone(Zone(ZoneId("z1"), draining=True))])
    lowest = 3
    for k in range(8):
        now = T0 + 250 * k
        p = run_plan(state, now_ms=now)
        assert all(x.cluster_id in ("b1", "c1") for x in of_type(p, c.CreateInstance))
        commit(state, p.commands)
        lowest = min(lowest, serving(state))
        warm_up(state, *[i.id for i in state.instances.values() if i.state in (S.PENDING, S.WARMING)], at_ms=now + 100)
        drained(state, now + 200)
    assert clusters_of(state) == {"b1", "c1"}
    assert serving(state) == 3 and lowest == 3


def test_without_capacity_elsewhere_the_guaranteed_minimum_stays_on_the_draining_cluster() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2", 1), tenant(), deployment(min_replicas=2), desired("chat", 2))
    add(state, "r1", "c1")
    add(state, "r2", "c1", at_ms=T0 - 50_000)
    commit(state, [cordon("c1", "z1", draining=True)])

    p = run_plan(state)
    assert p.grants == (("chat", 1, 0),)  # c2's one GPU is all the capacity left
    assert instance_commands(p) == [c.CreateInstance(f"chat-{T0}-0", "chat", "c2", T0)]
    commit(state, p.commands)
    warm_up(state, f"chat-{T0}-0", at_ms=T0 + 100)

    p = run_plan(state, now_ms=T0 + 250)
    assert instance_commands(p) == [move("r2", E.DRAIN, T0 + 250, drain_deadline_ms=T0 + 250 + CFG.scale_in_grace_ms)]
    assert p.notes == ("chat: 1 of 2 serving instances on draining clusters wait for replacements (1 of 2 ready elsewhere)",)
    commit(state, p.commands)
    assert serving(state) == 2  # min_replicas kept: r1 stays until capacity appears elsewhere


def test_pending_and_warming_instances_on_a_draining_cluster_are_stopped_at_once() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2"), tenant(), deployment(min_replicas=2), desired("chat", 2))
    add(state, "p1", "c1", S.PENDING)
    add(state, "w1", "c1", S.WARMING)
    commit(state, [cordon("c1", "z1", draining=True)])
    p = run_plan(state)
    assert instance_commands(p) == [
        c.CreateInstance(f"chat-{T0}-0", "chat", "c2", T0),
        c.CreateInstance(f"chat-{T0}-1", "chat", "c2", T0),
        move("p1", E.CANCEL, drain_deadline_ms=GRACE),
        move("w1", E.DRAIN, drain_deadline_ms=T0),
    ]


def test_preemption_victims_never_come_from_a_draining_cluster() -> None:
    # lo (borrowing) holds 2 GPUs on the draining c1 and 2 on c2; hi wants 2 on c2's free 2.
    state = build(
        cluster("c1", "z1", 2), cluster("c2", "z2", 4),
        tenant("hi", priority=100, quota=4), tenant("lo", priority=1, quota=0, borrow=8),
        deployment("hi-chat", "hi", min_replicas=2), deployment("lo-chat", "lo", min_replicas=0),
        desired("hi-chat", 2), desired("lo-chat", 4),
    )
    for k, cid in enumerate(["c1", "c1", "c2", "c2"]):
        add(state, f"lo-{k}", cid, did="lo-chat")
    commit(state, [cordon("c1", "z1", 2, draining=True)])
    p = run_plan(state)
    preempted = [x.instance_id for x in of_type(p, c.TransitionInstance) if x.preempted]
    assert preempted == [] and p.grants == (("hi-chat", 2, 0), ("lo-chat", 2, 0))
    assert [x.cluster_id for x in of_type(p, c.CreateInstance)] == ["c2", "c2"]


# --- deletion -----------------------------------------------------------------------------------


def test_a_deleted_deployment_scales_to_zero_then_is_removed() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2"), tenant(), deployment(min_replicas=2, warm_pool=1),
                  desired("chat", 3, 1))
    add(state, "r1", "c1")
    add(state, "r2", "c2")
    add(state, "p1", "c2", S.PENDING)
    add(state, "s1", "c1", S.STANDBY)
    commit(state, [deleting(state)])

    p = run_plan(state, {"chat": load(200)})  # load does not matter any more
    (dec,) = [d for _, d in p.decisions]
    assert (dec.target, dec.warm_pool, dec.reason) == (0, 0, ScaleReason.DELETING)
    assert dec.message == "deployment is being deleted: target 3 -> 0, min_replicas 2 ignored, 4 instances left"
    assert p.grants == (("chat", 0, 0),)
    assert p.commands[0] == c.SetDesired("chat", 0, 0, "deleting", T0, message=dec.message)
    assert sorted((x.instance_id, x.event) for x in of_type(p, c.TransitionInstance)) == [
        ("p1", E.CANCEL), ("r1", E.DRAIN), ("r2", E.DRAIN), ("s1", E.DRAIN),
    ]
    assert of_type(p, c.RemoveDeployment) == [] and of_type(p, c.CreateInstance) == []
    commit(state, p.commands)

    # Still draining: nothing more to do, not yet removed.
    p = run_plan(state, now_ms=T0 + 250)
    assert p.commands == ()
    drained(state, T0 + 300)

    p = run_plan(state, now_ms=T0 + 500)
    assert p.commands == (c.RemoveDeployment("chat"),)
    commit(state, p.commands)
    assert "chat" not in state.deployments and "chat" not in state.desired


def test_a_deleted_deployment_without_instances_is_removed_at_once() -> None:
    state = build(cluster("c1", "z1"), tenant(), deployment(min_replicas=1), desired("chat", 1))
    commit(state, [deleting(state)])
    p = run_plan(state)
    assert [type(x).__name__ for x in p.commands] == ["SetDesired", "RemoveDeployment"]
    commit(state, p.commands)
    assert state.deployments == {}


def test_a_deleted_deployment_on_a_draining_cluster_is_drained_too() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2"), tenant(), deployment(min_replicas=1), desired("chat", 1))
    add(state, "r1", "c1")
    commit(state, [cordon("c1", "z1", draining=True), deleting(state)])
    p = run_plan(state)
    assert instance_commands(p) == [move("r1", E.DRAIN, drain_deadline_ms=GRACE)]


# --- decision records -----------------------------------------------------------------------------


def test_set_desired_carries_the_decision_message() -> None:
    state = build(cluster("c1", "z1"), tenant(), deployment(min_replicas=3), desired("chat", 2))
    p = run_plan(state)
    (sd,) = of_type(p, c.SetDesired)
    assert (sd.replicas, sd.reason) == (3, "no_data")
    assert sd.message == no_data(2) + ", clamped to 3 (bounds [3, 16])"


def test_live_decisions_carry_current_target_grant_proposals_and_signals() -> None:
    state = build(cluster("c1", "z1", 2), tenant(), deployment(), desired("chat", 1))
    sig = load(144)
    p = run_plan(state, {"chat": sig})
    live = r.live_decisions(p, state, {DeploymentId("chat"): sig}, T0)
    d = live[DeploymentId("chat")]
    (dec,) = [x for _, x in p.decisions]
    assert (d.at_ms, d.current, d.target, d.granted, d.warm_pool) == (T0, 1, 6, 2, 0)
    assert (d.reason, d.message, d.panic) == ("panic", dec.message, True)
    assert d.proposals == {"concurrency": 6}
    assert d.signals == {"concurrency": 144.0, "panic.concurrency": 144.0, "serving": 1.0}


def test_signal_values_are_flat_and_empty_without_data() -> None:
    assert r.signal_values(None) == {}
    sig = FilteredSignals(T0, 3, {"kv_usage": 1.5, "concurrency": 40.0}, {"concurrency": 60.0}, None, {})
    assert r.signal_values(sig) == {
        "concurrency": 40.0, "kv_usage": 1.5, "panic.concurrency": 60.0, "serving": 3.0,
    }


def test_states_stay_consistent_after_a_whole_drain() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2"), tenant(), deployment(min_replicas=1), desired("chat", 1))
    add(state, "r1", "c1")
    commit(state, [cordon("c1", "z1", draining=True)])
    for k in range(4):
        now = T0 + 250 * k
        commit(state, run_plan(state, now_ms=now).commands)
        warm_up(state, *[i.id for i in state.instances.values() if i.state in (S.PENDING, S.WARMING)], at_ms=now + 100)
        drained(state, now + 200)
    assert states_of(state) == {f"chat-{T0}-0": S.READY}
    assert state.free_gpus(ClusterId("c1"), H100) == 4
