"""Status conditions in tenantctl (docs/tenantctl.md "Conditions"): the blocking reason ``get``
shows in its STATUS column, the table ``describe`` prints, and the warning ``apply`` writes on
stderr when the object it just wrote cannot be scheduled (exit status unchanged, like kubectl's
warnings)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

BAD_STATUS = {"Schedulable": "False", "AdapterConnected": "False", "Preempted": "True", "QuotaExceeded": "True",
              "BreakerOpen": "True", "Ready": "False"}
"""The status of each condition type that blocks or degrades an object."""
PRECEDENCE = ("Schedulable", "AdapterConnected", "Preempted", "QuotaExceeded", "BreakerOpen", "Ready")
"""Which blocking condition ``get`` names first: what stops it before what follows from it."""
WARN_TYPES = {"Deployment": ("Schedulable",), "Cluster": ("AdapterConnected", "Schedulable")}
"""The conditions ``apply`` warns about per kind (when they block)."""

HEADERS = ["TYPE", "STATUS", "REASON", "MESSAGE", "LAST TRANSITION"]
"""The columns of ``describe``'s ``Conditions:`` table (rows: :func:`conditions_rows`)."""


def blocking(conditions: Sequence[Any]) -> Any | None:
    """The blocking condition ``get`` names (by :data:`PRECEDENCE`), or None."""
    bad = [c for c in conditions if BAD_STATUS.get(c.type) == c.status]
    return min(bad, key=lambda c: PRECEDENCE.index(c.type)) if bad else None


def blocking_reason(conditions: Sequence[Any]) -> str | None:
    """The reason of the blocking condition (``NoCapacityInPool``, ``NoAdapter``...); ``Unknown``
    when none blocks but readiness is unknown; None when all is well or the server sent none."""
    c = blocking(conditions)
    if c is not None:
        return str(c.reason)
    if any(x.type == "Ready" and x.status == "Unknown" for x in conditions):
        return "Unknown"
    return None


def conditions_rows(conditions: Sequence[Any]) -> list[list[str]]:
    """One row per condition, in :data:`HEADERS` order."""
    from controlplane.cli.tenantctl.render import rfc3339

    return [[c.type, c.status, c.reason or "-", c.message or "-", rfc3339(c.last_transition_ms)] for c in conditions]


def warnings(kind: str, name: str, conditions: Sequence[Any]) -> list[str]:
    """``Warning: deployment/x: Schedulable=False NoCapacityInPool: ...`` lines for what blocks."""
    types = WARN_TYPES.get(kind, ())
    return [f"Warning: {kind.lower()}/{name}: {c.type}={c.status} {c.reason}: {c.message}"
            for c in conditions if c.type in types and BAD_STATUS.get(c.type) == c.status]


def warn_after_apply(err: TextIO, kind: str, reply: Any) -> None:
    """Warn on ``err`` about what blocks the object a write just stored (``reply``: the write's
    answer, which carries the object's conditions as of the write)."""
    status = getattr(reply, "status", None)
    if kind not in WARN_TYPES or status is None:
        return
    for line in warnings(kind, reply.metadata.name, status.conditions):
        print(line, file=err)
