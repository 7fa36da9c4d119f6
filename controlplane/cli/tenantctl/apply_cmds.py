"""tenantctl's server-side evaluations of files: ``apply --dry-run=server``, ``dry-run -f`` and ``diff -f``.

All three send the whole file (every kind) as ONE ``Scaling.DryRun`` request: the coordinator applies
the objects in dependency order (zones, clusters, tenants, deployments) to one copy of its state
through the same checks as the real writes, and answers each object as it would be, or why it would
be refused (docs/api.md "Apply, dry run and diff"). Nothing is written.

* ``apply --dry-run=server``: one line per object, ``tenant/search created (server dry run)``, or
  its refusal; exit 1 when any object would be refused.
* ``dry-run -f``: the same, with the scaling consequences of each deployment (targets, quota and
  capacity notes).
* ``diff -f``: a unified diff of each object, live against would-be, as YAML without the fields the
  server sets (``status``, ``metadata.resourceVersion`` / ``createdMs`` / ``updatedMs``). Exit codes,
  like ``kubectl diff``: 0 no differences, 1 differences, 2 a file or an object refused (or a usage
  error), 3 no endpoint answered.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import yaml
from rich.text import Text

from controlplane.api import manifests as mf
from controlplane.api.client import ApiClient, ApiError, Unreachable
from controlplane.api.v1 import api_pb2
from controlplane.cli.tenantctl import config as cfgmod
from controlplane.cli.tenantctl import render

DRY_RUN_MODES = ("none", "client", "server")
LISTS = {"Zone": "zones", "Cluster": "clusters", "Tenant": "tenants", "Deployment": "deployments"}
OUTPUT_ONLY = ("resourceVersion", "createdMs", "updatedMs", "applyResult")
"""metadata fields the server sets: left out of a diff."""
DIFF_SAME, DIFF_FOUND, DIFF_ERROR = 0, 1, 2

_ORDER = {k: i for i, k in enumerate(mf.KINDS)}


def add_dry_run_flag(a: argparse.ArgumentParser) -> None:
    a.add_argument("--dry-run", nargs="?", const="client", default="none", choices=DRY_RUN_MODES,
                   help="client: validate the files here and send nothing (bare --dry-run); server: the "
                        "coordinator evaluates the whole file like a real apply and writes nothing")


def add_diff(add: Callable[..., argparse.ArgumentParser]) -> argparse.ArgumentParser:
    d = add("diff", "what applying files would change, as a unified diff (exit 1: differences)")
    d.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                   help="file, directory (its *.yaml, *.yml, *.json) or - for stdin (repeatable)")
    return d


def in_order(objects: Sequence[mf.Manifest]) -> list[mf.Manifest]:
    """The order the server evaluates a file in (kinds in dependency order, each in file order)."""
    return sorted(objects, key=lambda m: _ORDER[m.kind])


def file_request(objects: Sequence[mf.Manifest]) -> api_pb2.DryRunRequest:
    req = api_pb2.DryRunRequest()
    for m in in_order(objects):
        getattr(req, LISTS[m.kind]).append(m.to_proto())
    return req


def evaluate(client: ApiClient, objects: Sequence[mf.Manifest]) -> list[tuple[mf.Manifest, api_pb2.DryRunObject]]:
    """Each object of the file with the server's answer for it. Raises ApiError / Unreachable."""
    ordered = in_order(objects)
    reply = client.call("Scaling", "DryRun", file_request(ordered))
    if len(reply.objects) != len(ordered):
        raise ApiError(client.last_endpoint, grpc.StatusCode.UNIMPLEMENTED,
                       f"the coordinator answered {len(reply.objects)} objects for {len(ordered)}: it does "
                       "not evaluate whole files (an older version?)")
    return list(zip(ordered, reply.objects, strict=True))


def refusal(client: ApiClient, o: api_pb2.DryRunObject) -> ApiError | None:
    """The refusal of one object as the client's ApiError (None: it would be accepted)."""
    if not o.error_code:
        return None
    code = getattr(grpc.StatusCode, o.error_code, grpc.StatusCode.UNKNOWN)
    return ApiError(client.last_endpoint, code, o.error, [(v.field, v.description) for v in o.violations])


def would_be(o: api_pb2.DryRunObject) -> Any:
    return getattr(o, o.kind.lower())


# --- apply --dry-run=server and dry-run -f ---------------------------------------------------------------


def server_dry_run(s: Any, objects: Sequence[mf.Manifest], *, scaling: bool) -> int:
    """``apply --dry-run=server`` (``scaling`` False) and ``dry-run -f`` (True)."""
    from controlplane.cli.tenantctl.app import Outcome, report

    outcome = Outcome()
    results: list[dict[str, Any]] = []
    fmt = s.opt("output", "table") or "table"
    for ctx, client in s.each():
        try:
            answers = evaluate(client, objects)
        except (ApiError, Unreachable) as exc:
            report(s, exc, "dry-run", ctx, outcome)
            continue
        for m, o in answers:
            err = refusal(client, o)
            if err is not None:
                report(s, err, f"{m.where}: {'dry-run' if scaling else 'apply (server dry run)'} {m.ref}", ctx, outcome)
                continue
            result = would_be(o).metadata.apply_result
            if fmt != "table":
                entry = {"object": m.ref, "result": result, **(mf.plain(o.scaling) if o.HasField("scaling") else {})}
                results.append({"context": ctx.name, **entry} if s.multi else entry)
            elif scaling and o.HasField("scaling"):
                print_scaling(s, ctx, m, o.scaling)
            else:
                prefix = f"{ctx.name}: " if s.multi else ""
                s.out.write(f"{prefix}{m.ref} {result} ({'dry run: nothing was written' if scaling else 'server dry run'})\n")
    if fmt != "table":
        render.dump(s.console, results if len(results) != 1 else results[0], fmt)
    return outcome.code


def print_scaling(s: Any, ctx: cfgmod.Context, m: mf.Manifest, r: api_pb2.DryRunResult) -> None:
    head = f"{ctx.name}: " if s.multi else ""
    verb = ("would change" if r.changes else "unchanged") if r.exists else "would be created"
    s.console.print(Text(f"{head}{m.ref} {verb} (dry run: nothing was written)", style="bold"))
    if r.changes:
        s.console.print(render.make_table(["  FIELD", "BEFORE", "AFTER"],
                                          [["  " + c.field, c.before or "-", c.after or "-"] for c in r.changes]))
    s.console.print(Text(f"  replicas now {r.current_replicas}; scaling target {r.target_before} -> "
                         f"{r.target_after} ({r.reason_after or '-'}); warm pool {r.warm_pool_after}"))
    if r.message_after:
        s.console.print(Text(f"  {r.message_after}"))
    if not r.live_signals:
        s.console.print(Text("  (no live signals from the lease holder: targets assume no load)"))
    for note in r.notes:
        s.console.print(Text(f"  note: {note}"))


# --- diff ----------------------------------------------------------------------------------------------------


def comparable(kind: str, obj: Any | None) -> str:
    """``obj`` as YAML without what the server sets; empty for no object."""
    if obj is None:
        return ""
    data = mf.envelope(kind, obj)
    data.pop("status", None)
    for key in OUTPUT_ONLY:
        data["metadata"].pop(key, None)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _live(client: ApiClient, m: mf.Manifest) -> Any | None:
    from controlplane.cli.tenantctl.app import METHODS

    service, get, _, _ = METHODS[m.kind]
    try:
        obj = client.call(service, get, api_pb2.GetRequest(name=m.address))
    except ApiError as exc:
        if exc.code is grpc.StatusCode.NOT_FOUND:
            return None
        raise
    if m.kind == "Zone" and not obj.status.registered:
        return None
    return obj


def unified(m: mf.Manifest, live: Any | None, after: Any) -> list[str]:
    name = m.address
    return list(difflib.unified_diff(
        comparable(m.kind, live).splitlines(keepends=True), comparable(m.kind, after).splitlines(keepends=True),
        fromfile=f"live/{m.kind.lower()}/{name}", tofile=f"merged/{m.kind.lower()}/{name}"))


def cmd_diff(s: Any) -> int:
    from controlplane.cli.tenantctl.app import EXIT_UNREACHABLE, Failed, load_manifests, report

    try:
        objects = load_manifests(s, s.args.filename)
    except Failed:
        return DIFF_ERROR
    code = DIFF_SAME
    for ctx, client in s.each():
        try:
            answers = evaluate(client, objects)
            lives = [_live(client, m) for m, _ in answers]
        except (ApiError, Unreachable) as exc:
            report(s, exc, "diff", ctx)
            return EXIT_UNREACHABLE if isinstance(exc, Unreachable) else DIFF_ERROR
        for (m, o), live in zip(answers, lives, strict=True):
            err = refusal(client, o)
            if err is not None:
                report(s, err, f"{m.where}: diff {m.ref}", ctx)
                code = DIFF_ERROR
                continue
            lines = unified(m, live, would_be(o))
            if lines:
                code = max(code, DIFF_FOUND)
                if s.multi:
                    s.out.write(f"# context {ctx.name}\n")
                s.out.write("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    s.out.flush()
    return code
