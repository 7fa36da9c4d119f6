"""Per-tenant deployment names through the API of a real coordinator (one in-process member, gRPC on
127.0.0.1; docs/api.md "Deployment names"): admins name ``tenant/name``, a bare name from an admin is
INVALID_ARGUMENT saying how to qualify it, bad qualified names are INVALID_ARGUMENT naming the field,
and a deployment with a legacy (unqualified) id is its tenant's, under its name."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from controlplane.api.v1 import api_pb2
from controlplane.coordinator import Coordinator
from controlplane.domain import commands as c
from controlplane.domain.ids import DeploymentId, PoolId, TenantId
from controlplane.domain.tenants import Deployment, Engine
from raft import codec
from tests.support.waiting import wait_until
from tests.unit.test_api_server import MODEL, Api, deployment_msg, started_group, tenant_msg

S = grpc.StatusCode


class Group:
    def __init__(self, co: Coordinator, admin_token: str) -> None:
        self.co = co
        self.endpoint = co.cfg.api_address
        self.admin = Api(self.endpoint, admin_token)
        self.tenant: dict[str, Api] = {}

    def state(self):  # type: ignore[no-untyped-def]
        return self.co.node.state_copy()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    with started_group(tmp_path_factory.mktemp("names"), Group) as g:
        for name in ("alpha", "bravo"):
            g.admin.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg(name, quota={"h100": 4})), timeout=10)
            token = g.admin.tokens.CreateToken(api_pb2.CreateTokenRequest(role="tenant", tenant=name), timeout=10).token
            g.tenant[name] = Api(g.endpoint, token)
            g.admin.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("chat", name)),
                                                timeout=10)
        # a deployment as state written before names were per tenant holds it: an unqualified id
        legacy = Deployment(DeploymentId("legacy"), TenantId("alpha"), Engine.VLLM, MODEL, PoolId("h100"), 1, warm_pool=0)
        g.co.node.submit(codec.encode(c.Batch((c.PutDeployment(legacy, c.MUST_NOT_EXIST, 1),))), timeout_s=5)
        wait_until(lambda: "legacy" in g.state().deployments, 5.0, "the legacy deployment to be applied")
        yield g


def failure(call, request) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        out = call(request, timeout=10)
        if hasattr(out, "__next__"):
            list(out)
    return err.value


def violations(err: grpc.RpcError) -> list[str]:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    bad = error_details_pb2.BadRequest()
    assert status is not None and status.details and status.details[0].Unpack(bad)
    return [v.field for v in bad.field_violations]


def test_two_tenants_own_chat_and_admins_name_them_tenant_slash_name(group: Group) -> None:
    admin = group.admin
    assert sorted(group.state().deployments) == ["alpha/chat", "bravo/chat", "legacy"]
    for t in ("alpha", "bravo"):
        d = admin.deployments.GetDeployment(api_pb2.GetRequest(name=f"{t}/chat"), timeout=10)
        assert (d.metadata.name, d.spec.tenant) == ("chat", t)
        exp = admin.scaling.Explain(api_pb2.ExplainRequest(deployment=f"{t}/chat"), timeout=10)
        assert (exp.deployment, exp.tenant) == ("chat", t)
        # a tenant names its own by bare name, or qualified
        for name in ("chat", f"{t}/chat"):
            own = group.tenant[t].deployments.GetDeployment(api_pb2.GetRequest(name=name), timeout=10)
            assert (own.metadata.name, own.spec.tenant, own.metadata.created_ms) == ("chat", t, d.metadata.created_ms)
    listed = admin.deployments.ListDeployments(api_pb2.ListRequest(), timeout=10).items
    assert [(d.spec.tenant, d.metadata.name) for d in listed] == [("alpha", "chat"), ("alpha", "legacy"), ("bravo", "chat")]
    only = admin.deployments.ListDeployments(api_pb2.ListRequest(tenant="bravo"), timeout=10).items
    assert [(d.spec.tenant, d.metadata.name) for d in only] == [("bravo", "chat")]
    # a watch on one tenant's chat: that one only, named locally with its tenant
    for req in (api_pb2.WatchRequest(once=True, since_revision=0, kinds=["Deployment"], deployment="bravo/chat"),
                api_pb2.WatchRequest(once=True, since_revision=0, kinds=["Deployment"], deployment="chat", tenant="bravo")):
        events = [e for e in admin.scaling.Watch(req, timeout=10) if e.type != "BOOKMARK"]
        assert [(e.type, e.name, e.tenant) for e in events] == [("ADDED", "chat", "bravo")]


def test_a_bare_name_from_an_admin_says_how_to_qualify_it(group: Group) -> None:
    admin = group.admin
    hint = "deployment names are per tenant: an admin names one as '<tenant>/<name>' (e.g. 'alpha/chat')"
    for call, request, field in (
        (admin.deployments.GetDeployment, api_pb2.GetRequest(name="chat"), "name"),
        (admin.deployments.DeleteDeployment, api_pb2.DeleteRequest(name="chat"), "name"),
        (admin.scaling.Explain, api_pb2.ExplainRequest(deployment="chat"), "deployment"),
        (admin.scaling.Watch, api_pb2.WatchRequest(once=True, deployment="chat"), "deployment"),
    ):
        err = failure(call, request)
        assert (err.code(), err.details()) == (S.INVALID_ARGUMENT, f"{field}: {hint}"), request
        if field == "name":
            assert violations(err) == [field]
    assert {d.tenant for d in group.state().deployments.values() if not d.deleting} == {"alpha", "bravo"}


BAD = {
    "alpha/": "its name part must not be empty",
    "/chat": "its tenant part must not be empty",
    "Alpha/chat": "its tenant part 'Alpha' is not a valid id",
    "alpha/b/c": "its name part 'b/c' is not a valid id",
    "alpha/" + "x" * 64: "its name part must be at most 63 characters, got 64",
}


@pytest.mark.parametrize("value", list(BAD), ids=["empty-name", "empty-tenant", "upper", "two-slashes", "long"])
def test_bad_qualified_names_are_invalid_argument_naming_the_field(group: Group, value: str) -> None:
    before = group.state().deployments
    for api in (group.admin, group.tenant["alpha"]):
        for call, request, field in (
            (api.deployments.GetDeployment, api_pb2.GetRequest(name=value), "name"),
            (api.deployments.DeleteDeployment, api_pb2.DeleteRequest(name=value), "name"),
            (api.scaling.Explain, api_pb2.ExplainRequest(deployment=value), "deployment"),
            (api.scaling.Watch, api_pb2.WatchRequest(once=True, deployment=value), "deployment"),
        ):
            err = failure(call, request)
            assert err.code() is S.INVALID_ARGUMENT, (field, value)
            assert err.details().startswith(f"{field}: ") and BAD[value] in err.details(), err.details()
    # metadata.name is the name within spec.tenant: a qualified one is refused whatever it says
    for call, request, field in (
        (group.admin.deployments.ApplyDeployment, api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(value, "alpha")),
         "metadata.name"),
        (group.admin.scaling.DryRun, api_pb2.DryRunRequest(deployment=deployment_msg(value, "alpha")),
         "deployment.metadata.name"),
    ):
        err = failure(call, request)
        assert err.code() is S.INVALID_ARGUMENT and err.details().startswith(f"{field}: "), err.details()
        assert violations(err) == [field]
    assert group.state().deployments == before


def test_qualified_names_that_disagree_with_the_request_are_refused(group: Group) -> None:
    err = failure(group.admin.scaling.Watch, api_pb2.WatchRequest(once=True, deployment="alpha/chat", tenant="bravo"))
    assert (err.code(), err.details()) == (
        S.INVALID_ARGUMENT, "deployment: 'alpha/chat' names tenant 'alpha', but tenant is 'bravo'")
    err = failure(group.admin.deployments.ApplyDeployment,
                  api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("alpha/chat", "bravo")))
    assert err.code() is S.INVALID_ARGUMENT and "the tenant goes in spec.tenant" in err.details()
    # bravo naming alpha's qualified name: a free name (NOT_FOUND, echoing what was sent)
    err = failure(group.tenant["bravo"].deployments.GetDeployment, api_pb2.GetRequest(name="alpha/chat"))
    assert (err.code(), err.details()) == (S.NOT_FOUND, "deployment 'alpha/chat' not found")


def test_a_legacy_id_is_its_tenants_deployment_under_its_name(group: Group) -> None:
    alpha, bravo, admin = group.tenant["alpha"], group.tenant["bravo"], group.admin
    got = alpha.deployments.GetDeployment(api_pb2.GetRequest(name="legacy"), timeout=10)
    assert (got.metadata.name, got.spec.tenant) == ("legacy", "alpha")
    assert admin.deployments.GetDeployment(api_pb2.GetRequest(name="alpha/legacy"), timeout=10).metadata == got.metadata
    err = failure(bravo.deployments.GetDeployment, api_pb2.GetRequest(name="legacy"))
    assert (err.code(), err.details()) == (S.NOT_FOUND, "deployment 'legacy' not found")  # as a free name
    # alpha's apply updates the legacy deployment in place: no second "alpha/legacy" appears
    updated = alpha.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(
        deployment=deployment_msg("legacy", "alpha", rv=got.metadata.resource_version, max_replicas=3)), timeout=10)
    assert (updated.metadata.name, updated.spec.max_replicas) == ("legacy", 3)
    assert updated.metadata.resource_version > got.metadata.resource_version
    err = failure(alpha.deployments.ApplyDeployment,
                  api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("legacy", "alpha"), create_only=True))
    assert (err.code(), err.details()) == (S.ALREADY_EXISTS, "deployment 'legacy' already exists")
    state = group.state()
    assert "alpha/legacy" not in state.deployments and state.deployments[DeploymentId("legacy")].max_replicas == 3
    # bravo's "legacy" is bravo's own, beside alpha's
    mine = bravo.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(
        deployment=deployment_msg("legacy", "bravo"), create_only=True), timeout=10)
    assert (mine.metadata.name, mine.spec.tenant) == ("legacy", "bravo")
    state = group.state()
    assert state.deployments[DeploymentId("bravo/legacy")].tenant == "bravo"
    assert state.deployments[DeploymentId("legacy")].tenant == "alpha" and state.deployments["legacy"].max_replicas == 3
    events = [e for e in alpha.scaling.Watch(api_pb2.WatchRequest(
        once=True, since_revision=0, kinds=["Deployment"], deployment="legacy"), timeout=10) if e.type != "BOOKMARK"]
    assert [(e.type, e.name, e.tenant) for e in events] == [("ADDED", "legacy", "alpha"), ("MODIFIED", "legacy", "alpha")]
    assert alpha.scaling.Explain(api_pb2.ExplainRequest(deployment="legacy"), timeout=10).deployment == "legacy"
    # and alpha deletes it by its name
    assert alpha.deployments.DeleteDeployment(api_pb2.DeleteRequest(name="legacy"), timeout=10).revision > 0
    assert group.state().deployments[DeploymentId("legacy")].deleting
    assert not group.state().deployments[DeploymentId("bravo/legacy")].deleting
