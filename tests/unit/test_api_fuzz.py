"""Property-based tests of the API's edge: every method of every service (api.proto and Admin) gets
random requests (any field set or not, any value of its wire type: ``tests.support.protofuzz.messages``)
and near-valid ones (a valid request with one or two fields broken: ``protofuzz.near_valid``), as an
admin, as a tenant principal, and with no, garbage, unknown, expired or revoked tokens; and bytes
that are no message at all (truncated, a wrong wire type, invalid UTF-8, garbage after a message).

Whatever comes in, the server answers with a proper status (never UNKNOWN or INTERNAL) and a message;
INVALID_ARGUMENT carries google.rpc.BadRequest field violations naming the field; tenant principals
are refused admin methods and never see another tenant's objects; a rejected request leaves the
replicated state the API owns (tenants, deployments, clusters, zones, tokens, their metadata)
unchanged; and the server stays healthy.

One in-process coordinator (Raft group of one, its control loop running) serves the whole module. The
only writer of those tables besides these calls is the control loop, which removes deployments
marked ``deleting`` once they have no instances: the state digest leaves out deleting deployments.
Runs are reproducible (derandomized, no example database) and bounded for CI.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from controlplane.api.v1 import admin_pb2, api_pb2
from controlplane.config import CoordinatorConfig, address_problem
from controlplane.coordinator import Coordinator
from controlplane.domain import commands as c
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.tokens import new_token
from raft import codec
from tests.conftest import long_mode
from tests.raft.cluster import cluster_configs
from tests.support.protofuzz import messages, near_valid
from tests.support.waiting import wait_until
from tests.unit.test_api_server import Api, deployment_msg, every_method, tenant_msg

S = grpc.StatusCode
METHODS = [(s, m) for s, m, _ in every_method()]
IDS = [f"{s}.{m}" for s, m in METHODS]

MINE, OTHER = "team-a", "team-b"
"""The tenant principal's tenant and another one (both names protofuzz's random ids use, so random
requests hit existing objects too)."""
MY_DEPLOYMENT, OTHER_DEPLOYMENT = "chat", "gpu-a1"

_SLOW = long_mode()
FUZZ = settings(max_examples=150 if _SLOW else 16, deadline=None, derandomize=not _SLOW, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
"""Per method and principal. CP_SLOW=1: many more examples, a fresh random seed each run (exploration)."""
UNAUTH = settings(FUZZ, max_examples=30 if _SLOW else 4)

ALLOWED = {S.OK, S.INVALID_ARGUMENT, S.NOT_FOUND, S.ALREADY_EXISTS, S.FAILED_PRECONDITION, S.PERMISSION_DENIED}
EXTRA_ALLOWED = {
    "Watch": {S.OUT_OF_RANGE, S.RESOURCE_EXHAUSTED},  # behind the retained log; too many live watches
    "DryRun": {S.UNIMPLEMENTED},  # a coordinator without the dry-run module
}
ADMIN_ONLY = {
    ("Tenants", "CreateTenant"), ("Tenants", "UpdateTenant"), ("Tenants", "DeleteTenant"),
    *((s, m) for s, m in METHODS if s == "Clusters"),
    ("Tokens", "CreateToken"), ("Tokens", "ListTokens"), ("Tokens", "RevokeToken"),
    ("Admin", "AddMember"), ("Admin", "RemoveMember"),
}
STATS: dict[str, list[str]] = {}
API_TABLES = ("tenants", "deployments", "clusters", "zones", "tokens", "meta")


# --- the group --------------------------------------------------------------------------------------------------


@dataclass
class Fuzz:
    co: Coordinator
    admin: Api
    tenant: Api
    anonymous: Api
    bad_tokens: tuple[str, ...]
    protected_tokens: frozenset[str]
    health: health_pb2_grpc.HealthStub

    @property
    def raft_address(self) -> str:
        return self.co.cfg.raft_address

    def digest(self) -> dict[str, str]:
        """The tables the API writes, as text (NaN-safe), leaving out deployments being deleted (the
        control loop removes those by itself, any time)."""
        state = self.co.node.state_copy()
        deleting = {k for k, d in state.deployments.items() if d.deleting}
        tables: dict[str, dict[str, Any]] = {name: dict(getattr(state, name)) for name in API_TABLES}
        for k in deleting:
            tables["deployments"].pop(k, None)
            tables["meta"].pop(f"deployment/{k}", None)
        return {name: repr(sorted(t.items())) for name, t in tables.items()}


@pytest.fixture(scope="module")
def fz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    base: Path = tmp_path_factory.mktemp("fuzz")
    token, admin_id, _ = new_token()
    (base / "admin.token").write_text(token + "\n", encoding="utf-8")
    [raw] = cluster_configs(base, 1, admin_token_file=str(base / "admin.token"))
    co = Coordinator(CoordinatorConfig.model_validate(raw))
    co.start()
    channels: list[Api] = []
    try:
        admin = Api(co.cfg.api_address, token)
        channels.append(admin)

        def ready() -> bool:
            try:
                return admin.tokens.WhoAmI(api_pb2.WhoAmIRequest(), timeout=2).role == "admin"
            except grpc.RpcError:
                return False

        wait_until(ready, 20.0, "the bootstrap admin token to be registered")
        # two tenants with a deployment each (pool h100: the only cluster has a100 GPUs, so nothing is
        # placed), a registered zone and a cluster
        for tenant, dep in ((MINE, MY_DEPLOYMENT), (OTHER, OTHER_DEPLOYMENT)):
            admin.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg(tenant, quota={"h100": 4})),
                                       timeout=10)
            admin.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(dep, tenant)),
                                              timeout=10)
        admin.clusters.RegisterZone(api_pb2.RegisterZoneRequest(zone=api_pb2.Zone(
            metadata=api_pb2.ObjectMeta(name="az-a"), spec=api_pb2.ZoneSpec(region="eu"))), timeout=10)
        admin.clusters.RegisterCluster(api_pb2.RegisterClusterRequest(cluster=api_pb2.Cluster(
            metadata=api_pb2.ObjectMeta(name="c1"), spec=api_pb2.ClusterSpec(zone="az-a", capacity={"a100": 8}))),
            timeout=10)
        mine = admin.tokens.CreateToken(api_pb2.CreateTokenRequest(role="tenant", tenant=MINE), timeout=10)
        revoked = admin.tokens.CreateToken(api_pb2.CreateTokenRequest(role="tenant", tenant=MINE), timeout=10)
        admin.tokens.RevokeToken(api_pb2.RevokeTokenRequest(id=revoked.info.id), timeout=10)
        expired, expired_id, expired_sha = new_token()
        co.node.submit(codec.encode(c.Batch((c.PutToken(TokenRecord(expired_id, expired_sha, Role.ADMIN, "", 1, 2,
                                                                     "expired")),))), timeout_s=5)
        _, unknown_id, _ = new_token()
        tenant = Api(co.cfg.api_address, mine.token)
        anonymous = Api(co.cfg.api_address, None)
        channels += [tenant, anonymous]
        bad = ("", "garbage", "Basic YWRtaW46YWRtaW4=", "Bearer", "Bearer garbage", f"Bearer cp_{unknown_id}_{'x' * 43}",
               f"Bearer {expired}", f"Bearer {revoked.token}", f"bearer {token[:-1]}")
        health_channel = grpc.insecure_channel(co.cfg.api_address)
        yield Fuzz(co, admin, tenant, anonymous, bad, frozenset({admin_id, mine.info.id}),
                   health_pb2_grpc.HealthStub(health_channel))
        health_channel.close()
    finally:
        for api in channels:
            api.channel.close()
        co.stop()


# --- requests ------------------------------------------------------------------------------------------------------


def _valid_requests(raft_address: str) -> dict[str, Message]:
    """One valid request per method (the base near-valid requests break)."""
    get, lst = api_pb2.GetRequest, api_pb2.ListRequest
    cluster = api_pb2.Cluster(metadata=api_pb2.ObjectMeta(name="c2"),
                              spec=api_pb2.ClusterSpec(zone="az-a", region="eu", capacity={"a100": 2},
                                                       adapter_address="127.0.0.1:7001"))
    policy = api_pb2.ScalingPolicy(target_concurrency=4.0, tolerance=0.1, panic_window_ms=6000, max_step_up=4)
    return {
        "CreateTenant": api_pb2.CreateTenantRequest(tenant=tenant_msg(
            "fresh", 3, quota={"h100": 2}, borrow_limit={"h100": 1}, slo=api_pb2.Slo(ttft_p99_ms=500, max_queue_ms=100))),
        "GetTenant": get(name=MINE, read=api_pb2.ReadOptions(linearizable=True)),
        "ListTenants": lst(read=api_pb2.ReadOptions(linearizable=False)),
        "UpdateTenant": api_pb2.UpdateTenantRequest(tenant=tenant_msg(OTHER, 2, quota={"h100": 4})),
        "DeleteTenant": get_delete(OTHER),
        "ApplyDeployment": api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(
            "fresh-dep", MINE, min_replicas=1, max_replicas=4, warm_pool=1, policy=policy)),
        "GetDeployment": get(name=MY_DEPLOYMENT),
        "ListDeployments": lst(tenant=MINE),
        "DeleteDeployment": get_delete(OTHER_DEPLOYMENT),
        "RegisterCluster": api_pb2.RegisterClusterRequest(cluster=cluster),
        "GetCluster": get(name="c1"),
        "ListClusters": lst(),
        "DeleteCluster": get_delete("c1"),
        "CordonCluster": api_pb2.CordonRequest(name="c1", cordoned=True),
        "DrainCluster": api_pb2.DrainRequest(name="c1"),
        "RegisterZone": api_pb2.RegisterZoneRequest(zone=api_pb2.Zone(metadata=api_pb2.ObjectMeta(name="az-b"),
                                                                      spec=api_pb2.ZoneSpec(region="eu"))),
        "GetZone": get(name="az-a"),
        "ListZones": lst(),
        "DeleteZone": get_delete("az-a"),
        "CordonZone": api_pb2.CordonRequest(name="az-a", cordoned=False),
        "DrainZone": api_pb2.DrainRequest(name="az-a"),
        "Explain": api_pb2.ExplainRequest(deployment=MY_DEPLOYMENT, limit=5),
        "Watch": api_pb2.WatchRequest(since_revision=0, deployment=MY_DEPLOYMENT, tenant=MINE,
                                      kinds=["Deployment", "Decision"], once=True),
        "DryRun": api_pb2.DryRunRequest(deployment=deployment_msg(MY_DEPLOYMENT, MINE, max_replicas=3)),
        "CreateToken": api_pb2.CreateTokenRequest(role="tenant", tenant=OTHER, ttl_seconds=60, description="fuzz"),
        "ListTokens": api_pb2.ListTokensRequest(tenant=MINE),
        "RevokeToken": api_pb2.RevokeTokenRequest(id="0123456789ab"),
        "WhoAmI": api_pb2.WhoAmIRequest(),
        "Status": admin_pb2.StatusRequest(),
        # a membership change that is refused (a node cannot remove itself; an address without a port)
        "AddMember": admin_pb2.MemberRequest(node_id="coord-9", raft_address="127.0.0.1", api_address="127.0.0.1:1"),
        "RemoveMember": admin_pb2.MemberRequest(raft_address=raft_address),
    }


def get_delete(name: str) -> api_pb2.DeleteRequest:
    return api_pb2.DeleteRequest(name=name, resource_version=2**40)  # a version it never has: refused


def requests_for(method: str, raft_address: str) -> st.SearchStrategy[Message]:
    base = _valid_requests(raft_address)[method]
    return st.one_of(messages(base.DESCRIPTOR), near_valid(base))


def destructive(method: str, request: Any, fz: Fuzz) -> bool:
    """Calls that would take the fixture's principal away, or change the Raft membership for real
    (not sent: a successful membership change to a node that does not exist loses the quorum)."""
    if method == "DeleteTenant" and request.name == MINE:
        return True
    if method == "DeleteDeployment" and request.name == MY_DEPLOYMENT:
        return True
    if method == "RevokeToken" and request.id in fz.protected_tokens:
        return True
    if method == "AddMember":
        return bool(request.node_id and request.api_address and address_problem(request.raft_address) is None)
    if method == "RemoveMember":
        return address_problem(request.raft_address) is None and request.raft_address != fz.raft_address
    return False


# --- one call, checked ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    code: grpc.StatusCode
    reply: Any = None
    error: grpc.RpcError | None = None


def invoke(api: Api, service: str, method: str, request: Message,
           metadata: tuple[tuple[str, str], ...] | None = None) -> Outcome:
    fn = getattr(api.stub(service), method)
    try:
        if method != "Watch":
            return Outcome(S.OK, fn(request, timeout=15, metadata=metadata))
        stream = fn(request, timeout=15, metadata=metadata)
        if request.once:
            return Outcome(S.OK, list(stream))
        first = next(stream)  # a live watch: the server's first answer (a bookmark, or the error)
        stream.cancel()
        return Outcome(S.OK, [first])
    except grpc.RpcError as err:
        return Outcome(err.code(), error=err)


def check_status(service: str, method: str, request: Message, out: Outcome) -> None:
    where = f"{service}.{method}({_short(request)})"
    allowed = ALLOWED | EXTRA_ALLOWED.get(method, set())
    assert out.code in allowed, f"{where}: {out.code.name}: {out.error and out.error.details()}"
    if out.error is None:
        return
    details = out.error.details()
    assert details and details.strip(), f"{where}: {out.code.name} without a message"
    if out.code is S.INVALID_ARGUMENT:
        status = rpc_status.from_call(out.error)
        assert status is not None, f"{where}: INVALID_ARGUMENT without google.rpc.Status details: {details}"
        assert status.message == details
        bad = error_details_pb2.BadRequest()
        assert status.details and status.details[0].Unpack(bad), f"{where}: no BadRequest in the details"
        assert bad.field_violations, f"{where}: a BadRequest without field violations"
        for v in bad.field_violations:
            assert v.field and v.description, f"{where}: a field violation without a field: {v} ({details})"
            assert names_a_field(request, v.field), f"{where}: {v.field!r} is not a field of the request ({details})"


def names_a_field(request: Message, path: str) -> bool:
    """Whether ``path`` (``spec.quota.h100``, ``kinds[0]``) names a field of the request, from its
    root or (the convention for requests carrying one object) from that object."""
    roots = [request.DESCRIPTOR] + [f.message_type for f in request.DESCRIPTOR.fields
                                    if f.message_type is not None and not f.message_type.GetOptions().map_entry]

    def resolves(desc: Any) -> bool:
        for part in re.sub(r"\[\d+\]", "", path).split("."):
            if desc is None:  # a map key or past a scalar
                return True
            field = desc.fields_by_name.get(part)
            if field is None:
                return False
            desc = None if field.message_type is None or field.message_type.GetOptions().map_entry else field.message_type
        return True

    return any(resolves(d) for d in roots)


def check_isolation(method: str, out: Outcome) -> None:
    """What a tenant principal gets back is its own tenant's."""
    reply = out.reply
    if method == "ListTenants":  # [MINE], or [] when a random label_selector leaves it out
        assert [t.metadata.name for t in reply.items] in ([MINE], [])
    elif method == "GetTenant":
        assert reply.metadata.name == MINE
    elif method == "ListDeployments":
        assert all(d.spec.tenant == MINE for d in reply.items)
    elif method in ("GetDeployment", "ApplyDeployment"):
        assert reply.spec.tenant == MINE
    elif method == "Explain":
        assert reply.tenant == MINE
    elif method == "Watch":
        assert all(e.type == "BOOKMARK" or e.tenant == MINE for e in reply), [e for e in reply if e.tenant != MINE]
    elif method == "WhoAmI":
        assert (reply.role, reply.tenant) == ("tenant", MINE)


def _short(request: Message) -> str:
    text = str(request).replace("\n", " ")
    return text if len(text) < 300 else text[:300] + "..."


def healthy(fz: Fuzz) -> None:
    reply = fz.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _no_nan_written(fz: Fuzz) -> None:
    """No float the API accepted is NaN or infinite (a NaN target would stall scaling)."""
    state = fz.co.node.state_copy()
    for d in state.deployments.values():
        for f in dataclasses.fields(d.policy):
            value = getattr(d.policy, f.name)
            assert not (isinstance(value, float) and not math.isfinite(value)), (d.id, f.name, value)


# --- the properties ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("principal", ["admin", "tenant"])
@pytest.mark.parametrize(("service", "method"), METHODS, ids=IDS)
def test_random_and_near_valid_requests_get_a_proper_answer(fz: Fuzz, service: str, method: str, principal: str) -> None:
    api = fz.admin if principal == "admin" else fz.tenant
    checked: list[grpc.StatusCode] = []

    @FUZZ
    @given(request=requests_for(method, fz.raft_address))
    def run(request: Message) -> None:
        assume(not destructive(method, request, fz))
        before = fz.digest()
        out = invoke(api, service, method, request)
        checked.append(out.code)
        if os.environ.get("FUZZ_STATS"):
            STATS.setdefault(f"{service}.{method}/{principal}", []).append(out.code.name)
        check_status(service, method, request, out)
        if principal == "tenant" and (service, method) in ADMIN_ONLY:
            assert out.code is S.PERMISSION_DENIED, f"{service}.{method} as a tenant: {out.code.name}"
        if out.code is S.OK and principal == "tenant":
            check_isolation(method, out)
        if out.code is not S.OK:
            after = fz.digest()
            changed = [k for k in API_TABLES if before[k] != after[k]]
            assert not changed, f"{service}.{method} answered {out.code.name} but changed {changed}: {_short(request)}"
        healthy(fz)

    run()
    assert checked
    _no_nan_written(fz)


@pytest.mark.parametrize(("service", "method"), METHODS, ids=IDS)
def test_requests_without_a_valid_token_are_unauthenticated(fz: Fuzz, service: str, method: str) -> None:
    @UNAUTH
    @given(request=requests_for(method, fz.raft_address), auth=st.sampled_from(fz.bad_tokens))
    def run(request: Message, auth: str) -> None:
        before = fz.digest()
        metadata = (("authorization", auth),) if auth else None
        out = invoke(fz.anonymous, service, method, request, metadata)
        assert out.code is S.UNAUTHENTICATED, f"{service}.{method} with {auth[:12]!r}: {out.code.name}"
        assert out.error is not None and out.error.details()
        secret = auth.partition(" ")[2]
        assert not secret or secret not in out.error.details()  # no token echoed
        assert fz.digest() == before
        healthy(fz)

    run()


# --- bytes that are not a message at all ---------------------------------------------------------------------------

_BROKEN = [b"\xff", b"\x0b", b"\x0c", b"\x0a\x05ab", b"\x0a\x02\xc3\x28", b"\x08" + b"\xff" * 11,
           b"\x0a\x80\x80\x80\x80\x10", b"\x12\x01"]
"""Truncated varints and lengths, group tags, invalid UTF-8 in field 1, a length past the end."""


def _method(service: str, method: str) -> tuple[str, type[Message], bool]:
    """(path, request class, server streaming) of a method."""
    module = admin_pb2 if service == "Admin" else api_pb2
    desc = module.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return (f"/{desc.containing_service.full_name}/{method}", message_factory.GetMessageClass(desc.input_type),
            desc.server_streaming)


def payloads(cls: type[Message]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.sampled_from(_BROKEN),
        st.binary(max_size=48),
        st.tuples(messages(cls.DESCRIPTOR).map(lambda m: m.SerializeToString()), st.sampled_from(_BROKEN)).map(
            lambda t: t[0] + t[1]),  # a message with garbage after it
    )


def invoke_raw(channel: grpc.Channel, path: str, streaming: bool, payload: bytes) -> Outcome:
    try:
        if not streaming:
            return Outcome(S.OK, channel.unary_unary(path)(payload, timeout=15))
        stream = channel.unary_stream(path)(payload, timeout=15)
        first = next(stream, None)  # a once watch, or a live one's first bookmark
        stream.cancel()
        return Outcome(S.OK, first)
    except grpc.RpcError as err:
        return Outcome(err.code(), error=err)


@pytest.mark.parametrize(("service", "method"), METHODS, ids=IDS)
def test_undecodable_requests_are_invalid_arguments(fz: Fuzz, service: str, method: str) -> None:
    path, cls, streaming = _method(service, method)

    @UNAUTH
    @given(payload=payloads(cls), admin=st.booleans())
    def run(payload: bytes, admin: bool) -> None:
        try:
            decoded: Message | None = cls.FromString(payload)
        except Exception:  # noqa: BLE001  (what the server must answer INVALID_ARGUMENT for)
            decoded = None
        assume(decoded is None or not destructive(method, decoded, fz))
        before = fz.digest()
        out = invoke_raw((fz.admin if admin else fz.anonymous).channel, path, streaming, payload)
        if not admin:
            assert out.code is S.UNAUTHENTICATED, f"{path} {payload!r} without a token: {out.code.name}"
        elif decoded is None:
            assert out.code is S.INVALID_ARGUMENT, f"{path} {payload!r}: {out.code.name}"
            bad = error_details_pb2.BadRequest()
            status = rpc_status.from_call(out.error)
            assert status is not None and status.details[0].Unpack(bad)
            assert [v.field for v in bad.field_violations] == ["request"] and bad.field_violations[0].description
        else:
            check_status(service, method, decoded, out)
        if out.code is not S.OK:
            assert fz.digest() == before, f"{path} {payload!r} answered {out.code.name} but changed the state"
        healthy(fz)

    run()


def test_negative_resource_versions_are_invalid_and_change_nothing(fz: Fuzz) -> None:
    """0 means unconditional; a negative version is no version at all (-1 used to delete
    unconditionally, lower ones were refused as the internal field ``expect_version``)."""
    before = fz.digest()
    calls: list[tuple[str, str, Message, str]] = [
        ("Tenants", "DeleteTenant", api_pb2.DeleteRequest(name=OTHER, resource_version=-1), "resource_version"),
        ("Deployments", "DeleteDeployment", api_pb2.DeleteRequest(name=f"{OTHER}/{OTHER_DEPLOYMENT}", resource_version=-1),
         "resource_version"),
        ("Clusters", "DeleteCluster", api_pb2.DeleteRequest(name="c1", resource_version=-(2**63)), "resource_version"),
        ("Clusters", "DeleteZone", api_pb2.DeleteRequest(name="az-a", resource_version=-2), "resource_version"),
        ("Tenants", "UpdateTenant", api_pb2.UpdateTenantRequest(tenant=tenant_msg(OTHER, 7, rv=-1)),
         "metadata.resource_version"),
        ("Deployments", "ApplyDeployment", api_pb2.ApplyDeploymentRequest(
            deployment=deployment_msg(OTHER_DEPLOYMENT, OTHER, rv=-1)), "metadata.resource_version"),
    ]
    for service, method, request, field in calls:
        out = invoke(fz.admin, service, method, request)
        assert out.code is S.INVALID_ARGUMENT, (method, out.code)
        check_status(service, method, request, out)
        assert out.error is not None and out.error.details().startswith(f"{field}: "), out.error.details()
    assert fz.digest() == before
