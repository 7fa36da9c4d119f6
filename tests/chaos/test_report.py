"""The chaos report from made-up runs: totals, percentiles, the Markdown and the plot. Pure + a PNG."""

from __future__ import annotations

from pathlib import Path

from controlplane.bench.chaos import percentile, render_markdown, summarize, write_plot
from controlplane.chaos.history import FaultRecord
from controlplane.chaos.runner import RunResult


def _runs() -> list[RunResult]:
    f1 = FaultRecord(0, "kill", "coord-a", 10.0, ended=11.0, recovered=11.2, outage_ms=900.0)
    f2 = FaultRecord(0, "pause", "coord-b", 12.0, ended=14.0, recovered=14.5, outage_ms=1500.0)
    f3 = FaultRecord(1, "kill", "coord-c", 20.0, ended=21.0, recovered=None)
    ok = RunResult(0, 7, {}, "seed=7", [f1, f2], duration_s=9.0)
    bad = RunResult(1, 8, {}, "seed=8", [f3], violations=["stale: gpu-a1 accepted epoch 3 ..."], duration_s=12.0)
    return [ok, bad]


def test_summary_counts_and_recovery_percentiles() -> None:
    s = summarize(_runs(), {"stale": 1}, 42.0, seed=7, command="controlplane bench chaos --runs 2 --seed 7",
                  wall_s=30.0, writes={"acked": 10, "failed": 2, "unknown": 1})
    assert s["runs"] == 2 and s["stale_commands_accepted"] == 1 and s["lost_writes"] == 0
    assert s["illegal_transitions"] == 0 and s["faults"] == {"kill": 2, "pause": 1}
    assert s["recovery_ms"]["n"] == 2 and s["recovery_ms"]["p50"] in (200.0, 500.0) and s["recovery_ms"]["max"] == 500.0
    assert s["unrecovered_faults"] == 1
    assert s["runs_failed"] == [{"run": 1, "seed": 8, "violations": ["stale: gpu-a1 accepted epoch 3 ..."],
                                 "convergence": None}]
    md = render_markdown(dict(s, evidence={"lease_intervals": 3}))
    assert "| stale commands accepted | 1 |" in md and "seed=8 run=1" in md and "lease intervals 3" in md


def test_percentile_edges() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([float(i) for i in range(101)], 99) == 99.0


def test_the_plot_is_written(tmp_path: Path) -> None:
    write_plot(_runs(), tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 1000
