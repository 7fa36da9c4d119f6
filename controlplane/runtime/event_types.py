"""What kind of change an event is (its *type* for ``tenantctl watch --type`` / ``WatchRequest.types``)
and which events are *significant* (what a watch sends by default).

A pure function of an event's fields, so the server (on :class:`~controlplane.runtime.events.ChangeEvent`)
and clients (on ``api_pb2.Event``) classify alike:

* ``object``: a Tenant, Deployment, Cluster or Zone was added, modified or deleted.
* ``decision``: a scaling decision (``SetDesired``). Significant when it changed a count (replicas or
  warm pool) against the deployment's previous desired state.
* ``busy``: an instance flipping between Ready and Busy (every few hundred milliseconds under load):
  never significant.
* ``preemption``: an instance drained because another tenant preempted its GPUs.
* ``lifecycle``: any other instance transition (created, warming, sleeping, draining, failed...).
* ``breaker``: a circuit breaker's record changed. Significant when its phase changed (closed, open,
  half_open); a failure counted while closed is not.
* ``lease``: the control lease changed hands or epoch (acquired, released, failover). Renewals make
  no event at all.

The significance of a decision and a breaker needs the state before the command: it is computed when
the event is derived and carried as ``significant``; the others are significant by type.
"""

from __future__ import annotations

from typing import Any

OBJECT, DECISION, BUSY, PREEMPTION, LIFECYCLE, BREAKER, LEASE = (
    "object", "decision", "busy", "preemption", "lifecycle", "breaker", "lease")
TYPES = (DECISION, LIFECYCLE, PREEMPTION, BREAKER, LEASE, OBJECT, BUSY)
"""Every event type, in the order the docs list them."""
SIGNIFICANT_BY_TYPE = {OBJECT: True, DECISION: True, BUSY: False, PREEMPTION: True, LIFECYCLE: True,
                       BREAKER: True, LEASE: True}
"""Whether each type is significant when the event itself does not say otherwise (``significant``)."""

PREEMPTED = "preempted"
"""The ``reason`` of an instance transition caused by a preemption."""
_BUSY_PAIR = frozenset(("Ready", "Busy"))


def event_type(ev: Any) -> str:
    """The type of an event (a ``ChangeEvent`` or an ``api_pb2.Event``); "" for a bookmark."""
    kind = ev.kind
    if kind == "Decision":
        return DECISION
    if kind == "Breaker":
        return BREAKER
    if kind == "Lease":
        return LEASE
    if kind == "Instance":
        if ev.reason == PREEMPTED:
            return PREEMPTION
        if frozenset((ev.from_state, ev.to_state)) == _BUSY_PAIR:
            return BUSY
        return LIFECYCLE
    return OBJECT if kind else ""


def parse_types(values: Any, field: str = "types") -> frozenset[str]:
    """``values`` checked against :data:`TYPES` (case-insensitive); raises ``ValueError`` naming the
    first unknown one."""
    out = set()
    for i, v in enumerate(values):
        norm = str(v).strip().lower()
        if norm not in TYPES:
            raise ValueError(f"{field}[{i}]: unknown type {str(v)[:40]!r} (one of {', '.join(TYPES)})")
        out.add(norm)
    return frozenset(out)


def selector(all_events: bool, types: frozenset[str]) -> Any:
    """The predicate of a watch's ``all`` / ``types``: ``types`` (when not empty) selects by type,
    whatever the significance; else ``all`` sends everything; else only significant events."""
    if types:
        return lambda ev: event_type(ev) in types
    if all_events:
        return lambda ev: True
    return lambda ev: bool(ev.significant)
