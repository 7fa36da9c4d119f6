"""Decision labels name what moved the number (issue 18, point 4): ``preempted`` by whom, ``quota``,
``capacity``, ``breaker``; never ``scale_up`` for a decrease. The plan is run for real on built
states; only the SetDesired labels and messages are checked (the decisions are the planner's)."""

from __future__ import annotations

from controlplane.core import grant_reasons as gr
from controlplane.core import reconcile as r
from controlplane.domain import commands as c
from controlplane.domain.ids import DeploymentId, PoolId, TenantId
from controlplane.domain.records import BreakerPhase, BreakerRecord
from controlplane.domain.tenants import Deployment, Engine, Tenant
from tests.unit.test_reconcile import (
    MODEL,
    T0,
    add,
    build,
    cluster,
    deployment,
    desired,
    load,
    of_type,
    run_plan,
    tenant,
)


def decision_of(p: r.Plan, did: str) -> c.SetDesired:
    (sd,) = [x for x in of_type(p, c.SetDesired) if x.deployment_id == did]
    return sd


def test_a_preemption_from_7_to_4_is_labeled_preempted_by_the_tenant_that_took_it() -> None:
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
    assert {d: g for d, g, _ in p.grants} == {"g-chat": 4, "s-chat": 4}
    sd = decision_of(p, "s-chat")
    assert (sd.replicas, sd.reason) == (4, "preempted")
    assert sd.message.startswith("preempted by tenant gold (priority 100): granted 4 of 7 replicas x 1 GPUs; ")
    assert decision_of(p, "g-chat").reason == "no_data"  # gold got what it asked for: its own stage stands


def test_a_grant_held_by_quota_and_borrow_limit_is_labeled_quota_with_the_numbers() -> None:
    state = build(cluster("c1", "z1", 8), tenant(quota=2, borrow=1), deployment(), desired("chat", 2))
    add(state, "r1", "c1")
    add(state, "r2", "c1")
    p = run_plan(state, {"chat": load(144, serving=2)})
    sd = decision_of(p, "chat")
    assert sd.replicas == 3 and sd.reason == "quota"
    assert "tenant acme's h100 quota 2 + borrow limit 1 = 3 GPUs, 3 granted to its deployments: granted 3 of" in sd.message


def test_a_pool_no_cluster_has_is_labeled_capacity_naming_the_pools_that_exist() -> None:
    a100 = c.PutDeployment(Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, MODEL, PoolId("a100"), 1))
    state = build(cluster("c1", "z1", 8), c.PutTenant(Tenant(TenantId("acme"), 10, {PoolId("a100"): 4})), a100)
    sd = decision_of(run_plan(state), "chat")
    assert (sd.replicas, sd.reason) == (0, "capacity")
    assert sd.message.startswith("no schedulable cluster has a100 GPUs (pools with capacity: h100): granted 0 of 1")
    assert "allocation granted" not in sd.reason


def test_a_full_pool_is_labeled_capacity_naming_who_holds_it() -> None:
    state = build(cluster("c1", "z1", 2), tenant(), deployment(), desired("chat", 1))
    add(state, "r1", "c1")
    sd = decision_of(run_plan(state, {"chat": load(144)}), "chat")
    assert sd.reason == "capacity" and sd.message.startswith("pool h100 full: 2 of 2 GPUs granted: granted 2 of")


def test_gpus_behind_an_open_breaker_are_labeled_breaker() -> None:
    state = build(cluster("c1", "z1", 4), cluster("c2", "z2", 2), tenant(), deployment(), desired("chat", 1))
    add(state, "r1", "c2")
    open_ = BreakerRecord(BreakerPhase.OPEN, trips=1, open_until_ms=T0 + 60_000, changed_ms=T0 - 1_000)
    state.breakers[r.cluster_key("c1")] = open_
    sd = decision_of(run_plan(state, {"chat": load(144)}), "chat")
    assert sd.reason == "breaker"
    assert sd.message.startswith("4 h100 GPUs sit behind open breakers (clusters c1): granted 2 of")


def test_a_decrease_is_never_labeled_scale_up() -> None:
    # The load asks for 8 (scale_up), the tenant's lowered quota holds 3: 6 -> 3 is a decrease.
    state = build(cluster("c1", "z1", 8), tenant(quota=3), deployment(), desired("chat", 6))
    for k in range(6):
        add(state, f"r{k}", "c1")
    sd = decision_of(run_plan(state, {"chat": load(24 * 8, serving=6)}), "chat")
    assert sd.replicas == 3 and sd.reason == "quota"


def test_the_stage_label_follows_the_direction() -> None:
    assert gr._direction("scale_up", 3, 6) == "scale_down"
    assert gr._direction("scale_down", 6, 3) == "scale_up"
    assert gr._direction("scale_up", 6, 3) == "scale_up"
    assert gr._direction("panic", 2, 6) == "panic"
    assert gr._direction("scale_up", 3, None) == "scale_up"


def test_a_full_grant_keeps_the_scaling_stage_and_builds_no_facts() -> None:
    state = build(cluster("c1", "z1", 8), tenant(), deployment(), desired("chat", 1))
    labels = gr.Labeler(state, lambda: {DeploymentId("chat"): 4}, (), lambda: (_ for _ in ()).throw(AssertionError("built")))
    d = state.deployments[DeploymentId("chat")]
    assert labels.label(d, "panic", 4, 4, 1) == ("panic", "")
