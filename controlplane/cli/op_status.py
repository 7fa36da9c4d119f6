"""``controlplane status``: one line per coordinator, every endpoint asked at once.

Where the endpoints come from: ``--endpoints`` when given; otherwise the tenantctl configuration
(``$TENANTCTL_CONFIG``, else ``~/.config/controlplane/tenantctl.yaml``: what ``controlplane up``
writes and tells you to export), its current context (``--context`` / ``$TENANTCTL_CONTEXT`` to
choose another): its endpoints, CA, client certificate and token. Flags win over the file
(``--token``, ``--ca-file``...; ``$TENANTCTL_TOKEN`` over the file's token).

Exit status: 0 every node answered, 1 some did not; a configuration problem is exit 2 (one line).
"""

from __future__ import annotations

import argparse
import json
import os

from controlplane.domain.errors import ControlPlaneError


def targets(args: argparse.Namespace) -> tuple[list[str], argparse.Namespace]:
    """The endpoints to ask and ``args`` completed from the tenantctl configuration (when
    ``--endpoints`` is not given)."""
    if args.endpoints:
        endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ControlPlaneError("--endpoints: give at least one HOST:PORT")
        return endpoints, args
    from controlplane.cli.tenantctl import config as cfgmod

    path = cfgmod.config_path(None)
    if not path.exists():
        raise ControlPlaneError(f"--endpoints not given and {path} does not exist (set TENANTCTL_CONFIG to the "
                                "file `controlplane up` wrote, or pass --endpoints HOST:PORT,...)")
    cfg = cfgmod.load(path)
    name = args.context or os.environ.get(cfgmod.ENV_CONTEXT) or cfg.current_context
    chosen = [c for c in cfg.contexts if c.name == name] if name else list(cfg.contexts[:1])
    if not chosen:
        known = ", ".join(c.name for c in cfg.contexts) or "none"
        raise ControlPlaneError(f"{path}: no context named {name!r} (known: {known})")
    ctx = cfgmod.resolve(chosen[0], path, args.token)
    done = argparse.Namespace(**vars(args))
    done.token = ctx.token
    done.ca_file = args.ca_file or ctx.ca_file
    done.cert_file = args.cert_file or ctx.cert_file
    done.key_file = args.key_file or ctx.key_file
    done.server_name = args.server_name or ctx.server_name
    return list(ctx.endpoints), done


def print_status(nodes: list[dict], as_json: bool) -> int:
    if as_json:
        print(json.dumps(nodes, indent=2, sort_keys=True))
        return 0 if all(n["reachable"] for n in nodes) else 1
    for n in nodes:
        if not n["reachable"]:
            print(f"{n['endpoint']:21} {n.get('why') or n['error']}")
            continue
        lease = n["lease"]
        print(f"{n['endpoint']:21} {n['node_id']:10} pid {n['pid']:<7} {n['zone']:6} {n['role']:9} term {n['term']:<4} "
              f"leader {n['leader_id'] or '-':10} lease {lease['holder'] or '-'}@{lease['epoch']} "
              f"({lease['remaining_ms']} ms left here) commit {n['commit_index']} applied {n['applied_index']}")
        for f in n.get("fenced_clusters", []):
            print(f"{'':21} fenced out: {f['cluster_id']} (its adapter holds epoch {f['adapter_epoch']}, above "
                  f"{f['epoch']}; nothing is sent to it: docs/lease.md \"Recovery\")")
    return 0 if all(n["reachable"] for n in nodes) else 1
