"""``controlplane bench raft`` end to end, short: 3 coordinator processes and 3 bare pysyncobj
processes on 127.0.0.1, 30 commits, 2 failover trials each. Checks the JSON shape, that every number
is positive and consistent, and the report files. Bounded: the run gets 90 s, every child process is
stopped by the bench itself (and a member exits when its stdin closes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.bench.raft import nearest_rank, summary

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 90
TRIALS = 2
COMMITS = 30


def _check_summary(s: dict, n: int) -> None:
    assert s["n"] == n
    assert 0 < s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"], s
    assert s["min"] <= s["mean"] <= s["max"], s


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_bench_raft_short_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}  # the defaults
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "bench", "raft", "--json",
         "--trials", str(TRIALS), "--commits", str(COMMITS), "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)

    assert r["benchmark"] == "raft"
    assert r["params"]["trials"] == TRIALS and r["params"]["commits"] == COMMITS
    assert r["params"]["batch_commands"] > 0 and r["params"]["batch_bytes"] > 0
    cfg = r["config"]["coordinator"]
    assert cfg["fsync"] == "entry" and r["config"]["coordinator_not_default"] == {}
    assert cfg["raft_min_timeout_ms"] == pytest.approx(r["config"]["bare"]["raftMinTimeout"] * 1000)
    assert r["config"]["bare"]["appendEntriesUseBatch"] is False
    assert "password" not in json.dumps(r["config"]["coordinator"])
    assert r["machine"]["cpus"] >= 1

    for system in ("coordinator", "bare"):
        part = r[system]
        _check_summary(part["latency_ms"], COMMITS)
        assert part["errors"] == 0
        tp = part["throughput"]
        assert tp["committed"] == COMMITS and tp["errors"] == 0
        assert tp["commits_per_s"] > 0 and tp["elapsed_s"] > 0
        _check_summary(tp["latency_ms"], COMMITS)

        fo = part["failover_ms"]
        assert fo["failed"] == 0
        assert len(fo["values"]) == TRIALS and all(v > 0 for v in fo["values"])
        _check_summary(fo, TRIALS)
        assert fo["max"] == max(fo["values"]) and fo["min"] == min(fo["values"])
        assert len(part["trials"]) == TRIALS
        for t in part["trials"]:
            assert t["ok"] and t["confirmed"]["ok"], t
            assert t["new_holder"] != t["killed"]
            assert t["new_epoch"] > t["old_epoch"]
            # the survivor's own timestamps are ordered and end before its report arrived
            assert 0 <= t["elected_ms"] <= t["committed_ms"] <= t["failover_ms"], t
            assert t["authority_ms"] <= t["committed_ms"], t
            assert t["first_commit_ms"] >= 0
    # the lease is the point: the coordinator's failover waits for the old lease to run out
    co = r["coordinator"]
    wait = r["verdict"]["contender_lease_wait_ms"]
    for t in co["trials"]:
        assert t["confirmed"]["lease_remaining_ms"] > 0
        assert t["acquire_sent_ms"] is not None and t["acquire_allowed_ms"] is not None
        assert t["acquire_allowed_ms"] <= t["acquire_sent_ms"] <= t["authority_ms"], t
        assert t["failover_ms"] >= wait - r["config"]["coordinator"]["lease_renew_ms"] - 50, t
    assert co["durability"]["fsync"] == "entry" and co["durability"]["fsyncs"] > 0

    for key in ("commit_p50", "commit_p99", "throughput", "failover_p50", "failover_p90", "failover_p99", "failover_max"):
        assert r["ratios"][key] > 0, key
    assert r["ratios"]["failover_p50"] == pytest.approx(co["failover_ms"]["p50"] / r["bare"]["failover_ms"]["p50"], abs=0.01)
    assert isinstance(r["verdict"]["coordinator_failover_p99_under_target"], bool)

    md = (out / "bench-raft.md").read_text()
    assert "| metric | coordinator | bare pysyncobj |" in md and "failover p99" in md
    assert (out / "bench-raft.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "bench-raft.json").read_text())["ratios"] == r["ratios"]


def test_percentiles_by_nearest_rank() -> None:
    v = [float(x) for x in range(1, 21)]
    assert nearest_rank(v, 50) == 10 and nearest_rank(v, 90) == 18 and nearest_rank(v, 99) == 20
    s = summary([5.0, 1.0, 3.0])
    assert (s["min"], s["p50"], s["max"], s["n"]) == (1.0, 3.0, 5.0, 3)
    assert summary([]) == {"n": 0}


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    from controlplane.cli.main import main

    assert main(["bench", "raft", "--trials", "0", "--out", str(tmp_path)]) == 2
    assert main(["bench", "raft", "--commits", "-1", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
