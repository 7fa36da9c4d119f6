"""`controlplane simulate` as a user runs it: real subprocesses, real traces, real exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRED = {"requests", "slo_attainment", "ttft_ms", "gpu_hours", "scale_reversals", "cold_starts",
            "warm_starts", "preemptions", "dropped"}


def run_cli(*args: str, hashseed: str = "0", timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )


@pytest.mark.parametrize("trace", ["AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv"])
def test_trace_replay_prints_json_and_is_reproducible(traces_dir: Path, trace: str) -> None:
    path = str(traces_dir / trace)
    first = run_cli("simulate", "--trace", path, "--json", "--no-progress", hashseed="1")
    second = run_cli("simulate", "--trace", path, "--json", "--no-progress", hashseed="4242")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout  # byte-identical, whatever the string-hash seed
    result = json.loads(first.stdout)
    n_rows = sum(1 for _ in open(path)) - 1
    assert result["total"]["requests"] == n_rows
    for scope in [result["total"], *result["tenants"].values(), *result["deployments"].values()]:
        assert REQUIRED <= scope.keys()
        assert set(scope["ttft_ms"]) == {"p50", "p99", "p999"}
        assert scope["ttft_ms"]["p50"] <= scope["ttft_ms"]["p99"] <= scope["ttft_ms"]["p999"]
        assert 0.0 <= scope["slo_attainment"] <= 1.0
        assert scope["gpu_hours"] > 0
    assert result["total"]["completed"] + result["total"]["dropped"] == n_rows


def test_seed_changes_the_run(traces_dir: Path) -> None:
    """The seed is really used: different seeds give different (jittered) runs."""
    path = str(traces_dir / "AzureLLMInferenceTrace_code.csv")
    a = run_cli("simulate", "--trace", path, "--json", "--no-progress", "--seed", "1", "--rate-scale", "4")
    b = run_cli("simulate", "--trace", path, "--json", "--no-progress", "--seed", "2", "--rate-scale", "4")
    assert a.returncode == b.returncode == 0
    assert json.loads(a.stdout)["seed"] == 1 and json.loads(b.stdout)["seed"] == 2
    assert json.loads(a.stdout)["total"] != json.loads(b.stdout)["total"]


def test_the_builtin_scenario_prints_a_table_and_plot_is_a_png(tmp_path: Path) -> None:
    out = run_cli("simulate", "--no-progress")  # `controlplane demo` is the full system (tests/system/test_demo.py)
    assert out.returncode == 0, out.stderr
    assert "tenant chat" in out.stdout and "tenant batch" in out.stdout
    png = tmp_path / "demo.png"
    res = run_cli("simulate", "--no-progress", "--plot", str(png), "--json")
    assert res.returncode == 0, res.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads(res.stdout)
    assert summary["tenants"]["batch"]["preemptions"] >= 1  # chat's burst reclaims borrowed GPUs


def test_events_file_has_one_json_line_per_transition(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    res = run_cli("simulate", "--no-progress", "--json", "--events", str(events))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert lines, "no transitions written"
    for rec in lines:
        assert rec["event"] == "instance_transition"
        assert {"instance_id", "from", "to", "latency_ms", "init_method"} <= rec.keys()
        assert rec["init_method"] in ("cold", "cached", "warm", "sleep_l2", "reload")
    summary = json.loads(res.stdout)["total"]
    new_pods = [r for r in lines if (r["from"], r["to"]) == ("Pending", "Warming")]
    wakes = [r for r in lines if (r["from"], r["to"]) == ("Standby", "Warming")]
    assert len(new_pods) == summary["cold_starts"]
    assert len(wakes) == summary["warm_starts"]
    # The demo's clusters have every model pre-fetched (the default): new pods are node-cached
    # starts, and its vLLM deployments wake from sleep level 1.
    assert {r["init_method"] for r in new_pods} == {"cached"}
    assert {r["init_method"] for r in wakes} <= {"warm"}
    assert summary["starts_by_tier"] == {k: v for k, v in
                                         (("cached", len(new_pods)), ("warm", len(wakes))) if v}
    ready = [r for r in lines if (r["from"], r["to"]) == ("Warming", "Ready") and r["latency_ms"] > 0]
    if ready:
        assert summary["start_latency_ms"]["cached"]["count"] == sum(1 for r in ready if r["init_method"] == "cached")


# --- bad input: one clear line naming the file/line/field, non-zero exit, no traceback ----------

def _bad(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_malformed_csv_row_names_file_line_and_field(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,many,8\n"
    )
    _bad(run_cli("simulate", "--trace", str(trace), "--json"), f"{trace}:3", "ContextTokens", "'many'")


@pytest.mark.parametrize(
    ("rows", "needles"),
    [
        ("2023-11-16 18:17:03.9799600,4808\n", (":2", "expected 3 fields")),
        ("yesterday,1,2\n", (":2", "TIMESTAMP")),
        ("2023-11-16 18:17:03.9799600,10,-4\n", (":2", "GeneratedTokens")),
    ],
)
def test_other_malformed_rows(tmp_path: Path, rows: str, needles: tuple[str, ...]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    _bad(run_cli("simulate", "--trace", str(trace)), str(trace), *needles)


def test_missing_trace_file(tmp_path: Path) -> None:
    _bad(run_cli("simulate", "--trace", str(tmp_path / "nope.csv")), "nope.csv", "cannot open")


SCENARIO = """
clusters: [{id: c1, zone: az-a, capacity: {h100: 8}}]
tenants: [{id: t1, priority: 1, quota: {h100: QUOTA}}]
deployments:
  - id: d1
    tenant: t1
    engine: ENGINE
    model: llama3-8b-h100
    pool: h100
    workload: {generator: {duration_s: 30, base_rps: 2}}
EXTRA
"""


def _scenario(tmp_path: Path, quota: str = "4", engine: str = "vllm", extra: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("QUOTA", quota).replace("ENGINE", engine).replace("EXTRA", extra))
    return path


def test_good_scenario_runs(tmp_path: Path) -> None:
    res = run_cli("simulate", "--scenario", str(_scenario(tmp_path)), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["total"]["requests"] > 0


def test_unknown_engine(tmp_path: Path) -> None:
    path = _scenario(tmp_path, engine="tgi")
    _bad(run_cli("simulate", "--scenario", str(path)), str(path), "deployments[0].engine")


def test_negative_quota(tmp_path: Path) -> None:
    path = _scenario(tmp_path, quota="-1")
    _bad(run_cli("simulate", "--scenario", str(path)), str(path), "tenants[0].quota.h100", "greater than or equal to 0")


def test_unknown_field(tmp_path: Path) -> None:
    path = _scenario(tmp_path, extra="colour: blue")
    _bad(run_cli("simulate", "--scenario", str(path)), str(path), "colour", "unknown field")


def test_unknown_tenant_and_model(tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    path.write_text(path.read_text().replace("tenant: t1", "tenant: t9"))
    _bad(run_cli("simulate", "--scenario", str(path)), "deployments[0].tenant", "unknown tenant 't9'")
    path.write_text(path.read_text().replace("tenant: t9", "tenant: t1").replace("llama3-8b-h100", "gpt-9"))
    _bad(run_cli("simulate", "--scenario", str(path)), "deployments[0].model", "unknown model profile")


def test_every_problem_is_printed_one_per_line_with_its_line(tmp_path: Path) -> None:
    path = _scenario(tmp_path, quota="-1", engine="tgi", extra="colour: blue")
    path.write_text(path.read_text().replace("tenant: t1", "tenant: t9"))
    res = run_cli("simulate", "--scenario", str(path))
    assert res.returncode != 0 and "Traceback" not in res.stderr and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("controlplane: error: ")
    lines[0] = lines[0].removeprefix("controlplane: error: ")
    assert lines == [
        f"{path}:3: tenants[0].quota.h100: Input should be greater than or equal to 0, got -1",
        f"{path}:6: deployments[0].tenant: unknown tenant 't9' (tenants: t1)",
        f"{path}:7: deployments[0].engine: Input should be 'vllm', 'triton' or 'deepspeed-mii', got 'tgi'",
        f"{path}:11: colour: unknown field",
    ]


def test_the_builtin_fleet_loads(tmp_path: Path) -> None:
    """Running it takes ~30 s (the fleet benchmark does); here: it is packaged and loads."""
    from controlplane.sim.runner import builtin_scenario

    assert builtin_scenario("fleet").spec.name == "fleet"


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("clusters: [\n  {id: c1\n")
    _bad(run_cli("simulate", "--scenario", str(path)), "broken.yaml", "not valid YAML")


def test_bad_flag_values(tmp_path: Path) -> None:
    _bad(run_cli("simulate", "--plot", str(tmp_path / "x.jpg")), "--plot", ".png")
    res = run_cli("simulate", "--engine", "tgi")
    assert res.returncode == 2 and "invalid choice" in res.stderr and "Traceback" not in res.stderr
