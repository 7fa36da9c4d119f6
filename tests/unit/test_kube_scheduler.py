"""The Kubernetes-scheduler allocator (controlplane/sim/kube.py) on hand-built states: pure, no
clock, no simulator. Each test narrates ticks by calling ``allocate`` (or ``plan``) at given times and
moving instances through legal transitions in between."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core import reconcile as r
from controlplane.core.allocator import AllocationRequest, ExternalAllocation
from controlplane.domain import commands as c
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import Instance, InitMethod, InstanceEvent, InstanceState
from controlplane.domain.state import ControlState, apply
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.topology import Cluster
from controlplane.sim.kube import KubeScheduler, pick_one_node

S, E = InstanceState, InstanceEvent
H100 = PoolId("h100")
MODEL = "llama3-8b-h100"
T0 = 1_000_000
GRACE = 30_000


# --- builders -------------------------------------------------------------------------------------


def commit(state: ControlState, commands: Iterable[c.Command]) -> None:
    for cmd in commands:
        result = apply(state, cmd)
        assert result.ok, f"{cmd}: {result.error}"


def fleet(
    clusters: Mapping[str, int],
    tenants: Mapping[str, int],
    deployments: Mapping[str, tuple[str, int]],
    *,
    quota: Mapping[str, tuple[int, int]] | None = None,
) -> ControlState:
    """``clusters``: id -> H100s (zone z-<id>); ``tenants``: id -> priority; ``deployments``: id ->
    (tenant, GPUs per instance); ``quota``: tenant -> (quota, borrow limit) (default: no quota set)."""
    state = ControlState()
    cmds: list[c.Command] = [
        c.PutCluster(Cluster(ClusterId(cid), ZoneId(f"z-{cid}"), capacity={H100: n})) for cid, n in clusters.items()
    ]
    for tid, prio in tenants.items():
        q = (quota or {}).get(tid)
        cmds.append(c.PutTenant(Tenant(TenantId(tid), prio, {H100: q[0]} if q else {}, {H100: q[1]} if q else {})))
    for did, (tid, gpus) in deployments.items():
        cmds.append(c.PutDeployment(Deployment(
            DeploymentId(did), TenantId(tid), Engine.VLLM, MODEL, H100, gpus, min_replicas=0, max_replicas=64, warm_pool=0,
        )))
    commit(state, cmds)
    return state


def add(state: ControlState, iid: str, did: str, cid: str, *, at_ms: int = T0 - 60_000, st: InstanceState = S.READY) -> None:
    commit(state, [c.CreateInstance(InstanceId(iid), DeploymentId(did), ClusterId(cid), at_ms)])
    path = {S.PENDING: (), S.WARMING: (E.START_WARMUP,), S.READY: (E.START_WARMUP, E.WARMED)}[st]
    commit(state, [c.TransitionInstance(InstanceId(iid), ev, at_ms + k) for k, ev in enumerate(path, 1)])


def drain(state: ControlState, iid: str, at_ms: int, deadline_ms: int, *, preempted: bool = True) -> None:
    commit(state, [c.TransitionInstance(InstanceId(iid), E.DRAIN, at_ms, drain_deadline_ms=deadline_ms, preempted=preempted)])


def gone(state: ControlState, iid: str, at_ms: int) -> None:
    commit(state, [c.TransitionInstance(InstanceId(iid), E.DRAINED, at_ms)])


def have(state: ControlState) -> dict[DeploymentId, int]:
    out = {d: 0 for d in state.deployments}
    for i in state.instances.values():
        if i.state in (S.PENDING, S.WARMING, S.READY, S.BUSY):
            out[i.deployment] += 1
    return out


def tick(sched: KubeScheduler, state: ControlState, targets: Mapping[str, int], now_ms: int) -> ExternalAllocation:
    deps = tuple(state.deployments[k] for k in sorted(state.deployments))
    full = {d.id: targets.get(d.id, 0) for d in deps}
    return sched.allocate(AllocationRequest(state, deps, full, have(state), frozenset(), now_ms, GRACE))


def bind(state: ControlState, out: ExternalAllocation, now_ms: int) -> None:
    """What the plan does with the bindings: one instance per bound pod, on its node."""
    for did, nodes in sorted(out.bindings.items()):
        for k, cid in enumerate(nodes):
            add(state, f"{did}-{now_ms}-{k}", did, cid, at_ms=now_ms, st=S.PENDING)


def victims_of(out: ExternalAllocation) -> list[str]:
    return [v.instance_id for v in out.victims]


# --- queue order, Pending ---------------------------------------------------------------------------


def blocked_node(priority_classes: bool = True) -> tuple[KubeScheduler, ControlState]:
    """One 1-GPU node held by a priority-1000 pod; ``lo`` (10) asks at T0, ``hi`` (100) at T0+1 s:
    both stay Pending (nothing of lower priority to preempt); then the holder goes away."""
    state = fleet({"c1": 1}, {"top": 1000, "lo-t": 10, "hi-t": 100},
                  {"top": ("top", 1), "lo": ("lo-t", 1), "hi": ("hi-t", 1)})
    add(state, "top-0", "top", "c1")
    sched = KubeScheduler(priority_classes=priority_classes)
    out = tick(sched, state, {"top": 1, "lo": 1}, T0)
    assert out.grants["lo"] == 0 and not out.victims and not out.bindings
    out = tick(sched, state, {"top": 1, "lo": 1, "hi": 1}, T0 + 1000)
    assert out.grants["hi"] == 0 and not out.victims
    assert sched.last is not None and sched.last.pending == {"hi": 1, "lo": 1}
    drain(state, "top-0", T0 + 1500, T0 + 1500, preempted=False)
    gone(state, "top-0", T0 + 1600)
    return sched, state


def test_queue_serves_higher_priority_first_even_when_it_asked_later() -> None:
    sched, state = blocked_node()
    out = tick(sched, state, {"top": 0, "lo": 1, "hi": 1}, T0 + 2000)
    assert out.bindings == {"hi": ("c1",)}
    assert out.grants["hi"] == 1 and out.grants["lo"] == 0
    assert not out.victims  # lo may not preempt hi
    assert sched.last is not None and sched.last.pending == {"lo": 1}


def test_without_priority_classes_the_queue_is_fifo_and_nothing_is_preempted() -> None:
    sched, state = blocked_node(priority_classes=False)
    out = tick(sched, state, {"top": 0, "lo": 1, "hi": 1}, T0 + 2000)
    assert out.bindings == {"lo": ("c1",)}  # queued first
    assert out.grants["hi"] == 0 and not out.victims and not out.preemptions


def test_pod_that_fits_on_no_single_node_stays_pending() -> None:
    # 4 GPUs free in all, 2 + 2 on two nodes: an instance of 4 GPUs fits nowhere (fragmentation).
    state = fleet({"c1": 4, "c2": 4}, {"a": 10, "b": 10}, {"small": ("a", 2), "big": ("b", 4)})
    add(state, "s-1", "small", "c1")
    add(state, "s-2", "small", "c2")
    sched = KubeScheduler()
    out = tick(sched, state, {"small": 2, "big": 1}, T0)
    assert out.grants == {"big": 0, "small": 2}
    assert not out.bindings and not out.victims
    assert sched.last is not None and sched.last.pending == {"big": 1}


def test_binds_least_allocated_and_spread_nodes_and_the_plan_creates_there() -> None:
    state = fleet({"c1": 8, "c2": 8, "c3": 8}, {"a": 10}, {"d": ("a", 2)})
    add(state, "d-0", "d", "c1")
    sched = KubeScheduler()
    cfg = r.ReconcileConfig(allocator=sched, decider=lambda st, d, sig, now: _target(st, d, 3))
    p = r.plan(state, {DeploymentId("d"): None}, {}, T0, cfg)
    creates = [cmd for cmd in p.commands if isinstance(cmd, c.CreateInstance)]
    assert sorted(cmd.cluster_id for cmd in creates) == ["c2", "c3"]  # the emptier, unspread nodes
    assert p.grants == ((DeploymentId("d"), 3, 0),)
    assert p.preemptions == ()


def _target(state: ControlState, d: Deployment, n: int):
    from controlplane.core import scaling

    return scaling.ScaleDecision(n, 0, state.memory_of(d.id), scaling.ScaleReason.SCALE_UP, f"test: {n}")


# --- preemption -------------------------------------------------------------------------------------


def full_node() -> ControlState:
    """One 8-GPU node, full: ``mid`` (priority 20, one 4-GPU pod) and ``lo`` (priority 10, an old and
    a new 2-GPU pod). ``hi`` (priority 100) wants one 2-GPU pod."""
    state = fleet({"c1": 8}, {"hi-t": 100, "mid-t": 20, "lo-t": 10},
                  {"hi": ("hi-t", 2), "mid": ("mid-t", 4), "lo": ("lo-t", 2)})
    add(state, "mid-0", "mid", "c1", at_ms=T0 - 90_000)
    add(state, "lo-old", "lo", "c1", at_ms=T0 - 80_000)
    add(state, "lo-new", "lo", "c1", at_ms=T0 - 10_000)
    return state


def test_victims_are_the_fewest_lower_priority_pods_reprieved_most_important_first() -> None:
    state = full_node()
    sched = KubeScheduler()
    out = tick(sched, state, {"hi": 1, "mid": 1, "lo": 2}, T0)
    # All three removed, then added back: mid (highest priority) fits, lo-old (older) fits, lo-new not.
    assert victims_of(out) == ["lo-new"]
    assert out.victims[0].drain_deadline_ms == T0 + GRACE
    assert out.preemptions == (("hi", "lo", 1),)
    assert out.grants == {"hi": 0, "mid": 1, "lo": 1}  # hi waits for its victim: nominated, not bound
    assert not out.bindings
    assert sched.last is not None and sched.last.nominated == {"hi": ("c1",)}


def test_equal_priority_never_preempts() -> None:
    state = fleet({"c1": 2}, {"a": 50, "b": 50}, {"da": ("a", 2), "db": ("b", 2)})
    add(state, "a-0", "da", "c1")
    sched = KubeScheduler()
    out = tick(sched, state, {"da": 1, "db": 1}, T0)
    assert not out.victims and out.grants["db"] == 0


def test_preemption_policy_never_waits_instead_of_preempting() -> None:
    sched = KubeScheduler(preemption_policy="Never")
    out = tick(sched, full_node(), {"hi": 1, "mid": 1, "lo": 2}, T0)
    assert not out.victims and out.grants["hi"] == 0


def test_priority_classes_off_never_preempts() -> None:
    sched = KubeScheduler(priority_classes=False)
    out = tick(sched, full_node(), {"hi": 1, "mid": 1, "lo": 2}, T0)
    assert not out.victims and not out.preemptions and out.grants["hi"] == 0


def test_plan_drains_victims_preempted_with_the_termination_grace() -> None:
    state = full_node()
    sched = KubeScheduler(termination_grace_ms=45_000)
    targets = {"hi": 1, "mid": 1, "lo": 2}
    cfg = r.ReconcileConfig(allocator=sched, decider=lambda st, d, sig, now: _target(st, d, targets[d.id]))
    p = r.plan(state, {d: None for d in state.deployments}, {}, T0, cfg)
    drains = [cmd for cmd in p.commands if isinstance(cmd, c.TransitionInstance) and cmd.event is E.DRAIN]
    assert drains == [c.TransitionInstance(InstanceId("lo-new"), E.DRAIN, T0, drain_deadline_ms=T0 + 45_000, preempted=True)]
    assert p.preemptions == (("hi", "lo", 1),)
    assert not [cmd for cmd in p.commands if isinstance(cmd, c.CreateInstance)]  # the victim still holds its GPUs


def test_nominated_capacity_is_not_taken_by_a_lower_priority_pod_and_the_preemptor_binds_there() -> None:
    # 4-GPU node with two 2-GPU lo pods; hi needs 4: both are victims.
    state = fleet({"c1": 4}, {"hi-t": 100, "mid-t": 50, "lo-t": 10}, {"hi": ("hi-t", 4), "mid": ("mid-t", 2), "lo": ("lo-t", 2)})
    add(state, "lo-1", "lo", "c1")
    add(state, "lo-2", "lo", "c1")
    sched = KubeScheduler()
    targets = {"hi": 1, "mid": 0, "lo": 2}
    out = tick(sched, state, targets, T0)
    assert sorted(victims_of(out)) == ["lo-1", "lo-2"]
    for iid in victims_of(out):
        drain(state, iid, T0, T0 + GRACE)
    # One victim is gone, the other still terminating; mid (50) now asks for 2 GPUs, lo's ReplicaSet
    # replaces its pods. 2 GPUs are free, but they are hi's nominated capacity.
    gone(state, "lo-1", T0 + 500)
    targets = {"hi": 1, "mid": 1, "lo": 2}
    out = tick(sched, state, targets, T0 + 1000)
    assert not out.bindings and not out.victims  # hi waits (not eligible: its victim terminates)
    assert out.grants == {"hi": 0, "mid": 0, "lo": 0}
    assert sched.last is not None and sched.last.nominated == {"hi": ("c1",)}
    gone(state, "lo-2", T0 + 1500)
    out = tick(sched, state, targets, T0 + 2000)
    assert out.bindings == {"hi": ("c1",)} and out.grants["hi"] == 1
    assert not out.victims  # mid and lo stay Pending: nothing below them to take
    assert sched.last is not None and sched.last.pending == {"lo": 2, "mid": 1}


def test_preemption_picks_the_node_with_the_lowest_priority_victims() -> None:
    state = fleet({"c1": 2, "c2": 2}, {"hi-t": 100, "mid-t": 20, "lo-t": 10},
                  {"hi": ("hi-t", 2), "mid": ("mid-t", 2), "lo": ("lo-t", 2)})
    add(state, "mid-0", "mid", "c1")
    add(state, "lo-0", "lo", "c2")
    out = tick(KubeScheduler(), state, {"hi": 1, "mid": 1, "lo": 1}, T0)
    assert victims_of(out) == ["lo-0"]


def inst(iid: str, created_ms: int, tenant: str) -> Instance:
    return Instance(InstanceId(iid), DeploymentId("d-" + tenant), TenantId(tenant), ClusterId("c"), ZoneId("z"), H100, 1,
                    S.READY, InitMethod.COLD, created_ms, created_ms)


PRIO = {"p0": 0, "p5": 5, "p10": 10, "p20": 20}


def prio(i: Instance) -> int:
    return PRIO[i.tenant]


N1, N2 = (ClusterId("n1"), H100), (ClusterId("n2"), H100)


def test_pick_one_node_lowest_highest_victim_priority_first() -> None:
    a = (N1, [inst("a1", 0, "p20")])
    b = (N2, [inst("b1", 0, "p10"), inst("b2", 0, "p10"), inst("b3", 0, "p10")])
    assert pick_one_node([a, b], prio)[0] == N2  # more victims, but lower priority


def test_pick_one_node_then_lowest_sum_of_priorities() -> None:
    a = (N1, [inst("a1", 0, "p10"), inst("a2", 0, "p10")])
    b = (N2, [inst("b1", 0, "p10"), inst("b2", 0, "p5")])
    assert pick_one_node([a, b], prio)[0] == N2


def test_pick_one_node_then_fewest_victims() -> None:
    # With kube's +2^31 offset per victim, fewer victims always has the smaller sum: the sum decides.
    a = (N1, [inst("a1", 0, "p10"), inst("a2", 0, "p0")])
    b = (N2, [inst("b1", 0, "p10")])
    assert pick_one_node([a, b], prio)[0] == N2


def test_pick_one_node_then_latest_start_of_the_highest_priority_victims() -> None:
    a = (N1, [inst("a1", 100, "p10"), inst("a2", 900, "p5")])
    b = (N2, [inst("b1", 200, "p10"), inst("b2", 50, "p5")])
    assert pick_one_node([a, b], prio)[0] == N2  # its p10 victim started later (200 > 100)


def test_pick_one_node_then_the_first_candidate() -> None:
    a = (N1, [inst("a1", 100, "p10")])
    b = (N2, [inst("b1", 100, "p10")])
    assert pick_one_node([a, b], prio)[0] == N1
    assert pick_one_node([b, a], prio)[0] == N2


# --- ResourceQuota ----------------------------------------------------------------------------------


def test_resource_quota_rejects_pods_beyond_quota_plus_borrow_limit() -> None:
    state = fleet({"c1": 16}, {"a": 10}, {"d": ("a", 2)}, quota={"a": (4, 2)})
    sched = KubeScheduler()
    out = tick(sched, state, {"d": 5}, T0)
    assert out.grants["d"] == 3  # 6 GPUs admitted
    assert sched.last is not None and sched.last.quota_rejected == {"d": 2}
    assert KubeScheduler(quota="quota").allocate(_req(state, {"d": 5})).grants["d"] == 2
    assert KubeScheduler(quota="none").allocate(_req(state, {"d": 5})).grants["d"] == 5


def _req(state: ControlState, targets: Mapping[str, int]) -> AllocationRequest:
    deps = tuple(state.deployments[k] for k in sorted(state.deployments))
    return AllocationRequest(state, deps, {d.id: targets.get(d.id, 0) for d in deps}, have(state), frozenset(), T0, GRACE)


def test_resource_quota_counts_pending_pods_and_terminating_ones_until_their_grace_ends() -> None:
    state = fleet({"c1": 2}, {"a": 10}, {"d": ("a", 2)}, quota={"a": (4, 0)})
    add(state, "d-0", "d", "c1")
    sched = KubeScheduler()
    out = tick(sched, state, {"d": 3}, T0)  # 1 bound + 1 Pending (no node room) = 4 GPUs
    assert out.grants["d"] == 1
    assert sched.last is not None and sched.last.pending == {"d": 1} and sched.last.quota_rejected == {"d": 1}
    drain(state, "d-0", T0 + 100, T0 + 10_000, preempted=False)
    # Its ReplicaSet replaces the deleted pod, but the terminating pod still counts: 2 + 2 pending.
    tick(sched, state, {"d": 3}, T0 + 1000)
    assert sched.last.quota_rejected == {"d": 2} and sched.last.pending == {"d": 1}
    tick(sched, state, {"d": 3}, T0 + 10_001)  # its grace has passed: it no longer counts
    assert sched.last.quota_rejected == {"d": 1} and sched.last.pending == {"d": 2}


def test_scale_down_deletes_unscheduled_pods_first_newest_first() -> None:
    state = fleet({"c1": 2}, {"a": 10}, {"d": ("a", 2)})
    add(state, "d-0", "d", "c1")
    sched = KubeScheduler()
    tick(sched, state, {"d": 3}, T0)
    tick(sched, state, {"d": 4}, T0 + 1000)
    assert sched.last is not None and sched.last.pending == {"d": 3}
    out = tick(sched, state, {"d": 2}, T0 + 2000)
    assert out.grants["d"] == 1 and sched.last.pending == {"d": 1}
    assert [p.queued_ms for p in sched._pending[DeploymentId("d")]] == [T0]  # the oldest is kept


# --- options, determinism ---------------------------------------------------------------------------


def test_bad_options_are_named() -> None:
    with pytest.raises(ValidationError, match="preemption_policy"):
        KubeScheduler(preemption_policy="Sometimes")
    with pytest.raises(ValidationError, match="quota"):
        KubeScheduler(quota="soft")
    with pytest.raises(ValidationError, match="termination_grace_ms"):
        KubeScheduler(termination_grace_ms=-1)


def test_same_inputs_same_decisions() -> None:
    def run() -> list[ExternalAllocation]:
        state = full_node()
        sched = KubeScheduler()
        outs = []
        for k, targets in enumerate(({"hi": 1, "mid": 1, "lo": 2}, {"hi": 2, "mid": 1, "lo": 3}, {"hi": 1, "mid": 2, "lo": 1})):
            out = tick(sched, state, targets, T0 + 1000 * k)
            outs.append(out)
            for v in out.victims:
                drain(state, v.instance_id, T0 + 1000 * k, v.drain_deadline_ms)
            bind(state, out, T0 + 1000 * k)
        return outs

    assert run() == run()


# --- the seam in the plan ---------------------------------------------------------------------------


def test_the_product_allocation_reports_its_preemptions_in_the_plan() -> None:
    state = fleet({"c1": 4}, {"hi-t": 100, "lo-t": 10}, {"hi": ("hi-t", 1), "lo": ("lo-t", 1)},
                  quota={"hi-t": (4, 0), "lo-t": (0, 4)})
    for k in range(4):
        add(state, f"lo-{k}", "lo", "c1")
    targets = {"hi": 2, "lo": 4}
    cfg = r.ReconcileConfig(decider=lambda st, d, sig, now: _target(st, d, targets[d.id]))
    p = r.plan(state, {d: None for d in state.deployments}, {}, T0, cfg)
    assert p.preemptions == (("hi", "lo", 2),)
    assert len([cmd for cmd in p.commands if isinstance(cmd, c.TransitionInstance) and cmd.preempted]) == 2


def test_a_node_behind_an_open_breaker_gets_no_pods() -> None:
    from controlplane.core import breaker as br
    from controlplane.domain.records import BreakerPhase, BreakerRecord

    state = fleet({"c1": 4, "c2": 4}, {"a": 10}, {"d": ("a", 1)})
    rec = BreakerRecord(BreakerPhase.OPEN, trips=1, open_until_ms=T0 + 60_000, changed_ms=T0 - 1000)
    commit(state, [c.PutBreaker(br.breaker_key("cluster", "c1"), rec)])
    out = tick(KubeScheduler(), state, {"d": 2}, T0)
    assert out.bindings == {"d": ("c2", "c2")}


# --- properties against a naive reference -----------------------------------------------------------

PODS = st.lists(st.tuples(st.sampled_from([5, 10, 20, 100]), st.sampled_from([1, 2, 4]), st.integers(0, 50)),
                min_size=1, max_size=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=PODS, need=st.sampled_from([1, 2, 4, 8]), prio=st.sampled_from([10, 20, 100]))
def test_victims_are_lower_priority_enough_and_none_could_be_spared(
    pods: list[tuple[int, int, int]], need: int, prio: int
) -> None:
    """On one node filled with pods (priority, GPUs, age), the victims for a pod of ``need`` GPUs and
    priority ``prio``: all of strictly lower priority; removing them makes room; giving back any one
    of them would not (the reprieve is greedy, so this is what "minimal" means in kube too)."""
    capacity = sum(g for _, g, _ in pods)
    tenants = {f"p{p}": p for p in {p for p, _, _ in pods} | {prio}}
    deps = {f"d{k}": (f"p{p}", g) for k, (p, g, _) in enumerate(pods)}
    deps["new"] = (f"p{prio}", need)
    state = fleet({"c1": capacity}, tenants, deps)
    for k, (_, _, age) in enumerate(pods):
        add(state, f"i{k}", f"d{k}", "c1", at_ms=T0 - 60_000 - age)
    sched = KubeScheduler()
    out = tick(sched, state, {**{f"d{k}": 1 for k in range(len(pods))}, "new": 1}, T0)
    victims = {v.instance_id for v in out.victims}
    lower = sum(g for p, g, _ in pods if p < prio)
    if lower < need:
        assert not victims and out.grants["new"] == 0
        return
    assert victims, "a pod that fits once the lower-priority pods are gone must preempt"
    by_id = {f"i{k}": (p, g) for k, (p, g, _) in enumerate(pods)}
    assert all(by_id[v][0] < prio for v in victims)
    freed = sum(by_id[v][1] for v in victims)
    assert freed >= need
    assert all(freed - by_id[v][1] < need for v in victims)
    assert out.preemptions == tuple(sorted(
        (("new", f"d{k}", 1) for k in range(len(pods)) if f"i{k}" in victims)
    ))


def test_statistics_count_what_happened() -> None:
    state = full_node()
    sched = KubeScheduler()
    out = tick(sched, state, {"hi": 1, "mid": 1, "lo": 2}, T0)
    drain(state, "lo-new", T0, out.victims[0].drain_deadline_ms)
    # hi waits for lo-new (no second preemption); lo's ReplicaSet replaces it with a Pending pod.
    tick(sched, state, {"hi": 1, "mid": 1, "lo": 2}, T0 + 1000)
    s = sched.statistics()
    assert (s.ticks, s.pods_created, s.preemptions, s.victims, s.pods_bound, s.pending_pod_ticks) == (2, 2, 1, 1, 0, 3)
