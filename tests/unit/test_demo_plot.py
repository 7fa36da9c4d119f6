"""demo.png (controlplane/cli/demo_plot.py) read as matplotlib objects, not pixels: a recorded series
with two preemptions, a failover, a restart and a lease move nobody caused has each marked where it
happened, and the bottom panel is every tenant's TTFT p99 over time against its own SLO line."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from controlplane.cli.demo_plot import (
    FAILOVER,
    FAILOVER_WINDOW,
    LEASE_MOVE,
    P99_GID,
    PREEMPTION,
    RESTART,
    SLO_GID,
    demo_figure,
    write_demo_plot,
)

TENANTS = {"gold": ("chat", 200, 1_000), "silver": ("embed", 100, 2_000), "bronze": ("batch", 50, 3_000)}


def p99_at(dep: str, i: int) -> float | None:
    if i == 0:
        return None  # nothing finished yet
    return 80.0 + 10 * i + (4_000.0 if dep == "batch" and i == 13 else 0.0)  # batch's drops after the preemption


def summary() -> dict[str, Any]:
    timeline = []
    for i in range(21):
        point: dict[str, Any] = {"t_s": float(i), "holder": "coord-a" if i < 11 else "coord-c", "epoch": 3}
        for dep, _, _ in TENANTS.values():
            point[dep] = {"desired": 3 + i % 4, "serving": 3, "starting": i % 2, "draining": i % 3 == 0,
                          "offered_rps": 12.0, "arrival_rps": 11.5, "preempted": 0, "slo": 1.0,
                          "ttft_p99_ms": p99_at(dep, i), "serving_by_zone": {}}
        timeline.append(point)
    tenants = {t: {"deployment": dep, "priority": prio, "engine": "vllm", "slo_ttft_ms": slo, "slo_attainment": 0.99,
                   "preempted_instances": 3 if dep == "batch" else 0} for t, (dep, prio, slo) in TENANTS.items()}
    return {"workload": "built-in bursty", "duration_s": 20, "tenants": tenants, "timeline": timeline,
            "ttft_window_s": 5.0,
            "failover": {"killed": "coord-a", "killed_epoch": 3, "killed_at_s": 10.0, "new_holder": "coord-c",
                         "new_epoch": 770, "failover_ms": 1_250.0, "restarted_at_s": 14.0, "rejoined_at_s": 15.5},
            "unplanned_lease_changes": [{"t_s": 4.0, "from": "coord-b", "to": "coord-a", "epoch": 3}],
            "preemption_events": [
                {"t_s": 8.0, "deployment": "batch", "tenant": "bronze", "count": 2, "instances": ["a", "b"]},
                {"t_s": 12.5, "deployment": "batch", "tenant": "bronze", "count": 1, "instances": ["c"]}]}


def panels(fig) -> tuple[dict[str, Any], Any]:
    """The replica panel of each deployment (by its title) and the TTFT panel (twin axes left out)."""
    by_dep = {ax.get_title(loc="left").split(" ", 1)[0]: ax for ax in fig.axes if ax.get_ylabel() == "replicas"}
    ttft = [ax for ax in fig.axes if ax.get_ylabel().startswith("TTFT p99")]
    assert len(by_dep) == 3 and len(ttft) == 1, [ax.get_ylabel() for ax in fig.axes]
    return by_dep, ttft[0]


def vlines(ax, gid: str) -> list[float]:
    xs = []
    for line in ax.get_lines():
        if line.get_gid() == gid:
            x0, x1 = line.get_xdata()
            assert x0 == x1  # vertical
            xs.append(float(x0))
    return sorted(xs)


def test_failover_restart_and_lease_move_are_marked_on_every_panel() -> None:
    fig = demo_figure(summary())
    by_dep, ttft = panels(fig)
    for ax in [*by_dep.values(), ttft]:
        assert vlines(ax, FAILOVER) == [10.0]
        assert vlines(ax, RESTART) == [14.0]
        assert vlines(ax, LEASE_MOVE) == [4.0]
        spans = [p for p in ax.patches if p.get_gid() == FAILOVER_WINDOW]
        assert len(spans) == 1
        (x0, _), (x1, _) = spans[0].get_extents().get_points()  # display units: compare through the axes
        lo, hi = sorted(ax.transData.inverted().transform([(x0, 0), (x1, 0)])[:, 0])
        assert math.isclose(lo, 10.0, abs_tol=0.05) and math.isclose(hi, 11.25, abs_tol=0.05)
    labels = [t.get_text() for t in by_dep["chat"].texts]
    assert "SIGKILL coord-a -> coord-c after 1,250 ms" in labels and "coord-a restarted" in labels
    assert "lease coord-b -> coord-a (no kill)" in labels


def test_preemptions_are_marked_on_the_victims_panel_and_the_ttft_panel() -> None:
    fig = demo_figure(summary())
    by_dep, ttft = panels(fig)
    assert vlines(by_dep["batch"], PREEMPTION) == [8.0, 12.5]
    assert [t.get_text() for t in by_dep["batch"].texts if t.get_gid() == PREEMPTION] == ["2 preempted", "1 preempted"]
    assert vlines(by_dep["chat"], PREEMPTION) == vlines(by_dep["embed"], PREEMPTION) == []
    assert vlines(ttft, PREEMPTION) == [8.0, 12.5]
    assert "3 instances preempted" in by_dep["batch"].get_title(loc="left")


def test_the_slo_panel_is_ttft_p99_over_time_against_each_tenants_slo() -> None:
    s = summary()
    _, ttft = panels(demo_figure(s))
    assert ttft.get_yscale() == "log"
    lines = {line.get_gid(): line for line in ttft.get_lines()}
    for tenant, (dep, _, slo) in TENANTS.items():
        p99 = lines[f"{P99_GID}{tenant}"]
        assert list(p99.get_xdata()) == [p["t_s"] for p in s["timeline"]]
        ys = list(p99.get_ydata())
        assert math.isnan(ys[0]) and ys[1:] == [p99_at(dep, i) for i in range(1, 21)]
        slo_line = lines[f"{SLO_GID}{tenant}"]
        assert list(slo_line.get_ydata()) == [slo, slo] and slo_line.get_color() == p99.get_color()
    assert max(lines[f"{P99_GID}bronze"].get_ydata()[1:]) > 3_000  # the spike above bronze's SLO is drawn...
    assert ttft.get_ylim()[1] > 4_000  # ...and inside the axes
    legend = [t.get_text() for t in ttft.get_legend().get_texts()]
    assert "gold SLO 1,000 ms" in legend and any(t.startswith("bronze (batch) TTFT p99") for t in legend)
    assert not any("attainment" in ax.get_ylabel() for ax in ttft.figure.axes)


def test_the_figure_is_readable_and_saved(tmp_path: Path) -> None:
    fig = demo_figure(summary())
    assert fig._suptitle is not None and "built-in bursty" in fig._suptitle.get_text()
    by_dep, ttft = panels(fig)
    assert ttft.get_xlabel() == "seconds since the workload started"
    assert len(fig.legends) == 1 and "preemption (instances drained)" in [t.get_text() for t in fig.legends[0].texts]
    heights = [ax.get_position().height for ax in (*by_dep.values(), ttft)]
    assert max(heights) < 2 * min(heights)  # no panel squeezed flat, none taking half the figure
    path = tmp_path / "demo.png"
    write_demo_plot(summary(), path)
    assert path.read_bytes().startswith(b"\x89PNG")


def test_a_run_without_a_failover_or_preemption_still_plots() -> None:
    s = summary()
    s["failover"] = {"killed": "", "killed_epoch": 0, "killed_at_s": None, "new_holder": "", "new_epoch": 0,
                     "failover_ms": None, "restarted_at_s": None, "rejoined_at_s": None}
    s["preemption_events"], s["unplanned_lease_changes"] = [], []
    by_dep, ttft = panels(demo_figure(s))
    assert all(vlines(ax, g) == [] for ax in [*by_dep.values(), ttft] for g in (FAILOVER, PREEMPTION, RESTART))
