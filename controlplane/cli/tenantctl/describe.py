"""``tenantctl describe``: one object laid out like ``kubectl describe``.

::

    Name:         chat
    Tenant:       search
    Kind:         Deployment
    Labels:       team=search
                  tier=gold
    Created:      2026-12-02T17:41:23Z (5m ago)
    Updated:      2026-12-02T17:44:02Z (2m ago)
    Version:      42
    Spec:
      engine:     vllm
      ...
    Status:
      ...
    Conditions:
      TYPE          STATUS   REASON   MESSAGE   LAST TRANSITION
    Instances:
      ID   STATE   ...
    Decisions:
      ...
    Events:
      ...

Every time is RFC 3339 (UTC) with its age; values line up within a block (the keys of one level
of one section); nested sections are indented by two; lists of records are tables. No line ends
in a space. Plain text on ``out`` (no terminal formatting: this is also what scripts and pagers see).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from controlplane.api import manifests as mf
from controlplane.api.client import ApiClient, ApiError, Notice, Unreachable
from controlplane.api.v1 import api_pb2
from controlplane.cli.tenantctl import conditions, render
from controlplane.cli.tenantctl.views import STATUS_TIMES

EVENTS_SHOWN = 10
DECISIONS_SHOWN = 5


def when(ms: int) -> str:
    """``2026-12-02T17:41:23Z (5m ago)``; ``<unknown>`` for 0."""
    return f"{render.rfc3339(ms)} ({render.age(ms)} ago)" if ms else "<unknown>"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: int = 2) -> list[str]:
    """Columns three spaces apart, the last one not padded (no trailing spaces)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    out = []
    for r in [list(headers), *cells]:
        line = "   ".join(c.ljust(w) for c, w in zip(r, widths))
        out.append((" " * indent + line).rstrip())
    return out


class Lines:
    """A block of ``key: value`` lines, aligned when written."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, str | None]] = []  # indent, key, value (None: a section head)

    def kv(self, key: str, value: Any, indent: int = 0) -> None:
        text = str(value)
        lines = text.split("\n") if text else ["-"]
        self.rows.append((indent, key, lines[0]))
        for more in lines[1:]:  # a multi-line value: continued under the first line's value
            self.rows.append((indent, "", more))

    def head(self, key: str, indent: int = 0) -> None:
        self.rows.append((indent, key, None))

    def raw(self, line: str) -> None:
        self.rows.append((-1, line, None))

    def message(self, msg: Any, indent: int, skip: tuple[str, ...] = ()) -> None:
        """The fields ``msg`` has set: maps inline (``h100=4,a100=2``), messages as nested
        sections, lists of messages as tables, wall-clock times (``STATUS_TIMES``) in RFC 3339."""
        for fd, value in msg.ListFields():
            name = fd.name
            if name in skip:
                continue
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                self.kv(name, ",".join(f"{k}={_cell(v)}" for k, v in sorted(value.items())) or "<none>", indent)
            elif fd.is_repeated and fd.message_type is not None:
                rows = [mf.plain(v) for v in value]
                cols = list(dict.fromkeys(k for r in rows for k in r))
                self.head(name, indent)
                for line in table([c.upper() for c in cols], [[_cell(r.get(c)) for c in cols] for r in rows],
                                  indent + 2):
                    self.raw(line)
            elif fd.is_repeated:
                self.kv(name, ", ".join(str(v) for v in value) or "<none>", indent)
            elif fd.message_type is not None:
                self.head(name, indent)
                self.message(value, indent + 2)
            elif name in STATUS_TIMES and isinstance(value, int):
                self.kv(STATUS_TIMES[name], when(value), indent)
            else:
                self.kv(name, _cell(value), indent)

    def text(self) -> str:
        out: list[str] = []
        i = 0
        while i < len(self.rows):
            indent = self.rows[i][0]
            if indent < 0:
                out.append(self.rows[i][1].rstrip())
                i += 1
                continue
            j = i  # the run of rows of this indent (nested deeper rows end it)
            while j < len(self.rows) and self.rows[j][0] == indent:
                j += 1
            width = max(len(k) + 1 for _, k, v in self.rows[i:j] if v is not None) if any(
                v is not None for _, _, v in self.rows[i:j]) else 0
            for _, key, value in self.rows[i:j]:
                if value is None:
                    out.append(f"{' ' * indent}{key}:")
                else:
                    label = f"{key}:" if key else ""
                    out.append(f"{' ' * indent}{label:<{width}}  {value}".rstrip())
            i = j
        return "\n".join(out) + "\n"


def _cell(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def conditions_lines(obj: Any) -> list[str]:
    """The ``Conditions:`` table of a deployment, cluster or zone (times in RFC 3339)."""
    status = obj.status
    if status.DESCRIPTOR.fields_by_name.get("conditions") is None:  # tenants have none
        return []
    if not status.conditions:
        return ["Conditions:  <none>"]
    return ["Conditions:", *table(conditions.HEADERS, conditions.conditions_rows(status.conditions))]


def describe_text(kind: str, obj: Any, client: ApiClient | None = None) -> str:
    meta = obj.metadata
    head = Lines()
    head.kv("Name", meta.name)
    if kind == "Deployment":
        head.kv("Tenant", obj.spec.tenant)
    head.kv("Kind", kind)
    labels = [f"{k}={v}" for k, v in sorted(meta.labels.items())]
    head.kv("Labels", "\n".join(labels) if labels else "<none>")
    head.kv("Created", when(meta.created_ms))
    head.kv("Updated", when(meta.updated_ms))
    head.kv("Version", meta.resource_version)
    head.head("Spec")
    head.message(obj.spec, 2)
    head.head("Status")
    head.message(obj.status, 2, skip=("instances", "conditions"))
    parts = [head.text()]
    # -- Conditions: status.conditions (DeploymentStatus 11, ClusterStatus 6, ZoneStatus 7) ------
    cond = conditions_lines(obj)
    if cond:
        parts.append("\n".join(cond) + "\n")
    if kind == "Deployment":
        parts.append(_instances(obj))
        if client is not None:
            parts.append(_decisions(client, obj))
            parts.append(_events(client, obj))
    return "".join(parts)


def _instances(obj: Any) -> str:
    insts = list(obj.status.instances)
    if not insts:
        return "Instances:  <none>\n"
    rows = [[i.id, i.state, i.cluster or "-", i.zone or "-", i.init_method or "-", render.rfc3339(i.since_ms),
             "yes" if i.preempted else "-"] for i in insts]
    return "\n".join(["Instances:", *table(["ID", "STATE", "CLUSTER", "ZONE", "INIT", "SINCE", "PREEMPTED"], rows)]) + "\n"


def _decisions(client: ApiClient, obj: Any) -> str:
    try:
        exp = client.call("Scaling", "Explain", api_pb2.ExplainRequest(  # qualified: right for admins and tenants
            deployment=f"{obj.spec.tenant}/{obj.metadata.name}", limit=DECISIONS_SHOWN))
    except (ApiError, Unreachable):
        return "Decisions:  <unavailable>\n"
    if not exp.history:
        return "Decisions:  <none>\n"
    rows = [[d.revision, render.rfc3339(d.at_ms), d.replicas, d.warm_pool, d.reason or "-", render.person_times(d.message) or "-"]
            for d in exp.history]
    return "\n".join(["Decisions:", *table(["REVISION", "TIME", "REPLICAS", "WARM", "REASON", "MESSAGE"], rows)]) + "\n"


def _events(client: ApiClient, obj: Any) -> str:
    req = api_pb2.WatchRequest(deployment=f"{obj.spec.tenant}/{obj.metadata.name}", once=True)
    events: list[api_pb2.Event] = []
    try:
        for item in client.watch(req, max_rounds=1):
            if not isinstance(item, Notice) and item.type != "BOOKMARK":
                events.append(item)
    except (ApiError, Unreachable):
        return "Events:  <unavailable>\n"
    if not events:
        return "Events:  <none>\n"
    rows = [[e.revision, render.rfc3339(e.at_ms), e.type, render.event_detail(e) or "-"]
            for e in events[-EVENTS_SHOWN:]]
    return "\n".join(["Events:", *table(["REVISION", "TIME", "TYPE", "DETAIL"], rows)]) + "\n"


def write(out: TextIO, kind: str, obj: Any, client: ApiClient | None = None) -> None:
    out.write(describe_text(kind, obj, client))
    out.flush()
