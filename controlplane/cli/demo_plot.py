"""``OUT/demo.png``: what the demo's summary (``demo-summary.json``) shows over time.

One panel per deployment (replicas by state and the desired count against the offered and measured
load, its preemptions marked) and one below for every tenant's TTFT p99 over the last few seconds
against its SLO, on a log scale (the SLOs are seconds, the usual p99 a tenth of one). On every panel:
the SIGKILL of the lease holder and the failover window, the restart of the killed coordinator, any
lease move nobody caused, and the preemptions. :func:`demo_figure` builds the figure (the tests read
its artists: each marker has a ``gid``); :func:`write_demo_plot` saves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAILOVER, FAILOVER_WINDOW, RESTART, LEASE_MOVE, PREEMPTION = (
    "failover", "failover-window", "restart", "lease-move", "preemption")
"""The ``gid`` of each kind of marker."""
SLO_GID, P99_GID = "slo:", "ttft-p99:"
"""``gid`` prefixes of a tenant's SLO line and TTFT p99 line (``slo:gold``)."""
TENANT_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b")
PREEMPTION_COLOUR = "#9467bd"
_BOX = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85}


def demo_figure(summary: dict[str, Any]):
    """The figure for a summary (``Demo.summary()``): a matplotlib ``Figure``, not yet saved."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    tenants = summary["tenants"]
    fig = Figure(figsize=(12, 3.0 * len(tenants) + 4.2), layout="constrained")
    axes = fig.subplots(len(tenants) + 1, 1, sharex=True, height_ratios=[1.0] * len(tenants) + [1.35])
    tl = summary["timeline"]
    xs = [p["t_s"] for p in tl]
    for ax, (tenant, info) in zip(axes, tenants.items()):
        _replica_panel(ax, tl, xs, tenant, info)
        _mark_preemptions(ax, summary, info["deployment"], labelled=True)
    ttft = axes[-1]
    _ttft_panel(ttft, summary, tl, xs)
    _mark_preemptions(ttft, summary, None, labelled=False)
    for i, ax in enumerate(axes):
        _mark_lease(ax, summary, labelled=i == 0)
    fig.suptitle(f"controlplane demo: {summary['workload']}, {summary['duration_s']:.0f} s", fontsize=12,
                 fontweight="bold")
    handles = [Patch(color="#2ca02c", label="serving (ready + busy)"), Patch(color="#ffbb78", label="starting"),
               Patch(color="#ff9896", label="draining"), Line2D([], [], color="black", lw=1, label="desired"),
               Line2D([], [], color="#1f77b4", lw=1, ls="--", label="offered load (right axis)"),
               Line2D([], [], color="#1f77b4", lw=0.8, label="measured arrivals (right axis)"),
               Line2D([], [], color="red", lw=1.2, label="SIGKILL of the lease holder (shaded: until a new holder)"),
               Line2D([], [], color="grey", lw=1, ls="--", label="killed coordinator restarted"),
               Line2D([], [], color=PREEMPTION_COLOUR, lw=1, ls="-.", label="preemption (instances drained)")]
    if summary.get("unplanned_lease_changes"):
        handles.append(Line2D([], [], color="orange", lw=1, ls=":", label="lease moved without a kill"))
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=8, frameon=False)
    return fig


def write_demo_plot(summary: dict[str, Any], path: Path) -> None:
    demo_figure(summary).savefig(path, dpi=100)


def _replica_panel(ax, tl: list[dict[str, Any]], xs: list[float], tenant: str, info: dict[str, Any]) -> None:
    dep = info["deployment"]
    ax.stackplot(xs, [p[dep]["serving"] for p in tl], [p[dep]["starting"] for p in tl],
                 [p[dep]["draining"] for p in tl], colors=["#2ca02c", "#ffbb78", "#ff9896"], step="post")
    ax.step(xs, [p[dep]["desired"] for p in tl], where="post", color="black", lw=1)
    ax.set_ylabel("replicas")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{dep} (tenant {tenant}, priority {info['priority']}, {info.get('engine', '')}): replicas against "
                 f"load; {_count(info['preempted_instances'], 'instance')} preempted", fontsize=10, loc="left")
    load = ax.twinx()
    load.plot(xs, [p[dep]["offered_rps"] for p in tl], color="#1f77b4", lw=1, ls="--")
    load.plot(xs, [p[dep]["arrival_rps"] for p in tl], color="#1f77b4", lw=0.8)
    load.set_ylabel("requests / s")
    load.set_ylim(bottom=0)


def _ttft_panel(ax, summary: dict[str, Any], tl: list[dict[str, Any]], xs: list[float]) -> None:
    window = summary.get("ttft_window_s", 5.0)
    top = 0.0
    for colour, (tenant, info) in zip(TENANT_COLOURS, summary["tenants"].items()):
        dep, slo = info["deployment"], info["slo_ttft_ms"]
        ys = [p[dep].get("ttft_p99_ms") for p in tl]
        top = max([top, slo, *(y for y in ys if y is not None)])
        met = info.get("slo_attainment")
        met_text = "-" if met is None else f"{100 * met:.1f} %"
        ax.plot(xs, [float("nan") if y is None else y for y in ys], color=colour, lw=1.3, gid=f"{P99_GID}{tenant}",
                label=f"{tenant} ({dep}) TTFT p99; {met_text} of requests within SLO")
        ax.axhline(slo, color=colour, lw=1, ls="--", gid=f"{SLO_GID}{tenant}", label=f"{tenant} SLO {slo:,} ms")
    ax.set_yscale("log")
    ax.set_ylim(10, top * 4)
    ax.set_ylabel(f"TTFT p99, last {window:.0f} s (ms)")
    ax.set_xlabel("seconds since the workload started")
    ax.set_title(f"TTFT p99 per tenant over the last {window:.0f} s against each tenant's SLO (dashed); "
                 "a dropped request counts with the time it waited", fontsize=10, loc="left")
    ax.legend(loc="upper left", fontsize=7.5, ncol=3)
    ax.grid(axis="y", which="major", alpha=0.3)


def _mark_preemptions(ax, summary: dict[str, Any], deployment: str | None, labelled: bool) -> None:
    close = 0.06 * max(1.0, float(summary.get("duration_s", 1.0)))
    """Labels nearer each other than this (in seconds) go one step lower than the one before."""
    last_x, level = float("-inf"), 0
    for p in summary.get("preemption_events", []):
        if deployment is not None and p["deployment"] != deployment:
            continue
        ax.axvline(p["t_s"], color=PREEMPTION_COLOUR, lw=1, ls="-.", gid=PREEMPTION)
        if labelled:
            level = (level + 1) % 3 if p["t_s"] - last_x < close else 0
            last_x = p["t_s"]
            ax.annotate(f"{p['count']} preempted", xy=(p["t_s"], 0.97 - 0.09 * level), xycoords=("data", "axes fraction"),
                        xytext=(3, 0), textcoords="offset points", color=PREEMPTION_COLOUR, fontsize=8, va="top",
                        gid=PREEMPTION, bbox=_BOX)


def _mark_lease(ax, summary: dict[str, Any], labelled: bool) -> None:
    fo = summary["failover"]

    def label(x: float, text: str, colour: str, y: float) -> None:
        if labelled:
            ax.annotate(text, xy=(x, y), xycoords=("data", "axes fraction"), xytext=(3, 0), textcoords="offset points",
                        color=colour, fontsize=8, va="bottom", bbox=_BOX)

    for u in summary.get("unplanned_lease_changes", []):
        ax.axvline(u["t_s"], color="orange", lw=1, ls=":", gid=LEASE_MOVE)
        label(u["t_s"], f"lease {u['from']} -> {u['to']} (no kill)", "darkorange", 0.16)
    if fo.get("killed_at_s") is None:
        return
    ax.axvline(fo["killed_at_s"], color="red", lw=1.2, gid=FAILOVER)
    if fo.get("failover_ms") is not None:
        ax.axvspan(fo["killed_at_s"], fo["killed_at_s"] + fo["failover_ms"] / 1000, color="red", alpha=0.15,
                   gid=FAILOVER_WINDOW)
        label(fo["killed_at_s"], f"SIGKILL {fo['killed']} -> {fo['new_holder']} after {fo['failover_ms']:,.0f} ms",
              "red", 0.03)
    else:
        label(fo["killed_at_s"], f"SIGKILL {fo['killed']}: no new holder", "red", 0.03)
    if fo.get("restarted_at_s") is not None:
        ax.axvline(fo["restarted_at_s"], color="grey", lw=1, ls="--", gid=RESTART)
        label(fo["restarted_at_s"], f"{fo['killed']} restarted", "dimgrey", 0.12)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
