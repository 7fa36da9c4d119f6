"""``dry_run``: what applying a deployment spec would do now, computed from the replicated state and
the given signals only, without writing anything."""

from __future__ import annotations

import copy
import dataclasses

from controlplane.core.dryrun import DryRunOutcome, dry_run, field_changes
from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, PoolId, TenantId, ZoneId
from controlplane.domain.state import snapshot
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Tenant
from controlplane.domain.topology import Cluster
from tests.unit.test_reconcile import (
    MODEL,
    T0,
    S,
    add,
    build,
    cluster,
    commit,
    desired,
    load,
    tenant,
)

H100, A100 = PoolId("h100"), PoolId("a100")


def spec(did: str = "chat", tid: str = "acme", *, gpus: int = 1, pool: PoolId = H100, **kw: object) -> Deployment:
    return Deployment(DeploymentId(did), TenantId(tid), Engine.VLLM, MODEL, pool, gpus, **kw)  # type: ignore[arg-type]


def test_a_new_deployment_lists_every_field_and_starts_at_its_minimum() -> None:
    state = build(cluster("c1", "z1", 8), tenant())
    got = dry_run(state, spec(min_replicas=2, max_replicas=4, warm_pool=1), None, T0)
    assert (got.exists, got.current_replicas, got.target_before, got.target_after, got.warm_pool_after) == (
        False, 0, 0, 2, 1,
    )
    assert got.reason_after == "no_data"
    fields = [f for f, _, _ in got.changes]
    assert fields[:6] == ["id", "tenant", "engine", "model", "pool", "gpus_per_instance"]
    assert "policy.target_concurrency" in fields and "created_ms" not in fields
    assert all(before == "" for _, before, _ in got.changes)
    assert ("engine", "", "vllm") in got.changes and ("deleting", "", "false") in got.changes
    assert got.notes == ("no live signals: the targets assume no load (they keep 2 replicas within bounds)",)


def test_a_policy_change_shows_the_fields_and_the_target_before_and_after_from_the_same_signals() -> None:
    state = build(cluster("c1", "z1", 8), tenant(), c.PutDeployment(spec(max_replicas=8)), desired("chat", 3))
    for k in range(3):
        add(state, f"r{k}", "c1")
    proposed = spec(max_replicas=8, policy=ScalingPolicy(target_concurrency=12.0))
    got = dry_run(state, proposed, load(72, serving=3), T0)
    assert got.exists and got.current_replicas == 3
    assert got.changes == (("policy.target_concurrency", "24.0", "12.0"),)
    assert (got.target_before, got.target_after) == (3, 6)  # 72 / 24 vs 72 / 12
    assert got.reason_after == "panic" and "target 3 -> 6" in got.message_after  # 2x the current 3
    assert got.notes == ()


def test_the_tenant_ceiling_and_borrowing_are_spelled_out_with_the_numbers() -> None:
    state = build(
        cluster("c1", "z1", 16),
        c.PutTenant(Tenant(TenantId("a"), 10, {H100: 4}, {H100: 4})),
        c.PutDeployment(spec("other", "a", min_replicas=1)),
    )
    add(state, "o1", "c1", did="other")  # tenant a already holds 1 GPU elsewhere
    got = dry_run(state, spec("big", "a", gpus=2, min_replicas=0, max_replicas=6), load(120), T0)
    assert got.target_after == 5  # 120 / 24, from 0 replicas
    assert got.notes == (
        ("tenant a may hold 8 h100 GPUs (quota 4 + borrow 4); max_replicas 6 x 2 GPUs = 12 exceeds it: "
        "at most 4 replicas can ever be granted"),
        ("tenant a may hold 8 h100 GPUs (quota 4 + borrow 4); its other deployments hold 1: target 5 x 2 GPUs = 10 "
        "exceeds the 7 left, so at most 3 replicas would be granted"),
        ("target 5 x 2 GPUs + 1 held by its other deployments = 11 is beyond the quota 4: 7 GPUs would be "
        "borrowed (reclaimable when other tenants need their quota)"),
    )


def test_a_minimum_that_does_not_fit_the_free_capacity_is_noted() -> None:
    state = build(cluster("c1", "z1", 4), cluster("c2", "z2", 4), tenant(quota=64))
    add_other = [c.PutDeployment(spec("other")), desired("other", 3)]
    commit(state, add_other)
    for k in range(3):
        add(state, f"o{k}", "c1", did="other")
    got = dry_run(state, spec(min_replicas=6, max_replicas=8, warm_pool=0), None, T0)
    assert got.target_after == 6
    assert got.notes[0] == (
        "min_replicas 6 needs 6 more h100 GPUs (6 new x 1) but only 5 h100 GPUs are free in 2 schedulable "
        "clusters (capacity 8): the rest waits for capacity or preempts lower-priority borrowing"
    )


def test_cordoned_clusters_do_not_count_and_a_missing_pool_is_noted() -> None:
    state = build(cluster("c1", "z1", 8), tenant())
    commit(state, [c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={H100: 8}, cordoned=True))])
    got = dry_run(state, spec(min_replicas=1, max_replicas=4), None, T0)
    assert got.notes[0] == "no schedulable cluster has a h100 pool: no instance can be placed"

    state = build(cluster("c1", "z1", 8), c.PutTenant(Tenant(TenantId("acme"), 10, {A100: 8})))
    got = dry_run(state, spec(pool=A100, gpus=2, max_replicas=4), None, T0)
    assert got.notes[0] == "no schedulable cluster has a a100 pool: no instance can be placed"


def test_changes_the_apply_would_refuse_are_named() -> None:
    state = build(cluster("c1", "z1", 8), tenant(), tenant("other"), c.PutDeployment(spec()))
    got = dry_run(state, spec(gpus=2), None, T0)
    assert got.notes[0] == (
        "refused: pool and gpus_per_instance cannot change (h100 x 1 -> h100 x 2); create a new deployment"
    )
    assert ("gpus_per_instance", "1", "2") in got.changes
    got = dry_run(state, spec(tid="other"), None, T0)
    assert got.notes[0] == "refused: deployment 'chat' belongs to tenant 'acme', not 'other'"
    got = dry_run(state, spec("new", "ghost"), None, T0)
    assert got.notes[0] == "refused: tenant 'ghost' does not exist" and got.target_after == 1

    commit(state, [c.PutDeployment(dataclasses.replace(spec(), deleting=True))])
    got = dry_run(state, spec(), None, T0)
    assert got.notes[0] == "refused: deployment 'chat' is being deleted; it cannot be updated"
    assert (got.target_before, got.target_after) == (0, 1)


def test_dry_run_is_pure() -> None:
    state = build(cluster("c1", "z1", 8), tenant(), c.PutDeployment(spec()), desired("chat", 2))
    add(state, "r1", "c1", S.READY)
    before = copy.deepcopy(snapshot(state))
    first = dry_run(state, spec(max_replicas=3), load(500), T0)
    assert snapshot(state) == before
    assert dry_run(state, spec(max_replicas=3), load(500), T0) == first
    assert isinstance(first, DryRunOutcome) and first.target_after == 3 and first.reason_after == "at_max"


def test_field_changes_render_values_as_text() -> None:
    old = spec()
    new = dataclasses.replace(old, warm_pool=3, policy=ScalingPolicy(panic_threshold=2.0, max_step_up=4))
    assert field_changes(old, new) == (
        ("warm_pool", "1", "3"),
        ("policy.panic_threshold", "1.6", "2.0"),
        ("policy.max_step_up", "32", "4"),
    )
    assert field_changes(old, old) == ()
