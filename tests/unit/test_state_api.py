"""What the API writes through ``apply``: optimistic concurrency (``expect_version``), object meta
(``resource_version``, times), zones, tokens, cluster and zone removal, deletion of deployments, and
the ``code`` / ``revision`` of every result. Each rejection leaves the state exactly as it was."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain import commands as c
from controlplane.domain.commands import MUST_NOT_EXIST
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import InstanceEvent
from controlplane.domain.records import BreakerRecord, ObjectMeta
from controlplane.domain.state import CODES, ApplyResult, ControlState, apply, meta_key, snapshot
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.domain.topology import Cluster, Zone


def tenant(tid: str = "acme", priority: int = 10) -> Tenant:
    return Tenant(TenantId(tid), priority, quota={"h100": 8})


def deployment(did: str = "chat", tid: str = "acme", **kw: Any) -> Deployment:
    return Deployment(DeploymentId(did), TenantId(tid), Engine.VLLM, "llama", PoolId("h100"), 2, max_replicas=8, **kw)


def cluster(cid: str = "c1", zone: str = "z1", **kw: Any) -> Cluster:
    return Cluster(ClusterId(cid), ZoneId(zone), capacity={"h100": 8}, **kw)


def token(tid: str = "0123456789ab", role: Role = Role.TENANT, tenant_id: str = "acme") -> TokenRecord:
    return TokenRecord(tid, "a" * 64, role, TenantId(tenant_id) if role is Role.TENANT else "", 5)


def fresh() -> ControlState:
    state = ControlState()
    for cmd in (
        c.PutTenant(tenant("acme"), at_ms=100),
        c.PutTenant(tenant("beta"), at_ms=100),
        c.PutCluster(cluster("c1", "z1"), at_ms=200),
        c.PutDeployment(deployment("chat"), at_ms=300),
    ):
        assert apply(state, cmd).ok, cmd
    return state


def ok(state: ControlState, cmd: c.Command) -> ApplyResult:
    result = apply(state, cmd)
    assert result.ok, result.error
    assert result.code == "" and result.revision == state.applied
    return result


def rejected(state: ControlState, cmd: c.Command, code: str, text: str) -> ApplyResult:
    before = copy.deepcopy(state)
    result = apply(state, cmd)
    assert not result.ok and result.code == code, result
    assert text in result.error, result.error
    assert result.revision == 0
    assert state == before, "a rejected command changed the state"
    return result


def version(state: ControlState, kind: str, ident: str) -> int:
    return state.meta[meta_key(kind, ident)].resource_version


# --- meta ---------------------------------------------------------------------------------------


def test_every_put_stamps_the_revision_and_keeps_the_creation_time() -> None:
    state = fresh()
    assert state.meta == {
        "tenant/acme": ObjectMeta(1, 100, 100),
        "tenant/beta": ObjectMeta(2, 100, 100),
        "cluster/c1": ObjectMeta(3, 200, 200),
        "deployment/chat": ObjectMeta(4, 300, 300),
    }
    ok(state, c.PutBreaker("k", BreakerRecord()))  # counts as a revision, touches no meta
    result = ok(state, c.PutDeployment(deployment("chat", warm_pool=1), expect_version=4, at_ms=900))
    assert result.revision == 6 == state.applied
    assert state.meta["deployment/chat"] == ObjectMeta(6, 300, 900)
    ok(state, c.PutZone(Zone(ZoneId("z1")), at_ms=950))
    assert state.meta["zone/z1"] == ObjectMeta(7, 950, 950)


def test_removes_drop_the_meta() -> None:
    state = fresh()
    ok(state, c.RemoveDeployment(DeploymentId("chat")))
    ok(state, c.RemoveTenant(TenantId("acme")))
    ok(state, c.RemoveCluster(ClusterId("c1")))
    assert list(state.meta) == ["tenant/beta"]


# --- expect_version -----------------------------------------------------------------------------

PUTS = {
    "tenant": lambda v: c.PutTenant(tenant("acme", 3), expect_version=v),
    "deployment": lambda v: c.PutDeployment(deployment("chat", warm_pool=2), expect_version=v),
    "cluster": lambda v: c.PutCluster(cluster("c1", "z1", cordoned=True), expect_version=v),
}
IDS = {"tenant": "acme", "deployment": "chat", "cluster": "c1"}


@pytest.mark.parametrize("kind", sorted(PUTS))
def test_put_with_the_current_version_updates(kind: str) -> None:
    state = fresh()
    ok(state, PUTS[kind](version(state, kind, IDS[kind])))
    assert version(state, kind, IDS[kind]) == state.applied


@pytest.mark.parametrize("kind", sorted(PUTS))
def test_put_with_a_stale_version_is_a_version_mismatch(kind: str) -> None:
    state = fresh()
    current = version(state, kind, IDS[kind])
    result = rejected(state, PUTS[kind](current + 7), "version_mismatch", f"at resource_version {current}, not {current + 7}")
    assert result.error.startswith(f"{kind} '{IDS[kind]}'")


@pytest.mark.parametrize("kind", sorted(PUTS))
def test_create_only_put_refuses_an_existing_object(kind: str) -> None:
    rejected(fresh(), PUTS[kind](MUST_NOT_EXIST), "already_exists", f"{kind} '{IDS[kind]}' already exists")


def test_create_only_put_creates() -> None:
    state = fresh()
    ok(state, c.PutTenant(tenant("gamma"), expect_version=MUST_NOT_EXIST))
    ok(state, c.PutZone(Zone(ZoneId("z9")), expect_version=MUST_NOT_EXIST))
    assert version(state, "zone", "z9") == state.applied


def test_conditional_put_of_a_missing_object_is_not_found() -> None:
    rejected(fresh(), c.PutTenant(tenant("gamma"), expect_version=3), "not_found", "tenant 'gamma' not found")
    rejected(fresh(), c.PutZone(Zone(ZoneId("z9")), expect_version=1), "not_found", "zone 'z9' not found")


@pytest.mark.parametrize(("cmd", "text"), [
    (c.RemoveTenant(TenantId("beta"), expect_version=1), "tenant 'beta' is at resource_version 2, not 1"),
    (c.RemoveCluster(ClusterId("c1"), expect_version=4), "cluster 'c1' is at resource_version 3, not 4"),
    (c.RemoveDeployment(DeploymentId("chat"), expect_version=3), "deployment 'chat' is at resource_version 4"),
])  # fmt: skip
def test_conditional_remove_checks_the_version(cmd: c.Command, text: str) -> None:
    rejected(fresh(), cmd, "version_mismatch", text)
    ok(fresh(), dataclasses.replace(cmd, expect_version=int(text.split("resource_version ")[1].split(",")[0])))


@pytest.mark.parametrize(("cmd", "code", "text"), [
    (c.PutTenant(tenant(), expect_version=-2), "invalid", "expect_version: must be -1 (any), 0 (create)"),
    (c.PutTenant(tenant(), expect_version=True), "invalid", "expect_version: must be"),
    (c.RemoveTenant(TenantId("beta"), expect_version=MUST_NOT_EXIST), "invalid",
     "expect_version: must be -1 (any) or a resource_version for a delete, got 0"),
    (c.PutTenant(tenant(), at_ms=-1), "invalid", "at_ms: must be an integer >= 0, got -1"),
    (c.PutCluster(cluster(), at_ms="now"), "invalid", "at_ms: must be an integer >= 0, got 'now'"),
])  # fmt: skip
def test_malformed_preconditions_are_invalid(cmd: c.Command, code: str, text: str) -> None:
    rejected(fresh(), cmd, code, text)


# --- tenants, deployments -----------------------------------------------------------------------


def test_remove_tenant_takes_its_tokens_along() -> None:
    state = fresh()
    ok(state, c.PutToken(token("00000000000a", Role.TENANT, "beta")))
    ok(state, c.PutToken(token("00000000000b", Role.ADMIN)))
    ok(state, c.PutToken(token("00000000000c", Role.TENANT, "acme")))
    ok(state, c.RemoveTenant(TenantId("beta")))
    assert list(state.tokens) == ["00000000000b", "00000000000c"]


def test_remove_tenant_refuses_while_it_owns_deployments() -> None:
    rejected(fresh(), c.RemoveTenant(TenantId("acme")), "conflict", "still owns deployments ['chat']")


def test_a_deleting_deployment_cannot_be_undeleted_or_created() -> None:
    state = fresh()
    ok(state, c.PutDeployment(deployment("chat", deleting=True), expect_version=4))
    rejected(state, c.PutDeployment(deployment("chat")), "conflict", "deployment 'chat' is being deleted")
    ok(state, c.PutDeployment(deployment("chat", deleting=True)))  # a repeated delete is fine
    rejected(state, c.PutDeployment(deployment("new", deleting=True)), "invalid",
             "deployment.deleting: deployment 'new' does not exist")
    rejected(state, c.CreateInstance(InstanceId("i1"), DeploymentId("chat"), ClusterId("c1"), 0), "conflict",
             "deployment 'chat' is being deleted; it gets no new instances")


def test_deployment_rules_that_stay() -> None:
    state = fresh()
    moved = Deployment(DeploymentId("chat"), TenantId("beta"), Engine.VLLM, "llama", PoolId("h100"), 2, max_replicas=8)
    rejected(state, c.PutDeployment(moved), "conflict", "belongs to tenant 'acme'")
    rejected(state, c.PutDeployment(deployment("x", "ghost")), "not_found", "tenant 'ghost' not found")
    bigger = Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, "llama", PoolId("h100"), 4, max_replicas=8)
    rejected(state, c.PutDeployment(bigger), "invalid", "deployment.pool: pool and gpus_per_instance cannot change")


# --- clusters and zones -------------------------------------------------------------------------


def test_cluster_flags_and_address_update_but_the_zone_cannot_change() -> None:
    state = fresh()
    ok(state, c.PutCluster(cluster("c1", "z1", cordoned=True, draining=True, adapter_address="a:1")))
    assert state.clusters["c1"].cordoned and not state.clusters["c1"].schedulable
    rejected(state, c.PutCluster(cluster("c1", "z2")), "invalid", "cluster.zone: cluster 'c1' is in zone 'z1'")


def test_remove_cluster_refuses_while_instances_run_there() -> None:
    state = fresh()
    ok(state, c.CreateInstance(InstanceId("i1"), DeploymentId("chat"), ClusterId("c1"), 0))
    rejected(state, c.RemoveCluster(ClusterId("c1")), "conflict", "cluster 'c1' still has 1 instances")
    ok(state, c.TransitionInstance(InstanceId("i1"), InstanceEvent.CANCEL, 5))
    assert state.gpus_used == {("c1", "h100"): 0}
    ok(state, c.RemoveCluster(ClusterId("c1")))
    assert "c1" not in state.clusters and state.gpus_used == {}


def test_zone_records() -> None:
    state = fresh()
    ok(state, c.PutZone(Zone(ZoneId("z1"), region="eu")))
    ok(state, c.PutZone(Zone(ZoneId("z1"), region="us", cordoned=True), expect_version=state.applied))
    assert state.zones["z1"] == Zone(ZoneId("z1"), "us", cordoned=True)
    rejected(state, c.RemoveZone(ZoneId("z1")), "conflict", "zone 'z1' still has clusters ['c1']")
    rejected(state, c.RemoveZone(ZoneId("z7")), "not_found", "zone 'z7' not found")
    rejected(state, c.PutZone(unchecked_zone(region="EU")), "invalid", "zone.region")
    ok(state, c.RemoveCluster(ClusterId("c1")))
    ok(state, c.RemoveZone(ZoneId("z1"), expect_version=version(state, "zone", "z1")))
    assert state.zones == {} and "zone/z1" not in state.meta


def unchecked_zone(**changes: Any) -> Zone:
    z = Zone(ZoneId("z1"))
    for name, v in changes.items():
        object.__setattr__(z, name, v)
    return z


# --- tokens -------------------------------------------------------------------------------------


def test_tokens_are_created_once_and_revoked() -> None:
    state = fresh()
    ok(state, c.PutToken(token()))
    rejected(state, c.PutToken(token()), "already_exists", "token '0123456789ab' already exists")
    rejected(state, c.PutToken(token("00000000000f", Role.TENANT, "ghost")), "not_found", "tenant 'ghost' not found")
    ok(state, c.RemoveToken("0123456789ab"))
    rejected(state, c.RemoveToken("0123456789ab"), "not_found", "token '0123456789ab' not found")
    assert state.tokens == {} and not any(k.startswith("token/") for k in state.meta)


def test_a_malformed_token_record_is_invalid() -> None:
    bad = token()
    object.__setattr__(bad, "sha256", "nope")
    rejected(fresh(), c.PutToken(bad), "invalid", "token.sha256: must be 64 lower-case hex digits")


# --- result codes and batches -------------------------------------------------------------------


def test_codes_name_the_kind_of_rejection() -> None:
    state = fresh()
    assert rejected(state, c.SetDesired(DeploymentId("chat"), 99, 0, "r", 0), "invalid", "replicas").code in CODES
    rejected(state, c.Command(), "malformed", "unknown command type Command")
    rejected(state, c.PutBreaker("", BreakerRecord()), "invalid", "key: must be a non-empty string")
    rejected(state, c.RemoveTenant(["acme"]), "malformed", "malformed remove_tenant")  # type: ignore[arg-type]
    rejected(state, c.TransitionInstance(InstanceId("i9"), InstanceEvent.WARMED, 0), "not_found", "instance 'i9'")
    ok(state, c.CreateInstance(InstanceId("i1"), DeploymentId("chat"), ClusterId("c1"), 0))
    rejected(state, c.TransitionInstance(InstanceId("i1"), InstanceEvent.WARMED, 0), "conflict", "no transition")


def test_a_batch_carries_its_first_rejection_and_its_last_revision() -> None:
    state = fresh()
    result = apply(state, c.Batch((
        c.PutZone(Zone(ZoneId("z1"))),
        c.RemoveZone(ZoneId("nope")),
        c.PutTenant(tenant("acme"), expect_version=2),
        c.PutBreaker("k", BreakerRecord()),
    )))
    assert not result.ok and (result.code, result.error) == ("not_found", "zone 'nope' not found")
    assert [r.code for r in result.results] == ["", "not_found", "version_mismatch", ""]
    assert [r.revision for r in result.results] == [5, 0, 0, 6]
    assert result.revision == 6 == state.applied
    empty = apply(state, c.Batch(()))
    assert empty.ok and empty.code == "" and empty.revision == 0
    nothing = apply(state, c.Batch((c.RemoveZone(ZoneId("nope")),)))
    assert nothing.revision == 0 and nothing.code == "not_found"


def test_the_snapshot_view_includes_the_new_tables() -> None:
    state = fresh()
    ok(state, c.PutZone(Zone(ZoneId("z1"))))
    ok(state, c.PutToken(token()))
    view = snapshot(state)
    assert list(view["zones"]) == ["z1"] and list(view["tokens"]) == ["0123456789ab"]  # type: ignore[call-overload]
    assert list(view["meta"]) == sorted(state.meta)  # type: ignore[call-overload]


# --- properties ---------------------------------------------------------------------------------

KINDS = ("tenant", "deployment", "cluster", "zone")
API_COMMANDS = st.one_of(
    st.builds(lambda t, v, a: c.PutTenant(tenant(t), v, a), st.sampled_from(["acme", "beta", "gamma"]),
              st.integers(-1, 12), st.integers(0, 10)),
    st.builds(lambda t, v: c.RemoveTenant(TenantId(t), v), st.sampled_from(["acme", "beta", "gamma"]),
              st.sampled_from([-1, *range(1, 12)])),
    st.builds(lambda d, t, dl, v, a: c.PutDeployment(deployment(d, t, deleting=dl), v, a),
              st.sampled_from(["chat", "code"]), st.sampled_from(["acme", "beta"]), st.booleans(),
              st.integers(-1, 12), st.integers(0, 10)),
    st.builds(lambda d, v: c.RemoveDeployment(DeploymentId(d), v), st.sampled_from(["chat", "code"]),
              st.sampled_from([-1, *range(1, 12)])),
    st.builds(lambda cid, z, co, v: c.PutCluster(cluster(cid, z, cordoned=co), v), st.sampled_from(["c1", "c2"]),
              st.sampled_from(["z1", "z2"]), st.booleans(), st.integers(-1, 12)),
    st.builds(lambda cid, v: c.RemoveCluster(ClusterId(cid), v), st.sampled_from(["c1", "c2"]),
              st.sampled_from([-1, *range(1, 12)])),
    st.builds(lambda z, dr, v: c.PutZone(Zone(ZoneId(z), draining=dr), v), st.sampled_from(["z1", "z2"]),
              st.booleans(), st.integers(-1, 12)),
    st.builds(lambda z, v: c.RemoveZone(ZoneId(z), v), st.sampled_from(["z1", "z2"]),
              st.sampled_from([-1, *range(1, 12)])),
    st.builds(lambda i, t: c.PutToken(token(i, Role.TENANT, t)), st.sampled_from(["00000000000a", "00000000000b"]),
              st.sampled_from(["acme", "beta", "gamma"])),
    st.builds(c.RemoveToken, st.sampled_from(["00000000000a", "00000000000b"])),
)


@settings(max_examples=60)
@given(st.lists(API_COMMANDS, max_size=25))
def test_meta_tracks_exactly_the_objects_and_their_last_write(cmds: list[c.Command]) -> None:
    """Whatever the API sends: every object has a meta whose version is the revision of its last
    accepted put, rejections change nothing, and every token names an existing tenant."""
    state = fresh()
    last_put = {meta_key(k, i): m.resource_version for k, i, m in
                ((key.split("/")[0], key.split("/")[1], m) for key, m in state.meta.items())}
    for cmd in cmds:
        before = copy.deepcopy(state)
        result = apply(state, cmd)
        assert result.code in CODES and result.ok == (result.code == "")
        if not result.ok:
            assert state == before
            continue
        assert result.revision == state.applied == before.applied + 1
        name = type(cmd).__name__
        if name.startswith("Put") and name != "PutToken":
            obj = next(getattr(cmd, f.name) for f in dataclasses.fields(cmd) if f.name not in ("expect_version", "at_ms"))
            last_put[meta_key(name[3:].lower(), obj.id)] = result.revision
        elif name.startswith("Remove") and name != "RemoveToken":
            ident = getattr(cmd, dataclasses.fields(cmd)[0].name)
            del last_put[meta_key(name[6:].lower(), ident)]
    tables = {"tenant": state.tenants, "deployment": state.deployments, "cluster": state.clusters, "zone": state.zones}
    assert sorted(state.meta) == sorted(meta_key(k, i) for k in KINDS for i in tables[k])
    assert {k: m.resource_version for k, m in state.meta.items()} == last_put
    assert all(t.tenant in state.tenants for t in state.tokens.values())
