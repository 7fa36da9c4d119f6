"""How the API's object writes are carried out: unchanged objects, dry runs and whole-file dry runs.

Every write (CreateTenant, UpdateTenant, ApplyDeployment, RegisterCluster, RegisterZone) builds one
replicated command from a fresh read of the state (``make(state)``) and then:

1. **compares** the object it would store (the domain value: defaults applied, every field, labels
   included once they exist) with the stored one: equal is ``unchanged``, and nothing is committed
   (no Raft entry, no new ``resource_version``, no watch event): a GitOps loop re-applying the same
   files costs reads only;
2. for an unchanged object and for a dry run, **tries** the command on a private copy of the state
   through the replicated state machine itself (:func:`controlplane.domain.state.apply`), so it is
   refused exactly as the real write would be (versions, limits, pool changes, missing tenants:
   the same status), and a dry run answers from that copy (the object as it would be);
3. otherwise commits, retrying a lost race from a fresh read as :meth:`ApiCore.update` does (the
   state machine validates it there; no copy is made for a write that changes something).

The reply's ``metadata.apply_result`` is ``created``, ``configured`` or ``unchanged``.

:func:`dry_run_file` evaluates a whole file (zones, clusters, tenants, deployments, in that order)
on ONE copy, so a new tenant and its deployments dry-run together; each object gets its would-be
form or its refusal (every object is tried: all refusals are reported at once).

The command builders (``*_command``) are shared by the writers and the whole-file dry run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from controlplane.api import convert as cv
from controlplane.api import names
from controlplane.api import server as srv
from controlplane.api.v1 import api_pb2
from controlplane.domain import commands as c
from controlplane.domain.state import ControlState, apply
from controlplane.domain.tenants import Deployment
from raft.fsm import copy_state

CREATED = "created"
CONFIGURED = "configured"
UNCHANGED = "unchanged"


@dataclass(frozen=True)
class Written:
    """What a write did (or, dry, would do): ``result`` (:data:`CREATED`, :data:`CONFIGURED`,
    :data:`UNCHANGED`) and, for a dry run, the state the write would leave (None: read back)."""

    result: str
    state: ControlState | None = None


# --- the object a put command stores --------------------------------------------------------------


def stored(state: ControlState, cmd: c.Command) -> object | None:
    if isinstance(cmd, c.PutTenant):
        return state.tenants.get(cmd.tenant.id)
    if isinstance(cmd, c.PutDeployment):
        return state.deployments.get(cmd.deployment.id)
    if isinstance(cmd, c.PutCluster):
        return state.clusters.get(cmd.cluster.id)
    if isinstance(cmd, c.PutZone):
        return cv.zone_record(state, cmd.zone.id)
    raise TypeError(f"not an object put: {type(cmd).__name__}")


def _written(cmd: c.Command) -> object:
    for attr in ("tenant", "deployment", "cluster", "zone"):
        if hasattr(cmd, attr):
            return getattr(cmd, attr)
    raise TypeError(f"not an object put: {type(cmd).__name__}")


def trial(state: ControlState, cmd: c.Command, limit: str | None = None) -> Written:
    """Apply ``cmd`` to a copy of ``state`` with the state machine; the would-be result and state.
    Raises the status the real write would get when the state machine refuses it."""
    before = stored(state, cmd)
    copy = copy_state(state)
    return apply_on(copy, cmd, before, limit)


def apply_on(work: ControlState, cmd: c.Command, before: object | None, limit: str | None) -> Written:
    result = apply(work, cmd)
    if not result.ok:
        raise srv.rejection_error(result, limit)
    if before is None:
        return Written(CREATED, work)
    return Written(UNCHANGED if before == _written(cmd) else CONFIGURED, work)


# --- a write -----------------------------------------------------------------------------------------


def put(core: srv.ApiCore, context: grpc.ServicerContext, make: Callable[[ControlState], c.Command], *,
        retry: bool, dry_run: bool, limit: str | None = None) -> Written:
    """Carry out the write ``make(state)`` describes (see the module doc)."""
    for attempt in range(srv.RMW_ATTEMPTS):
        state = core.node.state_copy()
        cmd = make(state)
        if dry_run:
            return trial(state, cmd, limit)
        before = stored(state, cmd)
        if before is not None and before == _written(cmd):
            trial(state, cmd, limit)  # refused as the write would be (a stale resource_version)
            return Written(UNCHANGED)
        try:
            core.commit(cmd, context, limit=limit)
            return Written(CREATED if before is None else CONFIGURED)
        except srv.ApiError as err:
            raced = err.cp_error == "version-mismatch" or err.code is grpc.StatusCode.ALREADY_EXISTS
            if not retry or not raced or attempt == srv.RMW_ATTEMPTS - 1:
                raise
            core.barrier(context)
    raise AssertionError("unreachable")


def reply(core: srv.ApiCore, context: grpc.ServicerContext, written: Written,
          render: Callable[[ControlState], Any]) -> Any:
    """``render(state)`` of the state the write left (the dry run's copy, else this replica read
    back), with ``metadata.apply_result`` set."""
    state = written.state if written.state is not None else core.read(context)[0]
    msg = render(state)
    msg.metadata.apply_result = written.result
    return msg


# --- command builders (shared by the writers and the whole-file dry run) ---------------------------


def tenant_command(core: srv.ApiCore, state: ControlState, msg: api_pb2.Tenant, *, mode: str) -> c.PutTenant:
    """``mode``: ``create`` (must not exist), ``update`` (must exist) or ``apply`` (either)."""
    t = cv.tenant_from_proto(msg)
    rv = srv.client_version(msg.metadata.resource_version, "metadata.resource_version")
    exists = t.id in state.tenants
    if mode == "create" and exists:  # refused before anything is proposed (no log entry)
        raise srv.ApiError(grpc.StatusCode.ALREADY_EXISTS, f"tenant {t.id!r} already exists")
    if mode == "create" or (mode == "apply" and not exists and rv == 0):
        return c.PutTenant(t, c.MUST_NOT_EXIST, core.now_ms())
    if not exists:
        raise srv.not_found("tenant", t.id)
    return c.PutTenant(t, core.expect(rv, srv._meta(state, "tenant", t.id), True), core.now_ms())


def deployment_command(core: srv.ApiCore, state: ControlState, d: Deployment, rv: int, *,
                       create_only: bool) -> c.PutDeployment:
    """``d`` as :func:`convert.deployment_from_proto` made it (``d.id``: the name within its tenant)."""
    # Names are per tenant (docs/security.md "Names"): the id is d.tenant's own, whatever
    # another tenant owns.
    name = d.id
    ident = names.resolve(state, d.tenant, name)
    existing = state.deployments.get(ident)
    current = srv._meta(state, "deployment", ident)
    if existing is not None and existing.deleting:
        raise srv.ApiError(grpc.StatusCode.FAILED_PRECONDITION,
                           f"deployment {name!r} is being deleted; apply it again once it is gone",
                           (("cp-error", "conflict"),))
    if existing is None and rv > 0:
        raise srv.not_found("deployment", name)
    created = existing.created_ms if existing is not None else core.now_ms()
    new = dataclasses.replace(d, id=ident, created_ms=created)
    expect = c.MUST_NOT_EXIST if create_only else core.expect(rv, current, existing is not None)
    return c.PutDeployment(new, expect, core.now_ms(), core.cfg.api_max_deployments_per_tenant)


def cluster_command(core: srv.ApiCore, state: ControlState, msg: api_pb2.Cluster) -> c.PutCluster:
    rv = srv.client_version(msg.metadata.resource_version, "metadata.resource_version")
    existing = state.clusters.get(msg.metadata.name)
    if existing is None and rv > 0:
        raise srv.not_found("cluster", msg.metadata.name)
    cl = cv.cluster_from_proto(msg, existing)
    current = srv._meta(state, "cluster", cl.id)
    return c.PutCluster(cl, core.expect(rv, current, existing is not None), core.now_ms())


def zone_command(core: srv.ApiCore, state: ControlState, msg: api_pb2.Zone) -> c.PutZone:
    rv = srv.client_version(msg.metadata.resource_version, "metadata.resource_version")
    z = cv.zone_from_proto(msg)
    existing = cv.zone_record(state, z.id)
    if existing is None and rv > 0:
        raise srv.not_found("zone", z.id)
    new = cv.zone_from_proto(msg, existing)
    return c.PutZone(new, core.expect(rv, srv._meta(state, "zone", z.id), existing is not None), core.now_ms())
