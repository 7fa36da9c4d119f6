"""The API served by a real coordinator (one in-process Raft member: lease, control loop, gRPC server on
127.0.0.1): authentication on every method, tenant isolation on every method, error mapping with
field violations, read metadata and linearizable reads, watch (resume, filters, cancellation),
explain, dry-run, cordon/drain, tokens.

The fleet here never places an instance (the only cluster has capacity in another pool), so the state
changes only through the calls the tests make and the loop's decisions."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from controlplane.api.admin import Credentials, fetch_status
from controlplane.api.channel import open_channel
from controlplane.api.server import MAX_WATCHES, SERVICE_NAMES
from controlplane.api.v1 import admin_pb2, admin_pb2_grpc, api_pb2, api_pb2_grpc
from controlplane.config import CoordinatorConfig
from controlplane.coordinator import Coordinator
from controlplane.domain import commands as c
from controlplane.domain.state import snapshot
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.tokens import new_token
from raft import codec
from tests.raft.cluster import cluster_configs
from tests.support.waiting import wait_until

MODEL = "llama3-8b-h100"
S = grpc.StatusCode


class Api:
    """Stubs for every service over one channel (one principal)."""

    def __init__(self, endpoint: str, token: str | None) -> None:
        self.channel = open_channel(endpoint, token=token)
        self.tenants = api_pb2_grpc.TenantsStub(self.channel)
        self.deployments = api_pb2_grpc.DeploymentsStub(self.channel)
        self.clusters = api_pb2_grpc.ClustersStub(self.channel)
        self.scaling = api_pb2_grpc.ScalingStub(self.channel)
        self.tokens = api_pb2_grpc.TokensStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)

    def stub(self, service: str) -> Any:
        return {"Tenants": self.tenants, "Deployments": self.deployments, "Clusters": self.clusters,
                "Scaling": self.scaling, "Tokens": self.tokens, "Admin": self.admin}[service]


def tenant_msg(name: str, priority: int = 1, rv: int = 0, **spec: Any) -> api_pb2.Tenant:
    return api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name=name, resource_version=rv),
                          spec=api_pb2.TenantSpec(priority=priority, **spec))


def deployment_msg(name: str, tenant: str, rv: int = 0, **spec: Any) -> api_pb2.Deployment:
    return api_pb2.Deployment(metadata=api_pb2.ObjectMeta(name=name, resource_version=rv),
                              spec=api_pb2.DeploymentSpec(tenant=tenant, engine="vllm", model=MODEL, pool="h100", **spec))


def code_of(fn: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        result = fn(*args, timeout=10, **kwargs)
        if hasattr(result, "__next__"):  # a stream: the status comes with the first read
            list(result)
    return err.value


class Group:
    def __init__(self, coordinator: Coordinator, admin_token: str) -> None:
        self.co = coordinator
        self.endpoint = coordinator.cfg.api_address
        self.admin_token = admin_token
        self.admin = Api(self.endpoint, admin_token)

    def token_for(self, tenant: str, ttl_s: int = 0) -> str:
        return self.admin.tokens.CreateToken(api_pb2.CreateTokenRequest(role="tenant", tenant=tenant, ttl_seconds=ttl_s),
                                             timeout=10).token

    def state_digest(self) -> dict[str, object]:
        snap = snapshot(self.co.node.state_copy())
        # the control loop's own bookkeeping moves on by itself: compare what the API may change
        keep = ("tenants", "deployments", "clusters", "zones", "tokens")
        return {k: v for k, v in snap.items() if k in keep}


G = TypeVar("G")


@contextmanager
def started_group(base: Path, make: Callable[[Coordinator, str], G], **overrides: Any) -> Iterator[G]:
    """One in-process coordinator under ``base`` with a bootstrap admin token (``overrides`` go into
    its configuration), wrapped by ``make(coordinator, admin_token)`` once the token is registered."""
    token, _, _ = new_token()
    (base / "admin.token").write_text(token + "\n", encoding="utf-8")
    [raw] = cluster_configs(base, 1, admin_token_file=str(base / "admin.token"), **overrides)
    co = Coordinator(CoordinatorConfig.model_validate(raw))
    co.start()
    try:
        g: Any = make(co, token)

        def ready() -> bool:
            try:
                return g.admin.tokens.WhoAmI(api_pb2.WhoAmIRequest(), timeout=2).role == "admin"
            except grpc.RpcError:
                return False

        wait_until(ready, 20.0, "the bootstrap admin token to be registered")
        yield g
    finally:
        co.stop()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    with started_group(tmp_path_factory.mktemp("api"), Group) as g:
        a = g.admin
        for name in ("a", "b"):
            a.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg(name, quota={"h100": 4})), timeout=10)
            a.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(f"d{name}", name)),
                                          timeout=10)
        a.clusters.RegisterCluster(api_pb2.RegisterClusterRequest(cluster=api_pb2.Cluster(
            metadata=api_pb2.ObjectMeta(name="c1"), spec=api_pb2.ClusterSpec(zone="z1", capacity={"a100": 8}))), timeout=10)
        yield g


# --- every method, every principal ---------------------------------------------------------------------------


def every_method() -> list[tuple[str, str, Any]]:
    """(service, method, an empty request) for every method of every API service and Admin."""
    from controlplane.api.v1 import admin_pb2 as adm

    out = []
    for name in SERVICE_NAMES:
        pkg_service = name.rsplit(".", 1)[1]
        module = adm if pkg_service == "Admin" else api_pb2
        svc = module.DESCRIPTOR.services_by_name[pkg_service]
        for m in svc.methods:
            out.append((pkg_service, m.name, getattr(module, m.input_type.name)()))
    return out


METHODS = every_method()


def test_the_method_table_covers_every_service() -> None:
    assert {s for s, _, _ in METHODS} == {"Tenants", "Deployments", "Clusters", "Scaling", "Tokens", "Admin"}
    assert len(METHODS) == 5 + 4 + 12 + 3 + 4 + 3


@pytest.mark.parametrize(("service", "method", "request_msg"), METHODS, ids=[f"{s}.{m}" for s, m, _ in METHODS])
def test_every_method_refuses_calls_without_a_valid_token(group: Group, service: str, method: str, request_msg: Any) -> None:
    _, token_id, _ = new_token()
    expired, expired_id, expired_sha = new_token()
    group.co.node.submit(codec.encode(c.Batch((c.PutToken(TokenRecord(expired_id, expired_sha, Role.ADMIN, "", 1, 2, "old")),))),
                         timeout_s=5)
    revoked = group.token_for("a")
    revoked_id = revoked.split("_")[1]
    group.admin.tokens.RevokeToken(api_pb2.RevokeTokenRequest(id=revoked_id), timeout=10)
    before = group.state_digest()
    for token in (None, "garbage", f"cp_{token_id}_{'x' * 43}", expired, revoked):
        api = Api(group.endpoint, token) if token is None or token.startswith("cp_") else None
        if api is None:  # a token with a character the channel refuses to send: send the header by hand
            api = Api(group.endpoint, None)
            err = code_of(getattr(api.stub(service), method), request_msg, metadata=(("authorization", f"Bearer {token}"),))
        else:
            err = code_of(getattr(api.stub(service), method), request_msg)
        assert err.code() is S.UNAUTHENTICATED, (token and token[:6], err.code(), err.details())
        assert "cp_" + token_id not in (err.details() or "")
    assert group.state_digest() == before


def test_health_and_reflection_need_no_token(group: Group) -> None:
    with grpc.insecure_channel(group.endpoint) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", *SERVICE_NAMES):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert set(SERVICE_NAMES) | {"grpc.health.v1.Health"} <= names


def test_tenant_b_cannot_reach_tenant_a_through_any_method(group: Group) -> None:
    b = Api(group.endpoint, group.token_for("b"))
    before = group.state_digest()
    nf, pd = S.NOT_FOUND, S.PERMISSION_DENIED
    # tenants
    assert code_of(b.tenants.GetTenant, api_pb2.GetRequest(name="a")).code() is nf
    assert code_of(b.tenants.GetTenant, api_pb2.GetRequest(name="zz")).code() is nf
    assert [t.metadata.name for t in b.tenants.ListTenants(api_pb2.ListRequest(), timeout=10).items] == ["b"]
    assert code_of(b.tenants.CreateTenant, api_pb2.CreateTenantRequest(tenant=tenant_msg("x"))).code() is pd
    assert code_of(b.tenants.UpdateTenant, api_pb2.UpdateTenantRequest(tenant=tenant_msg("a"))).code() is pd
    assert code_of(b.tenants.UpdateTenant, api_pb2.UpdateTenantRequest(tenant=tenant_msg("b", 9))).code() is pd
    assert code_of(b.tenants.DeleteTenant, api_pb2.DeleteRequest(name="a")).code() is pd
    # deployments
    err = code_of(b.deployments.ApplyDeployment, api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("new", "a")))
    assert err.code() is nf and err.details() == "tenant 'a' not found"
    err = code_of(b.deployments.ApplyDeployment, api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("a/da", "b")))
    assert err.code() is S.INVALID_ARGUMENT and err.details().startswith("metadata.name: 'a/da' is qualified")
    assert code_of(b.deployments.GetDeployment, api_pb2.GetRequest(name="da")).code() is nf
    err = code_of(b.deployments.GetDeployment, api_pb2.GetRequest(name="a/da"))
    assert err.code() is nf and err.details() == "deployment 'a/da' not found"
    assert [d.metadata.name for d in b.deployments.ListDeployments(api_pb2.ListRequest(), timeout=10).items] == ["db"]
    assert list(b.deployments.ListDeployments(api_pb2.ListRequest(tenant="a"), timeout=10).items) == []
    assert code_of(b.deployments.DeleteDeployment, api_pb2.DeleteRequest(name="da")).code() is nf
    # clusters and zones: admins only
    for _, method, req in (m for m in METHODS if m[0] == "Clusters"):
        assert code_of(getattr(b.clusters, method), req).code() is pd, method
    # scaling
    assert code_of(b.scaling.Explain, api_pb2.ExplainRequest(deployment="da")).code() is nf
    assert code_of(b.scaling.DryRun, api_pb2.DryRunRequest(deployment=deployment_msg("da", "a"))).code() is nf
    events = list(b.scaling.Watch(api_pb2.WatchRequest(once=True, since_revision=0), timeout=10))
    assert events and all(e.type == "BOOKMARK" or e.tenant == "b" for e in events)
    assert any(e.name == "db" for e in events) and not any(e.name in ("da", "a", "c1") for e in events)
    leaked = list(b.scaling.Watch(api_pb2.WatchRequest(once=True, since_revision=0, tenant="a"), timeout=10))
    assert [e.type for e in leaked] == ["BOOKMARK"]
    # tokens and membership
    for method in ("CreateToken", "ListTokens", "RevokeToken"):
        req = next(r for s, m, r in METHODS if s == "Tokens" and m == method)
        assert code_of(getattr(b.tokens, method), req).code() is pd, method
    who = b.tokens.WhoAmI(api_pb2.WhoAmIRequest(), timeout=10)
    assert (who.role, who.tenant) == ("tenant", "b")
    assert code_of(b.admin.AddMember, admin_pb2.MemberRequest(node_id="x", raft_address="127.0.0.1:1", api_address="127.0.0.1:2")).code() is pd
    assert code_of(b.admin.RemoveMember, admin_pb2.MemberRequest(raft_address="127.0.0.1:1")).code() is pd
    assert b.admin.Status(admin_pb2.StatusRequest(), timeout=10).node_id == group.co.cfg.node_id
    assert group.state_digest() == before


def test_a_tenant_principal_manages_its_own_deployments(group: Group) -> None:
    a = Api(group.endpoint, group.token_for("a"))
    got = a.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("mine", "a", warm_pool=0)), timeout=10)
    assert (got.spec.tenant, got.spec.warm_pool, got.status.gpus_per_instance) == ("a", 0, 1)
    assert a.tenants.GetTenant(api_pb2.GetRequest(name="a"), timeout=10).status.deployments >= 2
    rev = a.deployments.DeleteDeployment(api_pb2.DeleteRequest(name="mine"), timeout=10).revision
    assert rev > 0
    assert a.deployments.DeleteDeployment(api_pb2.DeleteRequest(name="mine"), timeout=10).revision >= 0  # harmless


# --- errors -------------------------------------------------------------------------------------------------------


def test_invalid_arguments_carry_bad_request_field_violations(group: Group) -> None:
    bad = api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name="Bad_Name"), spec=api_pb2.TenantSpec(quota={"h100": -2}))
    err = code_of(group.admin.tenants.CreateTenant, api_pb2.CreateTenantRequest(tenant=bad))
    assert err.code() is S.INVALID_ARGUMENT
    status = rpc_status.from_call(err)
    assert status is not None and status.message == err.details()
    detail = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(detail)
    fields = [v.field for v in detail.field_violations]
    assert fields == ["metadata.name", "spec.priority", "spec.quota.h100"]
    assert all(v.description for v in detail.field_violations)
    assert err.details().startswith("metadata.name: ")
    err = code_of(group.admin.deployments.ApplyDeployment, api_pb2.ApplyDeploymentRequest(
        deployment=deployment_msg("dx", "a", policy=api_pb2.ScalingPolicy(panic_window_ms=10))))
    assert err.code() is S.INVALID_ARGUMENT and err.details().startswith("spec.policy.panic_window_ms: ")
    err = code_of(group.admin.tokens.CreateToken, api_pb2.CreateTokenRequest(role="root", ttl_seconds=-1))
    assert err.code() is S.INVALID_ARGUMENT and err.details().startswith("role: ") and "ttl_seconds" in err.details()


def test_error_codes(group: Group) -> None:
    a = group.admin
    err = code_of(a.tenants.CreateTenant, api_pb2.CreateTenantRequest(tenant=tenant_msg("a")))
    assert err.code() is S.ALREADY_EXISTS
    assert code_of(a.tenants.GetTenant, api_pb2.GetRequest(name="nope")).code() is S.NOT_FOUND
    assert code_of(a.tenants.UpdateTenant, api_pb2.UpdateTenantRequest(tenant=tenant_msg("nope"))).code() is S.NOT_FOUND
    assert code_of(a.tenants.GetTenant, api_pb2.GetRequest(name="")).code() is S.INVALID_ARGUMENT
    # optimistic concurrency
    t = a.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg("occ")), timeout=10)
    rv = t.metadata.resource_version
    assert rv > 0 and t.metadata.created_ms > 0
    t2 = a.tenants.UpdateTenant(api_pb2.UpdateTenantRequest(tenant=tenant_msg("occ", 5, rv=rv)), timeout=10)
    assert t2.spec.priority == 5 and t2.metadata.resource_version > rv and t2.metadata.created_ms == t.metadata.created_ms
    err = code_of(a.tenants.UpdateTenant, api_pb2.UpdateTenantRequest(tenant=tenant_msg("occ", 6, rv=rv)))
    assert err.code() is S.FAILED_PRECONDITION
    assert dict(err.trailing_metadata())["cp-error"] == "version-mismatch"
    err = code_of(a.tenants.DeleteTenant, api_pb2.DeleteRequest(name="occ", resource_version=rv))
    assert dict(err.trailing_metadata())["cp-error"] == "version-mismatch"
    assert a.tenants.DeleteTenant(api_pb2.DeleteRequest(name="occ"), timeout=10).revision > 0
    # the state forbids it
    err = code_of(a.tenants.DeleteTenant, api_pb2.DeleteRequest(name="a"))
    assert err.code() is S.FAILED_PRECONDITION and dict(err.trailing_metadata())["cp-error"] == "conflict"
    err = code_of(a.clusters.DeleteZone, api_pb2.DeleteRequest(name="z1"))
    assert err.code() is S.FAILED_PRECONDITION and dict(err.trailing_metadata())["cp-error"] == "conflict"
    err = code_of(a.deployments.ApplyDeployment, api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("da", "a"),
                                                                                create_only=True))
    assert err.code() is S.ALREADY_EXISTS
    # a deployment never changes tenant: its id holds the tenant, and metadata.name is the local name
    err = code_of(a.deployments.ApplyDeployment, api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("a/da", "b")))
    assert err.code() is S.INVALID_ARGUMENT and "spec.tenant" in err.details()


# --- reads ---------------------------------------------------------------------------------------------------------


def test_reads_carry_the_applied_index_and_linearizable_reads_see_the_last_write(group: Group) -> None:
    a = group.admin
    reply, call = a.tenants.GetTenant.with_call(api_pb2.GetRequest(name="a"), timeout=10)
    index = int(dict(call.trailing_metadata())["applied-index"])
    assert index > 0 and reply.metadata.name == "a"
    lst, call = a.tenants.ListTenants.with_call(
        api_pb2.ListRequest(read=api_pb2.ReadOptions(linearizable=True)), timeout=10)
    assert lst.read.linearizable and lst.read.served_by == group.co.cfg.node_id
    assert lst.read.applied_index > index  # the barrier entry itself was applied first
    assert int(dict(call.trailing_metadata())["applied-index"]) == lst.read.applied_index


# --- watch ------------------------------------------------------------------------------------------------------------


def test_watch_streams_changes_and_resumes_after_a_revision(group: Group) -> None:
    a = group.admin
    stream = a.scaling.Watch(api_pb2.WatchRequest(kinds=["Tenant"]), timeout=30)
    first = next(stream)
    assert first.type == "BOOKMARK" and first.served_by == group.co.cfg.node_id
    a.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg("w1")), timeout=10)
    ev = next(e for e in stream if e.type != "BOOKMARK")
    assert (ev.type, ev.kind, ev.name, ev.tenant) == ("ADDED", "Tenant", "w1", "w1") and ev.revision > first.revision
    stream.cancel()
    a.tenants.DeleteTenant(api_pb2.DeleteRequest(name="w1"), timeout=10)
    resumed = list(a.scaling.Watch(api_pb2.WatchRequest(since_revision=ev.revision - 1, kinds=["Tenant"], once=True),
                                   timeout=10))
    assert [(e.type, e.name) for e in resumed[:2]] == [("ADDED", "w1"), ("DELETED", "w1")]
    assert resumed[-1].type == "BOOKMARK" and resumed[-1].revision >= resumed[1].revision
    err = code_of(a.scaling.Watch, api_pb2.WatchRequest(kinds=["Gadget"]))
    assert err.code() is S.INVALID_ARGUMENT and err.details().startswith("kinds[0]: ")


def test_a_watch_ends_when_its_client_goes(group: Group) -> None:
    core = group.co.api.core  # type: ignore[union-attr]
    assert core.active_watches == 0
    streams = [group.admin.scaling.Watch(api_pb2.WatchRequest(), timeout=60) for _ in range(3)]
    for s in streams:
        assert next(s).type == "BOOKMARK"
    wait_until(lambda: core.active_watches == 3, 5.0, "three watches being served")
    for s in streams:
        s.cancel()
    wait_until(lambda: core.active_watches == 0, 5.0, "the cancelled watches to end on the server")
    assert MAX_WATCHES >= 3


# --- explain, dry-run ---------------------------------------------------------------------------------------------------


def test_explain_shows_the_decisions_and_the_holder(group: Group) -> None:
    a = group.admin
    wait_until(lambda: a.scaling.Explain(api_pb2.ExplainRequest(deployment="a/da"), timeout=10).history, 15.0,
               "a scaling decision for da")
    out = a.scaling.Explain(api_pb2.ExplainRequest(deployment="a/da", limit=5), timeout=10)
    assert (out.deployment, out.tenant, out.lease_holder) == ("da", "a", group.co.cfg.node_id)
    assert 0 < len(out.history) <= 5 and all(d.reason for d in out.history)
    assert out.history[-1].replicas == out.desired_replicas
    assert out.HasField("live") and out.live.target >= out.live.granted >= 0 and "concurrency" in out.live.proposals
    assert code_of(a.scaling.Explain, api_pb2.ExplainRequest(deployment="a/da", limit=-1)).code() is S.INVALID_ARGUMENT


def test_explain_carries_the_holders_forecast(group: Group, monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.core.reconcile import LiveDecision
    from controlplane.domain.demand import Forecast

    core = group.co.api.core  # type: ignore[union-attr]
    f = Forecast(1_700_000_000_000, 3.2, 7.5, 2.4, 1_000, 30_000, 0.9, 120, 0.184)
    seen = LiveDecision(1_700_000_001_000, 1, 4, 4, "forecast", "m", {"concurrency": 1}, False, {}, 4, f)
    monkeypatch.setattr(core.holder, "live_decision", lambda did: seen if did == "a/da" else None)
    wait_until(core.holds_lease, 15.0, "the coordinator to hold the lease")
    live = group.admin.scaling.Explain(api_pb2.ExplainRequest(deployment="a/da"), timeout=10).live
    assert (live.reason, live.target, live.warm_pool) == ("forecast", 4, 4)
    fc = live.forecast
    assert fc.usable and (fc.ready, fc.total, fc.wake_ms, fc.restart_ms, fc.buckets) == (3.2, 7.5, 1_000, 30_000, 120)
    assert fc.wake_fits  # da is a vLLM deployment; tenant a has the default 2 s TTFT SLO
    seen = LiveDecision(1_700_000_001_000, 1, 1, 1, "stable", "", {}, False, {}, 1,
                        Forecast(0, 0.0, 0.0, 0.0, 1_000, 30_000, 0.9, 3, None, False, "too little history"))
    fc = group.admin.scaling.Explain(api_pb2.ExplainRequest(deployment="a/da"), timeout=10).live.forecast
    assert not fc.usable and fc.note == "too little history" and not fc.HasField("mape")
    seen = LiveDecision(1_700_000_001_000, 1, 1, 1, "stable", "", {}, False, {})
    assert not group.admin.scaling.Explain(api_pb2.ExplainRequest(deployment="a/da"), timeout=10).live.HasField("forecast")


def test_dry_run_writes_nothing(group: Group) -> None:
    pytest.importorskip("controlplane.core.dryrun")
    before = group.state_digest()
    out = group.admin.scaling.DryRun(api_pb2.DryRunRequest(deployment=deployment_msg("da", "a", max_replicas=3)), timeout=10)
    assert out.exists and any(ch.field.endswith("max_replicas") for ch in out.changes)
    new = group.admin.scaling.DryRun(api_pb2.DryRunRequest(deployment=deployment_msg("fresh", "a")), timeout=10)
    assert not new.exists
    assert group.state_digest() == before


# --- clusters and zones ------------------------------------------------------------------------------------------------


def test_cordon_drain_and_uncordon(group: Group) -> None:
    cl = group.admin.clusters
    got = cl.CordonCluster(api_pb2.CordonRequest(name="c1", cordoned=True), timeout=10)
    assert (got.status.cordoned, got.status.draining, got.status.schedulable) == (True, False, False)
    got = cl.DrainCluster(api_pb2.DrainRequest(name="c1"), timeout=10)
    assert (got.status.cordoned, got.status.draining) == (True, True)
    # re-registering keeps the cordon and drain state
    got = cl.RegisterCluster(api_pb2.RegisterClusterRequest(cluster=api_pb2.Cluster(
        metadata=api_pb2.ObjectMeta(name="c1"), spec=api_pb2.ClusterSpec(zone="z1", capacity={"a100": 16}))), timeout=10)
    assert got.status.draining and got.spec.capacity["a100"] == 16
    got = cl.CordonCluster(api_pb2.CordonRequest(name="c1", cordoned=False), timeout=10)
    assert (got.status.cordoned, got.status.draining, got.status.schedulable) == (False, False, True)
    z = cl.GetZone(api_pb2.GetRequest(name="z1"), timeout=10)
    assert not z.status.registered and list(z.status.clusters) == ["c1"]
    z = cl.CordonZone(api_pb2.CordonRequest(name="z1", cordoned=True), timeout=10)
    assert z.status.registered and z.status.cordoned
    assert not cl.GetCluster(api_pb2.GetRequest(name="c1"), timeout=10).status.schedulable
    z = cl.CordonZone(api_pb2.CordonRequest(name="z1", cordoned=False), timeout=10)
    assert not (z.status.cordoned or z.status.draining)
    assert code_of(cl.CordonZone, api_pb2.CordonRequest(name="nowhere", cordoned=True)).code() is S.NOT_FOUND
    assert code_of(cl.DrainCluster, api_pb2.DrainRequest(name="nope")).code() is S.NOT_FOUND


# --- tokens, admin -----------------------------------------------------------------------------------------------------------


def test_tokens_create_list_revoke(group: Group) -> None:
    a = group.admin
    created = a.tokens.CreateToken(api_pb2.CreateTokenRequest(role="tenant", tenant="a", ttl_seconds=3600,
                                                              description="ci"), timeout=10)
    assert created.token.startswith(f"cp_{created.info.id}_")
    assert created.info.expires_ms - created.info.created_ms == 3_600_000
    listed = a.tokens.ListTokens(api_pb2.ListTokensRequest(tenant="a"), timeout=10).items
    assert created.info.id in [t.id for t in listed] and all(t.tenant == "a" for t in listed)
    assert created.token not in str(listed)
    err = code_of(a.tokens.CreateToken, api_pb2.CreateTokenRequest(role="tenant", tenant="ghost"))
    assert err.code() is S.NOT_FOUND
    a.tokens.RevokeToken(api_pb2.RevokeTokenRequest(id=created.info.id), timeout=10)
    assert code_of(a.tokens.RevokeToken, api_pb2.RevokeTokenRequest(id=created.info.id)).code() is S.NOT_FOUND
    gone = Api(group.endpoint, created.token)
    assert code_of(gone.tokens.WhoAmI, api_pb2.WhoAmIRequest()).code() is S.UNAUTHENTICATED


def test_status_client_uses_the_token(group: Group) -> None:
    [ok] = fetch_status([group.endpoint], 5.0, Credentials(token=group.admin_token))
    assert ok["reachable"] and ok["node_id"] == group.co.cfg.node_id
    [refused] = fetch_status([group.endpoint], 5.0)
    assert not refused["reachable"] and refused["error"].startswith("UNAUTHENTICATED")


def test_concurrent_writers_of_one_object_all_get_an_answer(group: Group) -> None:
    """Unconditional read-modify-writes (cordon/uncordon) racing each other retry instead of failing."""
    cl = group.admin.clusters
    errors: list[str] = []

    def flip(i: int) -> None:
        try:
            cl.CordonCluster(api_pb2.CordonRequest(name="c1", cordoned=i % 2 == 0), timeout=20)
        except grpc.RpcError as exc:
            errors.append(f"{exc.code().name}: {exc.details()}")

    threads = [threading.Thread(target=flip, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    cl.CordonCluster(api_pb2.CordonRequest(name="c1", cordoned=False), timeout=10)


def test_a_watch_behind_the_retained_log_is_out_of_range(group: Group) -> None:
    """Last in this module: it empties the event log (and the decision history) of the group."""
    events = group.co.node.events
    events.reset(events.last_revision)  # what a snapshot install does
    err = code_of(group.admin.scaling.Watch, api_pb2.WatchRequest(since_revision=0))
    assert err.code() is S.OUT_OF_RANGE and "list again" in err.details()
