"""The change feed of the replicated state: what ``Scaling.Watch`` streams and ``Scaling.Explain`` shows.

Each node derives :class:`ChangeEvent` values from the entries it applies (``raft/fsm.py`` collects
:func:`capture` values through ``apply``'s ``before`` hook, then calls :meth:`EventLog.record`), so
every replica holds the same events under the same revisions and a watch resumes on any of them. The log
is in memory only: a restart or a snapshot install starts it again at the state's revision.

Revisions are ``ControlState.applied`` values: the event of a command carries the revision of that
command (its ``ApplyResult.revision``, the ``resource_version`` it gave its object). A command makes at
most one event, so revisions of retained events strictly increase (a batch's members have their own).
Tokens and scaling memory make none (token data never leaves the state through here). A breaker
update makes a ``Breaker`` event; a lease change (holder or epoch: an acquisition, a release, a
failover; never a renewal) makes a ``Lease`` event through :meth:`EventLog.record_lease`, at the
revision the FSM gives it (``raft/fsm.py`` counts such a change as an applied command).

Every event carries ``significant`` (see :mod:`controlplane.runtime.event_types`): what a watch
sends by default. A decision that changes no count and a breaker update that keeps its phase are
not significant; neither is an instance's Ready <-> Busy flip.

Retention, with ``first_revision`` as the one number that defines it: every event with a revision
greater than ``first_revision`` is retained, so ``since(r)`` answers completely for any
``r >= first_revision`` and raises :class:`EventsCompacted` below it. ``first_revision`` starts at 0,
moves up to the revision of the oldest event dropped when more than ``capacity`` are held, and to the
state's revision on :meth:`EventLog.reset`. Decisions are also kept per deployment (the newest
``decisions_per_deployment``), independent of that horizon, until the deployment is deleted.

Pure apart from its lock: no clocks (``at_ms`` is the command's own), no randomness.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from controlplane.domain import commands as c
from controlplane.domain.instances import InstanceState
from controlplane.domain.state import ApplyResult, ControlState
from controlplane.runtime import event_types as et

ADDED, MODIFIED, DELETED, TRANSITION, DECIDED = "ADDED", "MODIFIED", "DELETED", "TRANSITION", "DECIDED"
KINDS = ("Tenant", "Deployment", "Cluster", "Zone", "Instance", "Decision", "Breaker", "Lease")


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    revision: int
    at_ms: int
    """The command's ``at_ms`` (0 for commands without one, such as removals)."""
    type: str
    """ADDED, MODIFIED, DELETED (objects), TRANSITION (instances, breakers, the lease) or DECIDED (decisions)."""
    kind: str
    """One of :data:`KINDS`."""
    name: str
    """The object's id (the deployment's for a decision)."""
    tenant: str = ""
    """The owning tenant ("" for clusters and zones: only admins see those)."""
    deployment: str = ""
    from_state: str = ""
    to_state: str = ""
    event: str = ""
    """An instance's lifecycle event (``create`` for a new one)."""
    cluster: str = ""
    zone: str = ""
    replicas: int = 0
    warm_pool: int = 0
    reason: str = ""
    """A decision's reason; ``preempted`` for an instance drained by a preemption; ``failover`` for a
    lease taken over from another holder."""
    message: str = ""
    significant: bool = True
    """Sent by a watch by default (:mod:`controlplane.runtime.event_types`)."""


class EventsCompacted(Exception):
    """``since(revision)`` asked for events the log no longer holds. ``oldest`` is the lowest revision
    a reader can resume after (the log's ``first_revision``)."""

    def __init__(self, revision: int, oldest: int) -> None:
        super().__init__(f"revision {revision} is compacted: events are retained after revision {oldest} only")
        self.revision = revision
        self.oldest = oldest


Match = Callable[[ChangeEvent], bool]
_REVISION = attrgetter("revision")
_OBJECT_KINDS: dict[type, tuple[str, str]] = {
    c.PutTenant: ("Tenant", "tenant"),
    c.PutDeployment: ("Deployment", "deployment"),
    c.PutCluster: ("Cluster", "cluster"),
    c.PutZone: ("Zone", "zone"),
}


def capture(state: ControlState, cmd: c.Command) -> Any:
    """What ``cmd``'s event needs from the state *before* it is applied: the object a put replaces (to
    tell ADDED from MODIFIED), the deployment a removal or decision names, an instance before its
    transition (a terminal one leaves the state). Never raises, even for a malformed command."""
    try:
        t = type(cmd)
        if t is c.PutTenant:
            return state.tenants.get(cmd.tenant.id)  # type: ignore[attr-defined]
        if t is c.PutDeployment:
            return state.deployments.get(cmd.deployment.id)  # type: ignore[attr-defined]
        if t is c.PutCluster:
            return state.clusters.get(cmd.cluster.id)  # type: ignore[attr-defined]
        if t is c.PutZone:
            return state.zones.get(cmd.zone.id)  # type: ignore[attr-defined]
        if t is c.RemoveDeployment:
            return state.deployments.get(cmd.deployment_id)  # type: ignore[attr-defined]
        if t is c.SetDesired:
            return state.deployments.get(cmd.deployment_id), state.desired.get(cmd.deployment_id)  # type: ignore[attr-defined]
        if t is c.PutBreaker:
            return state.breakers.get(cmd.key), _breaker_tenant(state, cmd.key)  # type: ignore[attr-defined]
        if t is c.RemoveCluster:
            return state.clusters.get(cmd.cluster_id)  # type: ignore[attr-defined]
        if t is c.CreateInstance:
            return state.deployments.get(cmd.deployment_id), state.clusters.get(cmd.cluster_id)  # type: ignore[attr-defined]
        if t is c.TransitionInstance:
            return state.instances.get(cmd.instance_id)  # type: ignore[attr-defined]
    except (TypeError, AttributeError):  # unhashable or missing fields: apply rejects the command too
        return None
    return None


def derive(cmd: c.Command, result: ApplyResult, before: Any) -> ChangeEvent | None:
    """The event of one applied (``result.ok``) non-batch command, given :func:`capture`'s value."""
    rev, at = result.revision, getattr(cmd, "at_ms", 0)
    t = type(cmd)
    if t in _OBJECT_KINDS:
        kind, attr = _OBJECT_KINDS[t]
        obj = getattr(cmd, attr)
        kw: dict[str, Any] = {}
        if kind == "Tenant":
            kw = {"tenant": obj.id}
        elif kind == "Deployment":
            kw = {"tenant": obj.tenant, "deployment": obj.id}
        elif kind == "Cluster":
            kw = {"cluster": obj.id, "zone": obj.zone}
        else:
            kw = {"zone": obj.id}
        return ChangeEvent(rev, at, ADDED if before is None else MODIFIED, kind, obj.id, **kw)
    if t is c.RemoveTenant:
        return ChangeEvent(rev, 0, DELETED, "Tenant", cmd.tenant_id, tenant=cmd.tenant_id)  # type: ignore[attr-defined]
    if t is c.RemoveDeployment:
        did = cmd.deployment_id  # type: ignore[attr-defined]
        return ChangeEvent(rev, 0, DELETED, "Deployment", did, tenant=before.tenant, deployment=did)
    if t is c.RemoveCluster:
        cid = cmd.cluster_id  # type: ignore[attr-defined]
        return ChangeEvent(rev, 0, DELETED, "Cluster", cid, cluster=cid, zone=before.zone)
    if t is c.RemoveZone:
        return ChangeEvent(rev, 0, DELETED, "Zone", cmd.zone_id, zone=cmd.zone_id)  # type: ignore[attr-defined]
    if t is c.CreateInstance:
        d, cl = before
        return ChangeEvent(
            rev, at, TRANSITION, "Instance", cmd.instance_id, tenant=d.tenant, deployment=d.id,  # type: ignore[attr-defined]
            to_state=InstanceState.PENDING.value, event="create", cluster=cl.id, zone=cl.zone,
        )
    if t is c.TransitionInstance:
        (rec,) = result.transitions
        preempted = bool(cmd.preempted) and rec.to_state is InstanceState.DRAINING  # type: ignore[attr-defined]
        ev = ChangeEvent(
            rev, at, TRANSITION, "Instance", rec.instance_id, tenant=before.tenant, deployment=before.deployment,
            from_state=rec.from_state.value, to_state=rec.to_state.value, event=rec.event.value,
            cluster=before.cluster, zone=before.zone, reason=et.PREEMPTED if preempted else "",
        )
        return ev if et.event_type(ev) != et.BUSY else _replace_significant(ev, False)
    if t is c.SetDesired:
        d, prev = before
        changed = prev is None or (prev.replicas, prev.warm_pool) != (cmd.replicas, cmd.warm_pool)  # type: ignore[attr-defined]
        return ChangeEvent(
            rev, at, DECIDED, "Decision", cmd.deployment_id, tenant=d.tenant, deployment=cmd.deployment_id,  # type: ignore[attr-defined]
            replicas=cmd.replicas, warm_pool=cmd.warm_pool, reason=cmd.reason, message=cmd.message,  # type: ignore[attr-defined]
            significant=changed,
        )
    if t is c.PutBreaker:
        return _breaker_event(cmd, rev, before)  # type: ignore[arg-type]
    return None  # tokens, scaling memory


def _replace_significant(ev: ChangeEvent, significant: bool) -> ChangeEvent:
    return replace(ev, significant=significant)


def _breaker_tenant(state: ControlState, key: str) -> str:
    """The tenant of a deployment breaker's key (``deployment/<cluster>/<deployment id>``); ""."""
    parts = key.split("/") if isinstance(key, str) else []
    if len(parts) < 3 or parts[0] != "deployment":
        return ""
    d = state.deployments.get("/".join(parts[2:]))  # type: ignore[call-overload]
    return d.tenant if d is not None else (parts[2] if len(parts) > 3 else "")


def _breaker_event(cmd: c.PutBreaker, rev: int, before: Any) -> ChangeEvent:
    prev, tenant = before if isinstance(before, tuple) else (None, "")
    parts = cmd.key.split("/")
    cluster = parts[1] if len(parts) > 1 and parts[0] in ("cluster", "deployment") else ""
    deployment = "/".join(parts[2:]) if parts[0] == "deployment" and len(parts) > 2 else ""
    rec = cmd.record
    old = prev.phase.value if prev is not None else "closed"
    return ChangeEvent(
        rev, rec.changed_ms, TRANSITION, "Breaker", cmd.key, tenant=tenant, deployment=deployment,
        from_state=old, to_state=rec.phase.value, event="trip" if rec.phase.value == "open" else rec.phase.value,
        cluster=cluster, message=f"failures {rec.failures}, trips {rec.trips}", significant=old != rec.phase.value,
    )


def lease_event(before: Any, after: Any, revision: int, at_ms: int = 0) -> ChangeEvent | None:
    """The event of a lease change (``raft.lease.LeaseRecord`` before and after), or None when the
    holder and epoch are the same (a renewal)."""
    if (before.holder, before.epoch) == (after.holder, after.epoch):
        return None
    if not after.holder:
        what, reason = "release", ""
        text = f"released by {before.holder or 'nobody'} (epoch {before.epoch})"
    else:
        what = "acquire"
        reason = "failover" if before.holder and before.holder != after.holder else ""
        text = f"{after.holder} holds the lease at epoch {after.epoch}" + (
            f" (was {before.holder} at epoch {before.epoch})" if before.holder else "")
    return ChangeEvent(revision, at_ms, TRANSITION, "Lease", "lease", from_state=before.holder, to_state=after.holder,
                       event=what, reason=reason, message=text)


class EventLog:
    """A bounded, thread-safe log of :class:`ChangeEvent`, written by the FSM, read by API servers.

    Writer (one thread, the FSM's): for each applied entry, collect :func:`capture` of every command
    through ``apply``'s ``before`` hook, then call :meth:`record`. Readers (any thread): :meth:`since`,
    :meth:`wait_after`, :meth:`decisions` and the two revision properties.
    """

    def __init__(self, capacity: int = 50_000, decisions_per_deployment: int = 200) -> None:
        if capacity < 1 or decisions_per_deployment < 1:
            raise ValueError("capacity and decisions_per_deployment must be >= 1")
        self._capacity = capacity
        self._per_deployment = decisions_per_deployment
        self._cond = threading.Condition(threading.Lock())
        self._events: deque[ChangeEvent] = deque()
        self._decisions: dict[str, deque[ChangeEvent]] = {}
        self._first = 0
        self._last = 0

    # --- writer -------------------------------------------------------------------------------------

    def record(self, command: c.Command, result: ApplyResult, befores: Sequence[Any], applied: int) -> None:
        """Turn the entry just applied into events. ``befores`` are the :func:`capture` values of the
        commands ``apply`` applied, in order; ``applied`` is the state's revision after the entry (it
        becomes :attr:`last_revision` even when the entry made no event)."""
        if isinstance(command, c.Batch):
            members: tuple[Any, ...] = command.commands if isinstance(command.commands, (tuple, list)) else ()
            results = result.results
        else:
            members, results = (command,), (result,)
        events = []
        captured = iter(befores)
        for cmd, res in zip(members, results):
            if isinstance(cmd, c.Batch):
                continue  # nested: rejected without being captured
            before = next(captured, None)
            if res.ok:
                event = derive(cmd, res, before)
                if event is not None:
                    events.append(event)
        with self._cond:
            for event in events:
                self._append(event)
            if applied != self._last:
                self._last = applied
                self._cond.notify_all()

    def record_lease(self, event: ChangeEvent | None, applied: int) -> None:
        """A lease change (:func:`lease_event`) the FSM applied as revision ``applied``."""
        with self._cond:
            if event is not None:
                self._append(event)
            if applied != self._last:
                self._last = applied
                self._cond.notify_all()

    def _append(self, event: ChangeEvent) -> None:
        self._events.append(event)
        if len(self._events) > self._capacity:
            self._first = self._events.popleft().revision
        if event.type == DECIDED:
            q = self._decisions.get(event.deployment)
            if q is None:
                q = self._decisions[event.deployment] = deque(maxlen=self._per_deployment)
            q.append(event)
        elif event.type == DELETED and event.kind == "Deployment":
            self._decisions.pop(event.deployment, None)

    def reset(self, revision: int) -> None:
        """Forget everything: the state was replaced (snapshot install) at ``revision``. Readers
        resuming below it get :class:`EventsCompacted`; waiters wake up."""
        with self._cond:
            self._events.clear()
            self._decisions.clear()
            self._first = self._last = revision
            self._cond.notify_all()

    # --- readers ------------------------------------------------------------------------------------

    @property
    def first_revision(self) -> int:
        """The lowest revision :meth:`since` accepts: every event after it is retained."""
        with self._cond:
            return self._first

    @property
    def last_revision(self) -> int:
        """The state's revision after the last recorded entry (or the last reset)."""
        with self._cond:
            return self._last

    def since(self, revision: int, match: Match | None = None, limit: int | None = None) -> list[ChangeEvent]:
        """Retained events with a revision greater than ``revision``, oldest first, those for which
        ``match`` (if given) is true, at most ``limit`` (the oldest ones). A revision ahead of
        :attr:`last_revision` (a reader coming from a replica further ahead) gets ``[]``. Raises
        :class:`EventsCompacted` when ``revision < first_revision``."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit: must be >= 0, got {limit}")
        with self._cond:
            if revision < self._first:
                raise EventsCompacted(revision, self._first)
            events = self._events
            start = bisect.bisect_right(events, revision, key=_REVISION)
            out: list[ChangeEvent] = []
            for e in itertools.islice(events, start, None):
                if limit is not None and len(out) >= limit:
                    break
                if match is None or match(e):
                    out.append(e)
            return out

    def wait_after(self, revision: int, timeout_s: float) -> int:
        """Block until :attr:`last_revision` is greater than ``revision`` or ``timeout_s`` passed;
        returns :attr:`last_revision` either way."""
        with self._cond:
            self._cond.wait_for(lambda: self._last > revision, timeout_s)
            return self._last

    def decisions(self, deployment_id: str, limit: int) -> list[ChangeEvent]:
        """The newest ``limit`` decisions of a deployment, oldest first (the newest last)."""
        with self._cond:
            q = self._decisions.get(deployment_id)
            if q is None or limit <= 0:
                return []
            return list(q)[-limit:]
