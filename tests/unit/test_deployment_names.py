"""Per-tenant deployment names in the pure layers (docs/api.md "Deployment names"): qualified ids
``<tenant>/<name>`` validate each part, two tenants can both own ``chat`` through the state machine,
the planner and the adapter command path, and what is derived from an id (instance ids) is a valid
DNS-1123 label without '/', distinct across tenants; legacy (unqualified) ids keep working."""

from __future__ import annotations

import random
import re

import pytest

from adapters.backend import FenceToken, InstanceCommand, InstanceSpec, ScaleCommand
from adapters.kubernetes import WorkloadConfig
from adapters.simulated import LoadStep, SimDeploymentConfig, SimulatedBackend, SimulatedConfig
from controlplane.core import reconcile as r
from controlplane.domain import commands as c
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import (
    INSTANCE_PREFIX_CHARS,
    ClusterId,
    DeploymentId,
    PoolId,
    TenantId,
    ZoneId,
    deployment_id_problem,
    id_problem,
    instance_prefix,
    local_name,
    qualified_id,
    split_deployment_id,
)
from controlplane.domain.instances import InstanceEvent
from controlplane.domain.observations import InstanceReport, Observations
from controlplane.domain.state import ControlState, apply, snapshot
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.topology import Cluster
from raft import codec

H100 = PoolId("h100")
MODEL = "llama3-8b-h100"
T0 = 1_700_000_000_000


def deployment(did: str, tenant: str, **kw: object) -> Deployment:
    return Deployment(DeploymentId(did), TenantId(tenant), Engine.VLLM, MODEL, H100, 1, **kw)  # type: ignore[arg-type]


def commit(state: ControlState, *commands: c.Command) -> None:
    for cmd in commands:
        result = apply(state, codec.decode(codec.encode(cmd)))  # through the codec, as a replica applies it
        assert result.ok, f"{cmd}: {result.error}"


# --- ids ----------------------------------------------------------------------------------------------


def test_qualified_ids_validate_each_part_and_say_which() -> None:
    assert deployment_id_problem("alpha/chat") is None
    assert deployment_id_problem("chat") is None  # a legacy / scenario id
    assert deployment_id_problem(f"{'a' * 63}/{'b' * 63}") is None
    assert split_deployment_id("alpha/chat") == ("alpha", "chat") and split_deployment_id("chat") == (None, "chat")
    assert local_name("alpha/chat") == local_name("chat") == "chat"
    assert qualified_id("alpha", "chat") == "alpha/chat"
    cases = {
        "alpha/": "'alpha/' is not '<tenant>/<name>': its name part must not be empty",
        "/chat": "'/chat' is not '<tenant>/<name>': its tenant part must not be empty",
        "Alpha/chat": "its tenant part 'Alpha' is not a valid id",
        "alpha/b/c": "its name part 'b/c' is not a valid id",
        f"alpha/{'x' * 64}": "its name part must be at most 63 characters, got 64",
        "alpha/chat\n": "its name part 'chat\\n' is not a valid id",
    }
    for value, problem in cases.items():
        got = deployment_id_problem(value)
        assert got is not None and problem in got, (value, got)
    assert deployment_id_problem(7) == "must be a string, got int"


def test_a_deployment_id_names_its_own_tenant() -> None:
    assert deployment("alpha/chat", "alpha").id == "alpha/chat"
    with pytest.raises(ValidationError) as err:
        deployment("alpha/chat", "bravo")
    assert err.value.field == "deployment.id"
    assert err.value.problem == "'alpha/chat' names tenant 'alpha', but the deployment's tenant is 'bravo'"
    with pytest.raises(ValidationError) as err:
        deployment("alpha/Chat", "alpha")
    assert err.value.field == "deployment.id" and "name part 'Chat'" in err.value.problem


def test_instance_prefixes_are_labels_without_slash_and_distinct_across_tenants() -> None:
    assert instance_prefix("chat") == "chat"  # legacy: unchanged, so simulator runs stay byte-for-byte the same
    assert instance_prefix("x" * 63) == "x" * 40
    ids = ["alpha/chat", "bravo/chat", "a/b-c", "a-b/c", f"{'t' * 63}/{'n' * 62}a", f"{'t' * 63}/{'n' * 62}b", "alpha-chat"]
    prefixes = [instance_prefix(i) for i in ids]
    assert len(set(prefixes)) == len(ids), prefixes  # '/' -> '-' and cutting alone would collide
    for did, prefix in zip(ids, prefixes, strict=True):
        assert "/" not in prefix and len(prefix) <= INSTANCE_PREFIX_CHARS
        assert id_problem(f"{prefix}-{T0}-99") is None, did
    assert instance_prefix("alpha/chat") == instance_prefix("alpha/chat")  # stable (a hash, not a counter)


# --- two tenants, one name, through the state machine, the planner and an adapter ----------------


def two_chats() -> ControlState:
    state = ControlState()
    commit(state, c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={H100: 8})))
    for t in ("alpha", "bravo"):
        commit(state, c.PutTenant(Tenant(TenantId(t), 10, {H100: 4}, {H100: 0})),
               c.PutDeployment(deployment(qualified_id(t, "chat"), t, min_replicas=2, warm_pool=0), c.MUST_NOT_EXIST, 0))
    return state


def test_two_tenants_own_chat_end_to_end_with_valid_distinct_instance_ids() -> None:
    state = two_chats()
    assert sorted(state.deployments) == ["alpha/chat", "bravo/chat"]
    # a create of the same qualified id is refused; the other tenant's is another id
    refused = apply(state, c.PutDeployment(deployment("alpha/chat", "alpha"), c.MUST_NOT_EXIST, 0))
    assert not refused.ok and refused.code == "already_exists"
    plan = r.plan(state, {d: None for d in state.deployments}, {}, T0, r.ReconcileConfig())
    creates = [x for x in plan.commands if isinstance(x, c.CreateInstance)]
    assert sorted(x.deployment_id for x in creates) == ["alpha/chat"] * 2 + ["bravo/chat"] * 2
    commit(state, *plan.commands)
    iids = [x.instance_id for x in creates]
    assert len(set(iids)) == 4
    for iid in iids:
        assert id_problem(iid) is None and "/" not in iid, iid
    assert {state.instances[i].deployment for i in iids} == {"alpha/chat", "bravo/chat"}
    assert {state.instances[i].tenant for i in iids} == {"alpha", "bravo"}
    # the snapshot keeps both, and reads back equal
    again, _ = codec.decode_state(codec.encode_state(state, _lease()))
    assert snapshot(again) == snapshot(state)

    # the adapter command path: one simulated cluster serving both tenants' chat
    sim = SimulatedBackend("c1", SimulatedConfig(seed=1, deployments=[
        SimDeploymentConfig(deployment=d, cold_start_ms=10, warm_start_ms=5, load=[LoadStep(at_s=0, rps=0)])
        for d in ("alpha/chat", "bravo/chat")]), clock_ms=lambda: T0)
    fence = FenceToken(1, 1, "n1")
    for k, iid in enumerate(iids):
        inst = state.instances[iid]
        sim.apply(InstanceCommand(f"r{k}", "create", InstanceSpec(inst.id, inst.deployment, inst.tenant), fence, 0), T0)
    sim.scale(ScaleCommand("s1", "bravo/chat", 3, (), fence), T0)
    reports = sim.observe(T0 + 1_000).reports
    started = {x.instance_id for x in reports if x.event == "start_warmup"}
    assert set(iids) <= started and len(started) == 5
    for iid in started:
        assert id_problem(iid) is None and "/" not in iid, iid
    [added] = started - set(iids)
    assert added.startswith(instance_prefix("bravo/chat") + "-s1-")


def test_warmup_failures_of_a_qualified_id_open_its_own_breaker() -> None:
    """Breaker keys join parts with '/': a qualified id is two parts, a legacy id one, so keys never
    collide and never fail (the demo found ``tick_failed: breaker_key.parts[1]: 'bronze/batch'``)."""
    assert r.deployment_key("c1", "alpha/chat") == "deployment/c1/alpha/chat"
    assert r.deployment_key("c1", "chat") == "deployment/c1/chat"  # as before: existing records still apply
    assert r.deployment_key("c1", "alpha-chat") != r.deployment_key("c1", "alpha/chat")
    state = two_chats()
    plan = r.plan(state, {d: None for d in state.deployments}, {}, T0, r.ReconcileConfig())
    commit(state, *plan.commands)
    mine = sorted(i.id for i in state.instances_of(DeploymentId("bravo/chat")))
    commit(state, *(c.TransitionInstance(i, InstanceEvent.START_WARMUP, T0 + 1) for i in mine))
    failed = Observations(T0 + 10, reports=tuple(InstanceReport(i, InstanceEvent.WARMUP_FAILED.value, T0 + 10 + k)
                                                 for k, i in enumerate(mine)))
    out = r.facts(state, failed, (), T0 + 20, r.ReconcileConfig(), random.Random(7))
    commit(state, *out)
    touched = [x.key for x in out if isinstance(x, c.PutBreaker)]
    assert touched and set(touched) == {"deployment/c1/bravo/chat"}, touched


def _lease():  # type: ignore[no-untyped-def]
    from raft.lease import LeaseRecord

    return LeaseRecord("", 0, 0, 0)


# --- legacy (unqualified) ids ---------------------------------------------------------------------


def test_state_with_legacy_ids_decodes_and_keeps_running_beside_qualified_ones() -> None:
    """Entries and snapshots written before names were per tenant hold unqualified ids: they decode
    to the same values, keep their instance ids, and live beside qualified ids of other tenants."""
    state = ControlState()
    commit(state, c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={H100: 8})),
           c.PutTenant(Tenant(TenantId("alpha"), 10, {H100: 4}, {H100: 0})),
           c.PutTenant(Tenant(TenantId("bravo"), 10, {H100: 4}, {H100: 0})))
    # a put_deployment exactly as the build at COMMAND_VERSION 4 (before per-tenant names) encoded it
    legacy = (
        b'{"f":{"at_ms":0,"deployment":{"created_ms":0,"deleting":false,"engine":"vllm","gpus_per_instance":1,'
        b'"id":"chat","max_replicas":64,"min_replicas":1,"model":"llama3-8b-h100","policy":{"ewma_half_life_ms":4000,'
        b'"max_step_down":2,"max_step_up":32,"panic_hold_ms":30000,"panic_threshold":1.6,"panic_window_ms":3000,'
        b'"scale_down_cooldown_ms":5000,"scale_down_stabilization_ms":600000,"stable_window_ms":30000,'
        b'"target_concurrency":24.0,"target_kv_usage":0.7,"target_token_utilization":0.9,"tolerance":0.1,'
        b'"ttft_slo_weight":1.0},"pool":"h100","tenant":"alpha","warm_pool":0},"expect_version":0},'
        b'"k":"put_deployment","v":2}')
    cmd = codec.decode(legacy)
    assert isinstance(cmd, c.PutDeployment) and cmd.deployment.id == "chat" and cmd.deployment.tenant == "alpha"
    assert codec.encode(cmd) == legacy  # and this build writes it back byte for byte
    assert apply(state, cmd).ok
    commit(state, c.PutDeployment(deployment("bravo/chat", "bravo", warm_pool=0), c.MUST_NOT_EXIST, 0))
    plan = r.plan(state, {d: None for d in state.deployments}, {}, T0, r.ReconcileConfig())
    commit(state, *plan.commands)
    by_dep = {d: sorted(i.id for i in state.instances_of(DeploymentId(d))) for d in ("chat", "bravo/chat")}
    [legacy_iid] = by_dep["chat"]
    assert re.fullmatch(rf"chat-{T0}-\d+", legacy_iid)  # the legacy id's instance ids are what they always were
    assert len(by_dep["bravo/chat"]) == 1 and by_dep["bravo/chat"][0].startswith(instance_prefix("bravo/chat"))
    again, _ = codec.decode_state(codec.encode_state(state, _lease()))
    assert snapshot(again) == snapshot(state)


# --- adapter configuration ---------------------------------------------------------------------------


def test_kubernetes_workloads_name_qualified_or_legacy_ids_and_refuse_bad_ones() -> None:
    def workload(dep: str) -> WorkloadConfig:
        return WorkloadConfig(deployment=dep, namespace="serving", kind="Deployment", name="chat-vllm",
                              engine="vllm", port=8000)

    assert workload("team-a/chat").deployment == "team-a/chat"
    assert workload("chat").deployment == "chat"
    for bad, why in (("team-a/", "its name part must not be empty"), ("Team/chat", "its tenant part 'Team'")):
        with pytest.raises(ValueError, match="deployment") as err:
            workload(bad)
        assert why in str(err.value), str(err.value)
