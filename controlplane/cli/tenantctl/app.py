"""tenantctl's commands. Exit codes: 0 success, 1 a request or a file was refused, 2 usage or
configuration error, 3 no endpoint answered, 130 interrupted. Never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from controlplane.api import manifests as mf
from controlplane.api.client import ApiClient, ApiError, Notice, Unreachable
from controlplane.api.v1 import api_pb2
from controlplane.cli.tenantctl import apply_cmds, conditions, describe, flags, kubectl, render, views
from controlplane.cli.tenantctl import config as cfgmod
from controlplane.cli.tenantctl.flags import FlagError, watch_types
from controlplane.config import ConfigError, address_problem
from controlplane.domain.errors import ControlPlaneError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

KIND_ALIASES = {
    "tenant": "Tenant", "tenants": "Tenant", "tn": "Tenant",
    "deployment": "Deployment", "deployments": "Deployment", "deploy": "Deployment", "dep": "Deployment",
    "cluster": "Cluster", "clusters": "Cluster", "cl": "Cluster",
    "zone": "Zone", "zones": "Zone", "z": "Zone",
    "token": "Token", "tokens": "Token",
}
OBJECT_KINDS = ("Tenant", "Deployment", "Cluster", "Zone")

# kind -> (service, get, list, delete, list field of reply)
METHODS = {
    "Tenant": ("Tenants", "GetTenant", "ListTenants", "DeleteTenant"),
    "Deployment": ("Deployments", "GetDeployment", "ListDeployments", "DeleteDeployment"),
    "Cluster": ("Clusters", "GetCluster", "ListClusters", "DeleteCluster"),
    "Zone": ("Clusters", "GetZone", "ListZones", "DeleteZone"),
}
NAME_HELP = ("the object's name; deployment names are per tenant: admins name one TENANT/NAME "
             "(a tenant's token: NAME, its own tenant implied)")


class UsageError(Exception):
    """Bad flags or arguments (exit 2)."""


class Failed(Exception):
    """Already reported on stderr; exit with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# --------------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    """Connection options, accepted before or after the command (``default=SUPPRESS`` so a
    subcommand does not reset what was given before it)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    s = argparse.SUPPRESS
    g.add_argument("--config", default=s, metavar="FILE",
                   help="configuration file (default $TENANTCTL_CONFIG or ~/.config/controlplane/tenantctl.yaml)")
    g.add_argument("--context", default=s, metavar="NAME", help="context to use (default: current-context)")
    g.add_argument("--all-contexts", action="store_true", default=s,
                   help="run against every context (multi-region views; tables get a CONTEXT column)")
    g.add_argument("--endpoint", action="append", default=s, metavar="HOST:PORT",
                   help="override the context's endpoints (repeat or comma-separate)")
    g.add_argument("--token", default=s, help="bearer token (default $TENANTCTL_TOKEN, then the context's)")
    g.add_argument("--ca-file", default=s, metavar="FILE", help="CA to verify the coordinators (TLS)")
    g.add_argument("--timeout", type=float, default=s, metavar="SECONDS", help="per-call deadline (default 10)")
    return p


def _output(p: argparse.ArgumentParser, choices: Sequence[str] = ("table", "wide", "json", "yaml")) -> None:
    p.add_argument("-o", "--output", choices=choices, default="table", help="output format (default table)")


def build_parser(prog: str = "tenantctl") -> argparse.ArgumentParser:
    common = _common()
    p = argparse.ArgumentParser(
        prog=prog, parents=[common], description="Manage tenants, deployments, clusters and zones of the control plane.",
        epilog="Exit codes: 0 ok, 1 request or file refused, 2 usage or configuration error, "
               "3 no endpoint answered, 130 interrupted. See docs/tenantctl.md.")
    p.add_argument("--version", action="store_true", help="print tenantctl's version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_text: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, parents=[common], **kw)

    g = add("get", "list objects, or show one (-w: keep watching)")
    g.add_argument("kind", help="tenants, deployments, clusters, zones or tokens")
    g.add_argument("name", nargs="?", help=NAME_HELP)
    g.add_argument("-o", "--output", type=kubectl.output_format, default="table", metavar="FORMAT",
                   help="table (default), wide, json, yaml, name, jsonpath=TEMPLATE or custom-columns=SPEC")
    kubectl.add_get_options(g)
    g.add_argument("-w", "--watch", action="store_true", help="after listing, print changes as they happen")
    g.add_argument("--tenant", default="", help="deployments/tokens: only this tenant's")
    g.add_argument("--linearizable", action="store_true", help="read through the leader (see every acknowledged write)")

    d = add("describe", "show one object in detail")
    d.add_argument("kind")
    d.add_argument("name", help=NAME_HELP)

    a = add("apply", "create or update the objects in files (YAML or JSON)")
    a.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                   help="file, directory (its *.yaml, *.yml, *.json) or - for stdin (repeatable)")
    apply_cmds.add_dry_run_flag(a)
    kubectl.add_file_options(a)
    kubectl.add_file_options(apply_cmds.add_diff(add))

    rm = add("delete", "delete objects (KIND NAME, KIND -l SELECTOR, or -f FILE|DIR)")
    rm.add_argument("kind", nargs="?")
    rm.add_argument("name", nargs="?", help=NAME_HELP)
    rm.add_argument("-f", "--filename", action="append", metavar="FILE")
    rm.add_argument("--resource-version", type=int, default=0, help="delete only at this version")
    rm.add_argument("--tenant", default="", help="deployments with -l: only this tenant's")
    kubectl.add_delete_options(rm)

    e = add("explain", "why a deployment has the replicas it has: live evaluation and decision history")
    e.add_argument("deployment", help="its name; admins: TENANT/NAME")
    e.add_argument("--limit", type=int, default=20, help="decisions to show (default 20, at most 200)")
    _output(e, ("table", "json", "yaml"))

    w = add("watch", "live view of instance transitions, decisions and object changes")
    _event_filters(w)
    _output(w, ("table", "json"))

    ev = add("events", "retained events (transitions, decisions, changes) as a table")
    _event_filters(ev)
    ev.add_argument("--limit", type=int, default=None, help="only the last N (>= 1)")
    _output(ev, ("table", "json", "yaml"))

    for kind in ("cluster", "zone"):
        c = add(kind, f"{kind} operations: cordon, uncordon, drain")
        csub = c.add_subparsers(dest="op", metavar="OP", required=True)
        for op, text in (("cordon", "no new instances there"), ("uncordon", "schedulable again (ends a drain)"),
                         ("drain", "cordon, replace its instances elsewhere, then drain them")):
            x = csub.add_parser(op, help=text, parents=[common])
            x.add_argument("name")

    st = add("status", "coordinators of the context(s): pid, role, leader, lease, indexes (-o wide: more)")
    _output(st, ("table", "wide", "json", "yaml"))

    tk = add("token", "API tokens: create, list, revoke (admins)")
    _token_commands(tk, common)

    wh = add("whoami", "who the token says you are")
    _output(wh, ("table", "json", "yaml"))

    dr = add("dry-run", "what applying files would do, evaluated by the server (nothing is written)")
    dr.add_argument("-f", "--filename", action="append", required=True, metavar="FILE")
    kubectl.add_file_options(dr)
    _output(dr, ("table", "json", "yaml"))

    kubectl.add_commands(add, common, NAME_HELP)

    cf = add("config", "the configuration file: view, use-context, get-contexts, current-context, set-context")
    cfsub = cf.add_subparsers(dest="op", metavar="OP", required=True)
    v = cfsub.add_parser("view", help="print the configuration (tokens redacted)", parents=[common])
    v.add_argument("--raw", action="store_true", help="show tokens")
    u = cfsub.add_parser("use-context", help="set current-context", parents=[common])
    u.add_argument("name")
    gc = cfsub.add_parser("get-contexts", help="list the contexts", parents=[common])
    gc.add_argument("-o", "--output", choices=("table", "name"), default="table")
    kubectl.add_config_commands(cfsub, common)

    comp = add("completion", "print a shell completion script")
    comp.add_argument("shell", choices=("bash", "zsh"))
    return p


def _event_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deployment", default="", help="only this deployment's events")
    p.add_argument("--tenant", default="", help="admins: only this tenant's events")
    p.add_argument("--kind", action="append", default=[], metavar="KIND",
                   help="Tenant, Deployment, Cluster, Zone, Instance, Decision, Breaker or Lease (repeatable)")
    p.add_argument("--since", type=int, default=None, metavar="REVISION", help="start after this revision")
    p.add_argument("--all", action="store_true", dest="all_events",
                   help="every event (default: the significant ones: no Ready <-> Busy flips, no decision that "
                        "changed no count)")
    p.add_argument("--type", action="append", default=[], metavar="TYPE", dest="types",
                   help="only these types, significant or not: decision, lifecycle, preemption, breaker, lease, "
                        "object, busy (repeatable)")


def _token_commands(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    tsub = p.add_subparsers(dest="op", metavar="OP", required=True)
    c = tsub.add_parser("create", help="create a token and print it (shown only once)", parents=[common])
    who = c.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", help="a token scoped to this tenant")
    who.add_argument("--admin", action="store_true", help="an admin token")
    c.add_argument("--ttl", default="0", help="lifetime: 3600, 90m, 12h, 30d (default: never expires)")
    c.add_argument("--description", default="")
    _output(c, ("table", "json", "yaml"))
    ls = tsub.add_parser("list", help="list tokens (never their secrets)", parents=[common])
    ls.add_argument("--tenant", default="")
    _output(ls, ("table", "wide", "json", "yaml"))
    rv = tsub.add_parser("revoke", help="revoke a token by id", parents=[common])
    rv.add_argument("id")


def parse_ttl(text: str) -> int:
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    mult = 1
    if text and text[-1] in units:
        mult, text = units[text[-1]], text[:-1]
    if not text.isdigit():
        raise UsageError("--ttl: must be a number of seconds or end in s, m, h or d (e.g. 12h)")
    return int(text) * mult


# --------------------------------------------------------------------------------------------------
# Session: contexts and clients
# --------------------------------------------------------------------------------------------------


@dataclass
class Session:
    args: argparse.Namespace
    out: TextIO
    err: TextIO
    stdin: TextIO
    channel_factory: Callable[[str], grpc.Channel] | None = None
    sleep: Callable[[float], None] = time.sleep
    clients: list[ApiClient] = field(default_factory=list)

    def __post_init__(self) -> None:
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        self.console = Console(file=self.out, highlight=False, markup=False, emoji=False,
                               width=None if tty else 100_000, force_terminal=None if tty else False)
        self.tty = tty

    def opt(self, name: str, default: Any = None) -> Any:
        return getattr(self.args, name, default)

    def warn(self, text: str) -> None:
        print(f"tenantctl: {text}", file=self.err)

    def config_path(self) -> Path:
        return cfgmod.config_path(self.opt("config"))

    def endpoints_flag(self) -> list[str]:
        out: list[str] = []
        for item in self.opt("endpoint") or []:
            out.extend(e.strip() for e in item.split(",") if e.strip())
        for ep in out:
            problem = address_problem(ep)
            if problem:
                raise UsageError(f"--endpoint: {problem}")
        return out

    def contexts(self) -> list[cfgmod.Context]:
        token = self.opt("token")
        endpoints = self.endpoints_flag()
        path = self.config_path()
        if not path.exists():
            if endpoints:
                return [cfgmod.adhoc(endpoints, token, self.opt("ca_file"))]
            raise ConfigError(f"{path}: no configuration file (run `controlplane up`, which writes one, or pass "
                              "--endpoint HOST:PORT)", file=str(path))
        cfg = cfgmod.load(path)
        if not cfg.contexts:
            if endpoints:
                return [cfgmod.adhoc(endpoints, token, self.opt("ca_file"))]
            raise ConfigError(f"{path}: contexts: no context defined", file=str(path), field="contexts")
        if self.opt("all_contexts"):
            chosen = list(cfg.contexts)
        else:
            name = self.opt("context") or os.environ.get(cfgmod.ENV_CONTEXT) or cfg.current_context
            if name is None:
                if len(cfg.contexts) > 1:
                    raise ConfigError(f"{path}: current-context: not set; choose one with --context or "
                                      "`tenantctl config use-context NAME`", file=str(path))
                name = cfg.contexts[0].name
            match = [c for c in cfg.contexts if c.name == name]
            if not match:
                known = ", ".join(c.name for c in cfg.contexts)
                raise UsageError(f"--context: no context named {name!r} in {path} (known: {known})")
            chosen = match
        out = []
        for c in chosen:
            ctx = cfgmod.resolve(c, path, token)
            if endpoints:
                ctx = cfgmod.Context(ctx.name, ctx.region, endpoints, self.opt("ca_file") or ctx.ca_file,
                                     ctx.cert_file, ctx.key_file, ctx.server_name, ctx.token, ctx.token_source)
            elif self.opt("ca_file"):
                ctx = cfgmod.Context(ctx.name, ctx.region, ctx.endpoints, self.opt("ca_file"), ctx.cert_file,
                                     ctx.key_file, ctx.server_name, ctx.token, ctx.token_source)
            out.append(ctx)
        return out

    def client(self, ctx: cfgmod.Context) -> ApiClient:
        client = ApiClient(ctx.endpoints, token=ctx.token, ca_file=ctx.ca_file, cert_file=ctx.cert_file,
                           key_file=ctx.key_file, server_name=ctx.server_name,
                           timeout_s=self.opt("timeout") or 10.0, channel_factory=self.channel_factory)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def each(self) -> Iterator[tuple[cfgmod.Context, ApiClient]]:
        for ctx in self.contexts():
            yield ctx, self.client(ctx)

    @property
    def multi(self) -> bool:
        return bool(self.opt("all_contexts"))


class Outcome:
    """The exit status of a command that may fail for some objects or contexts and go on."""

    def __init__(self) -> None:
        self.code = EXIT_OK

    def fail(self, code: int) -> None:
        # unreachable (3) only when nothing else failed; any refused request makes it 1
        if self.code == EXIT_OK or (self.code == EXIT_UNREACHABLE and code == EXIT_FAILED):
            self.code = code


def report(s: Session, exc: ApiError | Unreachable, what: str, ctx: cfgmod.Context | None = None,
           outcome: Outcome | None = None) -> int:
    """Print one request failure (with its endpoint, status and field violations); returns the exit code."""
    where = f"context {ctx.name}: " if ctx is not None and s.multi else ""
    if isinstance(exc, Unreachable):
        name = f" of context {ctx.name!r}" if ctx is not None else ""
        s.warn(f"error: {where}{what}: no endpoint{name} answered: "
               + "; ".join(f"{ep}: {why}" for ep, why in exc.failures))
        code = EXIT_UNREACHABLE
    else:
        many = len(exc.violations) > 1  # every problem on its own line, each once
        s.warn(f"error: {where}{what}: "
               + (f"{exc.endpoint}: {exc.code.name}: {len(exc.violations)} problems" if many else str(exc)))
        for fld, desc in exc.violations:
            if many or f"{fld}:" not in exc.message:
                print(f"  {fld}: {desc}" if fld else f"  {desc}", file=s.err)
        if exc.code is grpc.StatusCode.UNAUTHENTICATED and ctx is not None and ctx.token_source == "none":
            print("  (no token: set token or token_file in the context, --token or $TENANTCTL_TOKEN)", file=s.err)
        code = EXIT_FAILED
    if outcome is not None:
        outcome.fail(code)
    return code


def _read(client: ApiClient, s: Session) -> api_pb2.ReadOptions | None:
    return api_pb2.ReadOptions(linearizable=True) if s.opt("linearizable") else None


def kind_of(text: str | None, allowed: Sequence[str] = (*OBJECT_KINDS, "Token")) -> str:
    if not text:
        raise UsageError(f"a kind is required ({', '.join(k.lower() + 's' for k in allowed)})")
    kind = KIND_ALIASES.get(text.lower()) or (text if text in OBJECT_KINDS else None)
    if kind is None or kind not in allowed:
        raise UsageError(f"unknown kind {text!r} (use {', '.join(k.lower() + 's' for k in allowed)})")
    return kind


# --------------------------------------------------------------------------------------------------
# get / describe
# --------------------------------------------------------------------------------------------------


def _fetch(s: Session, client: ApiClient, kind: str, name: str | None) -> list[Any]:
    if kind == "Token":
        reply = client.call("Tokens", "ListTokens", api_pb2.ListTokensRequest(tenant=s.opt("tenant") or ""))
        items = list(reply.items)
        if name:
            items = [t for t in items if t.id == name]
            if not items:
                raise ApiError(client.last_endpoint, grpc.StatusCode.NOT_FOUND, f"token {name!r} not found")
        return items
    service, get, lst, _ = METHODS[kind]
    read = _read(client, s)
    if name:
        if kind == "Deployment" and "/" not in name and s.opt("tenant"):
            name = f"{s.opt('tenant')}/{name}"  # deployment names are per tenant (get --tenant T NAME)
        return [client.call(service, get, api_pb2.GetRequest(name=name, read=read))]
    req = api_pb2.ListRequest(read=read, tenant=(s.opt("tenant") or "") if kind == "Deployment" else "",
                              label_selector=kubectl.selector_of(s, kind))
    reply = client.call(service, lst, req)
    s.listed_at = reply.read.revision  # type: ignore[attr-defined]  # event revision, not the Raft index
    return list(reply.items)


def _as_data(kind: str, obj: Any, fmt: str = "json") -> dict[str, Any]:
    return views.object_data(kind, obj, fmt)


def cmd_get(s: Session) -> int:
    kind = kind_of(s.args.kind)
    fmt = s.args.output
    outcome = Outcome()
    results: list[tuple[cfgmod.Context, list[Any]]] = []
    for ctx, client in s.each():
        try:
            results.append((ctx, _fetch(s, client, kind, s.args.name)))
        except (ApiError, Unreachable) as exc:
            report(s, exc, f"get {kind.lower()}{' ' + s.args.name if s.args.name else 's'}", ctx, outcome)
    results = kubectl.sort_results(s, kind, results)
    print_objects(s, kind, results, fmt)
    if s.args.watch and outcome.code == EXIT_OK:
        if s.multi:
            raise UsageError("get -w: watch one context at a time (drop --all-contexts)")
        if kind == "Token":
            raise UsageError("get -w: tokens cannot be watched")
        return _get_watch(s, kind, results[0][0] if results else None)
    return outcome.code


def print_objects(s: Session, kind: str, results: list[tuple[cfgmod.Context, list[Any]]], fmt: str) -> None:
    if fmt.startswith(kubectl.TEMPLATE_FORMATS):
        kubectl.print_template(s, kind, results, fmt)
        return
    if fmt in ("json", "yaml"):
        if s.multi:
            data: Any = {"kind": "ContextLists", "contexts": [
                {"context": ctx.name, "region": ctx.region, **mf.list_envelope([_as_data(kind, o, fmt) for o in objs])}
                for ctx, objs in results]}
        elif s.opt("name") and results and len(results[0][1]) == 1:
            data = _as_data(kind, results[0][1][0], fmt)
        else:
            data = mf.list_envelope([_as_data(kind, o, fmt) for _, objs in results for o in objs])
        render.dump(s.console, data, fmt)
        return
    if fmt == "name":
        for ctx, objs in results:
            for o in objs:
                name = o.id if kind == "Token" else o.metadata.name
                if kind == "Deployment":  # names are per tenant: the form every principal may send back
                    name = f"{o.spec.tenant}/{name}"
                prefix = f"{ctx.name}/" if s.multi else ""
                s.out.write(f"{prefix}{kind.lower()}/{name}\n")
        return
    wide = fmt == "wide"
    now = render.now_ms()
    headers = render.headers_of(kind, wide) + (["LABELS"] if s.opt("show_labels") else [])
    rows = []
    for ctx, objs in results:
        for o in objs:
            row = render.row_of(kind, o, wide, now) + ([kubectl.labels_cell(o)] if s.opt("show_labels") else [])
            rows.append([ctx.name, *row] if s.multi else row)
    if s.multi:
        headers = ["CONTEXT", *headers]
    if not rows:
        if results:
            print(f"No {kind.lower()}s found.", file=s.err)
        return
    kubectl.print_table(s, render.make_table(headers, rows))
    s._widths = render.column_widths(headers, rows)  # type: ignore[attr-defined]


def _get_watch(s: Session, kind: str, ctx: cfgmod.Context | None) -> int:
    """``get KIND -w``: after the table, one row per changed object (re-read on every event)."""
    if ctx is None:
        return EXIT_OK
    client = s.client(ctx)
    kinds = [kind] + (["Instance", "Decision"] if kind == "Deployment" else [])
    req = api_pb2.WatchRequest(kinds=kinds, tenant=s.opt("tenant") or "")
    listed_at = getattr(s, "listed_at", 0)
    if listed_at:  # watch from the list's revision: nothing between the two is missed
        req.since_revision = listed_at
    widths = getattr(s, "_widths", None)
    wide = s.args.output == "wide"
    headers = render.headers_of(kind, wide)
    for item in client.watch(req, backoff=lambda r: s.sleep(min(5.0, 0.5 * 2 ** r))):
        if isinstance(item, Notice):
            s.warn(f"{item.endpoint}: {item.message}")
            continue
        if item.type == "BOOKMARK":
            continue
        name = item.deployment if item.kind in ("Instance", "Decision") else item.name
        if s.args.name and name != s.args.name:
            continue
        if item.type == "DELETED":
            row = [name] + ["-"] * (len(headers) - 2) + ["deleted"]
            obj = None
        else:
            try:
                obj = _fetch(s, client, kind, name)[0]
            except ApiError as exc:
                if exc.code is grpc.StatusCode.NOT_FOUND:
                    continue
                raise
            if not kubectl.watch_matches(s, obj):
                continue
            row = render.row_of(kind, obj, wide, render.now_ms())
        if s.args.output in ("json", "yaml"):
            render.dump(s.console, _as_data(kind, obj, s.args.output) if obj is not None else {"kind": kind, "name": name,
                                                                                   "deleted": True}, s.args.output)
        elif s.args.output == "name":
            s.out.write(f"{kind.lower()}/{name}\n")
            s.out.flush()
        else:
            s.console.print(render.make_table(headers, [row], show_header=widths is None, min_widths=widths))
    return EXIT_OK


def cmd_describe(s: Session) -> int:
    kind = kind_of(s.args.kind, OBJECT_KINDS)
    outcome = Outcome()
    for ctx, client in s.each():
        try:
            obj = _fetch(s, client, kind, s.args.name)[0]
        except (ApiError, Unreachable) as exc:
            report(s, exc, f"describe {kind.lower()} {s.args.name}", ctx, outcome)
            continue
        if s.multi:
            s.out.write(f"Context: {ctx.name} (region {ctx.region})\n")
        describe.write(s.out, kind, obj, client)
    return outcome.code


def _kv(s: Session, label: str, value: Any, indent: int = 0) -> None:
    s.console.print(Text(f"{' ' * indent}{label + ':':<16}{value}"))


def _when(ms: int) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f" ({render.age(ms)} ago)"


def _history_table(history: Sequence[api_pb2.Decision], indent: bool = False) -> Any:
    pad = "  " if indent else ""
    rows = [[pad + str(d.revision), render.clock(d.at_ms), str(d.replicas), str(d.warm_pool), d.reason or "-",
             render.person_times(d.message)] for d in history]
    return render.make_table([pad + "REVISION", "TIME", "REPLICAS", "WARM", "REASON", "MESSAGE"], rows)


# --------------------------------------------------------------------------------------------------
# apply / delete / dry-run
# --------------------------------------------------------------------------------------------------


def load_manifests(s: Session, files: Sequence[str]) -> list[mf.Manifest]:
    # one character past the cap is enough to refuse it (load_files names the limit)
    stdin_text = s.stdin.read(mf.MAX_MANIFEST_BYTES + 1) if "-" in files else None
    try:
        return mf.load_files(kubectl.expand_files(files, bool(s.opt("recursive"))), stdin_text)
    except mf.ManifestError as exc:
        for line in exc.problems:
            print(f"tenantctl: error: {line}", file=s.err)
        print("tenantctl: nothing was sent (fix the file(s) and run again)", file=s.err)
        raise Failed(EXIT_FAILED) from None


def apply_one(client: ApiClient, m: mf.Manifest) -> str:
    """Send one object; returns the server's ``metadata.apply_result``: ``created``, ``configured``
    or ``unchanged`` (nothing written). Raises ApiError / Unreachable."""
    return str(apply_object(client, m).metadata.apply_result or "configured")


def apply_object(client: ApiClient, m: mf.Manifest) -> Any:
    """Send one object; returns the server's reply: the object as stored, with its conditions and
    ``metadata.apply_result`` (set to "created" when a CreateTenant answered without one)."""
    msg = m.to_proto()
    if m.kind == "Tenant":
        if not m.resource_version:
            try:
                reply = client.call("Tenants", "CreateTenant", api_pb2.CreateTenantRequest(tenant=msg), idempotent=False)
                if not reply.metadata.apply_result:
                    reply.metadata.apply_result = "created"
                return reply
            except ApiError as exc:
                if exc.code is not grpc.StatusCode.ALREADY_EXISTS:
                    raise
        reply = client.call("Tenants", "UpdateTenant", api_pb2.UpdateTenantRequest(tenant=msg))
    elif m.kind == "Deployment":
        reply = client.call("Deployments", "ApplyDeployment", api_pb2.ApplyDeploymentRequest(deployment=msg))
    elif m.kind == "Cluster":
        reply = client.call("Clusters", "RegisterCluster", api_pb2.RegisterClusterRequest(cluster=msg))
    else:
        reply = client.call("Clusters", "RegisterZone", api_pb2.RegisterZoneRequest(zone=msg))
    return reply


def _sorted(ms: list[mf.Manifest], reverse: bool = False) -> list[mf.Manifest]:
    order = {k: i for i, k in enumerate(mf.KINDS)}
    return sorted(ms, key=lambda m: order[m.kind], reverse=reverse)


def cmd_apply(s: Session) -> int:
    objects = _sorted(load_manifests(s, s.args.filename))
    if s.args.dry_run == "server":
        return apply_cmds.server_dry_run(s, objects, scaling=False)
    if s.args.dry_run == "client":
        for m in objects:
            s.out.write(f"{m.ref} valid (dry run: nothing sent)\n")
        return EXIT_OK
    outcome = Outcome()
    for ctx, client in s.each():
        prefix = f"{ctx.name}: " if s.multi else ""
        for m in objects:
            try:
                reply = apply_object(client, m)
            except (ApiError, Unreachable) as exc:
                report(s, exc, f"{m.where}: apply {m.ref}", ctx, outcome)
                if isinstance(exc, Unreachable):
                    break
                continue
            s.out.write(f"{prefix}{m.ref} {reply.metadata.apply_result or 'configured'}\n")
            s.out.flush()
            conditions.warn_after_apply(s.err, m.kind, reply)
    return outcome.code


def cmd_delete(s: Session) -> int:
    targets: list[tuple[str, str, int, str]] = []  # kind, name, version, where
    if s.args.filename:
        if s.args.kind or s.args.name or s.args.selector:
            raise UsageError("delete: give either KIND NAME (or KIND -l SELECTOR) or -f FILE, not both")
        for m in _sorted(load_manifests(s, s.args.filename), reverse=True):
            targets.append((m.kind, m.address, m.resource_version or s.args.resource_version, f"{m.where}: "))
    elif s.args.selector:
        if s.args.name:
            raise UsageError("delete: give KIND NAME or KIND -l SELECTOR, not both")
        targets = kubectl.selected_targets(s, kind_of(s.args.kind, OBJECT_KINDS))
        if not targets:
            print("No objects found.", file=s.err)
    else:
        if not s.args.name:
            raise UsageError("delete: give KIND NAME (e.g. delete deployment chat), KIND -l SELECTOR or -f FILE")
        targets.append((kind_of(s.args.kind, OBJECT_KINDS), s.args.name, s.args.resource_version, ""))
    outcome = Outcome()
    for ctx, client in s.each():
        prefix = f"{ctx.name}: " if s.multi else ""
        for kind, name, version, where in targets:
            service, _, _, delete = METHODS[kind]
            try:
                reply = client.call(service, delete, api_pb2.DeleteRequest(name=name, resource_version=version))
                gone = kubectl.wait_gone(s, client, kind, name) if s.args.wait else None
            except (ApiError, Unreachable) as exc:
                if not (s.args.ignore_not_found and kubectl.not_found(exc)):
                    report(s, exc, f"{where}delete {kind.lower()}/{name}", ctx, outcome)
                continue
            what = "deletion started (scaling to zero)" if kind == "Deployment" and not gone else "deleted"
            s.out.write(f"{prefix}{kind.lower()}/{name} {what} (revision {reply.revision})\n")
            if gone is False:
                s.warn(f"error: {where}delete {kind.lower()}/{name}: still there after the --timeout of "
                       f"{s.opt('timeout') or kubectl.WAIT_DEFAULT_S:g} s")
                outcome.fail(EXIT_FAILED)
    return outcome.code


def cmd_dry_run(s: Session) -> int:
    return apply_cmds.server_dry_run(s, load_manifests(s, s.args.filename), scaling=True)


# --------------------------------------------------------------------------------------------------
# explain / watch / events
# --------------------------------------------------------------------------------------------------


def cmd_explain(s: Session) -> int:
    if not 1 <= s.args.limit <= 200:
        raise UsageError(f"--limit: must be between 1 and 200, got {s.args.limit}")
    outcome = Outcome()
    datas = []
    for ctx, client in s.each():
        try:
            exp = client.call("Scaling", "Explain", api_pb2.ExplainRequest(deployment=s.args.deployment,
                                                                            limit=s.args.limit))
        except (ApiError, Unreachable) as exc:
            report(s, exc, f"explain {s.args.deployment}", ctx, outcome)
            continue
        if s.args.output != "table":
            datas.append({"context": ctx.name, **mf.plain(exp)} if s.multi else mf.plain(exp))
            continue
        if s.multi:
            s.console.print(Text(f"Context: {ctx.name}", style="bold"))
        _print_explain(s, exp)
    if datas:
        render.dump(s.console, datas if s.multi else datas[0], s.args.output)
    return outcome.code


def _print_explain(s: Session, exp: api_pb2.Explanation) -> None:
    _kv(s, "Deployment", exp.deployment)
    _kv(s, "Tenant", exp.tenant)
    _kv(s, "Desired", f"{exp.desired_replicas} replicas, warm pool {exp.desired_warm_pool}")
    _kv(s, "Lease holder", exp.lease_holder or "-")
    if exp.HasField("live"):
        lv = exp.live
        s.console.print(Text(f"Live evaluation ({render.clock(lv.at_ms)}):", style="bold"))
        _kv(s, "current", lv.current, 2)
        load = f"; the load alone asks for {lv.target_before_forecast}" if lv.HasField("target_before_forecast") else ""
        _kv(s, "target", f"{lv.target} (policy{load})", 2)
        _kv(s, "granted", f"{lv.granted} (quotas, priorities, capacity)", 2)
        _kv(s, "warm pool", f"{lv.warm_pool} Standby granted", 2)
        _kv(s, "reason", lv.reason or "-", 2)
        if lv.message:
            _kv(s, "message", render.person_times(lv.message), 2)
        _kv(s, "panic", "yes" if lv.panic else "no", 2)
        if lv.unknown_signals:
            _kv(s, "load unknown", f"{', '.join(lv.unknown_signals)} (not reported by every serving instance: "
                                   "no scale-down while so)", 2)
        if lv.proposals or lv.signals:
            rows = [["  " + k, f"{lv.signals[k]:.4g}" if k in lv.signals else "-",
                     str(lv.proposals[k]) if k in lv.proposals else "-"]
                    for k in sorted(set(lv.proposals) | set(lv.signals))]
            s.console.print(render.make_table(["  SIGNAL", "VALUE", "REPLICAS ASKED"], rows))
        if lv.HasField("forecast"):
            s.console.print(Text(f"Forecast (history to {render.clock(lv.forecast.at_ms)}):", style="bold"))
            for label, value in render.forecast_lines(lv):
                _kv(s, label, value, 2)
        else:
            s.console.print(Text("Forecast: none computed (reactive scaling)"))
    else:
        s.console.print(Text("Live evaluation: (no lease holder could be asked)"))
    if exp.history:
        s.console.print(Text("Decisions (newest last):", style="bold"))
        s.console.print(_history_table(exp.history, indent=True))
    else:
        s.console.print(Text("Decisions: none recorded"))


def _watch_request(s: Session, once: bool) -> api_pb2.WatchRequest:
    valid = {"tenant": "Tenant", "deployment": "Deployment", "cluster": "Cluster", "zone": "Zone",
             "instance": "Instance", "decision": "Decision", "breaker": "Breaker", "lease": "Lease"}
    kinds = []
    for k in s.args.kind:
        norm = valid.get(k.lower().rstrip("s"))
        if norm is None:
            raise UsageError(f"--kind: {k!r} is not one of {', '.join(valid.values())}")
        kinds.append(norm)
    req = api_pb2.WatchRequest(deployment=s.args.deployment, tenant=s.args.tenant, kinds=kinds, once=once,
                               all=s.args.all_events, types=watch_types(s.args.types, s.args.all_events))
    if s.args.since is not None:
        if s.args.since < 0:
            raise UsageError("--since: must be >= 0")
        req.since_revision = s.args.since
    return req


def cmd_events(s: Session) -> int:
    req = _watch_request(s, once=True)
    outcome = Outcome()
    collected: list[tuple[cfgmod.Context, api_pb2.Event]] = []
    for ctx, client in s.each():
        events: list[api_pb2.Event] = []
        try:
            for item in client.watch(req, max_rounds=1):
                if isinstance(item, Notice):
                    s.warn(f"{item.endpoint}: {item.message}")
                elif item.type != "BOOKMARK":
                    events.append(item)
        except (ApiError, Unreachable) as exc:
            report(s, exc, "events", ctx, outcome)
            continue
        if s.args.limit:
            events = events[-s.args.limit:]
        collected.extend((ctx, e) for e in events)
    if s.args.output != "table":
        data = [{"context": c.name, **render.event_dict(e)} if s.multi else render.event_dict(e) for c, e in collected]
        render.dump(s.console, data, s.args.output)
        return outcome.code
    if not collected:
        if outcome.code == EXIT_OK:
            print("No events found.", file=s.err)
        return outcome.code
    headers = (["CONTEXT"] if s.multi else []) + render.EVENT_HEADERS
    rows = [([c.name] if s.multi else []) + render.event_row(e) for c, e in collected]
    s.console.print(render.make_table(headers, rows))
    return outcome.code


@dataclass
class WatchView:
    """What the live view shows: the newest events, where the stream is, how often it moved."""

    context: str
    max_rows: int = 25
    events: list[api_pb2.Event] = field(default_factory=list)
    revision: int = 0
    endpoint: str = "-"
    reconnects: int = 0
    notice: str = ""

    def add(self, e: api_pb2.Event) -> None:
        self.revision = max(self.revision, e.revision)
        if e.type != "BOOKMARK":
            self.events.append(e)
            del self.events[:-self.max_rows]

    def renderable(self) -> Any:
        head = Text(f"context {self.context} · endpoint {self.endpoint} · revision {self.revision} · "
                    f"reconnects {self.reconnects}", style="bold")
        parts: list[Any] = [head]
        if self.notice:
            parts.append(Text(self.notice, style="yellow"))
        parts.append(render.make_table(render.EVENT_HEADERS, [render.event_row(e) for e in self.events]))
        return Group(*parts)


def cmd_watch(s: Session) -> int:
    if s.multi:
        raise UsageError("watch: one context at a time (drop --all-contexts)")
    ctx = s.contexts()[0]
    client = s.client(ctx)
    req = _watch_request(s, once=False)
    view = WatchView(ctx.name)
    stream = client.watch(req, max_rounds=10**9 if s.tty else 5,
                          backoff=lambda r: s.sleep(min(5.0, 0.25 * 2 ** min(r, 5))))
    try:
        if s.tty and s.args.output == "table":
            with Live(view.renderable(), console=s.console, refresh_per_second=8, transient=False) as live:
                for item in stream:
                    _watch_item(s, view, client, item, live=True)
                    live.update(view.renderable())
        else:
            for item in stream:
                _watch_item(s, view, client, item, live=False)
    except (ApiError, Unreachable) as exc:
        return report(s, exc, "watch", ctx)
    return EXIT_OK


def _watch_item(s: Session, view: WatchView, client: ApiClient, item: Any, *, live: bool) -> None:
    if isinstance(item, Notice):
        view.reconnects += 1
        view.notice = f"{item.endpoint}: {item.message}"
        if not live:
            s.warn(view.notice)
        return
    view.endpoint = client.last_endpoint
    view.add(item)
    if live or item.type == "BOOKMARK":
        return
    if s.args.output == "json":
        import json

        s.out.write(json.dumps(render.event_dict(item)) + "\n")
    else:
        row = render.event_row(item)
        s.out.write(f"{row[0]:>8}  {row[1]:12}  {row[2]:10}  {row[3]:10}  {row[4]:20}  {row[5]}\n")
    s.out.flush()


# --------------------------------------------------------------------------------------------------
# cluster / zone / status / tokens / whoami
# --------------------------------------------------------------------------------------------------


def cmd_topology(s: Session) -> int:
    kind = "Cluster" if s.args.command == "cluster" else "Zone"
    op, name = s.args.op, s.args.name
    outcome = Outcome()
    for ctx, client in s.each():
        try:
            if op == "drain":
                obj = client.call("Clusters", f"Drain{kind}", api_pb2.DrainRequest(name=name))
            else:
                obj = client.call("Clusters", f"Cordon{kind}", api_pb2.CordonRequest(name=name, cordoned=op == "cordon"))
        except (ApiError, Unreachable) as exc:
            report(s, exc, f"{kind.lower()} {op} {name}", ctx, outcome)
            continue
        prefix = f"{ctx.name}: " if s.multi else ""
        state = render._sched(obj.status.cordoned, obj.status.draining)
        done = {"cordon": "cordoned", "uncordon": "uncordoned", "drain": "draining"}[op]
        s.out.write(f"{prefix}{kind.lower()}/{name} {done} (status {state}, version {obj.metadata.resource_version})\n")
    return outcome.code


def cmd_status(s: Session) -> int:
    from controlplane.cli.tenantctl.status_cmd import cmd_status as status

    return status(s)


def cmd_token(s: Session) -> int:
    op = s.args.op
    ctxs = s.contexts()
    if len(ctxs) > 1:
        raise UsageError("token: one context at a time (drop --all-contexts)")
    ctx = ctxs[0]
    client = s.client(ctx)
    try:
        if op == "create":
            ttl = parse_ttl(s.args.ttl)
            req = api_pb2.CreateTokenRequest(role="admin" if s.args.admin else "tenant", tenant=s.args.tenant or "",
                                             ttl_seconds=ttl, description=s.args.description)
            created = client.call("Tokens", "CreateToken", req, idempotent=False)
            if s.args.output != "table":
                render.dump(s.console, {"token": created.token, **mf.plain(created.info)}, s.args.output)
            else:
                s.out.write(created.token + "\n")
                scope = f"tenant {created.info.tenant}" if created.info.tenant else "admin"
                exp = "never expires" if not created.info.expires_ms else f"expires {_when(created.info.expires_ms)}"
                print(f"token {created.info.id} ({scope}, {exp}); it is shown only once", file=s.err)
        elif op == "list":
            reply = client.call("Tokens", "ListTokens", api_pb2.ListTokensRequest(tenant=s.args.tenant))
            print_objects(s, "Token", [(ctx, list(reply.items))], s.args.output)
        else:
            reply = client.call("Tokens", "RevokeToken", api_pb2.RevokeTokenRequest(id=s.args.id))
            s.out.write(f"token {s.args.id} revoked (revision {reply.revision})\n")
    except (ApiError, Unreachable) as exc:
        return report(s, exc, f"token {op}", ctx)
    return EXIT_OK


def cmd_whoami(s: Session) -> int:
    outcome = Outcome()
    for ctx, client in s.each():
        try:
            p = client.call("Tokens", "WhoAmI", api_pb2.WhoAmIRequest())
        except (ApiError, Unreachable) as exc:
            report(s, exc, "whoami", ctx, outcome)
            continue
        if s.args.output != "table":
            render.dump(s.console, {"context": ctx.name, **mf.plain(p)}, s.args.output)
            continue
        scope = f"tenant {p.tenant}" if p.role == "tenant" else "admin"
        exp = "never expires" if not p.expires_ms else f"expires {_when(p.expires_ms)}"
        s.out.write(f"{ctx.name + ': ' if s.multi else ''}token {p.token_id}: {scope} ({exp}; token from "
                    f"{ctx.token_source}; endpoint {client.last_endpoint})\n")
    return outcome.code


# --------------------------------------------------------------------------------------------------
# config / completion
# --------------------------------------------------------------------------------------------------


def cmd_config(s: Session) -> int:
    path = s.config_path()
    op = s.args.op
    if op == "use-context":
        cfgmod.use_context(path, s.args.name)
        s.out.write(f"switched to context {s.args.name!r} ({path})\n")
        return EXIT_OK
    if op == "current-context":
        return kubectl.config_current(s, path)
    if op == "set-context":
        return kubectl.config_set_context(s, path)
    if not path.exists():
        raise ConfigError(f"{path}: no configuration file (run `controlplane up`, which writes one)", file=str(path))
    cfg = cfgmod.load(path)
    if op == "view":
        raw = cfgmod.read_yaml_mapping(path)
        render.dump(s.console, raw if s.args.raw else cfgmod.redacted(raw), "yaml")
        return EXIT_OK
    if s.args.output == "name":
        for c in cfg.contexts:
            s.out.write(c.name + "\n")
        return EXIT_OK
    rows = []
    for c in cfg.contexts:
        auth = "token" if c.token else ("token_file" if c.token_file else "none")
        tls = "mTLS" if c.cert_file else ("plaintext" if c.insecure else "TLS")
        rows.append(["*" if c.name == cfg.current_context else "", c.name, c.region, ",".join(c.endpoints), tls, auth])
    s.console.print(render.make_table(["CURRENT", "NAME", "REGION", "ENDPOINTS", "TRANSPORT", "AUTH"], rows))
    return EXIT_OK


def cmd_completion(s: Session) -> int:
    from controlplane.cli.tenantctl.completion import script

    s.out.write(script(s.args.shell, build_parser()))
    return EXIT_OK


COMMANDS: dict[str, Callable[[Session], int]] = {
    "get": cmd_get, "describe": cmd_describe, "apply": cmd_apply, "delete": cmd_delete, "explain": cmd_explain,
    "watch": cmd_watch, "events": cmd_events, "cluster": cmd_topology, "zone": cmd_topology, "status": cmd_status,
    "token": cmd_token, "whoami": cmd_whoami, "dry-run": cmd_dry_run, "config": cmd_config, "diff": apply_cmds.cmd_diff,
    "completion": cmd_completion, "scale": kubectl.cmd_scale, "edit": kubectl.cmd_edit,
}


# --------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------


def run(argv: Sequence[str] | None, *, parser: argparse.ArgumentParser | None = None,
        out: TextIO | None = None, err: TextIO | None = None, stdin: TextIO | None = None,
        channel_factory: Callable[[str], grpc.Channel] | None = None,
        sleep: Callable[[float], None] = time.sleep) -> int:
    """Parse ``argv`` and run the command; returns the exit status (never raises, never a traceback)."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = parser or build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2, already printed)
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE
    if getattr(args, "version", False):
        from controlplane.cli.version import version_line

        out.write(version_line("tenantctl") + "\n")
        return EXIT_OK
    if getattr(args, "command", None) is None:
        parser.print_help(out)
        return EXIT_OK
    s = Session(args, out, err, stdin or sys.stdin, channel_factory, sleep)
    try:
        flags.check(args)
        return COMMANDS[args.command](s)
    except Failed as exc:
        return exc.code
    except (UsageError, FlagError) as exc:
        print(f"tenantctl: error: {exc}", file=err)
        return EXIT_USAGE
    except ConfigError as exc:
        print(f"tenantctl: error: {exc}", file=err)
        return EXIT_USAGE
    except ControlPlaneError as exc:  # e.g. open_channel: unreadable CA, malformed token
        print(f"tenantctl: error: {exc}", file=err)
        return EXIT_USAGE
    except ApiError as exc:
        print(f"tenantctl: error: {exc}", file=err)
        return EXIT_FAILED
    except Unreachable as exc:
        print(f"tenantctl: error: {exc}", file=err)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        print("tenantctl: interrupted", file=err)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's flush at exit
        except OSError:
            pass
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the promise: never a traceback
        print(f"tenantctl: internal error: {type(exc).__name__}: {exc} (please report it)", file=err)
        return EXIT_FAILED
    finally:
        s.close()
