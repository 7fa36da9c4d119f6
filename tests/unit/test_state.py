"""The replicated state machine: ``apply(state, command)`` is total, deterministic and atomic per
command, and keeps its derived indexes (``gpus_used``, ``by_deployment``) in step with the instances."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import (
    TRANSITIONS,
    InitMethod,
    InstanceEvent,
    InstanceState,
    Transitioned,
)
from controlplane.domain.records import EMPTY_MEMORY, BreakerPhase, BreakerRecord, ScaleMemory
from controlplane.domain.state import MAX_BATCH, ApplyResult, ControlState, Desired, apply, snapshot
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.topology import Cluster

S, E = InstanceState, InstanceEvent
H100, A100 = PoolId("h100"), PoolId("a100")


# --- builders -----------------------------------------------------------------------------------


def tenant(tid: str = "acme", priority: int = 10, **kw: Any) -> Tenant:
    return Tenant(TenantId(tid), priority, **kw)


def deployment(did: str = "chat", tid: str = "acme", *, pool: str = "h100", gpus: int = 2, **kw: Any) -> Deployment:
    kw.setdefault("max_replicas", 8)
    return Deployment(DeploymentId(did), TenantId(tid), Engine.VLLM, "llama-3-8b", PoolId(pool), gpus, **kw)


def cluster(cid: str = "c1", zone: str = "z1", **capacity: int) -> Cluster:
    return Cluster(ClusterId(cid), ZoneId(zone), capacity=dict(capacity) or {"h100": 8})


def create(iid: str, did: str = "chat", cid: str = "c1", at_ms: int = 1_000) -> c.CreateInstance:
    return c.CreateInstance(InstanceId(iid), DeploymentId(did), ClusterId(cid), at_ms)


def move(iid: str, event: InstanceEvent, at_ms: int = 2_000, **kw: Any) -> c.TransitionInstance:
    return c.TransitionInstance(InstanceId(iid), event, at_ms, **kw)


def desired(did: str = "chat", replicas: int = 2, warm_pool: int = 1, reason: str = "r", at_ms: int = 0) -> c.SetDesired:
    return c.SetDesired(DeploymentId(did), replicas, warm_pool, reason, at_ms)


def unchecked(value: Any, **changes: Any) -> Any:
    """A copy of a frozen, validated value with fields changed *without* running its validation, as a
    buggy or hostile proposer (or a decoded log entry) could hand to ``apply``."""
    copy = dataclasses.replace(value)
    for name, v in changes.items():
        object.__setattr__(copy, name, v)
    return copy


SETUP: tuple[c.Command, ...] = (
    c.PutTenant(tenant("acme", 10, quota={"h100": 8})),
    c.PutTenant(tenant("beta", 5, quota={"a100": 4})),
    c.PutCluster(cluster("c1", "z1", h100=8, a100=4)),
    c.PutCluster(cluster("c2", "z2", h100=4)),
    c.PutDeployment(deployment("chat", "acme", pool="h100", gpus=2)),
    c.PutDeployment(deployment("embed", "beta", pool="a100", gpus=1)),
)


def fresh() -> ControlState:
    state = ControlState()
    for cmd in SETUP:
        assert apply(state, cmd).ok, cmd
    return state


def ok(state: ControlState, cmd: c.Command, *, within_capacity: bool = True) -> ApplyResult:
    before = state.applied
    result = apply(state, cmd)
    assert result.ok, result.error
    assert result.error == ""
    if not isinstance(cmd, c.Batch):
        assert state.applied == before + 1
    check_invariants(state, within_capacity=within_capacity)
    return result


def view(state: ControlState) -> tuple[object, ...]:
    """Everything in the state, replicated or derived, order included (values are frozen)."""
    return (
        snapshot(state),
        [(d, list(ids)) for d, ids in state.by_deployment.items()],
        list(state.gpus_used.items()),
        list(state.instances.items()),
        [list(t) for t in (state.tenants, state.deployments, state.clusters, state.desired, state.memory)],
        list(state.breakers.items()),
    )


def rejected(state: ControlState, cmd: object, *words: str, within_capacity: bool = True) -> ApplyResult:
    before = view(state)
    result = apply(state, cmd)  # type: ignore[arg-type]
    assert not result.ok
    assert result.transitions == ()
    for w in words:
        assert w in result.error, f"{w!r} not in {result.error!r}"
    assert view(state) == before, "a rejected command changed the state"
    check_invariants(state, within_capacity=within_capacity)
    return result


def recomputed_gpus(state: ControlState) -> dict[tuple[ClusterId, PoolId], int]:
    used: Counter[tuple[ClusterId, PoolId]] = Counter()
    for inst in state.instances.values():
        used[(inst.cluster, inst.pool)] += inst.gpus
    return dict(used)


def check_invariants(state: ControlState, *, within_capacity: bool = True) -> None:
    assert all(v >= 0 for v in state.gpus_used.values()), state.gpus_used
    assert {k: v for k, v in state.gpus_used.items() if v} == recomputed_gpus(state)
    if within_capacity:
        for (cid, pool), used in state.gpus_used.items():
            assert used <= state.clusters[cid].capacity.get(pool, 0), (cid, pool, used)
            assert state.free_gpus(cid, pool) >= 0
    assert set(state.by_deployment) == set(state.deployments)
    for did, ids in state.by_deployment.items():
        assert list(ids) == [i.id for i in state.instances.values() if i.deployment == did]
        assert [i.id for i in state.instances_of(did)] == list(ids)
    for iid, inst in state.instances.items():
        assert inst.id == iid
        assert isinstance(inst.state, InstanceState) and not inst.state.terminal
        d = state.deployments[inst.deployment]
        cl = state.clusters[inst.cluster]
        assert (inst.tenant, inst.pool, inst.gpus, inst.zone) == (d.tenant, d.pool, d.gpus_per_instance, cl.zone)
    for d in state.deployments.values():
        assert d.tenant in state.tenants
    assert set(state.desired) <= set(state.deployments)
    assert set(state.memory) <= set(state.deployments)
    snapshot(state)  # never raises (keys stay mutually comparable)


# --- tenants ------------------------------------------------------------------------------------


def test_put_tenant_adds_and_replaces() -> None:
    state = fresh()
    ok(state, c.PutTenant(tenant("gamma", 3)))
    ok(state, c.PutTenant(tenant("gamma", 7, quota={"h100": 2})))
    assert state.tenants[TenantId("gamma")] == tenant("gamma", 7, quota={"h100": 2})


@pytest.mark.parametrize(("changes", "words"), [
    ({"quota": {"h100": -1}}, "tenant.quota.h100"),
    ({"priority": -3}, "tenant.priority"),
    ({"id": "Bad_Id"}, "tenant.id"),
    ({"quota": None}, "malformed put_tenant"),
])
def test_put_tenant_revalidates(changes: dict[str, Any], words: str) -> None:
    rejected(fresh(), c.PutTenant(unchecked(tenant("gamma"), **changes)), words)


def test_remove_tenant() -> None:
    state = fresh()
    ok(state, c.PutTenant(tenant("gamma")))
    ok(state, c.RemoveTenant(TenantId("gamma")))
    assert TenantId("gamma") not in state.tenants


def test_remove_unknown_tenant() -> None:
    rejected(fresh(), c.RemoveTenant(TenantId("ghost")), "tenant 'ghost' not found")


def test_remove_tenant_that_still_has_deployments() -> None:
    state = fresh()
    rejected(state, c.RemoveTenant(TenantId("acme")), "tenant 'acme' still owns deployments ['chat']")
    ok(state, c.RemoveDeployment(DeploymentId("chat")))
    ok(state, c.RemoveTenant(TenantId("acme")))


# --- deployments --------------------------------------------------------------------------------


def test_put_deployment_adds_and_updates() -> None:
    state = fresh()
    ok(state, c.PutDeployment(deployment("chat2", "acme")))
    assert list(state.by_deployment[DeploymentId("chat2")]) == []
    ok(state, c.PutDeployment(deployment("chat", "acme", max_replicas=3, warm_pool=0)))
    assert state.deployments[DeploymentId("chat")].max_replicas == 3


def test_put_deployment_of_unknown_tenant() -> None:
    rejected(fresh(), c.PutDeployment(deployment("new", "ghost")), "tenant 'ghost' not found")


def test_put_deployment_of_another_tenant() -> None:
    rejected(fresh(), c.PutDeployment(deployment("chat", "beta")), "deployment 'chat' belongs to tenant 'acme'")


@pytest.mark.parametrize("kw", [{"pool": "a100"}, {"gpus": 4}])
def test_deployment_shape_cannot_change(kw: dict[str, Any]) -> None:
    rejected(fresh(), c.PutDeployment(deployment("chat", "acme", **kw)), "deployment.pool", "cannot change")


@pytest.mark.parametrize(("changes", "words"), [
    ({"gpus_per_instance": 0}, "deployment.gpus_per_instance"),
    ({"min_replicas": 9, "max_replicas": 2}, "deployment.min_replicas"),
    ({"engine": "tgi"}, "deployment.engine"),
])
def test_put_deployment_revalidates(changes: dict[str, Any], words: str) -> None:
    rejected(fresh(), c.PutDeployment(unchecked(deployment("new"), **changes)), words)


def test_remove_unknown_deployment() -> None:
    rejected(fresh(), c.RemoveDeployment(DeploymentId("ghost")), "deployment 'ghost' not found")


def test_remove_deployment_with_live_instances() -> None:
    state = fresh()
    ok(state, create("i1"))
    rejected(state, c.RemoveDeployment(DeploymentId("chat")), "deployment 'chat' still has 1 instances")
    ok(state, move("i1", E.CANCEL))
    ok(state, desired("chat", 0, 0))
    ok(state, c.PutScaleMemory(DeploymentId("chat"), ScaleMemory(panic_peak=3)))
    ok(state, c.RemoveDeployment(DeploymentId("chat")))
    assert DeploymentId("chat") not in state.deployments
    assert DeploymentId("chat") not in state.desired
    assert DeploymentId("chat") not in state.memory
    assert DeploymentId("chat") not in state.by_deployment


# --- clusters -----------------------------------------------------------------------------------


def test_put_cluster() -> None:
    state = fresh()
    ok(state, c.PutCluster(cluster("c3", "z1", h100=2)))
    ok(state, c.PutCluster(cluster("c3", "z1", h100=6)))
    assert state.free_gpus(ClusterId("c3"), H100) == 6
    assert state.free_gpus(ClusterId("nowhere"), H100) == 0


def test_cluster_zone_cannot_change() -> None:
    rejected(fresh(), c.PutCluster(cluster("c1", "z2")), "cluster.zone", "zones cannot change")


def test_put_cluster_revalidates() -> None:
    rejected(fresh(), c.PutCluster(unchecked(cluster("c3"), capacity={"h100": -1})), "cluster.capacity.h100")


def test_shrinking_a_cluster_below_use_is_recorded_and_blocks_new_instances() -> None:
    """Capacity follows reality (nodes go away); the excess instances are the reconciler's to drain.
    Until then no new instance fits and ``free_gpus`` is negative."""
    state = fresh()
    ok(state, create("i1"))
    ok(state, create("i2"))
    ok(state, c.PutCluster(cluster("c1", "z1", h100=2, a100=4)), within_capacity=False)
    assert state.free_gpus(ClusterId("c1"), H100) == -2
    rejected(state, create("i3"), "has -2 free h100 GPUs", within_capacity=False)
    ok(state, move("i1", E.LOST), within_capacity=False)
    ok(state, move("i2", E.CANCEL))
    assert state.free_gpus(ClusterId("c1"), H100) == 2


# --- desired ------------------------------------------------------------------------------------


def test_set_desired_generation_bumps_only_on_change() -> None:
    state = fresh()
    ok(state, desired("chat", 2, 1, "first", 10))
    assert state.desired[DeploymentId("chat")] == Desired(2, 1, 1, "first", 10)
    ok(state, desired("chat", 2, 1, "same numbers", 20))
    assert state.desired[DeploymentId("chat")] == Desired(2, 1, 1, "same numbers", 20)
    ok(state, desired("chat", 3, 1, "up", 30))
    assert state.desired[DeploymentId("chat")].generation == 2
    ok(state, desired("chat", 3, 0, "warm pool only", 40))
    assert state.desired[DeploymentId("chat")].generation == 3
    ok(state, desired("chat", 3, 0, "again", 50))
    assert state.desired[DeploymentId("chat")].generation == 3
    ok(state, desired("embed", 0, 0))
    assert state.desired[DeploymentId("embed")].generation == 1


@pytest.mark.parametrize(("cmd", "words"), [
    (desired("ghost"), "deployment 'ghost' not found"),
    (desired("chat", 9), "replicas: must be between 0 and 8, got 9"),
    (desired("chat", -1), "replicas: must be between 0 and 8, got -1"),
    (desired("chat", 1, -1), "warm_pool: must be >= 0, got -1"),
    (desired("chat", "2"), "malformed set_desired"),  # type: ignore[arg-type]
])
def test_set_desired_rejections(cmd: c.SetDesired, words: str) -> None:
    state = fresh()
    ok(state, desired("chat", 2, 1))
    rejected(state, cmd, words)


def test_scale_memory() -> None:
    state = fresh()
    assert state.memory_of(DeploymentId("chat")) is EMPTY_MEMORY
    mem = ScaleMemory(recs=((1_000, 3),), panic_until_ms=5_000, panic_peak=3)
    ok(state, c.PutScaleMemory(DeploymentId("chat"), mem))
    assert state.memory_of(DeploymentId("chat")) == mem
    rejected(state, c.PutScaleMemory(DeploymentId("ghost"), mem), "deployment 'ghost' not found")


def test_scale_memories_apply_in_order_and_skip_removed_deployments() -> None:
    state = fresh()
    one, two = ScaleMemory(recs=((1_000, 3),)), ScaleMemory(recs=((2_000, 2),), panic_peak=4)
    # A deployment removed between the plan and its commit is skipped; the other entries apply.
    chat, ghost = DeploymentId("chat"), DeploymentId("ghost")
    ok(state, c.PutScaleMemories(((ghost, one), (chat, one), (chat, two))))
    assert state.memory_of(DeploymentId("chat")) == two and DeploymentId("ghost") not in state.memory
    applied = state.applied
    ok(state, c.PutScaleMemories(()))
    assert state.applied == applied + 1


@pytest.mark.parametrize("memories", [
    [(DeploymentId("chat"), ScaleMemory())],
    ((DeploymentId("chat"), ScaleMemory(), 1),),
    ((DeploymentId("chat"), "memory"),),
    ((7, ScaleMemory()),),
])
def test_malformed_scale_memories_are_rejected_whole(memories: object) -> None:
    state = fresh()
    mem = ScaleMemory(panic_peak=1)
    ok(state, c.PutScaleMemory(DeploymentId("chat"), mem))
    result = apply(state, c.PutScaleMemories(memories))  # type: ignore[arg-type]
    assert not result.ok and result.code == "invalid" and "memories" in result.error
    assert state.memory_of(DeploymentId("chat")) == mem


# --- instances ----------------------------------------------------------------------------------


def test_create_instance() -> None:
    state = fresh()
    ok(state, create("i1", at_ms=1_234))
    inst = state.instances[InstanceId("i1")]
    assert (inst.state, inst.init_method, inst.created_ms, inst.state_since_ms) == (S.PENDING, InitMethod.COLD, 1_234, 1_234)
    assert (inst.deployment, inst.tenant, inst.cluster, inst.zone, inst.pool, inst.gpus) == (
        "chat", "acme", "c1", "z1", "h100", 2)
    assert state.gpus_used == {(ClusterId("c1"), H100): 2}
    assert state.free_gpus(ClusterId("c1"), H100) == 6
    assert list(state.by_deployment[DeploymentId("chat")]) == ["i1"]


@pytest.mark.parametrize(("cmd", "words"), [
    (create("i1"), "instance 'i1' already exists"),
    (create("i2", "ghost"), "deployment 'ghost' not found"),
    (create("i2", "chat", "c9"), "cluster 'c9' not found"),
    (create("i2", "embed", "c2"), "cluster 'c2' has 0 free a100 GPUs, instance needs 1"),
    (create("Bad_Id"), "instance_id"),
    (create(7), "instance_id"),  # type: ignore[arg-type]
])
def test_create_instance_rejections(cmd: c.CreateInstance, words: str) -> None:
    state = fresh()
    ok(state, create("i1"))
    rejected(state, cmd, words)


def test_capacity_exceeded() -> None:
    state = fresh()
    for i in range(4):
        ok(state, create(f"i{i}"))  # 4 x 2 GPUs fill c1's 8 h100
    rejected(state, create("i9"), "cluster 'c1' has 0 free h100 GPUs, instance needs 2")
    ok(state, create("i9", cid="c2"))
    ok(state, move("i0", E.LOST))
    ok(state, create("i10"))  # the lost instance's GPUs are free again


def test_transition_instance() -> None:
    state = fresh()
    ok(state, create("i1", at_ms=1_000))
    result = ok(state, move("i1", E.START_WARMUP, 3_000))
    assert result.transitions == (
        Transitioned(InstanceId("i1"), S.PENDING, S.WARMING, E.START_WARMUP, 2_000, InitMethod.COLD, 3_000),
    )
    assert state.instances[InstanceId("i1")].state is S.WARMING
    ok(state, move("i1", E.WARMED, 33_000))
    ok(state, move("i1", E.SLEEP, 40_000))
    result = ok(state, move("i1", E.WAKE, 50_000))
    assert result.transitions[0].init_method is InitMethod.WARM
    ok(state, move("i1", E.WARMED, 51_000))
    ok(state, move("i1", E.DRAIN, 60_000, drain_deadline_ms=90_000, preempted=True))
    inst = state.instances[InstanceId("i1")]
    assert (inst.state, inst.drain_deadline_ms, inst.preempted, inst.init_method) == (
        S.DRAINING, 90_000, True, InitMethod.WARM)


@pytest.mark.parametrize(("path", "last"), [
    ([E.CANCEL], S.TERMINATED),
    ([E.START_WARMUP, E.WARMUP_FAILED], S.FAILED),
    ([E.START_WARMUP, E.WARMED, E.WORK, E.DRAIN, E.DRAINED], S.TERMINATED),
    ([E.START_WARMUP, E.WARMED, E.SLEEP, E.LOST], S.FAILED),
    ([E.LOST], S.FAILED),
])
def test_terminal_instances_leave_the_state(path: list[InstanceEvent], last: InstanceState) -> None:
    state = fresh()
    ok(state, create("i1"))
    ok(state, create("i2"))
    for t, event in enumerate(path):
        result = ok(state, move("i1", event, 2_000 + t))
    assert result.transitions[0].to_state is last
    assert InstanceId("i1") not in state.instances
    assert list(state.by_deployment[DeploymentId("chat")]) == ["i2"]
    assert state.gpus_used[(ClusterId("c1"), H100)] == 2
    rejected(state, move("i1", E.LOST), "instance 'i1' not found")


@pytest.mark.parametrize(("cmd", "words"), [
    (move("ghost", E.WARMED), "instance 'ghost' not found"),
    (move("i1", E.WARMED), "instance i1: no transition from Pending on warmed"),
    (move("i1", E.DRAINED), "no transition from Pending on drained"),
    (move("i1", "warmed"), "malformed transition_instance"),  # type: ignore[arg-type]
])
def test_transition_rejections(cmd: c.TransitionInstance, words: str) -> None:
    state = fresh()
    ok(state, create("i1"))
    rejected(state, cmd, words)


# --- breakers, unknown and malformed commands ---------------------------------------------------


def test_put_breaker() -> None:
    state = fresh()
    rec = BreakerRecord(BreakerPhase.OPEN, failures=3, trips=1, open_until_ms=9_000)
    ok(state, c.PutBreaker("cluster/c1", rec))
    assert state.breakers["cluster/c1"] == rec
    rejected(state, c.PutBreaker("", rec), "key: must be a non-empty string")
    rejected(state, c.PutBreaker(5, rec), "key")  # type: ignore[arg-type]


@pytest.mark.parametrize("cmd", [c.Command(), object(), None, "put_tenant"])
def test_unknown_command_type(cmd: object) -> None:
    rejected(fresh(), cmd, "unknown command type")


# --- batches ------------------------------------------------------------------------------------


def test_batch_all_ok() -> None:
    state = fresh()
    before = state.applied
    result = ok(state, c.Batch((create("i1"), move("i1", E.START_WARMUP), desired("chat", 1, 0))))
    assert [r.ok for r in result.results] == [True, True, True]
    assert [t.to_state for t in result.transitions] == [S.WARMING]
    assert state.applied == before + 3


def test_batch_members_are_independent() -> None:
    state = fresh()
    before = state.applied
    result = apply(state, c.Batch((create("i1"), create("i1"), move("i1", E.CANCEL))))
    assert not result.ok
    assert [r.ok for r in result.results] == [True, False, True]
    assert "already exists" in result.results[1].error
    assert [t.to_state for t in result.transitions] == [S.TERMINATED]
    assert state.applied == before + 2
    check_invariants(state)


def test_nested_batch_is_rejected_but_siblings_apply() -> None:
    state = fresh()
    result = apply(state, c.Batch((c.Batch((create("i1"),)), create("i2"))))
    assert not result.ok
    assert result.results[0] == ApplyResult(False, "batch: batches cannot be nested", code="malformed")
    assert result.results[1].ok
    assert InstanceId("i1") not in state.instances and InstanceId("i2") in state.instances


def test_batch_over_the_limit_is_rejected_whole() -> None:
    cmds = tuple(c.PutBreaker(f"k{i}", BreakerRecord()) for i in range(MAX_BATCH + 1))
    result = rejected(fresh(), c.Batch(cmds), f"exceed the limit of {MAX_BATCH}")
    assert result.results == ()
    ok(fresh(), c.Batch(cmds[:MAX_BATCH]))


@pytest.mark.parametrize("commands", [None, 5, create("i1")])
def test_malformed_batch_is_rejected(commands: object) -> None:
    rejected(fresh(), c.Batch(commands), "batch")  # type: ignore[arg-type]


def test_empty_batch() -> None:
    assert ok(fresh(), c.Batch(())) == ApplyResult(True, "", (), ())


def test_same_log_same_state() -> None:
    log = [*SETUP, create("i1"), move("i1", E.START_WARMUP, 5), create("i2", "embed"), desired("chat", 1, 0),
           c.Batch((move("i2", E.CANCEL), create("i3"))), move("i1", E.WARMED, 9), create("i1")]
    a, b = ControlState(), ControlState()
    assert [apply(a, cmd) for cmd in log] == [apply(b, cmd) for cmd in log]
    assert snapshot(a) == snapshot(b) and view(a) == view(b)


# --- properties ---------------------------------------------------------------------------------

TENANT_IDS = ["acme", "beta", "gamma"]
DEPLOYMENT_IDS = ["chat", "embed", "code"]
CLUSTER_IDS = ["c1", "c2", "c3"]
INSTANCE_IDS = ["i1", "i2", "i3", "i4", "i5", "i6"]
FIXED_CAPACITY = {"c1": {"h100": 8, "a100": 4}, "c2": {"h100": 4}, "c3": {"a100": 2}}

times = st.integers(0, 100_000)


def base_commands(fixed_capacity: bool) -> st.SearchStrategy[c.Command]:
    tids, dids = st.sampled_from(TENANT_IDS), st.sampled_from(DEPLOYMENT_IDS)
    cids, iids = st.sampled_from(CLUSTER_IDS), st.sampled_from(INSTANCE_IDS)
    pools = st.sampled_from(["h100", "a100"])
    gpu_maps = st.dictionaries(pools, st.integers(0, 8), max_size=2)
    if fixed_capacity:
        clusters = st.builds(lambda cid, zone: Cluster(cid, zone, capacity=FIXED_CAPACITY[cid]),
                             cids, st.sampled_from(["z1", "z2"]))
    else:
        clusters = st.builds(lambda cid, zone, cap: Cluster(cid, zone, capacity=cap),
                             cids, st.sampled_from(["z1", "z2"]), gpu_maps)
    deployments = st.builds(
        lambda did, tid, pool, gpus, mx: deployment(did, tid, pool=pool, gpus=gpus, max_replicas=mx, min_replicas=0),
        dids, tids, pools, st.sampled_from([1, 2, 4]), st.integers(1, 5),
    )
    malformed = st.sampled_from([
        c.PutTenant(unchecked(tenant("gamma"), priority=-1)),
        c.PutDeployment(unchecked(deployment("code", "acme"), gpus_per_instance=0)),
        c.PutCluster(unchecked(cluster("c3"), capacity={"h100": -4})),
        c.SetDesired(DeploymentId("chat"), "3", 0, "x", 0),  # type: ignore[arg-type]
        c.SetDesired(DeploymentId("chat"), None, 0, "x", 0),  # type: ignore[arg-type]
        c.TransitionInstance(InstanceId("i1"), "warmed", 0),  # type: ignore[arg-type]
        c.CreateInstance(7, DeploymentId("chat"), ClusterId("c1"), 0),  # type: ignore[arg-type]
        c.CreateInstance(InstanceId("I_1"), DeploymentId("chat"), ClusterId("c1"), 0),
        c.CreateInstance(InstanceId("i1"), ["chat"], ClusterId("c1"), 0),  # type: ignore[arg-type]
        c.PutBreaker(5, BreakerRecord()),  # type: ignore[arg-type]
        c.PutBreaker(("a",), BreakerRecord()),  # type: ignore[arg-type]
        c.RemoveTenant(["acme"]),  # type: ignore[arg-type]
        c.Batch(None),  # type: ignore[arg-type]
        c.Command(),
    ])
    return st.one_of(
        st.builds(lambda tid, p, q: c.PutTenant(tenant(tid, p, quota=q)), tids, st.integers(0, 9), gpu_maps),
        st.builds(c.RemoveTenant, tids),
        st.builds(c.PutDeployment, deployments),
        st.builds(c.RemoveDeployment, dids),
        st.builds(c.PutCluster, clusters),
        st.builds(c.SetDesired, dids, st.integers(-1, 6), st.integers(-1, 3), st.just("r"), times),
        st.builds(lambda did, p: c.PutScaleMemory(did, ScaleMemory(panic_peak=p)), dids, st.integers(0, 5)),
        st.builds(c.CreateInstance, iids, dids, cids, times),
        st.builds(c.TransitionInstance, iids, st.sampled_from(list(InstanceEvent)), times, times, st.booleans()),
        st.builds(lambda k, n: c.PutBreaker(k, BreakerRecord(failures=n)),
                  st.sampled_from(["", "cluster/c1", "adapter/c2"]), st.integers(0, 3)),
        malformed,
    )


BASE_COMMANDS = {fixed: base_commands(fixed) for fixed in (True, False)}
BATCHES = {
    fixed: st.lists(st.one_of(base, st.builds(lambda x: c.Batch((x,)), base)), max_size=4).map(
        lambda members: c.Batch(tuple(members)))
    for fixed, base in BASE_COMMANDS.items()
}


def draw_command(data: st.DataObject, state: ControlState, fixed_capacity: bool) -> c.Command:
    kind = data.draw(st.integers(0, 9))
    if kind < 3 and state.instances:
        # Steer towards legal moves so the fleet gets past Pending.
        iid = data.draw(st.sampled_from(sorted(state.instances)))
        legal = sorted((e for (s, e) in TRANSITIONS if s is state.instances[iid].state), key=lambda e: e.value)
        return c.TransitionInstance(iid, data.draw(st.sampled_from(legal)), data.draw(times))
    if kind == 3:
        return data.draw(BATCHES[fixed_capacity])
    return data.draw(BASE_COMMANDS[fixed_capacity])


def run_random_log(data: st.DataObject, fixed_capacity: bool) -> tuple[list[c.Command], ControlState]:
    state = fresh()
    log: list[c.Command] = []
    for _ in range(data.draw(st.integers(0, 30))):
        cmd = draw_command(data, state, fixed_capacity)
        log.append(cmd)
        before, applied, used = view(state), state.applied, dict(state.gpus_used)
        result = apply(state, cmd)  # (a) never raises
        # Rejected single commands (and whole-batch rejections) leave everything as it was.
        if not result.ok and not result.results:
            assert result.error and view(state) == before
        n_ok = sum(r.ok for r in result.results) if isinstance(cmd, c.Batch) else int(result.ok)
        assert state.applied == applied + n_ok
        for t in result.transitions:
            assert TRANSITIONS[(t.from_state, t.event)] is t.to_state
        check_invariants(state, within_capacity=fixed_capacity)  # (c), (d)
        # apply never over-commits: an index above capacity (after a cluster shrank) never grows.
        for key, n in state.gpus_used.items():
            cap = state.clusters[key[0]].capacity.get(key[1], 0)
            assert n <= cap or n <= used.get(key, 0), (key, n, cap)
    return log, state


@given(st.data())
def test_random_logs_are_total_deterministic_and_keep_invariants(data: st.DataObject) -> None:
    log, state = run_random_log(data, fixed_capacity=True)
    replica = fresh()
    results = [apply(replica, cmd) for cmd in log]  # (b) same log, same state
    assert snapshot(replica) == snapshot(state)
    assert view(replica) == view(state)
    again = fresh()
    assert [apply(again, cmd) for cmd in log] == results


@given(st.data())
def test_random_logs_with_changing_capacity_never_overcommit(data: st.DataObject) -> None:
    log, state = run_random_log(data, fixed_capacity=False)
    replica = fresh()
    for cmd in log:
        apply(replica, cmd)
    assert view(replica) == view(state)
