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


def test_isolation_counts_reach_the_totals_the_report_and_the_exit_status(monkeypatch, tmp_path: Path) -> None:
    import controlplane.bench.chaos as bench

    runs = _runs()
    runs[0].isolation_probes, runs[1].isolation_probes = 66, 33
    s = summarize(runs, {"isolation": 2}, None, seed=7, command="c", wall_s=1.0,
                  writes={"acked": 1, "failed": 0, "unknown": 0})
    assert s["isolation_violations"] == 2 and s["isolation_probes"] == 99
    assert "| tenant isolation violations (bravo probing alpha, every method) | 2 (99 probes) |" in render_markdown(s)
    ev = {"fencing_verdicts_accepted": 1, "lease_intervals": 1, "transitions": 1, "isolation_probes": 99,
          "isolation_pairs_compared": 90}
    clean = summarize(runs[:1], {}, None, seed=7, command="c", wall_s=1.0, writes={"acked": 1, "failed": 0, "unknown": 0})
    for summary, rc in ((dict(s, evidence=ev), 1), (dict(clean, evidence=ev), 0),
                        (dict(clean, evidence=dict(ev, isolation_probes=0)), 1)):
        monkeypatch.setattr(bench, "run_bench", lambda *a, _s=summary, **k: _s)
        assert bench.run_cli(1, 7, str(tmp_path), True) == rc
