"""The demo's live view and its terminal summary (:mod:`controlplane.cli.demo` feeds them).

One frame of the live view is a :class:`ViewState`, plain values the demo gathers every half second;
:func:`render` lays a frame out for a terminal's width and height and computes nothing else. Laid out
for 100 columns and up: whole instance ids, no column cut or folded into a stack of fragments. Below
:data:`WIDE_COLUMNS` the deployments take two tables (replicas; traffic and SLO), from there one; the
``Scaling.Watch`` panel shows as many of the latest events as the terminal's height leaves room for.

``controlplane demo --record-view FILE`` writes every frame as a JSON line;
``python -m controlplane.cli.demo_view FILE`` plays such a recording back in the same live view (no
group, no clusters: what the terminal test of the view drives, and a way to look at a run again).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

WIDE_COLUMNS = 170
"""From this width on the deployments are one table."""
MAX_EVENTS = 20
"""The most ``Scaling.Watch`` events a frame keeps (the view shows what the height allows)."""
MIN_EVENTS = 3
STATE_LETTERS = {"pending": "P", "warming": "W", "ready": "R", "busy": "B", "standby": "S", "draining": "D"}


@dataclass
class NodeRow:
    """One coordinator as the demo sees it: updated in place while the demo polls it
    (``controlplane.cli.demo``), copied into each frame."""

    node_id: str
    zone: str
    pid: int | None = None
    reachable: bool = False
    role: str = ""
    term: int = 0
    leader: str = ""
    holder: str = ""
    epoch: int = 0
    remaining_ms: int = 0
    applied: int = 0
    note: str = ""


@dataclass(frozen=True)
class DeploymentRow:
    name: str
    tenant: str
    priority: int
    slo_ms: int
    desired: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    by_zone_state: dict[str, dict[str, int]] = field(default_factory=dict)
    preempted: int = 0
    load_rps: float = 0.0
    offered_rps: float = 0.0
    ttft_p99_ms: float | None = None
    """TTFT p99 of the requests finished in the last ``TTFT_WINDOW_S`` (a drop counts with its wait)."""
    attainment: float | None = None
    dropped: int = 0
    gpu_s: float = 0.0


@dataclass(frozen=True)
class EventRow:
    t_s: float
    deployment: str
    subject: str
    """An instance's whole id, or ``decided N``."""
    text: str
    """The instance's event, new state and zone, or the decision's whole reason."""


@dataclass(frozen=True)
class BreakerRow:
    key: str
    phase: str
    failures: int = 0


@dataclass(frozen=True)
class ViewState:
    t_s: float
    duration_s: float
    workload: str
    holder: str = ""
    epoch: int = 0
    failover: str = ""
    zones: tuple[str, ...] = ()
    nodes: tuple[NodeRow, ...] = ()
    deployments: tuple[DeploymentRow, ...] = ()
    breakers: tuple[BreakerRow, ...] = ()
    events: tuple[EventRow, ...] = ()
    log: tuple[str, ...] = ()
    ttft_window_s: float = 5.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> ViewState:
        raw = json.loads(line)
        return cls(**{**raw, "zones": tuple(raw["zones"]), "log": tuple(raw["log"]),
                      "nodes": tuple(NodeRow(**n) for n in raw["nodes"]),
                      "deployments": tuple(DeploymentRow(**d) for d in raw["deployments"]),
                      "breakers": tuple(BreakerRow(**b) for b in raw["breakers"]),
                      "events": tuple(EventRow(**e) for e in raw["events"])})


# ---------------------------------------------------------------------------------------------
# cells


def states(by_state: dict[str, int]) -> str:
    order = list(STATE_LETTERS)
    parts = [f"{STATE_LETTERS.get(k, k)}{v}" for k, v in sorted(by_state.items(), key=lambda kv: order.index(kv[0])
                                                                if kv[0] in STATE_LETTERS else 99) if v]
    return " ".join(parts) or "-"


def serving(by_state: dict[str, int]) -> int:
    return by_state.get("ready", 0) + by_state.get("busy", 0)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} ms"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def nearest_rank_p99(values: Sequence[float]) -> float | None:
    """The 99th percentile by nearest rank (the summary's definition), ``None`` for no values."""
    if not values:
        return None
    xs = sorted(values)
    return float(xs[min(len(xs) - 1, int(len(xs) * 0.99))])


# ---------------------------------------------------------------------------------------------
# the frame


def _table(title: str):
    from rich import box
    from rich.table import Table

    return Table(title=title, box=box.SIMPLE_HEAD, expand=True, title_justify="left", show_edge=False,
                 pad_edge=False, collapse_padding=True, padding=(0, 1), title_style="bold")


def _col(table, header: str, *, right: bool = False, ratio: int | None = None) -> None:
    table.add_column(header, justify="right" if right else "left", no_wrap=ratio is None, ratio=ratio)


def header_panel(s: ViewState):
    from rich.panel import Panel

    parts = [f"{b.key} [{'green' if b.phase == 'closed' else 'red'}]{b.phase}[/]" + (f" ({b.failures} failures)"
                                                                                   if b.failures else "")
             for b in s.breakers]
    head = (f"[b]controlplane demo[/b]  t = {s.t_s:5.1f} / {s.duration_s:.0f} s   "
            f"lease: [b]{s.holder or '-'}[/b] epoch {s.epoch or '-'}   workload: {s.workload}")
    breakers = "[b]breakers[/b] (derived from the watched instance events): " + (", ".join(parts) or "-")
    return Panel(head + "\n" + s.failover + "\n" + breakers)


def nodes_table(s: ViewState):
    t = _table("coordinators (Admin.Status of each)")
    for col in ("node", "zone", "pid", "role", "term", "raft leader", "lease@epoch", "lease left", "applied"):
        _col(t, col, right=col in ("pid", "term", "lease left", "applied"))
    _col(t, "", ratio=1)
    for n in s.nodes:
        if not n.reachable:
            t.add_row(n.node_id, n.zone, str(n.pid or "-"), "[red]down[/red]", "", "", "", "", "", n.note)
            continue
        role = f"[green]{n.role}[/green]" if n.role == "leader" else n.role
        t.add_row(n.node_id, n.zone, str(n.pid or "-"), role, str(n.term), n.leader or "-",
                  f"{n.holder or '-'}@{n.epoch}", f"{n.remaining_ms:,} ms", str(n.applied), n.note)
    return t


def _replica_cells(s: ViewState, d: DeploymentRow) -> list[str]:
    return [str(d.desired), states(d.by_state), *[states(d.by_zone_state.get(z, {})) for z in s.zones],
            str(d.preempted)]


def _traffic_cells(d: DeploymentRow) -> list[str]:
    return [f"{d.load_rps:.1f}", f"{d.offered_rps:.1f}", ms(d.ttft_p99_ms), f"{d.slo_ms:,} ms", pct(d.attainment),
            str(d.dropped), f"{d.gpu_s:.0f}"]


def deployment_tables(s: ViewState, width: int) -> list[Any]:
    who = ("deployment", "tenant", "prio")
    replicas = ("desired", "by state", *s.zones, "preempted")
    traffic = ("load/s", "offered/s", f"TTFT p99 {s.ttft_window_s:.0f}s", "SLO", "met so far", "dropped", "GPU-s")
    right = {"prio", "desired", "preempted", *traffic}
    title_r = "deployments: replicas by state (P pending, W warming, R ready, B busy, S standby, D draining)"
    title_t = "traffic and TTFT (the simulated clusters; met = finished within the SLO, drops miss)"
    wide = ("deployments (replicas by state: P pending, W warming, R ready, B busy, S standby, D draining; "
            "traffic and TTFT from the simulated clusters)")
    layouts = [(wide, replicas + traffic)] if width >= WIDE_COLUMNS else [(title_r, replicas), (title_t, traffic)]
    tables = []
    for title, cols in layouts:
        t = _table(title)
        for col in (*who, *cols):
            _col(t, col, right=col in right)
        for d in s.deployments:
            cells = {**dict(zip(replicas, _replica_cells(s, d))), **dict(zip(traffic, _traffic_cells(d)))}
            t.add_row(d.name, d.tenant, str(d.priority), *[cells[c] for c in cols])
        tables.append(t)
    return tables


def events_panel(events: Sequence[EventRow]):
    from rich.panel import Panel
    from rich.table import Table

    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for e in events:
        grid.add_row(f"{e.t_s:.1f}s", e.deployment, e.subject, e.text)
    if not events:
        grid.add_row("", "", "", "(waiting for events)")
    return Panel(grid, title="Scaling.Watch (latest)", title_align="left")


def render(s: ViewState, width: int, height: int | None = None):
    """The frame for a terminal ``width`` columns wide. With ``height``: as many of the latest events
    as fit, at least :data:`MIN_EVENTS`; below that the demo's own log gives up its older lines, then
    its panel (the failover line in the header says what it would)."""
    from rich.console import Console, Group

    fixed = [header_panel(s), nodes_table(s), *deployment_tables(s, width)]
    events, log = list(s.events[-MAX_EVENTS:]), list(s.log)
    if height is None:
        return Group(*fixed, events_panel(events), *_log_panel(log))
    console = Console(width=width, height=height, file=_NullFile(), force_terminal=True)

    def lines(*parts: Any) -> int:
        return len(console.render_lines(Group(*parts), console.options, pad=False, new_lines=False))

    budget = height - 1  # a spare line: the cursor after the frame must not scroll it
    used = lines(*fixed)
    while log and used + lines(events_panel(events[-MIN_EVENTS:]), *_log_panel(log)) > budget:
        log = log[1:]
    used += lines(*_log_panel(log))
    while len(events) > MIN_EVENTS and used + lines(events_panel(events)) > budget:
        events = events[1:]
    return Group(*fixed, events_panel(events), *_log_panel(log))


def _log_panel(log: list[str]) -> list[Any]:
    from rich.panel import Panel

    return [Panel("\n".join(log), title="demo", title_align="left")] if log else []


class _NullFile:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


class LiveFrame:
    """A rich renderable that lays the latest frame out for the console it is drawn on."""

    def __init__(self, state: ViewState) -> None:
        self.state = state

    def __rich_console__(self, console, options):
        yield render(self.state, options.max_width, console.size.height)


def plain_line(s: ViewState) -> str:
    parts = [f"t={s.t_s:5.1f}s", f"lease {s.holder}@{s.epoch}" if s.holder else "lease -"]
    for d in s.deployments:
        parts.append(f"{d.name}: desired {d.desired} serving {serving(d.by_state)} load {d.load_rps:.1f}/s "
                     f"TTFT p99 {ms(d.ttft_p99_ms)} SLO {pct(d.attainment)} preempted {d.preempted}")
    return "demo: " + " | ".join(parts)


# ---------------------------------------------------------------------------------------------
# the end


def summary_table(summary: dict[str, Any]):
    from rich import box
    from rich.table import Table

    table = Table(title=f"controlplane demo: {summary['workload']}, {summary['duration_s']:.0f} s "
                        f"(+{summary['setup_s']:.0f} s start-up); TTFT SLO, p50 and p99 in ms; met: within the SLO", title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, collapse_padding=True, padding=(0, 1))
    for col in ("tenant", "prio", "deployment", "requests", "dropped", "SLO", "met", "p50", "p99", "GPU-s", "replicas",
                "preempted"):
        table.add_column(col, justify="left" if col in ("tenant", "deployment") else "right", no_wrap=True)
    for name, t in summary["tenants"].items():
        table.add_row(name, str(t["priority"]), t["deployment"], str(t["requests"]), str(t["dropped"]),
                      f"{t['slo_ttft_ms']:,}", pct(t["slo_attainment"]), _num(t["ttft_p50_ms"]), _num(t["ttft_p99_ms"]),
                      f"{t['gpu_seconds']:.0f}", f"{t['min_replicas']} -> {t['peak_serving_replicas']}",
                      str(t["preempted_instances"]))
    return table


def print_summary(summary: dict[str, Any], json_path: Path, png_path: Path) -> None:
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=150)
    console.print(summary_table(summary))
    fo = summary["failover"]
    if fo["new_holder"]:
        console.print(f"failover: SIGKILL of {fo['killed']} (epoch {fo['killed_epoch']}) at {fo['killed_at_s']} s -> "
                      f"{fo['new_holder']} holds epoch {fo['new_epoch']} after {fo['failover_ms']:.0f} ms; "
                      f"{fo['killed']} restarted at {fo['restarted_at_s']} s"
                      + (f", rejoined at {fo['rejoined_at_s']} s" if fo["rejoined_at_s"] is not None else ""))
    when = ", ".join(f"{p['count']} of {p['deployment']} at {p['t_s']:.1f} s" for p in summary.get("preemption_events", []))
    console.print(f"preemptions: {summary['preemptions']} instances drained for a higher-priority tenant"
                  + (f" ({when})" if when else "") + "; breakers: "
                  + (", ".join(f"{k} {v}" for k, v in summary["breakers"].items()) or "-"))
    for u in summary["unplanned_lease_changes"]:
        console.print(f"[yellow]note:[/yellow] at {u['t_s']} s the lease moved from {u['from']} to {u['to']} "
                      f"(epoch {u['epoch']}) without a kill (a holder that missed its renewals)")
    for p in summary["problems"]:
        console.print(f"[red]problem:[/red] {p}")
    console.print(f"summary: {json_path}\nplot:    {png_path}")


# ---------------------------------------------------------------------------------------------
# playing a recording back


def read_recording(path: Path) -> list[ViewState]:
    frames = [ViewState.from_json(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not frames:
        raise ValueError(f"{path}: no frames")
    return frames


def replay(frames: Iterable[ViewState], interval_s: float, hold_s: float) -> None:
    from rich.live import Live

    frame: LiveFrame | None = None
    with Live(auto_refresh=False, transient=False) as live:
        for state in frames:
            frame = LiveFrame(state)
            live.update(frame, refresh=True)
            time.sleep(interval_s)
        time.sleep(hold_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane.cli.demo_view",
                                     description="play back a live view recorded with `controlplane demo --record-view FILE`")
    parser.add_argument("recording", type=Path)
    parser.add_argument("--interval-s", type=float, default=0.5, help="seconds per frame (default 0.5, as recorded)")
    parser.add_argument("--hold-s", type=float, default=0.0, help="keep the last frame this long")
    args = parser.parse_args(argv)
    if args.interval_s < 0 or args.hold_s < 0:
        parser.error("--interval-s and --hold-s must be >= 0")
    try:
        frames = read_recording(args.recording)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"demo_view: error: {exc}", file=sys.stderr)
        return 2
    replay(frames, args.interval_s, args.hold_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
