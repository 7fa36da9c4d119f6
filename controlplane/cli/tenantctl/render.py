"""Output of tenantctl: tables (rich), JSON, YAML and ``kind/name`` lines."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from controlplane.api.v1 import api_pb2
from controlplane.cli.tenantctl.conditions import blocking_reason

FORMATS = ("table", "wide", "json", "yaml", "name")


def now_ms() -> int:
    return int(time.time() * 1000)


def age(ms: int, now: int | None = None) -> str:
    """``45s``, ``12m``, ``5h``, ``3d`` since ``ms`` (wall clock); ``-`` when unknown."""
    if not ms:
        return "-"
    s = max(0, ((now if now is not None else now_ms()) - ms) // 1000)
    if s < 120:
        return f"{s}s"
    if s < 120 * 60:
        return f"{s // 60}m"
    if s < 48 * 3600:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def rfc3339(ms: int) -> str:
    """``2026-12-02T17:41:23.125Z`` (UTC, RFC 3339, milliseconds only when not zero); ``-`` for 0.

    Every time a person reads (describe, yaml, messages) is written like this; JSON keeps the raw
    milliseconds under their own ``...Ms`` names next to it."""
    if not ms:
        return "-"
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000))
    frac = ms % 1000
    return f"{base}.{frac:03d}Z" if frac else f"{base}Z"


_WALL_MS = re.compile(r"\bt=(1\d{12})ms\b")


def person_times(text: str) -> str:
    """A server message with its wall-clock instants (``panic until t=1796160940691ms``) written in
    RFC 3339 (``panic until 2026-12-02T17:41:23.125Z``). Only 13-digit values (2001..2286) are
    taken for wall-clock times: virtual times of a simulation stay as they are."""
    return _WALL_MS.sub(lambda m: rfc3339(int(m.group(1))), text)


def clock(ms: int) -> str:
    if not ms:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def gpu_map(values: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(values.items())) or "-"


def make_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, show_header: bool = True,
               min_widths: Sequence[int] | None = None) -> Table:
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold", padding=(0, 3, 0, 0),
                  show_header=show_header)
    for i, h in enumerate(headers):
        table.add_column(h, no_wrap=True, overflow="fold", min_width=(min_widths[i] if min_widths else None))
    for row in rows:
        table.add_row(*(Text(str(c)) for c in row))
    return table


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(h), *(len(str(r[i])) for r in rows)]) for i, h in enumerate(headers)]


INSTANT_KEYS = {"at_ms": "time", "decided_ms": "decidedTime", "since_ms": "sinceTime",
                "last_transition_ms": "lastTransitionTime", "changed_ms": "changedTime", "created_ms": "createdTime",
                "expires_ms": "expiresTime"}
"""Fields holding a wall-clock instant in ms, and their RFC 3339 names in ``-o yaml`` (other ``_ms``
fields are durations: ``stable_window_ms``, ``lease_remaining_ms``)."""


def person_yaml(data: Any) -> Any:
    """``data`` for ``-o yaml``: each wall-clock instant (an :data:`INSTANT_KEYS` field of 13 digits)
    as RFC 3339 under its time name; a simulation's virtual times stay as they are."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if k in INSTANT_KEYS and type(v) is int and 10**12 <= v < 10**13:
                out[INSTANT_KEYS[k]] = rfc3339(v)
            else:
                out[k] = person_yaml(v)
        return out
    if isinstance(data, list):
        return [person_yaml(v) for v in data]
    return data


def dump(console: Console, data: Any, fmt: str) -> None:
    if fmt == "json":
        console.file.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    else:
        console.file.write(yaml.safe_dump(person_yaml(data), sort_keys=False, default_flow_style=False,
                                          allow_unicode=True))
    console.file.flush()


# --------------------------------------------------------------------------------------------------
# Rows per kind
# --------------------------------------------------------------------------------------------------


def _state_counts(d: api_pb2.Deployment) -> tuple[int, int]:
    by = d.status.replicas_by_state
    return by.get("ready", 0) + by.get("busy", 0), by.get("standby", 0)


def tenant_row(t: api_pb2.Tenant, wide: bool, now: int) -> list[str]:
    s = t.spec
    row = [t.metadata.name, str(s.priority), gpu_map(s.quota), gpu_map(s.borrow_limit),
           str(t.status.deployments), gpu_map(t.status.gpus_in_use), age(t.metadata.created_ms, now)]
    if wide:
        slo = s.slo
        row += [f"{slo.ttft_p99_ms}ms" if slo.HasField("ttft_p99_ms") else "-",
                f"{slo.max_queue_ms}ms" if slo.HasField("max_queue_ms") else "-", str(t.metadata.resource_version)]
    return row


TENANT_HEADERS = ["NAME", "PRIORITY", "QUOTA", "BORROW", "DEPLOYMENTS", "GPUS", "AGE"]
TENANT_WIDE = ["TTFT-SLO", "MAX-QUEUE", "VERSION"]


def deployment_row(d: api_pb2.Deployment, wide: bool, now: int) -> list[str]:
    s, st = d.spec, d.status
    ready, standby = _state_counts(d)
    status = "Deleting" if st.deleting else (blocking_reason(st.conditions) or "Active")
    row = [d.metadata.name, s.tenant, s.model, s.pool, f"{ready}/{st.desired_replicas}",
           f"{standby}/{st.desired_warm_pool}", status, age(d.metadata.created_ms, now)]
    if wide:
        states = ",".join(f"{k}={v}" for k, v in sorted(st.replicas_by_state.items())) or "-"
        row += [s.engine, str(s.min_replicas) if s.HasField("min_replicas") else "-",
                str(s.max_replicas) if s.HasField("max_replicas") else "-", states,
                gpu_map(st.replicas_by_zone), st.reason or "-", str(d.metadata.resource_version)]
    return row


DEPLOYMENT_HEADERS = ["NAME", "TENANT", "MODEL", "POOL", "READY", "WARM", "STATUS", "AGE"]
DEPLOYMENT_WIDE = ["ENGINE", "MIN", "MAX", "INSTANCES", "ZONES", "REASON", "VERSION"]


def _sched(cordoned: bool, draining: bool, schedulable: bool = True) -> str:
    if draining:
        return "Draining"
    if cordoned:
        return "Cordoned"
    return "Ready" if schedulable else "Ready,ZoneCordoned"


def cluster_row(c: api_pb2.Cluster, wide: bool, now: int) -> list[str]:
    s, st = c.spec, c.status
    row = [c.metadata.name, s.zone, s.region or "local", gpu_map(s.capacity), gpu_map(st.gpus_in_use),
           str(st.instances), blocking_reason(st.conditions) or _sched(st.cordoned, st.draining, st.schedulable),
           age(c.metadata.created_ms, now)]
    if wide:
        row += [s.adapter_address or "(configured)", str(c.metadata.resource_version)]
    return row


CLUSTER_HEADERS = ["NAME", "ZONE", "REGION", "CAPACITY", "IN-USE", "INSTANCES", "STATUS", "AGE"]
CLUSTER_WIDE = ["ADAPTER", "VERSION"]


def zone_row(z: api_pb2.Zone, wide: bool, now: int) -> list[str]:
    s, st = z.spec, z.status
    row = [z.metadata.name, s.region or "local", ",".join(st.clusters) or "-", gpu_map(st.capacity),
           gpu_map(st.gpus_in_use), blocking_reason(st.conditions) or _sched(st.cordoned, st.draining),
           age(z.metadata.created_ms, now)]
    if wide:
        row += ["yes" if st.registered else "no", str(z.metadata.resource_version)]
    return row


ZONE_HEADERS = ["NAME", "REGION", "CLUSTERS", "CAPACITY", "IN-USE", "STATUS", "AGE"]
ZONE_WIDE = ["REGISTERED", "VERSION"]


def token_row(t: api_pb2.TokenInfo, wide: bool, now: int) -> list[str]:
    expires = "never" if not t.expires_ms else ("expired" if t.expires_ms <= now else f"in {age(now, t.expires_ms)}")
    return [t.id, t.role, t.tenant or "-", age(t.created_ms, now), expires, t.description or "-"]


TOKEN_HEADERS = ["ID", "ROLE", "TENANT", "AGE", "EXPIRES", "DESCRIPTION"]

ROWS = {
    "Tenant": (TENANT_HEADERS, TENANT_WIDE, tenant_row),
    "Deployment": (DEPLOYMENT_HEADERS, DEPLOYMENT_WIDE, deployment_row),
    "Cluster": (CLUSTER_HEADERS, CLUSTER_WIDE, cluster_row),
    "Zone": (ZONE_HEADERS, ZONE_WIDE, zone_row),
    "Token": (TOKEN_HEADERS, [], token_row),
}


def headers_of(kind: str, wide: bool) -> list[str]:
    base, extra, _ = ROWS[kind]
    return [*base, *(extra if wide else [])]


def row_of(kind: str, obj: Any, wide: bool, now: int) -> list[str]:
    return ROWS[kind][2](obj, wide, now)


# --------------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------------

EVENT_HEADERS = ["REVISION", "TIME", "TYPE", "KIND", "NAME", "DETAIL"]


def event_detail(e: api_pb2.Event) -> str:
    if e.kind == "Lease":
        return e.message + (f" ({e.reason})" if e.reason else "")
    if e.kind == "Breaker":
        return f"{e.from_state or '-'} -> {e.to_state or '-'} ({e.message})"
    if e.type == "TRANSITION" and e.reason:
        where = "/".join(x for x in (e.zone, e.cluster) if x)
        return (f"{e.deployment}: {e.from_state or '-'} -> {e.to_state or '-'} ({e.event}, {e.reason})"
                + (f" on {where}" if where else ""))
    if e.type == "TRANSITION":
        where = "/".join(x for x in (e.zone, e.cluster) if x)
        return (f"{e.deployment}: {e.from_state or '-'} -> {e.to_state or '-'} ({e.event})"
                + (f" on {where}" if where else ""))
    if e.type == "DECIDED":
        text = f"replicas {e.replicas}, warm pool {e.warm_pool}: {e.reason or '-'}"
        return text + (f" ({person_times(e.message)})" if e.message else "")
    if e.type == "BOOKMARK":
        return "(no change)"
    return f"tenant {e.tenant}" if e.tenant and e.kind != "Tenant" else ""


def event_row(e: api_pb2.Event) -> list[str]:
    return [str(e.revision), clock(e.at_ms), e.type, e.kind or "-", e.name or "-", event_detail(e)]


def event_dict(e: api_pb2.Event) -> dict[str, Any]:
    from controlplane.api.manifests import plain

    return plain(e)


# --------------------------------------------------------------------------------------------------
# explain: the forecast block
# --------------------------------------------------------------------------------------------------


def seconds(ms: int) -> str:
    """``1.5 s``, ``32 s``, ``20 min``; a start horizon or a history length."""
    if ms >= 120_000 and ms % 60_000 == 0:
        return f"{ms // 60_000} min"
    return f"{ms / 1000:.3g} s" if ms < 100_000 else f"{ms // 1000} s"


def forecast_lines(lv: api_pb2.LiveDecision) -> list[tuple[str, str]]:
    """The ``(label, value)`` lines of ``explain``'s forecast block for a live decision that
    carries one: whether it drove the decision, what it forecasts over which horizon, what it was
    learned from, how good it was, and (reason ``forecast``) the capacity it started ahead of demand."""
    f = lv.forecast
    wake = f"wake horizon {seconds(f.wake_ms)}" if f.wake_ms else "no wake horizon: the engine cannot sleep"
    restart = f"restart horizon {seconds(f.restart_ms)}"
    out = [("status", "usable" if f.usable else f"not used, scaling is reactive: {f.note or 'no reason given'}")]
    if f.usable:
        if f.wake_ms:
            out.append(("ready", f"{f.ready:.2f} replicas serving within the {wake}"))
        out += [("total", f"{f.total:.2f} replicas serving or asleep within the {restart}"),
                ("expected", f"{f.expected:.2f} replicas (median peak within the {restart})")]
    if not f.usable or not f.wake_ms:
        out.append(("horizons", f"{wake}; {restart}"))
    out.append(("quantile", f"p{f.quantile * 100:g}"))
    out.append(("history", f"{f.buckets} buckets x {seconds(f.bucket_ms)} ({seconds(f.buckets * f.bucket_ms)})"
                if f.bucket_ms else f"{f.buckets} buckets"))
    if f.HasField("mape"):
        out.append(("MAPE", f"{f.mape * 100:.1f} %"))
    if f.usable:
        if f.wake_fits:
            sleep = f"capacity beyond {f.ready:.2f} may sleep (a wake of {seconds(f.wake_ms)} fits the TTFT SLO)"
        elif f.wake_ms:
            sleep = f"all of it serves (a wake of {seconds(f.wake_ms)} does not fit the TTFT SLO)"
        else:
            sleep = "all of it serves (the engine cannot sleep)"
        out.append(("warm path", sleep))
    if lv.reason == "forecast":
        asks = lv.target_before_forecast if lv.HasField("target_before_forecast") else None
        standby = (f"; the warm pool holds {lv.warm_pool} Standby for the {restart}" if f.wake_fits
                   else "; no Standby: everything the forecast needs serves")
        if asks is not None and asks >= lv.target:
            out.append(("ahead", f"none started: the tenant's quota held the forecast's raise (target stays {lv.target})"))
        else:
            raise_ = f"target {asks} -> {lv.target} (the load asks for {asks})" if asks is not None else f"target {lv.target}"
            out.append(("ahead", f"capacity started ahead of demand: {raise_}{standby}"))
    return out
