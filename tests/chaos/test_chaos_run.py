"""A short real chaos run: 3 coordinator processes, 2 simulated adapters, a client writing through
the API, a prober of tenant isolation (every API method as tenant bravo against tenant alpha's
objects), seeded fault schedules, heal-and-settle, the checker. The default suite runs 2 schedules;
``CP_SLOW=1`` runs 10 (``controlplane bench chaos --runs 100`` is the full benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.bench.chaos import run_bench
from tests.conftest import long_mode


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_chaos_schedules_keep_every_safety_property(tmp_path: Path) -> None:
    runs = 10 if long_mode() else 2
    summary = run_bench(runs, 4242, tmp_path / "out", command="test", show_progress=False)
    detail = json.loads((tmp_path / "out" / "results.json").read_text())
    assert summary["runs"] == runs == len(detail["runs"]), detail
    assert summary["stale_commands_accepted"] == 0, summary["runs_failed"]
    assert summary["lost_writes"] == 0, summary["runs_failed"]
    assert summary["illegal_transitions"] == 0, summary["runs_failed"]
    assert summary["lease_overlaps"] == 0, summary["runs_failed"]
    assert summary["convergence_failures"] == 0, summary["runs_failed"]
    assert summary["isolation_violations"] == 0, summary["runs_failed"]
    ev = summary["evidence"]
    assert ev["fencing_verdicts_accepted"] > 0 and ev["lease_intervals"] > 0 and ev["transitions"] > 0, ev
    # bravo probed every method under the faults, got real answers, and the pairs were compared
    assert ev["isolation_methods"] == 31 and ev["isolation_pairs_compared"] > 0 and ev["isolation_answers_ok"] > 0, ev
    assert summary["isolation_probes"] > 0 and sum(r["isolation_probes"] for r in detail["runs"]) == summary["isolation_probes"]
    assert sum(summary["faults"].values()) == 3 * runs
    assert summary["writes"]["acked"] > 0 and summary["recovery_ms"]["n"] > 0
    assert (tmp_path / "out" / "report.md").is_file() and (tmp_path / "out" / "recovery.png").is_file()
