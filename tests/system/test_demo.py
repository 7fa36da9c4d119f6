"""`controlplane demo` (what `make demo` runs), end to end and shortened: three coordinator processes,
three simulated clusters, two tenants created through the API, a bursty workload, a SIGKILL of the
lease holder. It must exit 0, show a real failover (a new lease holder with a newer epoch), scale both
tenants' deployments above their minimums, preempt the low-priority tenant, write the summary JSON and
the PNG, and leave no process behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.waiting import alive

EXE = [sys.executable, "-m", "controlplane.cli.main"]


def test_demo_runs_the_whole_system_fails_over_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    started = time.monotonic()
    res = subprocess.run(EXE + ["demo", "--duration-s", "30", "--no-live", "--out", str(out)],
                         check=False, capture_output=True, text=True, timeout=150)
    elapsed = time.monotonic() - started
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "Traceback" not in res.stderr
    summary = json.loads((out / "demo-summary.json").read_text())
    png = out / "demo.png"
    assert png.read_bytes().startswith(b"\x89PNG") and str(png) in res.stdout

    fo = summary["failover"]
    assert fo["killed"] and fo["new_holder"] and fo["new_holder"] != fo["killed"]
    assert fo["new_epoch"] > fo["killed_epoch"] and 0 < fo["failover_ms"] < 30_000
    assert fo["restarted_at_s"] is not None
    assert "failover:" in res.stdout and f"SIGKILL lease holder {fo['killed']}" in res.stdout

    tenants = summary["tenants"]
    assert set(tenants) == {"gold", "silver", "bronze"}
    assert tenants["gold"]["priority"] > tenants["silver"]["priority"] > tenants["bronze"]["priority"]
    assert {t["deployment"]: t["engine"] for t in tenants.values()} == {
        "chat": "vllm", "embed": "triton", "batch": "deepspeed-mii"}
    for t in tenants.values():
        assert t["peak_serving_replicas"] > t["min_replicas"], t
        assert t["requests"] > 50 and t["slo_attainment"] is not None and t["gpu_seconds"] > 0
    assert tenants["bronze"]["preempted_instances"] > 0 and tenants["gold"]["preempted_instances"] == 0
    assert summary["preemptions"] == tenants["bronze"]["preempted_instances"]
    assert summary["problems"] == []
    assert len(summary["timeline"]) > 20

    pids = summary["coordinator_pids"]
    assert len(pids) == 4  # three, and the killed one restarted
    assert not any(alive(p) for p in pids)
    assert elapsed < 120


def test_demo_rejects_a_bad_flag_in_one_line(tmp_path: Path) -> None:
    res = subprocess.run(EXE + ["demo", "--duration-s", "5", "--out", str(tmp_path)], check=False, capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 2 and "--duration-s" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(EXE + ["demo", "--trace", str(tmp_path / "nope.csv")], check=False, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "--trace" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(EXE + ["demo", "--record-view", str(tmp_path / "no" / "such" / "dir.jsonl")], check=False,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "--record-view" in res.stderr and "Traceback" not in res.stderr


def test_sigterm_during_the_demo_stops_every_process(tmp_path: Path) -> None:
    demo = subprocess.Popen(EXE + ["demo", "--duration-s", "60", "--no-live", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the line with the state folder comes once the coordinators have been started
        head = [demo.stdout.readline() for _ in range(3)]  # the title, the workload, then the state folder
        second = head[-1]
        assert "state and logs in" in second, "".join(head)
        root = Path(second.split("state and logs in ", 1)[1].strip())
        time.sleep(2.0)
        pids = [pid for pid, args in _ps() if str(root) in args]
        assert len(pids) == 3, pids
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(30)
    assert demo.returncode == 130
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
    assert not root.exists()


def _ps() -> list[tuple[int, str]]:
    """(pid, command line) of every process."""
    res = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True)
    out = []
    for line in res.stdout.splitlines():
        pid, _, args = line.strip().partition(" ")
        out.append((int(pid), args))
    return out
