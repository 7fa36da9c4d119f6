"""``Scaling.DryRun`` of a whole file: every object on ONE copy of the state, nothing written.

``DryRunRequest.zones / clusters / tenants / deployments`` are applied in that order (each list in
its order; the dependency order of ``tenantctl apply``) to a private copy of the replicated state,
each through the command builder of its real writer (:mod:`controlplane.api.writes`) and the
replicated state machine: a new tenant and its deployments evaluate together, and a refusal is the
status the real write would get. A refused object leaves the copy as it was and the next objects
are still tried, so every refusal of the file is reported at once.

Each object gets a :class:`api_pb2.DryRunObject`: its would-be form (``metadata.apply_result``
``created`` / ``configured`` / ``unchanged``) or its refusal (status name, message, field
violations); a deployment also gets the scaling dry run (:func:`controlplane.core.dryrun.dry_run`)
against the copy as it stood before it, with the lease holder's signals: a coordinator that does not
hold the lease forwards a file with deployments to the holder (one hop, short deadline, as the
single-deployment DryRun does) and evaluates it itself, without load (``live_signals`` false), when
that fails.
"""

from __future__ import annotations

from typing import Any

import grpc

from controlplane.api import convert as cv
from controlplane.api import names
from controlplane.api import server as srv
from controlplane.api import writes
from controlplane.api.auth import Principal
from controlplane.api.v1 import api_pb2, api_pb2_grpc
from controlplane.core.dryrun import DryRunOutcome, dry_run
from controlplane.domain import commands as c
from controlplane.domain.state import ControlState
from raft.fsm import copy_state

KINDS = ("Zone", "Cluster", "Tenant", "Deployment")
"""The order the objects of a file are evaluated in (a cluster names a zone, a deployment a tenant)."""


def is_file_request(request: api_pb2.DryRunRequest) -> bool:
    return bool(request.zones or request.clusters or request.tenants or request.deployments)


def dry_run_file(core: srv.ApiCore, context: grpc.ServicerContext, request: api_pb2.DryRunRequest) -> api_pb2.DryRunResult:
    p = core.auth.principal(context)
    if request.HasField("deployment"):
        raise cv.invalid("deployment", "give either deployment or the file's objects (zones, clusters, "
                                       "tenants, deployments), not both")
    if request.deployments and not core.holds_lease():  # the holder has the live signals
        reply = core.forward(context, lambda ch, md: api_pb2_grpc.ScalingStub(ch).DryRun(
            request, timeout=srv.FORWARD_DEADLINE_S, metadata=md))
        if reply is not None:
            return reply
    work = copy_state(core.node.state_copy())
    lists = {"Zone": request.zones, "Cluster": request.clusters, "Tenant": request.tenants,
             "Deployment": request.deployments}
    objects = [_one(core, p, work, kind, msg) for kind in KINDS for msg in lists[kind]]
    live = any(o.scaling.live_signals for o in objects if o.HasField("scaling"))
    return api_pb2.DryRunResult(objects=objects, live_signals=live)


def _one(core: srv.ApiCore, p: Principal, work: ControlState, kind: str, msg: Any) -> api_pb2.DryRunObject:
    out = api_pb2.DryRunObject(kind=kind, name=msg.metadata.name)
    try:
        if kind == "Deployment":
            _deployment(core, p, work, msg, out)
        else:
            if not p.is_admin:
                raise srv.permission_denied(f"{kind.lower()}s are managed by admins only")
            cmd = _command(core, work, kind, msg)
            before = writes.stored(work, cmd)
            done = writes.apply_on(work, cmd, before, None)
            _set(out, kind, _render(work, kind, msg.metadata.name), done.result)
    except Exception as exc:  # noqa: BLE001  (mapped like any servicer failure: INTERNAL logged)
        err = srv._failure(exc, "DryRun")
        out.error_code, out.error = err.code.name, err.message
        out.violations.extend(api_pb2.FieldViolation(field=f, description=d) for f, d in err.violations)
    return out


def _command(core: srv.ApiCore, work: ControlState, kind: str, msg: Any) -> c.Command:
    if kind == "Zone":
        return writes.zone_command(core, work, msg)
    if kind == "Cluster":
        return writes.cluster_command(core, work, msg)
    return writes.tenant_command(core, work, msg, mode="apply")


def _render(state: ControlState, kind: str, name: str) -> Any:
    if kind == "Zone":
        return cv.zone_to_proto(state, name)
    if kind == "Cluster":
        return cv.cluster_to_proto(state, state.clusters[name])
    return cv.tenant_to_proto(state, state.tenants[name])


def _set(out: api_pb2.DryRunObject, kind: str, obj: Any, result: str) -> None:
    obj.metadata.apply_result = result
    getattr(out, kind.lower()).CopyFrom(obj)


def _deployment(core: srv.ApiCore, p: Principal, work: ControlState, msg: api_pb2.Deployment,
                out: api_pb2.DryRunObject) -> None:
    names.refuse_qualified(msg.metadata.name, "metadata.name")
    d = cv.deployment_from_proto(msg)
    sent = d.id
    if not p.sees_tenant(d.tenant):
        raise srv.not_found("tenant", d.tenant)
    rv = srv.client_version(msg.metadata.resource_version, "metadata.resource_version")
    ident = names.resolve(work, d.tenant, sent)
    try:
        cmd = writes.deployment_command(core, work, d, rv, create_only=False)
        before = writes.stored(work, cmd)
        proposed = cmd.deployment
        signals = core.holder.signals_of(ident) if core.holds_lease() and core.holder is not None else None
        scaling = dry_run(work, proposed, signals, core.now_ms())
        done = writes.apply_on(work, cmd, before, "api_max_deployments_per_tenant")
    except srv.ApiError as err:
        raise srv.named_as_sent(err, ident, sent) from None
    _set(out, "Deployment", cv.deployment_to_proto(work, work.deployments[ident]), done.result)
    out.scaling.CopyFrom(outcome_to_proto(scaling, signals is not None, ident, sent))


def outcome_to_proto(out: DryRunOutcome, live: bool, ident: str, sent: str) -> api_pb2.DryRunResult:
    """A scaling dry run as the API answers it (notes name the deployment as the client sent it)."""
    return api_pb2.DryRunResult(
        exists=out.exists,
        changes=[api_pb2.FieldChange(field=str(f), before=str(b), after=str(a)) for f, b, a in out.changes],
        current_replicas=out.current_replicas, target_before=out.target_before, target_after=out.target_after,
        warm_pool_after=out.warm_pool_after, reason_after=out.reason_after, message_after=out.message_after,
        notes=[n.replace(repr(ident), repr(sent)) for n in out.notes], live_signals=live,
    )

