"""``controlplane bench tick``, short: 100 deployments x 10 instances, a few ticks. Checks the JSON
shape, that the numbers are positive and consistent, and the report files (a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from controlplane.bench.tick import INSTANCES_PER_DEPLOYMENT, TickHarness, run_bench

REPO = Path(__file__).resolve().parents[2]


def _check(s: dict, n: int) -> None:
    assert s["n"] == n
    assert 0 < s["min"] <= s["p50"] <= s["p99"] <= s["max"], s
    assert s["median"] == s["p50"]


def test_short_run_schema_and_files(tmp_path: Path) -> None:
    r = run_bench((100,), tmp_path, ticks={100: 5}, show_progress=False, pin=False, command="test")
    assert r["benchmark"] == "tick" and r["params"]["sizes"] == [100] and r["params"]["pinned_cpu"] is None
    (row,) = r["sizes"]
    assert row["deployments"] == 100 and row["instances"] == 100 * INSTANCES_PER_DEPLOYMENT
    assert row["ticks"] == 5 and row["clusters"] >= 3 and row["tenants"] >= 1
    for part in ("filter", "facts", "plan", "tick", "full"):
        _check(row[f"{part}_ms"], 5)
    assert row["tick_ms"]["max"] <= row["full_ms"]["max"]
    assert "target_ms" not in row and r["verdict"] == {}  # 100 deployments has no target
    mem = row["memory"]
    assert mem["state_mib"] > 0 and mem["held_mib"] >= mem["state_mib"] and mem["tick_peak_extra_mib"] > 0
    md = (tmp_path / "bench-tick.md").read_text()
    assert "| deployments | instances | tick p50 (ms) |" in md and "| 100 | 1,000 |" in md
    assert json.loads((tmp_path / "bench-tick.json").read_text())["sizes"][0]["tick_ms"] == row["tick_ms"]


def test_steady_fleet_stays_steady() -> None:
    """The benchmark measures a steady fleet: no instance is created or removed tick after tick."""
    h = TickHarness(20)
    for _ in range(8):
        h.tick()
    states = {i.state.value for i in h.state.instances.values()}
    assert len(h.state.instances) == 20 * INSTANCES_PER_DEPLOYMENT and states <= {"Ready", "Busy"}
    assert all(d.replicas == INSTANCES_PER_DEPLOYMENT for d in h.state.desired.values())
    # The scale memories every deployment changes on each 1 s bucket travel as one command (one per
    # deployment would fill a whole batch at 10,000 deployments).
    assert h.max_commands == 1


def test_cli_json(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "bench", "tick", "--deployments", "100", "--ticks", "2",
         "--json", "--out", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert [row["deployments"] for row in r["sizes"]] == [100] and r["sizes"][0]["ticks"] == 2
    assert "--deployments 100 --ticks 2" in r["command"] and (tmp_path / "bench-tick.md").is_file()


def test_targets_are_judged_on_the_tick_p99(tmp_path: Path, monkeypatch) -> None:
    from controlplane.bench import tick

    monkeypatch.setitem(tick.TARGET_MS, 50, 1e6)
    monkeypatch.setitem(tick.TARGET_MS, 60, 1e-6)
    r = run_bench((50, 60), tmp_path, ticks={50: 2, 60: 2}, memory=False, show_progress=False, pin=False)
    assert r["verdict"]["50"]["met"] is True and r["verdict"]["60"]["met"] is False
    assert r["sizes"][1]["target_ratio"] > 1 and "MISSED" in (tmp_path / "bench-tick.md").read_text()


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    from controlplane.cli.main import main

    assert main(["bench", "tick", "--deployments", "0", "--out", str(tmp_path)]) == 2
    assert main(["bench", "tick", "--ticks", "0", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
