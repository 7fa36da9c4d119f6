"""An in-process fake of the control plane's API (the generated servicer base classes, in-memory
objects) for tenantctl's tests, plus checks of the fake itself.

A :class:`FakeGroup` shares one store between several endpoints, like a Raft group: an endpoint can
be told to answer UNAVAILABLE with a leader hint (``leaderless``), to break watch streams after a
number of events (``break_after``), or be stopped altogether.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from controlplane.api.v1 import admin_pb2, admin_pb2_grpc, api_pb2, api_pb2_grpc
from controlplane.domain.errors import ValidationError
from controlplane.domain.labels import parse_selector
from controlplane.runtime import event_types

ADMIN_TOKEN = "cp_aaaaaaaaaaaa_" + "A" * 43
TENANT_TOKEN = "cp_bbbbbbbbbbbb_" + "B" * 43


@dataclass
class Store:
    lock: threading.Lock = field(default_factory=threading.Lock)
    revision: int = 0
    tenants: dict[str, api_pb2.Tenant] = field(default_factory=dict)
    deployments: dict[str, api_pb2.Deployment] = field(default_factory=dict)
    clusters: dict[str, api_pb2.Cluster] = field(default_factory=dict)
    zones: dict[str, api_pb2.Zone] = field(default_factory=dict)
    tokens: dict[str, api_pb2.TokenInfo] = field(default_factory=dict)
    events: list[api_pb2.Event] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    """Every method called (on any endpoint), in order."""
    live: api_pb2.LiveDecision | None = None
    """What ``Explain`` answers as the live decision (None: a fixed scale-up without a forecast)."""

    def bump(self) -> int:
        self.revision += 1
        return self.revision


class Endpoint:
    """One fake coordinator."""

    def __init__(self, group: FakeGroup, node_id: str) -> None:
        self.group = group
        self.node_id = node_id
        self.leaderless_hint: str | None = None
        self.lagging = False
        """Refuse every token UNAUTHENTICATED (a node that has not applied the tokens yet)."""
        self.break_after: int | None = None
        self.on_watch: list = []
        """Callables run (once each) when a watch starts on this endpoint."""
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        for add, servicer in ((api_pb2_grpc.add_TenantsServicer_to_server, _Tenants(self)),
                              (api_pb2_grpc.add_DeploymentsServicer_to_server, _Deployments(self)),
                              (api_pb2_grpc.add_ClustersServicer_to_server, _Clusters(self)),
                              (api_pb2_grpc.add_ScalingServicer_to_server, _Scaling(self)),
                              (api_pb2_grpc.add_TokensServicer_to_server, _Tokens(self)),
                              (admin_pb2_grpc.add_AdminServicer_to_server, _Admin(self))):
            add(servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait(2)

    # every call goes through here
    def enter(self, method: str, context: grpc.ServicerContext, write: bool = False) -> str:
        store = self.group.store
        with store.lock:
            store.calls.append(method)
        meta = dict(context.invocation_metadata())
        auth = meta.get("authorization", "")
        token = auth.removeprefix("Bearer ")
        if token not in (ADMIN_TOKEN, TENANT_TOKEN) or self.lagging:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown token")
        if self.leaderless_hint is not None and method != "Status":
            if self.leaderless_hint:
                context.set_trailing_metadata((("leader-hint", self.leaderless_hint),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "no leader")
        return "admin" if token == ADMIN_TOKEN else "tenant"


class FakeGroup:
    def __init__(self, n: int = 2) -> None:
        self.store = Store()
        self.endpoints = [Endpoint(self, f"n{i + 1}") for i in range(n)]

    @property
    def addresses(self) -> list[str]:
        return [e.address for e in self.endpoints]

    def stop(self) -> None:
        for e in self.endpoints:
            e.stop()

    def emit(self, **kw) -> api_pb2.Event:
        with self.store.lock:
            rev = kw.pop("revision", None) or self.store.bump()
            kw.setdefault("significant", True)  # as the real server marks all but Busy flips and no-op decisions
            e = api_pb2.Event(revision=rev, **kw)
            self.store.events.append(e)
        return e


def _meta(name: str, store: Store, old: api_pb2.ObjectMeta | None = None, sent: api_pb2.ObjectMeta | None = None
          ) -> api_pb2.ObjectMeta:
    """What the server stamps on a write; the labels are the ones ``sent`` (as the real server)."""
    rev = store.bump()
    created = old.created_ms if old is not None else 1_700_000_000_000
    return api_pb2.ObjectMeta(name=name, resource_version=rev, created_ms=created, updated_ms=created + rev,
                              labels=dict(sent.labels) if sent is not None else {})


def _select(request, items, context):  # type: ignore[no-untyped-def]
    """``ListRequest.label_selector`` as the real server evaluates it (domain/labels.py)."""
    try:
        selector = parse_selector(request.label_selector)
    except ValidationError as exc:
        _bad_request(context, "label_selector", exc.problem)
    return [i for i in items if selector.matches(i.metadata.labels)]


def _result(obj, result: str):  # type: ignore[no-untyped-def]
    """A copy of ``obj`` with ``metadata.apply_result`` set (what the real writers answer)."""
    out = type(obj)()
    out.CopyFrom(obj)
    out.metadata.apply_result = result
    return out


def _bad_request(context: grpc.ServicerContext, field_name: str, description: str) -> None:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field=field_name, description=description)]))
    context.abort_with_status(rpc_status.to_status(status_pb2.Status(
        code=code_pb2.INVALID_ARGUMENT, message=f"{field_name}: {description}", details=[detail])))


def _check_version(context, obj, wanted: int) -> None:
    if wanted and obj.metadata.resource_version != wanted:
        context.set_trailing_metadata((("cp-error", "version-mismatch"),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"version mismatch: expected {wanted}, is {obj.metadata.resource_version}")


class _Base:
    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep

    @property
    def store(self) -> Store:
        return self.ep.group.store


class _Tenants(_Base, api_pb2_grpc.TenantsServicer):
    def CreateTenant(self, request, context):
        self.ep.enter("CreateTenant", context, write=True)
        t = request.tenant
        if not t.spec.HasField("priority"):
            _bad_request(context, "spec.priority", "required")
        with self.store.lock:
            if t.metadata.name in self.store.tenants:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"tenant {t.metadata.name!r} already exists")
            obj = api_pb2.Tenant(metadata=_meta(t.metadata.name, self.store, sent=t.metadata), spec=t.spec)
            self.store.tenants[t.metadata.name] = obj
            return _result(obj, "created")

    def UpdateTenant(self, request, context):
        self.ep.enter("UpdateTenant", context, write=True)
        t = request.tenant
        with self.store.lock:
            old = self.store.tenants.get(t.metadata.name)
            if old is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"tenant {t.metadata.name!r} not found")
            _check_version(context, old, t.metadata.resource_version)
            obj = api_pb2.Tenant(metadata=_meta(t.metadata.name, self.store, old.metadata, t.metadata), spec=t.spec)
            self.store.tenants[t.metadata.name] = obj
            return _result(obj, "configured")

    def GetTenant(self, request, context):
        self.ep.enter("GetTenant", context)
        obj = self.store.tenants.get(request.name)
        if obj is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"tenant {request.name!r} not found")
        return obj

    def ListTenants(self, request, context):
        self.ep.enter("ListTenants", context)
        context.set_trailing_metadata((("applied-index", str(self.store.revision)),))
        return api_pb2.TenantList(items=_select(request, sorted(self.store.tenants.values(), key=lambda t: t.metadata.name),
                                                context),
                                  read=api_pb2.ReadInfo(applied_index=self.store.revision, revision=self.store.revision, served_by=self.ep.node_id))

    def DeleteTenant(self, request, context):
        self.ep.enter("DeleteTenant", context, write=True)
        with self.store.lock:
            old = self.store.tenants.get(request.name)
            if old is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"tenant {request.name!r} not found")
            if any(d.spec.tenant == request.name for d in self.store.deployments.values()):
                context.set_trailing_metadata((("cp-error", "conflict"),))
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"tenant {request.name!r} still owns deployments")
            del self.store.tenants[request.name]
            return api_pb2.DeleteResponse(revision=self.store.bump())


def _deployment(store, name: str):  # type: ignore[no-untyped-def]
    """The deployment a request names: ``NAME`` (as a tenant's token does; the fake keeps one
    deployment per local name) or ``TENANT/NAME`` (as an admin does), like the real server."""
    tenant, _, local = name.rpartition("/")
    obj = store.deployments.get(local)
    return None if obj is None or (tenant and obj.spec.tenant != tenant) else obj


class _Deployments(_Base, api_pb2_grpc.DeploymentsServicer):
    def ApplyDeployment(self, request, context):
        self.ep.enter("ApplyDeployment", context, write=True)
        d = request.deployment
        with self.store.lock:
            if d.spec.tenant not in self.store.tenants:
                context.abort(grpc.StatusCode.NOT_FOUND, f"tenant {d.spec.tenant!r} not found")
            old = self.store.deployments.get(d.metadata.name)
            if old is not None:
                _check_version(context, old, d.metadata.resource_version)
            status = api_pb2.DeploymentStatus(desired_replicas=d.spec.min_replicas or 1, desired_warm_pool=1,
                                              replicas_by_state={"ready": 1, "standby": 1}, gpus_per_instance=1,
                                              instances=[api_pb2.InstanceInfo(id="i-1", state="ready", cluster="c1",
                                                                              zone="z1", init_method="cold")])
            obj = api_pb2.Deployment(metadata=_meta(d.metadata.name, self.store, old.metadata if old else None, d.metadata),
                                     spec=d.spec, status=status)
            self.store.deployments[d.metadata.name] = obj
            return _result(obj, "configured" if old else "created")

    def GetDeployment(self, request, context):
        self.ep.enter("GetDeployment", context)
        obj = _deployment(self.store, request.name)
        if obj is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"deployment {request.name!r} not found")
        return obj

    def ListDeployments(self, request, context):
        self.ep.enter("ListDeployments", context)
        items = [d for d in self.store.deployments.values() if not request.tenant or d.spec.tenant == request.tenant]
        return api_pb2.DeploymentList(items=_select(request, items, context), read=api_pb2.ReadInfo(applied_index=self.store.revision, revision=self.store.revision))

    def DeleteDeployment(self, request, context):
        self.ep.enter("DeleteDeployment", context, write=True)
        with self.store.lock:
            old = _deployment(self.store, request.name)
            if old is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"deployment {request.name!r} not found")
            _check_version(context, old, request.resource_version)
            old.status.deleting = True
            return api_pb2.DeleteResponse(revision=self.store.bump())


class _Clusters(_Base, api_pb2_grpc.ClustersServicer):
    def RegisterCluster(self, request, context):
        self.ep.enter("RegisterCluster", context, write=True)
        c = request.cluster
        with self.store.lock:
            old = self.store.clusters.get(c.metadata.name)
            obj = api_pb2.Cluster(metadata=_meta(c.metadata.name, self.store, old.metadata if old else None, c.metadata),
                                  spec=c.spec,
                                  status=old.status if old else api_pb2.ClusterStatus(schedulable=True))
            self.store.clusters[c.metadata.name] = obj
            return _result(obj, "configured" if old else "created")

    def GetCluster(self, request, context):
        self.ep.enter("GetCluster", context)
        obj = self.store.clusters.get(request.name)
        if obj is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"cluster {request.name!r} not found")
        return obj

    def ListClusters(self, request, context):
        self.ep.enter("ListClusters", context)
        return api_pb2.ClusterList(items=_select(request, list(self.store.clusters.values()), context))

    def DeleteCluster(self, request, context):
        self.ep.enter("DeleteCluster", context, write=True)
        if self.store.clusters.pop(request.name, None) is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"cluster {request.name!r} not found")
        return api_pb2.DeleteResponse(revision=self.store.bump())

    def CordonCluster(self, request, context):
        self.ep.enter("CordonCluster", context, write=True)
        obj = self.GetCluster(api_pb2.GetRequest(name=request.name), context)
        obj.status.cordoned = request.cordoned
        obj.status.schedulable = not request.cordoned
        if not request.cordoned:
            obj.status.draining = False
        return obj

    def DrainCluster(self, request, context):
        self.ep.enter("DrainCluster", context, write=True)
        obj = self.GetCluster(api_pb2.GetRequest(name=request.name), context)
        obj.status.cordoned = obj.status.draining = True
        obj.status.schedulable = False
        return obj

    def RegisterZone(self, request, context):
        self.ep.enter("RegisterZone", context, write=True)
        z = request.zone
        old = self.store.zones.get(z.metadata.name)
        obj = api_pb2.Zone(metadata=_meta(z.metadata.name, self.store, sent=z.metadata), spec=z.spec,
                           status=api_pb2.ZoneStatus(registered=True))
        self.store.zones[z.metadata.name] = obj
        return _result(obj, "configured" if old else "created")

    def GetZone(self, request, context):
        self.ep.enter("GetZone", context)
        obj = self.store.zones.get(request.name)
        if obj is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"zone {request.name!r} not found")
        return obj

    def ListZones(self, request, context):
        self.ep.enter("ListZones", context)
        return api_pb2.ZoneList(items=_select(request, list(self.store.zones.values()), context))

    def DeleteZone(self, request, context):
        self.ep.enter("DeleteZone", context, write=True)
        if self.store.zones.pop(request.name, None) is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"zone {request.name!r} not found")
        return api_pb2.DeleteResponse(revision=self.store.bump())

    def CordonZone(self, request, context):
        self.ep.enter("CordonZone", context, write=True)
        obj = self.store.zones.setdefault(request.name, api_pb2.Zone(metadata=api_pb2.ObjectMeta(name=request.name)))
        obj.status.cordoned = request.cordoned
        return obj

    def DrainZone(self, request, context):
        self.ep.enter("DrainZone", context, write=True)
        obj = self.store.zones.setdefault(request.name, api_pb2.Zone(metadata=api_pb2.ObjectMeta(name=request.name)))
        obj.status.cordoned = obj.status.draining = True
        return obj


class _Scaling(_Base, api_pb2_grpc.ScalingServicer):
    def Explain(self, request, context):
        self.ep.enter("Explain", context)
        d = _deployment(self.store, request.deployment)
        if d is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"deployment {request.deployment!r} not found")
        return api_pb2.Explanation(
            deployment=d.metadata.name, tenant=d.spec.tenant, desired_replicas=3, desired_warm_pool=1,
            history=[api_pb2.Decision(revision=7, at_ms=1_700_000_000_000, replicas=3, warm_pool=1, reason="scale_up",
                                      message="concurrency 70 / 24 per replica")],
            live=self.store.live or api_pb2.LiveDecision(
                at_ms=1_700_000_001_000, current=2, target=3, granted=3, reason="scale_up",
                proposals={"concurrency": 3}, signals={"concurrency": 70.0}),
            lease_holder="n1")

    def DryRun(self, request, context):
        self.ep.enter("DryRun", context)
        if request.zones or request.clusters or request.tenants or request.deployments:
            return self._file(request)
        return self._scaling(request.deployment)

    def _scaling(self, d):
        exists = d.metadata.name in self.store.deployments
        return api_pb2.DryRunResult(
            exists=exists, changes=[api_pb2.FieldChange(field="max_replicas", before="64", after="6")] if exists else [],
            current_replicas=2, target_before=3, target_after=3, warm_pool_after=1, reason_after="stable",
            notes=["tenant a may hold 8 h100"], live_signals=True)

    def _file(self, request):
        """A whole file (the real server: controlplane/api/file_dryrun.py): every object as it is sent,
        created or configured; a deployment of an unknown tenant (not in the store or the file) refused."""
        tenants = set(self.store.tenants) | {t.metadata.name for t in request.tenants}
        objects = []
        for kind, items, table in (("Zone", request.zones, self.store.zones),
                                   ("Cluster", request.clusters, self.store.clusters),
                                   ("Tenant", request.tenants, self.store.tenants),
                                   ("Deployment", request.deployments, self.store.deployments)):
            for msg in items:
                o = api_pb2.DryRunObject(kind=kind, name=msg.metadata.name)
                if kind == "Deployment" and msg.spec.tenant not in tenants:
                    o.error_code, o.error = "NOT_FOUND", f"tenant {msg.spec.tenant!r} not found"
                else:
                    obj = getattr(o, kind.lower())
                    obj.CopyFrom(msg)
                    obj.metadata.apply_result = "configured" if msg.metadata.name in table else "created"
                    if kind == "Deployment":
                        o.scaling.CopyFrom(self._scaling(msg))
                objects.append(o)
        return api_pb2.DryRunResult(objects=objects, live_signals=True)

    def Watch(self, request, context):
        self.ep.enter("Watch", context)
        while self.ep.on_watch:
            self.ep.on_watch.pop(0)()
        store = self.store
        yield api_pb2.Event(type="BOOKMARK", revision=store.revision, served_by=self.ep.node_id)
        sent = 0
        since = request.since_revision if request.HasField("since_revision") else store.revision
        for e in list(store.events):
            if e.revision <= since:
                continue
            if request.deployment and e.deployment != request.deployment:
                continue
            if request.kinds and e.kind not in request.kinds:
                continue
            if not event_types.selector(request.all, event_types.parse_types(request.types))(e):
                continue
            if self.ep.break_after is not None and sent >= self.ep.break_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "node shutting down")
            out = api_pb2.Event()
            out.CopyFrom(e)
            out.served_by = self.ep.node_id
            yield out
            sent += 1
        # the fake never waits for live events: it ends the stream (a `once` watch) or breaks it
        if not request.once:
            context.abort(grpc.StatusCode.UNAVAILABLE, "stream ends (fake)")


class _Tokens(_Base, api_pb2_grpc.TokensServicer):
    def CreateToken(self, request, context):
        role = self.ep.enter("CreateToken", context, write=True)
        if role != "admin":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "admins only")
        if request.role == "tenant" and request.tenant not in self.store.tenants:
            context.abort(grpc.StatusCode.NOT_FOUND, f"tenant {request.tenant!r} not found")
        tid = f"{len(self.store.tokens) + 1:012x}"
        info = api_pb2.TokenInfo(id=tid, role=request.role, tenant=request.tenant, created_ms=1_700_000_000_000,
                                 expires_ms=(1_700_000_000_000 + request.ttl_seconds * 1000) if request.ttl_seconds else 0,
                                 description=request.description)
        self.store.tokens[tid] = info
        return api_pb2.CreatedToken(info=info, token=f"cp_{tid}_" + "S" * 43)

    def ListTokens(self, request, context):
        self.ep.enter("ListTokens", context)
        return api_pb2.TokenList(items=[t for t in self.store.tokens.values()
                                        if not request.tenant or t.tenant == request.tenant])

    def RevokeToken(self, request, context):
        self.ep.enter("RevokeToken", context, write=True)
        if self.store.tokens.pop(request.id, None) is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"token {request.id!r} not found")
        return api_pb2.DeleteResponse(revision=self.store.bump())

    def WhoAmI(self, request, context):
        role = self.ep.enter("WhoAmI", context)
        if role == "admin":
            return api_pb2.Principal(token_id="aaaaaaaaaaaa", role="admin")
        return api_pb2.Principal(token_id="bbbbbbbbbbbb", role="tenant", tenant="team-a")


class _Admin(_Base, admin_pb2_grpc.AdminServicer):
    def Status(self, request, context):
        self.ep.enter("Status", context)
        leader = self.ep.group.endpoints[0].node_id
        return admin_pb2.StatusResponse(node_id=self.ep.node_id, zone="z1", role="leader" if self.ep.node_id == leader
                                        else "follower", term=2, leader_id=leader, lease_holder=leader, lease_epoch=5,
                                        commit_index=self.store.revision, applied_index=self.store.revision,
                                        version="test", api_address=self.ep.address)


# --------------------------------------------------------------------------------------------------
# The fake's own checks
# --------------------------------------------------------------------------------------------------


def test_fake_refuses_calls_without_a_token() -> None:
    group = FakeGroup(1)
    try:
        with grpc.insecure_channel(group.addresses[0]) as ch:
            try:
                api_pb2_grpc.TenantsStub(ch).ListTenants(api_pb2.ListRequest(), timeout=5)
            except grpc.RpcError as exc:
                assert exc.code() is grpc.StatusCode.UNAUTHENTICATED
            else:
                raise AssertionError("expected UNAUTHENTICATED")
    finally:
        group.stop()
