"""Status conditions (core/conditions.py) on built states: what each says, with which names and
numbers, and since when (the record that set it, never the time of the read)."""

from __future__ import annotations

from controlplane.core import conditions as cc
from controlplane.core import reconcile as r
from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import InstanceEvent, InstanceState
from controlplane.domain.records import BreakerPhase, BreakerRecord
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.topology import Cluster, Zone
from tests.unit.test_reconcile import T0, add, build, cluster, commit, deployment, desired, load, run_plan, tenant

A100 = PoolId("a100")


def by_type(conds: tuple[cc.Condition, ...]) -> dict[str, cc.Condition]:
    return {x.type: x for x in conds}


def dep_conditions(state, did: str = "chat", message: str = "") -> dict[str, cc.Condition]:
    return by_type(cc.deployment_conditions(state, state.deployments[DeploymentId(did)], message))


def test_a_pool_no_cluster_has_is_not_schedulable_naming_pool_model_gpus_and_the_pools_there_are() -> None:
    a100 = c.PutDeployment(Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, "llama3-8b-a100", A100, 1),
                           at_ms=T0)
    state = build(cluster("c1", "z1", 8), c.PutTenant(Tenant(TenantId("acme"), 10, {A100: 4})), a100)
    got = dep_conditions(state)
    s = got["Schedulable"]
    assert (s.status, s.reason) == ("False", "NoCapacityInPool")
    assert s.message == ("no registered cluster has capacity in pool a100 (model llama3-8b-a100, 1 GPUs per instance); "
                         "pools: h100 (8 GPUs in 1 cluster(s))")
    assert s.last_transition_ms == T0  # the deployment's write: nothing has changed since
    assert (got["Ready"].status, got["Ready"].reason) == ("False", "NoCapacityInPool")
    assert cc.blocking(cc.deployment_conditions(state, state.deployments[DeploymentId("chat")])).reason == "NoCapacityInPool"


def test_a_model_larger_than_every_cluster_is_not_schedulable() -> None:
    big = c.PutDeployment(Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, "llama3-70b-h100x4",
                                     PoolId("h100"), 4))
    state = build(cluster("c1", "z1", 2), tenant(), big)
    s = dep_conditions(state)["Schedulable"]
    assert (s.status, s.reason) == ("False", "NoCapacityInPool")
    assert "no cluster has 4 h100 GPUs for one instance of model llama3-70b-h100x4 (largest: 2)" == s.message


def test_cordoned_and_draining_clusters_leave_no_schedulable_cluster() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2"), tenant(), deployment())
    commit(state, [c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={PoolId("h100"): 4}, cordoned=True),
                                at_ms=T0 + 5),
                   c.PutZone(Zone(ZoneId("z2"), draining=True, cordoned=True), at_ms=T0 + 9)])
    s = dep_conditions(state)["Schedulable"]
    assert (s.status, s.reason) == ("False", "NoSchedulableCluster")
    assert s.message.endswith("cordoned or draining: c1 (cordoned), c2 (zone z2 draining)")
    assert s.last_transition_ms == T0 + 9


def preempted_state():
    state = build(
        cluster("c1", "z1", 8),
        tenant("silver", priority=10, quota=0, borrow=8),
        tenant("gold", priority=100, quota=4),
        deployment("s-chat", "silver"),
        deployment("g-chat", "gold", min_replicas=4),
        desired("s-chat", 7),
    )
    for k in range(7):
        add(state, f"s-{k}", "c1", did="s-chat")
    p = run_plan(state)
    commit(state, p.commands)
    (sd,) = [x for x in p.commands if isinstance(x, c.SetDesired) and x.deployment_id == "s-chat"]
    return state, sd


def test_a_preempted_deployment_names_the_preempting_tenant_since_the_decision() -> None:
    state, sd = preempted_state()
    got = dep_conditions(state, "s-chat", sd.message)
    p = got["Preempted"]
    assert (p.status, p.reason) == ("True", "PreemptedByTenant")
    assert p.message == ("preempted by tenant gold (priority 100): granted 4 of 7 replicas x 1 GPUs; "
                         "3 preempted instance(s) draining")
    assert p.last_transition_ms == T0 == state.desired[DeploymentId("s-chat")].at_ms
    # without the decision's message (the event log no longer holds it) it still says what happened
    bare = dep_conditions(state, "s-chat")["Preempted"]
    assert bare.status == "True" and "higher-priority tenant" in bare.message
    assert dep_conditions(state, "g-chat")["Preempted"].status == "False"


def test_quota_exceeded_names_quota_and_borrow_limit() -> None:
    state = build(cluster("c1", "z1", 8), tenant(quota=2, borrow=1), deployment(), desired("chat", 2))
    add(state, "r1", "c1")
    add(state, "r2", "c1")
    p = run_plan(state, {"chat": load(144, serving=2)})
    commit(state, p.commands)
    (sd,) = [x for x in p.commands if isinstance(x, c.SetDesired)]
    q = dep_conditions(state, "chat", sd.message)["QuotaExceeded"]
    assert (q.status, q.reason, q.last_transition_ms) == ("True", "TenantCeilingReached", T0)
    assert q.message.startswith("tenant acme's h100 quota 2 + borrow limit 1 = 3 GPUs, 3 granted to its deployments")
    fine = dep_conditions(build(cluster("c1", "z1"), tenant(), deployment(), desired("chat", 1)))["QuotaExceeded"]
    assert fine.status == "False"


def test_an_open_breaker_of_a_usable_cluster_shows_since_it_changed() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z2"), tenant(), deployment())
    state.breakers[r.cluster_key("c2")] = BreakerRecord(BreakerPhase.OPEN, trips=2, changed_ms=T0 - 7)
    state.breakers[r.cluster_key("c1")] = BreakerRecord(BreakerPhase.CLOSED, changed_ms=T0 - 100)
    b = dep_conditions(state)["BreakerOpen"]
    assert (b.status, b.reason, b.last_transition_ms) == ("True", "CircuitOpen", T0 - 7)
    assert b.message == "breakers not closed: cluster c2 (open after 2 trip(s))"
    cl = by_type(cc.cluster_conditions(state, state.clusters[ClusterId("c2")], "a:1", {}, T0))
    assert cl["BreakerOpen"].status == "True" and cl["Ready"].reason == "AdapterDisconnected"


def test_ready_counts_serving_replicas_against_the_desired_ones() -> None:
    state = build(cluster("c1", "z1"), tenant(), deployment(), desired("chat", 2))
    add(state, "r1", "c1", at_ms=T0)
    add(state, "r2", "c1", InstanceState.WARMING, at_ms=T0)
    ready = dep_conditions(state)["Ready"]
    assert (ready.status, ready.reason) == ("False", "ReplicasStarting")
    assert ready.message == "1 of 2 desired replicas serving (1 starting)"
    add(state, "r3", "c1", at_ms=T0 + 50)
    ready = dep_conditions(state)["Ready"]
    assert (ready.status, ready.reason, ready.last_transition_ms) == ("True", "AllReplicasServing", T0 + 50)
    commit(state, [c.TransitionInstance(InstanceId("r1"), InstanceEvent.WORK, T0 + 900)])  # Ready -> Busy
    assert dep_conditions(state)["Ready"].last_transition_ms == T0 + 50  # a flip is no transition of Ready


def test_cluster_adapter_connectivity_from_the_holders_links() -> None:
    state = build(c.PutCluster(cluster("c1", "z1").cluster, at_ms=T0), tenant())
    cl = state.clusters[ClusterId("c1")]

    def adapter(configured: str, links) -> cc.Condition:
        return by_type(cc.cluster_conditions(state, cl, configured, links, T0 + 12_000))["AdapterConnected"]

    none = adapter("", None)
    assert (none.status, none.reason, none.last_transition_ms) == ("False", "NoAdapter", T0)
    assert adapter("127.0.0.1:9", None).status == "Unknown"
    up = adapter("127.0.0.1:9", {ClusterId("c1"): cc.AdapterLink(True, T0 + 500)})
    assert (up.status, up.reason, up.last_transition_ms) == ("True", "Connected", T0 + 500)
    down = adapter("127.0.0.1:9", {ClusterId("c1"): cc.AdapterLink(False, T0)})
    assert (down.status, down.reason, down.message) == ("False", "AdapterDisconnected",
                                                        "adapter 127.0.0.1:9: no observation batch for 12.0 s")
    assert down.last_transition_ms == T0  # the last batch, whatever the time of the read
    assert by_type(cc.cluster_conditions(state, cl, "", None, T0 + 99_999))["Ready"].last_transition_ms == T0


def test_zone_conditions_summarize_their_clusters() -> None:
    state = build(cluster("c1", "z1"), cluster("c2", "z1"), tenant())
    links = {ClusterId("c1"): cc.AdapterLink(True, T0)}
    per = {cid: cc.cluster_conditions(state, state.clusters[cid], "a:1", links, T0) for cid in state.clusters}
    ready, sched = cc.zone_conditions(state, ZoneId("z1"), per)
    assert (ready.status, ready.reason, sched.status) == ("True", "ClustersReady", "True")
    assert ready.message == "1 of 2 clusters ready; not ready: c2 (AdapterDisconnected)"
    commit(state, [c.PutZone(Zone(ZoneId("z1"), cordoned=True), at_ms=T0 + 3)])
    ready, sched = cc.zone_conditions(state, ZoneId("z1"), per)
    assert (sched.status, sched.reason, sched.last_transition_ms) == ("False", "Cordoned", T0 + 3)
    assert (ready.status, ready.reason) == ("False", "Cordoned")
