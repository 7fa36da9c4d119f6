"""``controlplane bench reaction`` end to end, short: 3 coordinator processes and one simulated
adapter on 127.0.0.1, 3 bursts over 3 deployments. Checks the JSON shape, that every latency is
positive and consistent with its breakdown, and the report files. Bounded: the run gets 90 s and
every child process is stopped by the bench itself (a child also exits when its stdin closes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.bench.reaction import SEGMENTS

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 90
BURSTS = 3


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_bench_reaction_short_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "bench", "reaction", "--json", "--bursts", str(BURSTS),
         "--deployments", "3", "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)

    assert r["benchmark"] == "reaction"
    p = r["params"]
    assert p["bursts"] == BURSTS and p["deployments"] == 3 and p["coordinators"] == 3
    assert p["tick_ms"] == p["tick_ms_default"] == 250 and p["fsync"] == "entry"
    lat = r["latency_ms"]
    assert lat["failed"] == 0 and lat["n"] == BURSTS and len(lat["values"]) == BURSTS
    assert 0 < lat["min"] <= lat["p50"] <= lat["p99"] <= lat["max"] < 5_000
    assert [b["burst"] for b in r["bursts"]] == list(range(1, BURSTS + 1))
    assert [b["deployment"] for b in r["bursts"]] == ["burst-00", "burst-01", "burst-02"]
    for b in r["bursts"]:
        assert b["done"] and not b["before_observation"], b
        assert b["action"] == "create" and b["epoch"] >= 1 and b["holder"].startswith("coord-")
        # the adapter's own clock at both ends: step <= first batch showing the burst <= command accepted
        assert b["step_at_ms"] < b["obs_at_ms"] < b["accepted_ms"]
        assert b["latency_ms"] == pytest.approx(b["accepted_ms"] - b["obs_at_ms"], abs=0.01)
        assert b["level"] > b["pre_level"] >= 0 and b["seq"] > 0
        # the breakdown (wall clock of both processes) adds up to the latency
        parts = b["breakdown_ms"]
        assert set(parts) == set(SEGMENTS)
        assert sum(parts.values()) == pytest.approx(b["latency_ms"], abs=0.05)
        assert parts["decide"] > 0 and parts["commit"] > 0 and parts["send"] > 0 and parts["deliver"] >= 0
        assert -5 <= parts["tick_wait"] <= p["tick_ms"] + 100
    for seg in SEGMENTS:
        assert r["breakdown_ms"][seg]["n"] == BURSTS
    assert r["adapter"]["stale_rejected"] == 0 and r["adapter"]["observe_errors"] == 0
    v = r["verdict"]
    assert v["target_p99_ms"] == 100 and v["p99_ms"] == lat["p99"] and v["met"] == (lat["p99"] < 100)

    md = (out / "bench-reaction.md").read_text()
    assert "| ms | p50 | p99 | max |" in md and "tick wait" in md
    assert (out / "bench-reaction.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "bench-reaction.json").read_text())["latency_ms"] == lat


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    from controlplane.cli.main import main

    assert main(["bench", "reaction", "--bursts", "0", "--out", str(tmp_path)]) == 2
    assert main(["bench", "reaction", "--tick-ms", "1", "--out", str(tmp_path)]) == 2
    assert main(["bench", "reaction", "--deployments", "0", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
