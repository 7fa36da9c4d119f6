"""The coordinator's gRPC server: the platform API (``api.proto``: Tenants, Deployments, Clusters,
Scaling, Tokens), the Admin service (``admin.proto``), grpc.health.v1 per service and server
reflection of all of them, over TLS (mutual TLS optional) or, on loopback, plaintext.

How a call is served (the proto header is the contract):

* **Authentication**: :class:`~controlplane.api.auth.AuthInterceptor` refuses any call without a
  valid bearer token before a servicer runs; every method then resolves its principal and applies
  the tenant rules itself (another tenant's objects are NOT_FOUND, lists are filtered, cluster, zone,
  token and membership methods need an admin: PERMISSION_DENIED).
* **Deployment names** are per tenant (:mod:`controlplane.api.names`): a request's name is resolved
  to the id ``<tenant>/<name>`` (or a legacy unqualified id of that tenant), answers give the local
  name with the tenant beside it, and errors name the deployment as the request did.
* **Writes** become one replicated command in a one-command batch, submitted through the local Raft
  node (a follower forwards it to the leader; the call returns once this node applied it) and never
  fenced (API writes are not the control loop's). The command's ``ApplyResult.code`` maps to the
  status: ``not_found`` NOT_FOUND, ``already_exists`` ALREADY_EXISTS, ``version_mismatch`` and
  ``conflict`` FAILED_PRECONDITION (``cp-error`` trailing metadata says which), ``invalid`` /
  ``malformed`` INVALID_ARGUMENT. No leader: UNAVAILABLE with ``leader-hint``; outcome unknown
  (leadership lost, commit timeout): UNAVAILABLE / DEADLINE_EXCEEDED with ``cp-outcome: unknown``.
  The reply is the object as read back from this node's replica after the apply. An object equal to
  the stored one, or a ``dry_run`` request, commits nothing (:mod:`controlplane.api.writes`;
  ``metadata.apply_result``); a whole file's DryRun is :mod:`controlplane.api.file_dryrun`.
* **Reads** come from the local replica; ``applied-index`` trailing metadata (and ``ReadInfo`` in
  lists) says how far it had applied. A linearizable read first commits an empty batch (a no-op log
  entry) and waits until this node applied it.
* **Errors** never carry a traceback: every servicer method runs inside :func:`_guarded`, which maps
  the known failures and answers anything unexpected with INTERNAL (logged here, with the method).
  INVALID_ARGUMENT carries ``google.rpc.BadRequest`` details with one field violation per problem.
* **Limits** (:mod:`controlplane.api.limits`, docs/api.md "Limits"): watches (``once`` ones
  included) and other calls in flight per tenant and in total, with a reserve for admins; request,
  string, map and command sizes; deployments and tokens per tenant (in the replicated apply). A
  limit reached is RESOURCE_EXHAUSTED naming the limit and its value (``cp-limit`` trailing metadata:
  its configuration field). No error repeats more than a short prefix of a client's value.
* **Watch** streams hold one worker thread each. A watch ends when the client goes away, when the server stops, or
  when it falls behind the retained event log (OUT_OF_RANGE: list again, then watch).
* **Explain / DryRun** need the lease holder's live view (its latest evaluation and filtered
  signals); another coordinator forwards the call to the holder's API with the caller's token (one
  hop, short deadline) and answers without the live part if that fails.

Tokens are never logged; log lines name a principal by its public token id.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controlplane.api import conditions as conds
from controlplane.api import redact
from controlplane.api import convert as cv
from controlplane.api import limits as lim
from controlplane.api import file_dryrun, names, writes
from controlplane.api.admin import Membership, NodeStatus, for_tenant, to_proto
from controlplane.api.auth import (
    Authenticator,
    AuthInterceptor,
    CatchingUp,
    Forbidden,
    Principal,
    Unauthenticated,
    bearer_of,
    same_shape_handler,
)
from controlplane.api.channel import channel_options
from controlplane.api.selection import selected
from controlplane.api.token_settle import TokenSettle
from controlplane.api.v1 import admin_pb2, admin_pb2_grpc, api_pb2, api_pb2_grpc
from controlplane.config import CoordinatorConfig
from controlplane.domain import commands as c
from controlplane.domain.errors import (
    CommitTimeout,
    ControlPlaneError,
    LeadershipLost,
    NotLeader,
    PermanentError,
    QueueFull,
    Unavailable,
    ValidationError,
)
from controlplane.domain.ids import local_name, qualified_id
from controlplane.domain.state import ApplyResult, ControlState
from controlplane.domain.tenants import Deployment, Slo
from controlplane.domain.tokens import MAX_DESCRIPTION, Role, TokenRecord
from controlplane.domain.topology import Zone
from controlplane.runtime.clock import wall_ms
from controlplane.runtime import event_types
from controlplane.runtime.events import EventLog, EventsCompacted
from controlplane.tokens import new_token
from raft import codec

log = structlog.get_logger("controlplane.api")

MAX_WATCHES = 16
"""Default of ``api_max_watches``: watch streams served at once (each holds a worker thread)."""
BOOKMARK_EVERY_S = 5.0
WATCH_POLL_S = 0.5
"""Longest a watch waits before checking that its client and the server are still there."""
WATCH_PAGE = 1000
"""Most events read from the log at once."""
FORWARD_DEADLINE_S = 1.5
"""Deadline of a call forwarded to the lease holder (Explain, DryRun)."""
RMW_ATTEMPTS = 4
"""Read-modify-write attempts (cordon, drain, unconditional updates) before giving up."""
DEFAULT_EXPLAIN_LIMIT = 20
MAX_EXPLAIN_LIMIT = 200
MAX_TTL_S = 10 * 365 * 24 * 3600
HEAVY_WAIT_S = 10.0
"""Longest a watch waits for its turn to read the event log (``api_heavy_concurrency``)."""
FORWARDED = "cp-forwarded"
"""Metadata on a call one coordinator forwards to another (never forwarded again)."""
WATCH_KINDS = ("Tenant", "Deployment", "Cluster", "Zone", "Instance", "Decision", "Breaker", "Lease")

API_SERVICES = ("Tenants", "Deployments", "Clusters", "Scaling", "Tokens")
SERVICE_NAMES = tuple(api_pb2.DESCRIPTOR.services_by_name[s].full_name for s in API_SERVICES) + (
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
)


# --- what the servicers need from the coordinator ------------------------------------------------------


class NodeView(Protocol):
    """The parts of :class:`raft.node.RaftNode` the API uses."""

    node_id: str

    def submit(self, payload: bytes, *, timeout_s: float, fence: tuple[str, int] | None = None) -> object: ...

    def state_copy(self) -> ControlState: ...

    def status(self) -> Any: ...

    def lease_view(self) -> Any: ...

    def leader_id(self) -> str | None: ...

    def leader_api_address(self) -> str | None: ...

    @property
    def events(self) -> EventLog:
        """The applied changes as events (watch, explain's history, conditions' decision messages)."""
        ...


class HolderView(Protocol):
    """The lease holder's live view (the coordinator's control loop)."""

    def holds_lease(self) -> bool: ...

    def live_decision(self, deployment_id: str) -> Any | None:
        """The loop's latest evaluation of the deployment (``LiveDecision``), or None."""

    def signals_of(self, deployment_id: str) -> Any | None:
        """The deployment's filtered signals, or None."""

    def adapter_links(self) -> Mapping[str, tuple[bool, int]] | None:
        """Per cluster the control loop has heard from: (its adapter delivers observation batches
        now, since when, wall ms): the clusters' ``AdapterConnected`` condition. None: not known."""


# --- failures -> statuses --------------------------------------------------------------------------------


@dataclass
class ApiError(Exception):
    """A failure answered with ``code``, ``message`` and optional trailing metadata / field violations."""

    code: grpc.StatusCode
    message: str
    trailing: tuple[tuple[str, str], ...] = ()
    violations: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    @property
    def cp_error(self) -> str:
        return dict(self.trailing).get("cp-error", "")


def not_found(kind: str, ident: str) -> ApiError:
    return ApiError(grpc.StatusCode.NOT_FOUND, f"{kind} {lim.clip(ident)} not found")


def named_as_sent(err: ApiError, ident: str, sent: str) -> ApiError:
    """``err`` (from the state machine, which names deployment ids) naming the deployment as the client
    did: a tenant never reads its own qualified id where it sent a bare name."""
    if ident == sent:
        return err
    message = err.message.replace(repr(ident), repr(sent))
    violations = [(f, p.replace(repr(ident), repr(sent))) for f, p in err.violations]
    return dataclasses.replace(err, message=message, violations=violations)


def permission_denied(what: str) -> ApiError:
    return ApiError(grpc.StatusCode.PERMISSION_DENIED, what)


def invalid_argument(exc: cv.InvalidArgument) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, exc.message, violations=exc.violations)


_CODE_OF_RESULT = {
    "not_found": (grpc.StatusCode.NOT_FOUND, ()),
    "already_exists": (grpc.StatusCode.ALREADY_EXISTS, ()),
    "version_mismatch": (grpc.StatusCode.FAILED_PRECONDITION, (("cp-error", "version-mismatch"),)),
    "conflict": (grpc.StatusCode.FAILED_PRECONDITION, (("cp-error", "conflict"),)),
    "invalid": (grpc.StatusCode.INVALID_ARGUMENT, ()),
    "limit": (grpc.StatusCode.RESOURCE_EXHAUSTED, ()),
    "malformed": (grpc.StatusCode.INVALID_ARGUMENT, ()),
}


def rejection_error(result: ApplyResult, limit: str | None = None) -> ApiError:
    """The status for a command the state machine rejected."""
    code, trailing = _CODE_OF_RESULT.get(getattr(result, "code", ""), (grpc.StatusCode.FAILED_PRECONDITION, ()))
    message = result.error or "rejected"
    if limit is not None and code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        message, trailing = f"{message} ({limit})", ((lim.LIMIT_KEY, limit),)
    violations: list[tuple[str, str]] = []
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        head, sep, tail = message.partition(": ")
        if sep and " " not in head:
            head = _request_path(head)
            violations = [(head, tail)]
            message = f"{head}: {tail}"
        else:
            violations = [("", message)]
    return ApiError(code, message, trailing, violations)


_DOMAIN_ROOTS = ("tenant.", "deployment.", "cluster.", "zone.")


def _request_path(domain_path: str) -> str:
    """The request field behind a state-machine rejection's domain path: ``deployment.pool`` is
    ``spec.pool`` of the request, ``cluster.id`` its ``metadata.name``."""
    for root in _DOMAIN_ROOTS:
        if domain_path.startswith(root):
            rest = domain_path[len(root):]
            return "metadata.name" if rest == "id" else f"spec.{rest}"
    return domain_path


def client_version(value: int, field: str) -> int:
    """A resource_version the client sent: 0 (unconditional) or a revision; never negative."""
    if value < 0:
        raise cv.invalid(field, f"must be 0 (unconditional) or a resource_version, got {value}")
    return value


def error_of(exc: BaseException, leader_hint: str | None = None) -> ApiError:
    """Map the control plane's error tree (raised by the Raft node) to a status."""
    hint = (("leader-hint", leader_hint),) if leader_hint else ()
    if isinstance(exc, NotLeader):
        hint = (("leader-hint", exc.leader_hint),) if exc.leader_hint else hint
        return ApiError(grpc.StatusCode.UNAVAILABLE, f"{exc} (leader: {exc.leader_hint or 'unknown'})", hint)
    if isinstance(exc, LeadershipLost):
        return ApiError(grpc.StatusCode.UNAVAILABLE, str(exc), (*hint, ("cp-outcome", "unknown")))
    if isinstance(exc, CommitTimeout):
        return ApiError(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc), (*hint, ("cp-outcome", "unknown")))
    if isinstance(exc, (QueueFull, Unavailable)):
        return ApiError(grpc.StatusCode.UNAVAILABLE, str(exc), hint)
    if isinstance(exc, ValidationError):
        return ApiError(grpc.StatusCode.INVALID_ARGUMENT, str(exc), violations=[(exc.field, exc.problem)])
    if isinstance(exc, PermanentError):
        return ApiError(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    return ApiError(grpc.StatusCode.UNAVAILABLE, str(exc), hint)


def _abort(context: grpc.ServicerContext, err: ApiError) -> None:
    lim.abort(context, err.code, err.message, err.trailing, err.violations)


def _failure(exc: Exception, method: str) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, cv.InvalidArgument):
        return invalid_argument(exc)
    if isinstance(exc, Unauthenticated):
        return ApiError(grpc.StatusCode.UNAUTHENTICATED, str(exc))
    if isinstance(exc, CatchingUp):
        return ApiError(grpc.StatusCode.UNAVAILABLE, str(exc))
    if isinstance(exc, Forbidden):
        return ApiError(grpc.StatusCode.PERMISSION_DENIED, str(exc))
    if isinstance(exc, ControlPlaneError):
        return error_of(exc)
    log.exception("api_internal_error", method=method)
    return ApiError(grpc.StatusCode.INTERNAL, f"internal error in {method} (logged by the coordinator)")


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a unary servicer method; any failure becomes a proper status (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except Exception as exc:  # noqa: BLE001  (mapped below: the one place that catches everything)
            err = _failure(exc, fn.__name__)
        _abort(context, err)

    return wrapper


def _guarded_stream(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Like :func:`_guarded` for a server-streaming method."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from fn(self, request, context)
            return
        except Exception as exc:  # noqa: BLE001
            err = _failure(exc, fn.__name__)
        _abort(context, err)

    return wrapper


# --- shared machinery --------------------------------------------------------------------------------------


class ApiCore:
    """What every servicer shares: authentication, reads, writes, forwarding to the lease holder."""

    def __init__(self, cfg: CoordinatorConfig, node: NodeView, holder: HolderView | None = None,
                 now_ms: Callable[[], int] = wall_ms) -> None:
        self.cfg = cfg
        self.node = node
        self.holder = holder
        self.now_ms = now_ms
        self.auth = Authenticator(lambda: getattr(self.node.state_copy(), "tokens", {}), now_ms, self.caught_up,
                                  TokenSettle(node))
        self.stopping = threading.Event()
        self.gate = lim.Gate(lim.CallLimits.of(cfg), cfg.node_id)
        """In-flight watches and calls per tenant (applied by :class:`~controlplane.api.limits.LimitsInterceptor`)."""
        self._channels: dict[str, grpc.Channel] = {}
        self._channels_lock = threading.Lock()
        self.unavailable = ""
        """Set by :meth:`ApiServer.set_stopped`: why every API call answers UNAVAILABLE."""

    def caught_up(self) -> bool:
        """This replica knows a leader and has applied everything it knows to be committed."""
        st = self.node.status()
        return bool(st.leader_id) and st.applied_index >= st.commit_index

    # reads ------------------------------------------------------------------------------------------------
    def read(self, context: grpc.ServicerContext, opts: api_pb2.ReadOptions | None = None) -> tuple[ControlState, api_pb2.ReadInfo]:
        linear = bool(opts is not None and opts.linearizable)
        if linear:
            self.barrier(context)
        applied = int(self.node.status().applied_index)
        state = self.node.state_copy()
        context.set_trailing_metadata((("applied-index", str(applied)),))
        return state, api_pb2.ReadInfo(applied_index=applied, served_by=self.cfg.node_id, linearizable=linear,
                                       revision=state.applied)

    def barrier(self, context: grpc.ServicerContext | None = None) -> None:
        """Commit an empty batch and wait until this node applied it: every write acknowledged
        before now is then visible in the local replica."""
        self._submit(c.Batch(()), context)

    # writes -----------------------------------------------------------------------------------------------
    def commit(self, cmd: c.Command, context: grpc.ServicerContext | None = None, *,
               limit: str | None = None) -> ApplyResult:
        """Commit one command; its result, or the mapped :class:`ApiError` when rejected/failed
        (``limit``: the configuration field named when the command's per-tenant limit is hit)."""
        result = self._submit(c.Batch((cmd,)), context)
        one = result.results[0] if result.results else result
        if not one.ok:
            raise rejection_error(one, limit)
        return one

    @property
    def active_watches(self) -> int:
        """Watch streams (``once`` ones included) being served now."""
        return self.gate.in_flight("watch")

    def reachable(self) -> None:
        """Refuse a write this node knows it cannot commit (UNAVAILABLE, nothing submitted): it is
        connected to less than a majority of the members, or a follower not connected to the leader.
        pysyncobj would otherwise queue it for a leader it cannot reach, and the caller would only
        learn "unknown outcome" at the deadline (a node connected to no one never even starts an
        election, so it keeps its last leader)."""
        st = self.node.status()
        peers = tuple(getattr(st, "peers", ()) or ())
        if not peers:
            return
        members, up = len(peers) + 1, dict(peers)
        connected = sum(1 for ok in up.values() if ok)
        hint = self.node.leader_api_address()
        trailing = (("leader-hint", hint),) if hint else ()
        if 2 * (connected + 1) <= members:
            raise ApiError(grpc.StatusCode.UNAVAILABLE,
                           f"{self.cfg.node_id} is cut off from the group (connected to {connected} of its "
                           f"{members - 1} peers; a write needs {members // 2 + 1} of {members} members): "
                           "not submitted, call another coordinator", trailing)
        leader = st.leader_id
        if leader and leader != self.cfg.node_id and leader in up and not up[leader]:
            raise ApiError(grpc.StatusCode.UNAVAILABLE,
                           f"{self.cfg.node_id} is not connected to the leader {leader}: not submitted, retry "
                           "or call another coordinator", trailing)

    def _submit(self, batch: c.Batch, context: grpc.ServicerContext | None) -> ApplyResult:
        timeout = self.cfg.commit_timeout_ms / 1000
        remaining = context.time_remaining() if context is not None else None
        if remaining is not None:
            timeout = max(0.05, min(timeout, remaining))
        payload = codec.encode(batch)
        if len(payload) > self.cfg.api_max_command_bytes:
            raise ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the write encodes to {len(payload)} bytes: at most {self.cfg.api_max_command_bytes} "
                           "per replicated command (api_max_command_bytes)",
                           ((lim.LIMIT_KEY, "api_max_command_bytes"),))
        self.reachable()
        try:
            result = self.node.submit(payload, timeout_s=timeout)
        except ControlPlaneError as exc:
            raise error_of(exc, self.node.leader_api_address()) from None
        if not isinstance(result, ApplyResult):
            raise ApiError(grpc.StatusCode.DEADLINE_EXCEEDED, "no result for the write: outcome unknown",
                           (("cp-outcome", "unknown"),))
        return result

    def update(self, context: grpc.ServicerContext, make: Callable[[ControlState], c.Command | None], *,
               retry: bool, limit: str | None = None) -> ApplyResult | None:
        """Read-modify-write: ``make(state)`` returns the command to commit (None: nothing to do),
        conditional on the version it read (see :meth:`expect`). With ``retry`` (the client named no
        version) a write that lost a race (version mismatch, or created meanwhile) is rebuilt from a
        fresh read, after a barrier, a few times."""
        for attempt in range(RMW_ATTEMPTS):
            cmd = make(self.node.state_copy())
            if cmd is None:
                return None
            try:
                return self.commit(cmd, context, limit=limit)
            except ApiError as err:
                raced = err.cp_error == "version-mismatch" or err.code is grpc.StatusCode.ALREADY_EXISTS
                if not retry or not raced or attempt == RMW_ATTEMPTS - 1:
                    raise
                self.barrier(context)
        raise AssertionError("unreachable")

    @staticmethod
    def expect(client_rv: int, current_rv: int | None, exists: bool) -> int:
        """The ``expect_version`` of a write: the client's, else the version just read."""
        if client_rv > 0:
            return client_rv
        if not exists:
            return c.MUST_NOT_EXIST
        return current_rv if current_rv else c.ANY_VERSION

    # forwarding to the lease holder -----------------------------------------------------------------------
    def holds_lease(self) -> bool:
        return self.holder is not None and self.holder.holds_lease()

    def holder_api_address(self) -> str | None:
        try:
            rec, _ = self.node.lease_view()
            holder = getattr(rec, "holder", "")
        except Exception:  # noqa: BLE001  (a missing view means: nobody to ask)
            return None
        if not holder or holder == self.cfg.node_id:
            return None
        member = self.cfg.member_by_id(holder)
        if member is not None:
            return member.api_address
        return self.node.leader_api_address() if self.node.leader_id() == holder else None

    def forward(self, context: grpc.ServicerContext, call: Callable[[grpc.Channel, tuple], Any]) -> Any | None:
        """Run ``call(channel, metadata)`` against the lease holder's API with the caller's token;
        None when this call was itself forwarded, no holder is known, or the holder did not answer."""
        metadata = dict(context.invocation_metadata() or ())
        if FORWARDED in metadata:
            return None
        address = self.holder_api_address()
        token = bearer_of(context.invocation_metadata())
        if address is None or token is None:
            return None
        try:
            return call(self._channel(address), (("authorization", f"Bearer {token}"), (FORWARDED, self.cfg.node_id)))
        except grpc.RpcError as exc:
            log.info("forward_failed", to=address, code=exc.code().name if hasattr(exc, "code") else "?")
            return None
        except ValidationError as exc:
            log.warning("forward_failed", to=address, error=str(exc))
            return None

    def _channel(self, address: str) -> grpc.Channel:
        with self._channels_lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._open(address)
                self._channels[address] = ch
            return ch

    def _open(self, address: str) -> grpc.Channel:
        tls = self.cfg.api_tls
        if tls is None:
            return grpc.insecure_channel(address, options=channel_options())
        ca = tls.ca_file or tls.client_ca_file
        mutual = tls.client_ca_file is not None
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca.read_bytes() if ca else None,
            private_key=tls.key_file.read_bytes() if mutual else None,
            certificate_chain=tls.cert_file.read_bytes() if mutual else None,
        )
        return grpc.secure_channel(address, creds, options=channel_options())

    def close(self) -> None:
        self.stopping.set()
        with self._channels_lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()


def _meta(state: ControlState, kind: str, ident: str) -> int:
    m = cv.meta_of(state, kind, ident)
    return m.resource_version if m is not None else 0


def _visible_deployment(state: ControlState, p: Principal, ref: tuple[str, str], sent: str) -> Deployment:
    """The deployment ``ref`` (``(tenant, name)`` from :func:`names.request_ref`) if ``p`` sees it, else
    NOT_FOUND naming what the client ``sent``: another tenant's deployment reads as a free name."""
    tenant, name = ref
    d = state.deployments.get(names.resolve(state, tenant, name)) if p.sees_tenant(tenant) else None
    if d is None:
        raise not_found("deployment", sent)
    return d


# --- Tenants ------------------------------------------------------------------------------------------------


class TenantsServicer(api_pb2_grpc.TenantsServicer):
    def __init__(self, core: ApiCore) -> None:
        self.core = core

    @_guarded
    def CreateTenant(self, request: api_pb2.CreateTenantRequest, context: grpc.ServicerContext) -> api_pb2.Tenant:
        self.core.auth.admin(context)
        t = cv.tenant_from_proto(request.tenant)
        w = writes.put(self.core, context, lambda st: writes.tenant_command(self.core, st, request.tenant, mode="create"),
                       retry=False, dry_run=request.dry_run)
        return writes.reply(self.core, context, w, lambda st: self._tenant_of(st, t.id))

    @_guarded
    def GetTenant(self, request: api_pb2.GetRequest, context: grpc.ServicerContext) -> api_pb2.Tenant:
        p = self.core.auth.principal(context)
        name = cv.check_name(request.name)
        state, _ = self.core.read(context, request.read)
        t = state.tenants.get(name)
        if t is None or not p.sees_tenant(name):
            raise not_found("tenant", name)
        return cv.tenant_to_proto(state, t)

    @_guarded
    def ListTenants(self, request: api_pb2.ListRequest, context: grpc.ServicerContext) -> api_pb2.TenantList:
        p = self.core.auth.principal(context)
        state, info = self.core.read(context, request.read)
        items = [cv.tenant_to_proto(state, state.tenants[k]) for k in sorted(state.tenants) if p.sees_tenant(k)]
        return api_pb2.TenantList(items=selected(request, items), read=info)

    @_guarded
    def UpdateTenant(self, request: api_pb2.UpdateTenantRequest, context: grpc.ServicerContext) -> api_pb2.Tenant:
        p = self.core.auth.principal(context)
        if not p.is_admin:
            raise permission_denied("tenants are changed by admins only")
        t = cv.tenant_from_proto(request.tenant)
        rv = client_version(request.tenant.metadata.resource_version, "metadata.resource_version")
        w = writes.put(self.core, context, lambda st: writes.tenant_command(self.core, st, request.tenant, mode="update"),
                       retry=rv == 0, dry_run=request.dry_run)
        return writes.reply(self.core, context, w, lambda st: self._tenant_of(st, t.id))

    @_guarded
    def DeleteTenant(self, request: api_pb2.DeleteRequest, context: grpc.ServicerContext) -> api_pb2.DeleteResponse:
        self.core.auth.admin(context)
        name = cv.check_name(request.name)
        rv = client_version(request.resource_version, "resource_version")
        r = self.core.commit(c.RemoveTenant(name, rv or c.ANY_VERSION), context)
        return api_pb2.DeleteResponse(revision=r.revision)

    def _read_back(self, name: str, context: grpc.ServicerContext) -> api_pb2.Tenant:
        state, _ = self.core.read(context)
        return self._tenant_of(state, name)

    @staticmethod
    def _tenant_of(state: ControlState, name: str) -> api_pb2.Tenant:
        t = state.tenants.get(name)
        if t is None:  # deleted right after our write
            raise not_found("tenant", name)
        return cv.tenant_to_proto(state, t)


# --- Deployments ------------------------------------------------------------------------------------------


class DeploymentsServicer(api_pb2_grpc.DeploymentsServicer):
    def __init__(self, core: ApiCore) -> None:
        self.core = core

    def _decided(self, state: ControlState, deployment_id: str, p: Principal) -> str:
        """The message of the decision that set the deployment's count, as ``p`` may read it."""
        return redact.for_principal(p, conds.decision_message(self.core.node.events, state, deployment_id))

    @_guarded
    def ApplyDeployment(self, request: api_pb2.ApplyDeploymentRequest, context: grpc.ServicerContext) -> api_pb2.Deployment:
        p = self.core.auth.principal(context)
        names.refuse_qualified(request.deployment.metadata.name, "metadata.name")
        d = cv.deployment_from_proto(request.deployment)  # d.id: the name within the tenant
        if not p.sees_tenant(d.tenant):
            raise not_found("tenant", d.tenant)
        rv = client_version(request.deployment.metadata.resource_version, "metadata.resource_version")
        name = d.id
        target = [qualified_id(d.tenant, name)]  # set to the id written
        if request.create_only and rv:
            raise cv.invalid("metadata.resource_version", "must be 0 (unset) with create_only")

        def make(state: ControlState) -> c.Command:
            cmd = writes.deployment_command(self.core, state, d, rv, create_only=request.create_only)
            target[0] = cmd.deployment.id
            return cmd

        try:
            w = writes.put(self.core, context, make, retry=rv == 0 and not request.create_only,
                           dry_run=request.dry_run, limit="api_max_deployments_per_tenant")
        except ApiError as err:
            raise named_as_sent(err, target[0], name) from None
        return writes.reply(self.core, context, w, lambda st: self._deployment_of(st, target[0], name, p))

    def _deployment_of(self, state: ControlState, ident: str, name: str, p: Principal) -> api_pb2.Deployment:
        got = state.deployments.get(ident)
        if got is None:
            raise not_found("deployment", name)
        return cv.deployment_to_proto(state, got, decision_message=self._decided(state, got.id, p))

    @_guarded
    def GetDeployment(self, request: api_pb2.GetRequest, context: grpc.ServicerContext) -> api_pb2.Deployment:
        p = self.core.auth.principal(context)
        ref = names.request_ref(p, request.name, "name")
        state, _ = self.core.read(context, request.read)
        d = _visible_deployment(state, p, ref, request.name)
        return cv.deployment_to_proto(state, d, decision_message=self._decided(state, d.id, p))

    @_guarded
    def ListDeployments(self, request: api_pb2.ListRequest, context: grpc.ServicerContext) -> api_pb2.DeploymentList:
        p = self.core.auth.principal(context)
        if request.tenant:
            cv.check_name(request.tenant, "tenant")
        state, info = self.core.read(context, request.read)
        items = [
            cv.deployment_to_proto(state, d, instances=False, decision_message=self._decided(state, d.id, p))
            for d in sorted(state.deployments.values(), key=lambda d: (d.tenant, local_name(d.id)))
            if p.sees_tenant(d.tenant) and (not request.tenant or d.tenant == request.tenant)
        ]
        return api_pb2.DeploymentList(items=selected(request, items), read=info)

    @_guarded
    def DeleteDeployment(self, request: api_pb2.DeleteRequest, context: grpc.ServicerContext) -> api_pb2.DeleteResponse:
        p = self.core.auth.principal(context)
        ref = names.request_ref(p, request.name, "name")
        name = request.name
        rv = client_version(request.resource_version, "resource_version")
        already: list[int] = []
        target = [name]

        def make(state: ControlState) -> c.Command | None:
            d = _visible_deployment(state, p, ref, name)
            target[0] = d.id
            current = _meta(state, "deployment", d.id)
            if rv > 0 and current and rv != current:
                raise ApiError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"deployment {name!r} is at resource_version {current}, not {rv}: it changed since you read it",
                               (("cp-error", "version-mismatch"),))
            if d.deleting:
                already.append(current)
                return None
            cmd = c.PutDeployment(dataclasses.replace(d, deleting=True), self.core.expect(rv, current, True),
                                  self.core.now_ms())
            return cmd

        try:
            r = self.core.update(context, make, retry=rv == 0)
        except ApiError as err:
            raise named_as_sent(err, target[0], name) from None
        return api_pb2.DeleteResponse(revision=r.revision if r is not None else (already[-1] if already else 0))


# --- Clusters and zones --------------------------------------------------------------------------------------


class ClustersServicer(api_pb2_grpc.ClustersServicer):
    def __init__(self, core: ApiCore) -> None:
        self.core = core

    def _admin(self, context: grpc.ServicerContext) -> None:
        p = self.core.auth.principal(context)
        if not p.is_admin:
            raise permission_denied("clusters and zones are managed by admins only")

    def _facts(self, context: grpc.ServicerContext) -> conds.ClusterFacts:
        """The lease holder's adapter links for this read's conditions (one forwarded call at most)."""
        return conds.cluster_facts(self.core.cfg, self.core.holds_lease(), self.core.holder, self.core.forward,
                                   context, self.core.now_ms())

    # clusters -----------------------------------------------------------------------------------------
    @_guarded
    def RegisterCluster(self, request: api_pb2.RegisterClusterRequest, context: grpc.ServicerContext) -> api_pb2.Cluster:
        self._admin(context)
        cv.cluster_from_proto(request.cluster)  # validate before touching the state
        rv = client_version(request.cluster.metadata.resource_version, "metadata.resource_version")
        w = writes.put(self.core, context, lambda st: writes.cluster_command(self.core, st, request.cluster),
                       retry=rv == 0, dry_run=request.dry_run)
        return writes.reply(self.core, context, w, lambda st: self._cluster_of(st, request.cluster.metadata.name, context))

    @_guarded
    def GetCluster(self, request: api_pb2.GetRequest, context: grpc.ServicerContext) -> api_pb2.Cluster:
        self._admin(context)
        name = cv.check_name(request.name)
        state, _ = self.core.read(context, request.read)
        cl = state.clusters.get(name)
        if cl is None:
            raise not_found("cluster", name)
        return cv.cluster_to_proto(state, cl, self._facts(context))

    @_guarded
    def ListClusters(self, request: api_pb2.ListRequest, context: grpc.ServicerContext) -> api_pb2.ClusterList:
        self._admin(context)
        state, info = self.core.read(context, request.read)
        facts = self._facts(context)
        return api_pb2.ClusterList(items=selected(request, [cv.cluster_to_proto(state, state.clusters[k], facts)
                                                            for k in sorted(state.clusters)]), read=info)

    @_guarded
    def DeleteCluster(self, request: api_pb2.DeleteRequest, context: grpc.ServicerContext) -> api_pb2.DeleteResponse:
        self._admin(context)
        name = cv.check_name(request.name)
        rv = client_version(request.resource_version, "resource_version")
        r = self.core.commit(c.RemoveCluster(name, rv or c.ANY_VERSION), context)
        return api_pb2.DeleteResponse(revision=r.revision)

    @_guarded
    def CordonCluster(self, request: api_pb2.CordonRequest, context: grpc.ServicerContext) -> api_pb2.Cluster:
        self._admin(context)
        name = cv.check_name(request.name)
        self._set_flags(name, context, cordoned=request.cordoned, draining=None if request.cordoned else False)
        return self._cluster(name, context)

    @_guarded
    def DrainCluster(self, request: api_pb2.DrainRequest, context: grpc.ServicerContext) -> api_pb2.Cluster:
        self._admin(context)
        name = cv.check_name(request.name)
        self._set_flags(name, context, cordoned=True, draining=True)
        return self._cluster(name, context)

    def _set_flags(self, name: str, context: grpc.ServicerContext, *, cordoned: bool, draining: bool | None) -> None:
        def make(state: ControlState) -> c.Command | None:
            cl = state.clusters.get(name)
            if cl is None:
                raise not_found("cluster", name)
            new = dataclasses.replace(cl, cordoned=cordoned, draining=cl.draining if draining is None else draining)
            current = _meta(state, "cluster", name)
            if new == cl:
                return None
            return c.PutCluster(new, self.core.expect(0, current, True), self.core.now_ms())

        self.core.update(context, make, retry=True)

    def _cluster(self, name: str, context: grpc.ServicerContext) -> api_pb2.Cluster:
        state, _ = self.core.read(context)
        return self._cluster_of(state, name, context)

    def _cluster_of(self, state: ControlState, name: str, context: grpc.ServicerContext) -> api_pb2.Cluster:
        cl = state.clusters.get(name)
        if cl is None:
            raise not_found("cluster", name)
        return cv.cluster_to_proto(state, cl, self._facts(context))

    # zones -------------------------------------------------------------------------------------------------
    @_guarded
    def RegisterZone(self, request: api_pb2.RegisterZoneRequest, context: grpc.ServicerContext) -> api_pb2.Zone:
        self._admin(context)
        z = cv.zone_from_proto(request.zone)
        rv = client_version(request.zone.metadata.resource_version, "metadata.resource_version")
        w = writes.put(self.core, context, lambda st: writes.zone_command(self.core, st, request.zone),
                       retry=rv == 0, dry_run=request.dry_run)
        return writes.reply(self.core, context, w, lambda st: self._zone_of(st, z.id, context))

    @_guarded
    def GetZone(self, request: api_pb2.GetRequest, context: grpc.ServicerContext) -> api_pb2.Zone:
        self._admin(context)
        name = cv.check_name(request.name)
        state, _ = self.core.read(context, request.read)
        if name not in cv.zones_of(state):
            raise not_found("zone", name)
        return cv.zone_to_proto(state, name, self._facts(context))

    @_guarded
    def ListZones(self, request: api_pb2.ListRequest, context: grpc.ServicerContext) -> api_pb2.ZoneList:
        self._admin(context)
        state, info = self.core.read(context, request.read)
        facts = self._facts(context)
        return api_pb2.ZoneList(items=selected(request, [cv.zone_to_proto(state, z, facts) for z in cv.zones_of(state)]),
                                read=info)

    @_guarded
    def DeleteZone(self, request: api_pb2.DeleteRequest, context: grpc.ServicerContext) -> api_pb2.DeleteResponse:
        self._admin(context)
        name = cv.check_name(request.name)
        rv = client_version(request.resource_version, "resource_version")
        state = self.core.node.state_copy()
        if cv.zone_record(state, name) is None and any(cl.zone == name for cl in state.clusters.values()):
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION,
                           f"zone {name!r} still has clusters registered in it (delete them first)",
                           (("cp-error", "conflict"),))
        r = self.core.commit(c.RemoveZone(name, rv or c.ANY_VERSION), context)
        return api_pb2.DeleteResponse(revision=r.revision)

    @_guarded
    def CordonZone(self, request: api_pb2.CordonRequest, context: grpc.ServicerContext) -> api_pb2.Zone:
        self._admin(context)
        name = cv.check_name(request.name)
        self._set_zone_flags(name, context, cordoned=request.cordoned, draining=None if request.cordoned else False)
        return self._zone(name, context)

    @_guarded
    def DrainZone(self, request: api_pb2.DrainRequest, context: grpc.ServicerContext) -> api_pb2.Zone:
        self._admin(context)
        name = cv.check_name(request.name)
        self._set_zone_flags(name, context, cordoned=True, draining=True)
        return self._zone(name, context)

    def _set_zone_flags(self, name: str, context: grpc.ServicerContext, *, cordoned: bool, draining: bool | None) -> None:
        def make(state: ControlState) -> c.Command | None:
            z = cv.zone_record(state, name)
            if z is None:
                regions = [cl.region for cl in state.clusters.values() if cl.zone == name]
                if not regions:
                    raise not_found("zone", name)
                z = Zone(name, min(regions))
                exists = False
            else:
                exists = True
            new = dataclasses.replace(z, cordoned=cordoned, draining=z.draining if draining is None else draining)
            current = _meta(state, "zone", name)
            if exists and new == z:
                return None
            return c.PutZone(new, self.core.expect(0, current, exists), self.core.now_ms())

        self.core.update(context, make, retry=True)

    def _zone(self, name: str, context: grpc.ServicerContext) -> api_pb2.Zone:
        state, _ = self.core.read(context)
        return self._zone_of(state, name, context)

    def _zone_of(self, state: ControlState, name: str, context: grpc.ServicerContext) -> api_pb2.Zone:
        if name not in cv.zones_of(state):
            raise not_found("zone", name)
        return cv.zone_to_proto(state, name, self._facts(context))


# --- Scaling ----------------------------------------------------------------------------------------------------


def _decision_to_proto(ev: Any, p: Principal) -> api_pb2.Decision:
    return api_pb2.Decision(revision=ev.revision, at_ms=ev.at_ms, replicas=ev.replicas, warm_pool=ev.warm_pool,
                            reason=ev.reason, message=redact.for_principal(p, ev.message))


def _event_to_proto(ev: Any, served_by: str) -> api_pb2.Event:
    # Deployments are named within their tenant (``tenant`` says which); instance names are global.
    name = local_name(ev.name) if ev.kind in _DEPLOYMENT_NAMED else ev.name
    return api_pb2.Event(
        revision=ev.revision, at_ms=ev.at_ms, type=ev.type, kind=ev.kind, name=name, tenant=ev.tenant,
        deployment=local_name(ev.deployment), from_state=ev.from_state, to_state=ev.to_state, event=ev.event,
        cluster=ev.cluster, zone=ev.zone, replicas=ev.replicas, warm_pool=ev.warm_pool, reason=ev.reason,
        message=ev.message, served_by=served_by, significant=ev.significant,
    )


_DEPLOYMENT_NAMED = ("Deployment", "Decision")
"""Event kinds whose ``name`` is a deployment id."""


def event_filter(p: Principal, request: api_pb2.WatchRequest) -> Callable[[Any], bool]:
    """Which events a watch sends: the principal's tenant only (cluster and zone events, which carry
    no tenant, are for admins), then the request's deployment / tenant / kinds filters, then its
    ``all`` / ``types`` (by default the significant events only: :mod:`controlplane.runtime.event_types`)."""
    kinds = frozenset(request.kinds)
    try:
        selected = event_types.selector(request.all, event_types.parse_types(request.types))
    except ValueError as exc:
        field, _, problem = str(exc).partition(": ")
        raise cv.invalid(field, problem) from None
    tenant = request.tenant if p.is_admin else p.tenant
    if not p.sees_tenant(request.tenant or p.tenant):
        return lambda ev: False  # another tenant's events do not exist for this principal
    ids: frozenset[str] = frozenset()
    if request.deployment:
        owner, name = names.request_ref(p, request.deployment, "deployment", request.tenant)
        if not p.sees_tenant(owner):
            return lambda ev: False  # as for a free name
        tenant, ids = owner, frozenset((qualified_id(owner, name), name))  # its qualified or legacy id

    def match(ev: Any) -> bool:
        if tenant and ev.tenant != tenant:
            return False
        if not p.is_admin and not ev.tenant:
            return False
        if kinds and ev.kind not in kinds:
            return False
        named = ev.kind in _DEPLOYMENT_NAMED and ev.name in ids
        return (not ids or ev.deployment in ids or named) and selected(ev)

    return match


class ScalingServicer(api_pb2_grpc.ScalingServicer):
    def __init__(self, core: ApiCore) -> None:
        self.core = core

    def _events(self) -> Any:
        events = getattr(self.core.node, "events", None)
        if events is None:
            raise ApiError(grpc.StatusCode.UNIMPLEMENTED, "this coordinator keeps no event log")
        return events

    @_guarded
    def Explain(self, request: api_pb2.ExplainRequest, context: grpc.ServicerContext) -> api_pb2.Explanation:
        p = self.core.auth.principal(context)
        ref = names.request_ref(p, request.deployment, "deployment")
        if request.limit < 0:
            raise cv.invalid("limit", f"must be >= 0, got {request.limit}")
        limit = min(request.limit or DEFAULT_EXPLAIN_LIMIT, MAX_EXPLAIN_LIMIT)
        state, info = self.core.read(context)
        d = _visible_deployment(state, p, ref, request.deployment)
        out = api_pb2.Explanation(deployment=local_name(d.id), tenant=d.tenant, read=info)
        desired = state.desired.get(d.id)
        if desired is not None:
            out.desired_replicas = desired.replicas
            out.desired_warm_pool = desired.warm_pool
        out.history.extend(_decision_to_proto(ev, p) for ev in self._events().decisions(d.id, limit))
        if self.core.holds_lease():
            out.lease_holder = self.core.cfg.node_id
            live = self.core.holder.live_decision(d.id) if self.core.holder is not None else None
            if live is not None:
                tenant = state.tenants.get(d.tenant)
                out.live.CopyFrom(cv.live_to_proto(live, d, tenant.slo if tenant is not None else Slo()))
        else:
            reply = self.core.forward(context, lambda ch, md: api_pb2_grpc.ScalingStub(ch).Explain(
                api_pb2.ExplainRequest(deployment=request.deployment, limit=1), timeout=FORWARD_DEADLINE_S, metadata=md))
            rec = self._lease_holder()
            out.lease_holder = reply.lease_holder if reply is not None and reply.lease_holder else rec
            if reply is not None and reply.HasField("live"):
                out.live.CopyFrom(reply.live)
        return out

    def _lease_holder(self) -> str:
        try:
            rec, _ = self.core.node.lease_view()
            return str(getattr(rec, "holder", "") or "")
        except Exception:  # noqa: BLE001
            return ""

    @_guarded_stream
    def Watch(self, request: api_pb2.WatchRequest, context: grpc.ServicerContext) -> Iterator[api_pb2.Event]:
        p = self.core.auth.principal(context)
        for i, kind in enumerate(request.kinds):
            if kind not in WATCH_KINDS:
                raise cv.invalid(f"kinds[{i}]", f"unknown kind {lim.clip(kind)} (one of {', '.join(WATCH_KINDS)})")
        if request.tenant:
            cv.check_name(request.tenant, "tenant")
        if request.HasField("since_revision") and request.since_revision < 0:
            raise cv.invalid("since_revision", f"must be >= 0, got {request.since_revision}")
        events = self._events()
        match = event_filter(p, request)
        me = self.core.cfg.node_id
        # The watch limits (per tenant and in total, once-watches included) are applied by
        # limits.LimitsInterceptor before this runs.
        stream = self._once(events, request, match, me) if request.once else self._live(events, request, match, context, me)
        for ev in stream:
            if ev.message and not p.is_admin:  # other tenants stay unnamed (redact.py)
                ev.message = redact.for_principal(p, ev.message)
            yield ev

    def _page(self, events: Any, cursor: int, match: Callable[[Any], bool], me: str = "") -> tuple[list[Any], int]:
        """Events after ``cursor`` (one page, as messages) and the new cursor. Reading, filtering and
        converting the log is the CPU-bound part of a watch: at most ``api_heavy_concurrency``
        threads do it at once (the others wait without holding the interpreter lock)."""
        last = events.last_revision
        heavy = self.core.gate.heavy
        if not heavy.acquire(timeout=HEAVY_WAIT_S):
            raise ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the event log is busy on {self.core.cfg.node_id}: more than api_heavy_concurrency = "
                           f"{self.core.cfg.api_heavy_concurrency} readers for {HEAVY_WAIT_S:.0f} s; retry",
                           ((lim.LIMIT_KEY, "api_heavy_concurrency"),))
        try:
            page = [_event_to_proto(ev, me) for ev in events.since(cursor, match, WATCH_PAGE)]
        except EventsCompacted as exc:
            raise ApiError(grpc.StatusCode.OUT_OF_RANGE,
                           f"since_revision {cursor} is no longer retained here (events are kept after revision "
                           f"{exc.oldest}); list again, then watch without since_revision") from None
        finally:
            heavy.release()
        if len(page) >= WATCH_PAGE:
            return page, page[-1].revision
        return page, max(last, page[-1].revision if page else cursor)

    def _once(self, events: Any, request: api_pb2.WatchRequest, match: Callable[[Any], bool], me: str) -> Iterator[api_pb2.Event]:
        cursor = request.since_revision if request.HasField("since_revision") else events.first_revision
        while True:
            page, cursor = self._page(events, cursor, match, me)
            yield from page
            if len(page) < WATCH_PAGE:
                break
        yield api_pb2.Event(revision=cursor, type="BOOKMARK", served_by=me)

    def _live(self, events: Any, request: api_pb2.WatchRequest, match: Callable[[Any], bool],
              context: grpc.ServicerContext, me: str) -> Iterator[api_pb2.Event]:
        # A since_revision ahead of this replica (a client coming from one further ahead) simply
        # waits here until this replica has caught up.
        cursor = request.since_revision if request.HasField("since_revision") else events.last_revision
        if cursor < events.first_revision:
            self._page(events, cursor, match, me)  # raises OUT_OF_RANGE before anything is sent
        yield api_pb2.Event(revision=cursor, type="BOOKMARK", served_by=me)
        next_bookmark = time.monotonic() + BOOKMARK_EVERY_S
        while context.is_active() and not self.core.stopping.is_set():
            page, new_cursor = self._page(events, cursor, match, me)
            yield from page
            cursor = new_cursor
            if len(page) >= WATCH_PAGE:
                continue
            if time.monotonic() >= next_bookmark:
                yield api_pb2.Event(revision=cursor, type="BOOKMARK", served_by=me)
                next_bookmark = time.monotonic() + BOOKMARK_EVERY_S
            wait = min(WATCH_POLL_S, max(0.0, next_bookmark - time.monotonic()))
            events.wait_after(cursor, wait)

    @_guarded
    def DryRun(self, request: api_pb2.DryRunRequest, context: grpc.ServicerContext) -> api_pb2.DryRunResult:
        if file_dryrun.is_file_request(request):  # a whole file on one copy of the state
            return file_dryrun.dry_run_file(self.core, context, request)
        p = self.core.auth.principal(context)
        names.refuse_qualified(request.deployment.metadata.name, "deployment.metadata.name")
        d = cv.deployment_from_proto(request.deployment)
        if not p.sees_tenant(d.tenant):
            raise not_found("tenant", d.tenant)
        state = self.core.node.state_copy()
        sent = d.id
        d = dataclasses.replace(d, id=names.resolve(state, d.tenant, sent))  # d.tenant's own (names are per tenant)
        existing = state.deployments.get(d.id)
        if d.tenant not in state.tenants:
            raise not_found("tenant", d.tenant)
        signals = None
        live = False
        if self.core.holds_lease() and existing is not None:
            signals = self.core.holder.signals_of(d.id) if self.core.holder is not None else None
            live = signals is not None
        elif existing is not None:
            reply = self.core.forward(context, lambda ch, md: api_pb2_grpc.ScalingStub(ch).DryRun(
                request, timeout=FORWARD_DEADLINE_S, metadata=md))
            if reply is not None:
                return reply
        try:
            from controlplane.core.dryrun import dry_run
        except ImportError:
            raise ApiError(grpc.StatusCode.UNIMPLEMENTED, "dry-run is not available on this coordinator") from None
        proposed = dataclasses.replace(d, created_ms=existing.created_ms) if existing is not None else d
        out = dry_run(state, proposed, signals, self.core.now_ms())
        return file_dryrun.outcome_to_proto(out, live, d.id, sent)  # named as sent


# --- Tokens -------------------------------------------------------------------------------------------------------


class TokensServicer(api_pb2_grpc.TokensServicer):
    def __init__(self, core: ApiCore) -> None:
        self.core = core

    @_guarded
    def CreateToken(self, request: api_pb2.CreateTokenRequest, context: grpc.ServicerContext) -> api_pb2.CreatedToken:
        admin = self.core.auth.admin(context)
        problems: list[tuple[str, str]] = []
        roles = {r.value: r for r in Role}
        role = roles.get(request.role)
        if role is None:
            problems.append(("role", f"must be one of {', '.join(sorted(roles))}, got {lim.clip(request.role)}"))
        if role is Role.TENANT:
            try:
                cv.check_name(request.tenant, "tenant")
            except cv.InvalidArgument as exc:
                problems += exc.violations
        elif role is Role.ADMIN and request.tenant:
            problems.append(("tenant", "must be empty for an admin token"))
        if not 0 <= request.ttl_seconds <= MAX_TTL_S:
            problems.append(("ttl_seconds", f"must be between 0 (never expires) and {MAX_TTL_S}, got {request.ttl_seconds}"))
        if len(request.description) > MAX_DESCRIPTION:
            problems.append(("description", f"must be at most {MAX_DESCRIPTION} characters"))
        if problems:
            raise cv.InvalidArgument(problems)
        assert role is not None
        token, token_id, sha = new_token()
        now = self.core.now_ms()
        record = TokenRecord(token_id, sha, role, request.tenant if role is Role.TENANT else "", now,
                             now + request.ttl_seconds * 1000 if request.ttl_seconds else 0, request.description)
        self.core.commit(c.PutToken(record, self.core.cfg.api_max_tokens_per_tenant), context,
                         limit="api_max_tokens_per_tenant")
        log.info("token_created", token_id=token_id, role=role.value, tenant=record.tenant, by=str(admin))
        return api_pb2.CreatedToken(info=cv.token_to_proto(record), token=token)

    @_guarded
    def ListTokens(self, request: api_pb2.ListTokensRequest, context: grpc.ServicerContext) -> api_pb2.TokenList:
        self.core.auth.admin(context)
        state, _ = self.core.read(context)
        tokens = getattr(state, "tokens", {})
        items = [cv.token_to_proto(tokens[k]) for k in sorted(tokens)
                 if not request.tenant or tokens[k].tenant == request.tenant]
        return api_pb2.TokenList(items=items)

    @_guarded
    def RevokeToken(self, request: api_pb2.RevokeTokenRequest, context: grpc.ServicerContext) -> api_pb2.DeleteResponse:
        admin = self.core.auth.admin(context)
        if not request.id:
            raise cv.invalid("id", "required")
        if len(request.id) != 12 or any(ch not in "0123456789abcdef" for ch in request.id):
            raise cv.invalid("id", f"must be a token id (12 lower-case hex digits), got {lim.clip(request.id)}")
        r = self.core.commit(c.RemoveToken(request.id), context)
        log.info("token_revoked", token_id=request.id, by=str(admin))
        return api_pb2.DeleteResponse(revision=r.revision)

    @_guarded
    def WhoAmI(self, request: api_pb2.WhoAmIRequest, context: grpc.ServicerContext) -> api_pb2.Principal:
        p = self.core.auth.principal(context)
        return api_pb2.Principal(token_id=p.token_id, role=p.role.value, tenant=p.tenant, expires_ms=p.expires_ms)


# --- Admin ----------------------------------------------------------------------------------------------------------


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """Group status (any principal) and membership changes (admins)."""

    def __init__(self, core: ApiCore, status: Callable[[], NodeStatus], members: Membership | None = None) -> None:
        self.core = core
        self._status = status
        self._members = members

    @_guarded
    def Status(self, request: admin_pb2.StatusRequest, context: grpc.ServicerContext) -> admin_pb2.StatusResponse:
        p = self.core.auth.principal(context)
        status = self._status()
        return to_proto(status if p.is_admin else for_tenant(status))  # tenants: no addresses, pids, epochs

    @_guarded
    def AddMember(self, request: admin_pb2.MemberRequest, context: grpc.ServicerContext) -> admin_pb2.MemberReply:
        self.core.auth.admin(context)
        members = self._require_members()
        problems = [(name, "must not be empty") for name in ("node_id", "raft_address", "api_address")
                    if not getattr(request, name)]
        if problems:
            raise cv.InvalidArgument(problems)
        index = members.add_member(request.node_id, request.raft_address, request.api_address)
        return admin_pb2.MemberReply(commit_index=index)

    @_guarded
    def RemoveMember(self, request: admin_pb2.MemberRequest, context: grpc.ServicerContext) -> admin_pb2.MemberReply:
        self.core.auth.admin(context)
        members = self._require_members()
        if not request.raft_address:
            raise cv.invalid("raft_address", "must not be empty")
        return admin_pb2.MemberReply(commit_index=members.remove_member(request.raft_address))

    def _require_members(self) -> Membership:
        if self._members is None:
            raise ApiError(grpc.StatusCode.UNIMPLEMENTED, "membership changes are not served by this node")
        return self._members


# --- the server -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Undecodable:
    """What the request deserializer returns for bytes that are not a message of the method's type."""

    type_name: str
    error: str


def _tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    owner = getattr(deserialize, "__self__", None)
    type_name = getattr(getattr(owner, "DESCRIPTOR", None), "full_name", "request")

    def wrapper(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError, invalid UTF-8...)
            return _Undecodable(type_name, str(exc) or type(exc).__name__)

    return wrapper


def _undecodable(context: grpc.ServicerContext, request: _Undecodable) -> None:
    _abort(context, ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {request.type_name} message",
                             violations=[("request", f"not a valid {request.type_name} message ({request.error})")]))


class DecodeInterceptor(grpc.ServerInterceptor):
    """A unary request that is not a valid protobuf message of the method's type (truncated, a wrong
    wire type, invalid UTF-8 in a string) gets INVALID_ARGUMENT; grpcio alone answers INTERNAL. Placed
    after the authentication interceptor, whose refusal (UNAUTHENTICATED) still comes first."""

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        deserialize, serialize = _tolerant(handler.request_deserializer), handler.response_serializer
        if handler.response_streaming:
            stream = handler.unary_stream

            def streaming(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                if isinstance(request, _Undecodable):
                    _undecodable(context, request)
                    return
                yield from stream(request, context)

            return grpc.unary_stream_rpc_method_handler(streaming, deserialize, serialize)
        unary = handler.unary_unary

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                _undecodable(context, request)
                return None
            return unary(request, context)

        return grpc.unary_unary_rpc_method_handler(call, deserialize, serialize)



# --- a member whose Raft storage failed ----------------------------------------------------------------


STOPPED_EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.", "/" + admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name + "/")
"""Still answered by a stopped member: health (NOT_SERVING), reflection, Admin (its Status shows the member)."""


class StoppedInterceptor(grpc.ServerInterceptor):
    """While ``ApiCore.unavailable`` is set (the member's journal, metadata or snapshot is unusable, or
    its disk is full: Raft has stopped here), every other call answers UNAVAILABLE with the reason
    instead of serving this replica's frozen state."""

    def __init__(self, core: ApiCore) -> None:
        self._core = core

    def intercept_service(self, continuation, handler_call_details):
        reason = self._core.unavailable
        method = handler_call_details.method or ""
        if not reason or method.startswith(STOPPED_EXEMPT):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None

        def unary(request: object, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAVAILABLE, reason)

        def stream(request: object, context: grpc.ServicerContext) -> Iterator[Any]:
            context.abort(grpc.StatusCode.UNAVAILABLE, reason)
            yield  # pragma: no cover

        return same_shape_handler(handler, unary, stream)


@dataclass
class ApiServer:
    server: grpc.Server
    health: health.HealthServicer
    port: int
    core: ApiCore

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *SERVICE_NAMES):
            self.health.set(name, status)

    def set_stopped(self, reason: str) -> None:
        """The member stopped taking part in Raft: health NOT_SERVING for good, API calls UNAVAILABLE
        with ``reason`` (absolute paths shortened to the file name)."""
        short = reason.replace(str(self.core.cfg.data_dir) + os.sep, "")
        self.core.unavailable = f"member {self.core.cfg.node_id} stopped: {short}"
        self.set_serving(False)

    def stop(self, grace_s: float = 1.0) -> None:
        """Refuse new calls, end the watches, wait ``grace_s`` for calls in flight."""
        self.core.close()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait(grace_s + 1.0)


def server_credentials(cfg: CoordinatorConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from ``api_tls`` (None: plaintext). Client certificates are required when
    ``client_ca_file`` is set."""
    tls = cfg.api_tls
    if tls is None:
        return None
    try:
        key, cert = tls.key_file.read_bytes(), tls.cert_file.read_bytes()
        client_ca = tls.client_ca_file.read_bytes() if tls.client_ca_file is not None else None
    except OSError as exc:
        raise Unavailable(f"api_tls: cannot read {exc.filename!r}: {exc.strerror}") from None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


def serve(cfg: CoordinatorConfig, node: NodeView, *, status: Callable[[], NodeStatus],
          members: Membership | None = None, holder: HolderView | None = None,
          now_ms: Callable[[], int] = wall_ms, address: str | None = None) -> ApiServer:
    """Start the coordinator's gRPC server on ``address`` (default ``cfg.api_address``): the API
    services, Admin, grpc.health.v1 (per service) and reflection. Raises :class:`Unavailable` when
    the address cannot be bound."""
    core = ApiCore(cfg, node, holder, now_ms)
    # The receive limit refuses an oversized request before it is parsed (RESOURCE_EXHAUSTED); replies
    # (fleet-sized lists) keep the channel's larger send limit.
    options = [(k, v) for k, v in channel_options() if k != "grpc.max_receive_message_length"]
    options.append(("grpc.max_receive_message_length", cfg.api_max_request_bytes))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=cfg.api_workers, thread_name_prefix="grpc"),
        interceptors=(StoppedInterceptor(core), AuthInterceptor(core.auth), DecodeInterceptor(),
                      lim.LimitsInterceptor(core.auth, core.gate, cfg.api_max_map_entries, cfg.api_max_string_bytes)),
        options=options,
        maximum_concurrent_rpcs=cfg.api_max_concurrent_rpcs,
    )
    api_pb2_grpc.add_TenantsServicer_to_server(TenantsServicer(core), server)
    api_pb2_grpc.add_DeploymentsServicer_to_server(DeploymentsServicer(core), server)
    api_pb2_grpc.add_ClustersServicer_to_server(ClustersServicer(core), server)
    api_pb2_grpc.add_ScalingServicer_to_server(ScalingServicer(core), server)
    api_pb2_grpc.add_TokensServicer_to_server(TokensServicer(core), server)
    admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(core, status, members), server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflected = (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(reflected, server)
    address = address or cfg.api_address
    creds = server_credentials(cfg)
    try:
        port = server.add_insecure_port(address) if creds is None else server.add_secure_port(address, creds)
    except RuntimeError:
        port = 0
    if port == 0:
        raise Unavailable(f"api_address: cannot bind {address}")
    server.start()
    api = ApiServer(server, health_servicer, port, core)
    api.set_serving(True)
    log.info("api_serving", address=address, port=port, tls=creds is not None,
             mutual_tls=cfg.api_tls is not None and cfg.api_tls.client_ca_file is not None)
    return api
