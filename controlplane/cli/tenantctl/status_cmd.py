"""``tenantctl status``: every coordinator of the context(s), asked at once with a short deadline.

* All endpoints (of every chosen context) are asked concurrently, each with ``min(--timeout, 1 s)``:
  one node down costs well under a second, not a deadline per node in turn.
* Columns: ENDPOINT, NODE, PID, ZONE, ROLE, TERM, LEADER, LEASE (holder@epoch), APPLIED; ``-o wide``
  adds COMMIT, LEASE-LEFT (this node's lease validity, ms), VERSION, RAFT and API addresses and
  PEERS (reachable/known). ``--all-contexts`` puts CONTEXT first.
* A node that did not answer is one short row: ``127.0.0.1:7003  -  unreachable (connection refused)``
  (:func:`controlplane.api.tls_errors.reason` names TLS and CA mistakes).
* Exit status: 0 every node answered, 1 some did not (or refused the call), 3 none answered.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from controlplane.api.admin import from_proto
from controlplane.api.client import ApiClient, ApiError, is_transport_failure
from controlplane.api.v1 import admin_pb2
from controlplane.cli.tenantctl import render

STATUS_DEADLINE_S = 1.0
"""Longest a status call waits for one node (less with a smaller ``--timeout``)."""
HEADERS = ["ENDPOINT", "NODE", "PID", "ZONE", "ROLE", "TERM", "LEADER", "LEASE", "APPLIED"]
WIDE = ["COMMIT", "LEASE-LEFT", "VERSION", "RAFT", "API", "PEERS"]


def probe(client: ApiClient, deadline_s: float) -> list[tuple[str, Any]]:
    """``(endpoint, StatusResponse | ApiError | str)`` for every endpoint of ``client``, asked at
    once; a ``str`` is why it did not answer (one line)."""
    stubs = [(ep, client._stub("Admin", ep)) for ep in client.endpoints]  # channels made here, not in threads

    def ask(item: tuple[str, Any]) -> tuple[str, Any]:
        ep, stub = item
        try:
            return ep, stub.Status(admin_pb2.StatusRequest(), timeout=deadline_s)
        except grpc.RpcError as exc:
            if is_transport_failure(exc):
                return ep, client.why(ep, exc)
            return ep, client._error(ep, exc)

    with ThreadPoolExecutor(max_workers=max(1, len(stubs))) as pool:
        return list(pool.map(ask, stubs))


def _row(reply: admin_pb2.StatusResponse, ep: str, wide: bool) -> list[str]:
    row = [ep, reply.node_id or "-", str(reply.pid) if reply.pid else "-", reply.zone or "-", reply.role or "-",
           str(reply.term), reply.leader_id or "-", f"{reply.lease_holder or '-'}@{reply.lease_epoch}",
           str(reply.applied_index)]
    if wide:
        known = len(reply.peers)
        up = sum(1 for p in reply.peers if p.reachable)
        row += [str(reply.commit_index), str(reply.lease_remaining_ms) if reply.lease_remaining_ms else "-",
                reply.version or "-", reply.raft_address or "-", reply.api_address or "-", f"{up}/{known}"]
    return row


def layout(headers: list[str], rows: list[list[str] | tuple[str, str]], lead: int) -> str:
    """A plain table, columns two spaces apart, no trailing spaces. A ``(prefix, message)`` row is a
    node that did not answer: its first ``lead`` cells, a ``-`` under NODE, then ``message``."""
    full = [r for r in rows if isinstance(r, list)]
    widths = [max([len(h)] + [len(r[i]) for r in full]) for i, h in enumerate(headers)]
    for r in rows:
        if isinstance(r, tuple):
            cells = r[0].split("\0")
            for i, cell in enumerate(cells):
                widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in rows:
        if isinstance(r, tuple):
            cells = r[0].split("\0")
            head = "  ".join(c.ljust(widths[i]) for i, c in enumerate(cells))
            lines.append(f"{head}  {'-'.ljust(widths[lead])}  {r[1]}".rstrip())
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines) + "\n"


def cmd_status(s: Any) -> int:
    """``tenantctl status`` (``s`` is the app's Session)."""
    wide = s.args.output == "wide"
    deadline = min(s.opt("timeout") or STATUS_DEADLINE_S, STATUS_DEADLINE_S)
    contexts = list(s.each())
    with ThreadPoolExecutor(max_workers=max(1, len(contexts))) as pool:
        answers = list(pool.map(lambda cc: (cc[0], probe(cc[1], deadline)), contexts))
    headers = (["CONTEXT"] if s.multi else []) + HEADERS + (WIDE if wide else [])
    rows: list[list[str] | tuple[str, str]] = []
    data: list[dict[str, Any]] = []
    total = answered = ok = 0
    for ctx, replies in answers:
        for ep, reply in replies:
            total += 1
            lead = [ctx.name] if s.multi else []
            if isinstance(reply, admin_pb2.StatusResponse):
                answered += 1
                ok += 1
                rows.append(lead + _row(reply, ep, wide))
                data.append({"context": ctx.name, "endpoint": ep, "reachable": True, **from_proto(reply)})
                continue
            if isinstance(reply, ApiError):
                answered += 1
                why = f"error ({reply.code.name}: {reply.message})"
            else:
                why = reply
            rows.append(("\0".join(lead + [ep]), why))
            data.append({"context": ctx.name, "endpoint": ep, "reachable": False, "error": why})
    if s.args.output in ("json", "yaml"):
        render.dump(s.console, data, s.args.output)
    else:
        s.out.write(layout(headers, rows, (1 if s.multi else 0) + 1))
    if answered == 0:
        return 3
    return 0 if ok == total else 1
