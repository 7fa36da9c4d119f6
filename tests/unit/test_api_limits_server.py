"""The API's per-tenant limits on a real coordinator (one in-process member, gRPC on 127.0.0.1) with
small limits: a watch flood from one tenant (200 once-watches and 48 live watches) leaves other
tenants and admins served, object floods stop at the cap, oversized requests and maps are refused
with the limit named, errors never exceed a short echo, and a tenant probing another tenant's names
gets exactly the answers a free name gets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_status import rpc_status

from controlplane.api.v1 import admin_pb2, api_pb2
from controlplane.coordinator import Coordinator
from tests.support.waiting import wait_until
from tests.unit.test_api_server import Api, deployment_msg, started_group, tenant_msg

S = grpc.StatusCode
LIMITS = dict(api_max_watches=10, api_max_watches_per_tenant=3, api_admin_reserve=2, api_max_deployments_per_tenant=5,
              api_max_tokens_per_tenant=3, api_max_command_bytes=4096, api_max_request_bytes=64 * 1024)
STATUS_DEADLINE_S = 2.0


class Group:
    def __init__(self, co: Coordinator, admin_token: str) -> None:
        self.co = co
        self.endpoint = co.cfg.api_address
        self.admin = Api(self.endpoint, admin_token)
        self.tenant: dict[str, Api] = {}

    def token_for(self, tenant: str) -> str:
        return self.admin.tokens.CreateToken(api_pb2.CreateTokenRequest(role="tenant", tenant=tenant), timeout=10).token


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    with started_group(tmp_path_factory.mktemp("limits"), Group, **LIMITS) as g:
        for name in ("alpha", "bravo", "carol"):
            g.admin.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg(name, quota={"h100": 4})), timeout=10)
            g.tenant[name] = Api(g.endpoint, g.token_for(name))
        g.admin.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("chat", "alpha")),
                                            timeout=10)
        yield g


def _error(call, *args, **kwargs) -> grpc.RpcError | None:  # type: ignore[no-untyped-def]
    try:
        out = call(*args, **kwargs)
        if hasattr(out, "__next__"):
            list(out)
    except grpc.RpcError as exc:
        return exc
    return None


def _status_ok(api: Api) -> float:
    t0 = time.monotonic()
    api.admin.Status(admin_pb2.StatusRequest(), timeout=STATUS_DEADLINE_S)
    return time.monotonic() - t0


# --- watches ---------------------------------------------------------------------------------------------------


def test_a_watch_flood_from_one_tenant_leaves_others_and_admins_served(group: Group) -> None:
    alpha, bravo = group.tenant["alpha"], group.tenant["bravo"]
    live = [alpha.scaling.Watch(api_pb2.WatchRequest(), timeout=60) for _ in range(48)]
    outcomes: list[str] = []
    for stream in live:
        try:
            outcomes.append(next(stream).type)
        except grpc.RpcError as exc:
            assert exc.code() is S.RESOURCE_EXHAUSTED, exc
            assert "api_max_watches_per_tenant" in exc.details() and "at most 3" in exc.details()
            assert dict(exc.trailing_metadata())["cp-limit"] == "api_max_watches_per_tenant"
            outcomes.append("refused")
    assert outcomes.count("BOOKMARK") == 3 and outcomes.count("refused") == 45
    try:
        # 200 once-watches at once: refused at the tenant's cap (its live watches hold it), quickly
        def once(_: int) -> S:
            err = _error(alpha.scaling.Watch, api_pb2.WatchRequest(once=True), timeout=30)
            return S.OK if err is None else err.code()

        status_s: list[float] = []
        with ThreadPoolExecutor(32) as pool:
            flood = pool.map(once, range(200))
            for _ in range(5):
                status_s.append(_status_ok(group.admin))  # admins: served within the deadline
            codes = list(flood)
        assert set(codes) == {S.RESOURCE_EXHAUSTED}
        assert max(status_s) < STATUS_DEADLINE_S
        # another tenant still watches, and so does an admin
        other = bravo.scaling.Watch(api_pb2.WatchRequest(), timeout=30)
        assert next(other).type == "BOOKMARK"
        admin_watch = group.admin.scaling.Watch(api_pb2.WatchRequest(), timeout=30)
        assert next(admin_watch).type == "BOOKMARK"
        other.cancel()
        admin_watch.cancel()
    finally:
        for stream in live:
            stream.cancel()
    wait_until(lambda: group.co.api.core.active_watches == 0, 10.0, "the cancelled watches to end")
    assert _error(alpha.scaling.Watch, api_pb2.WatchRequest(once=True), timeout=30) is None


def test_tenants_together_cannot_take_the_admin_reserve(group: Group) -> None:
    streams = []
    try:
        for name in ("alpha", "bravo", "carol"):  # 3 + 3 + 2 = 8 = api_max_watches 10 - reserve 2
            for _ in range(3):
                streams.append(group.tenant[name].scaling.Watch(api_pb2.WatchRequest(), timeout=60))
        got = []
        for s in streams:
            try:
                got.append(next(s).type)
            except grpc.RpcError as exc:
                got.append(exc.code().name)
                assert "api_max_watches" in exc.details() and "minus api_admin_reserve 2" in exc.details()
        assert got.count("BOOKMARK") == 8 and got.count("RESOURCE_EXHAUSTED") == 1
        admin = [group.admin.scaling.Watch(api_pb2.WatchRequest(), timeout=60) for _ in range(2)]
        streams += admin
        assert [next(s).type for s in admin] == ["BOOKMARK", "BOOKMARK"]
        assert _status_ok(group.admin) < STATUS_DEADLINE_S
    finally:
        for s in streams:
            s.cancel()
    wait_until(lambda: group.co.api.core.active_watches == 0, 10.0, "the cancelled watches to end")


# --- objects and sizes ----------------------------------------------------------------------------------------


def test_a_deployment_flood_stops_at_the_cap_even_when_creates_race(group: Group) -> None:
    carol = group.tenant["carol"]

    def create(i: int) -> S:
        req = api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(f"flood-{i}", "carol"), create_only=True)
        err = _error(carol.deployments.ApplyDeployment, req, timeout=20)
        if err is not None and err.code() is S.RESOURCE_EXHAUSTED:
            assert "api_max_deployments_per_tenant" in err.details() and "the most allowed per tenant (5)" in err.details()
        return S.OK if err is None else err.code()

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(create, range(20)))
    assert codes.count(S.OK) == 5 and codes.count(S.RESOURCE_EXHAUSTED) == 15, codes
    owned = carol.deployments.ListDeployments(api_pb2.ListRequest(), timeout=10).items
    assert len(owned) == 5
    # an update of an owned one still works at the cap
    carol.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(owned[0].metadata.name, "carol")),
                                      timeout=10)


def test_tokens_per_tenant_are_capped(group: Group) -> None:
    have = len(group.admin.tokens.ListTokens(api_pb2.ListTokensRequest(tenant="bravo"), timeout=10).items)
    for _ in range(3 - have):
        group.token_for("bravo")
    err = _error(group.admin.tokens.CreateToken, api_pb2.CreateTokenRequest(role="tenant", tenant="bravo"), timeout=10)
    assert err is not None and err.code() is S.RESOURCE_EXHAUSTED and "api_max_tokens_per_tenant" in err.details()


def test_a_huge_quota_map_and_oversized_requests_are_refused_naming_the_limit(group: Group) -> None:
    big = tenant_msg("big", quota={f"p{i}": 1 for i in range(65)})
    err = _error(group.admin.tenants.CreateTenant, api_pb2.CreateTenantRequest(tenant=big), timeout=10)
    assert err is not None and err.code() is S.INVALID_ARGUMENT
    [v] = [v for d in rpc_status.from_call(err).details for v in _violations(d)]
    assert v.field == "spec.quota" and "at most 64 entries, got 65" in v.description
    huge = tenant_msg("big", quota={f"p{i}-{'x' * 50}": 1 for i in range(1200)})  # ~70 KB > 64 KiB
    err = _error(group.admin.tenants.CreateTenant, api_pb2.CreateTenantRequest(tenant=huge), timeout=10)
    assert err is not None and err.code() is S.RESOURCE_EXHAUSTED
    assert "larger than max" in err.details() and str(64 * 1024) in err.details()  # gRPC's own words
    reported = tenant_msg("big", quota={f"pool-{i:07d}": 1 for i in range(400_000)})  # the reported 6.8 MB map
    assert reported.ByteSize() > 6_000_000
    err = _error(group.admin.tenants.CreateTenant, api_pb2.CreateTenantRequest(tenant=reported), timeout=30)
    assert err is not None and err.code() is S.RESOURCE_EXHAUSTED
    # within the shape limits, but a command over api_max_command_bytes (4096 here)
    wide = tenant_msg("wide", quota={f"p{i:02d}-{'y' * 58}": 1 for i in range(64)})
    err = _error(group.admin.tenants.CreateTenant, api_pb2.CreateTenantRequest(tenant=wide), timeout=10)
    assert err is not None and err.code() is S.RESOURCE_EXHAUSTED and "api_max_command_bytes" in err.details()
    assert _error(group.admin.tenants.GetTenant, api_pb2.GetRequest(name="wide"), timeout=10).code() is S.NOT_FOUND


def _violations(detail):  # type: ignore[no-untyped-def]
    from google.rpc import error_details_pb2

    br = error_details_pb2.BadRequest()
    return br.field_violations if detail.Unpack(br) else []


@pytest.mark.parametrize("char", ["z", "\u00e9", "\U0001f600"])
def test_max_size_values_never_overflow_the_error_metadata(group: Group, char: str) -> None:
    alpha = group.tenant["alpha"]
    value = char * (60 * 1024 // len(char.encode()))  # just under api_max_request_bytes
    probes = [
        (alpha.deployments.GetDeployment, api_pb2.GetRequest(name=value)),
        (alpha.scaling.Watch, api_pb2.WatchRequest(kinds=[value])),
        (alpha.deployments.ApplyDeployment, api_pb2.ApplyDeploymentRequest(deployment=api_pb2.Deployment(
            metadata=api_pb2.ObjectMeta(name="ok"), spec=api_pb2.DeploymentSpec(tenant="alpha", model=value)))),
        (group.admin.tokens.RevokeToken, api_pb2.RevokeTokenRequest(id=value)),
        (group.admin.tokens.CreateToken, api_pb2.CreateTokenRequest(role=value[:900])),
        (group.admin.clusters.RegisterCluster, api_pb2.RegisterClusterRequest(cluster=api_pb2.Cluster(
            metadata=api_pb2.ObjectMeta(name="c"), spec=api_pb2.ClusterSpec(zone="z", capacity={value[:900]: 1})))),
    ]
    for call, request in probes:
        err = _error(call, request, timeout=10)
        assert err is not None and err.code() is S.INVALID_ARGUMENT, (call, err)
        size = sum(len(k) + len(v) for k, v in err.trailing_metadata()) + len(err.details().encode())
        assert size < 4 * 1024, size
        assert value[:200] not in err.details()


# --- no existence oracle -----------------------------------------------------------------------------------------


def _answer(call, request, name: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    err = _error(call, request, timeout=10)
    if err is None:
        return "OK", ""
    return err.code().name, err.details().replace(name, "<name>")


def test_another_tenants_names_answer_exactly_as_free_names(group: Group) -> None:
    """Names are per tenant (docs/security.md "Names"): every answer to bravo about a name alpha owns
    is the answer for a name nobody owns, a create included, which creates bravo's own."""
    admin, alpha, bravo = group.admin, group.tenant["alpha"], group.tenant["bravo"]
    alpha.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("tools", "alpha")),
                                      timeout=10)
    alpha_before = {n: admin.deployments.GetDeployment(api_pb2.GetRequest(name=f"alpha/{n}"), timeout=10)
                    for n in ("chat", "tools")}
    assert {d.spec.tenant for d in alpha_before.values()} == {"alpha"}

    def listed() -> list[str]:
        return [d.metadata.name for d in bravo.deployments.ListDeployments(api_pb2.ListRequest(), timeout=10).items]

    def probes(name: str, create_only: bool) -> list[tuple[str, str]]:
        def answer(call, request) -> tuple[str, str]:  # type: ignore[no-untyped-def]
            return _answer(call, request, name)

        def dry(full: bool = True) -> tuple[str, str]:
            out = bravo.scaling.DryRun(api_pb2.DryRunRequest(deployment=deployment_msg(name, "bravo")), timeout=10)
            if not full:  # of an existing deployment: its notes depend on whether the loop has sampled it yet
                return "DryRun", str(out.exists)
            return "DryRun", str((out.exists, out.current_replicas, out.target_before, [c.field for c in out.changes],
                                  [n.replace(name, "<name>") for n in out.notes]))

        def watch() -> tuple[str, str]:
            events = bravo.scaling.Watch(api_pb2.WatchRequest(once=True, deployment=name, kinds=["Deployment"]), timeout=10)
            return "Watch", str([(e.type, e.name.replace(name, "<name>"), e.tenant) for e in events])

        before = [
            answer(bravo.deployments.GetDeployment, api_pb2.GetRequest(name=name)),
            answer(bravo.deployments.GetDeployment, api_pb2.GetRequest(name=name, read=api_pb2.ReadOptions(linearizable=True))),
            answer(bravo.deployments.GetDeployment, api_pb2.GetRequest(name=f"bravo/{name}")),
            answer(bravo.deployments.DeleteDeployment, api_pb2.DeleteRequest(name=name)),
            answer(bravo.deployments.DeleteDeployment, api_pb2.DeleteRequest(name=name, resource_version=3)),
            answer(bravo.scaling.Explain, api_pb2.ExplainRequest(deployment=name)),
            answer(bravo.deployments.ApplyDeployment,
                   api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(name, "bravo", rv=7))),
            dry(), watch(), ("List", str(name in listed())),
        ]
        created = bravo.deployments.ApplyDeployment(
            api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(name, "bravo"), create_only=create_only), timeout=10)
        got = bravo.deployments.GetDeployment(api_pb2.GetRequest(name=name), timeout=10)
        after = [
            ("Create", str((created.metadata.name == name, created.spec.tenant, created.metadata.resource_version > 0))),
            ("Get", str((got.metadata.name == name, got.spec.tenant, got.metadata.created_ms == created.metadata.created_ms))),
            answer(bravo.deployments.ApplyDeployment,
                   api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(name, "bravo"), create_only=True)),
            dry(full=False), watch(), ("List", str(name in listed())),
            answer(bravo.scaling.Explain, api_pb2.ExplainRequest(deployment=name, limit=1)),
        ]
        return before + after

    for create_only, taken, free in ((True, "chat", "free-one"), (False, "tools", "free-two")):
        answers = probes(taken, create_only)
        assert answers == probes(free, create_only), (create_only, taken, free)
        nf = ("NOT_FOUND", "deployment '<name>' not found")
        qualified_nf = ("NOT_FOUND", "deployment 'bravo/<name>' not found")  # echoes the name as sent
        assert answers[:7] == [nf, nf, qualified_nf, nf, nf, nf, nf]  # Get, Get qualified, Delete, Explain, Apply
        assert answers[7][1].startswith("(False, 0, 0, ") and answers[8:10] == [("Watch", "[('BOOKMARK', '', '')]"),
                                                                                ("List", "False")]
        assert answers[10:] == [("Create", "(True, 'bravo', True)"), ("Get", "(True, 'bravo', True)"),
                                ("ALREADY_EXISTS", "deployment '<name>' already exists"), ("DryRun", "True"),
                                ("Watch", "[('ADDED', '<name>', 'bravo'), ('BOOKMARK', '', '')]"), ("List", "True"),
                                ("OK", "")]
    assert sorted(listed()) == ["chat", "free-one", "free-two", "tools"]
    err = _error(bravo.deployments.GetDeployment, api_pb2.GetRequest(name="never-created"), timeout=10)
    assert err is not None and (err.code(), err.details()) == (S.NOT_FOUND, "deployment 'never-created' not found")
    err = _error(bravo.deployments.ApplyDeployment,
                 api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("chat", "bravo"), create_only=True), timeout=10)
    assert err is not None and (err.code(), err.details()) == (S.ALREADY_EXISTS, "deployment 'chat' already exists")
    # Two deployments named chat, one per tenant, with distinct ids; alpha's is untouched.
    for n, d in alpha_before.items():
        now = admin.deployments.GetDeployment(api_pb2.GetRequest(name=f"alpha/{n}"), timeout=10)
        assert (now.spec, now.metadata) == (d.spec, d.metadata), n
    state = group.co.node.state_copy()
    assert {d_id: d.tenant for d_id, d in state.deployments.items() if d_id.endswith("/chat")} == {
        "alpha/chat": "alpha", "bravo/chat": "bravo"}
    assert [d.metadata.name for d in alpha.deployments.ListDeployments(api_pb2.ListRequest(), timeout=10).items] == [
        "chat", "tools"]
    # alpha's view of bravo's qualified name is a free name too
    err = _error(alpha.deployments.GetDeployment, api_pb2.GetRequest(name="bravo/free-one"), timeout=10)
    assert err is not None and (err.code(), err.details()) == (S.NOT_FOUND, "deployment 'bravo/free-one' not found")
