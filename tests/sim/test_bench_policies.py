"""`controlplane bench policies` on a short slice of both Azure traces (the full run is documented
in docs/performance.md; CP_SLOW=1 replays a longer slice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import long_mode

POLICIES = ["controlplane", "hpa", "kpa", "static", "oracle"]


@pytest.mark.slow
def test_bench_policies_json_files_and_bound(tmp_path: Path, traces_dir: Path) -> None:
    limit = "900" if long_mode() else "180"
    out = tmp_path / "bench"
    res = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "bench", "policies", "--json", "--out", str(out),
         "--limit-s", limit, "--seed", "3"],
        check=False, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONHASHSEED="0"),
    )
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["seed"] == 3
    assert [t["trace"] for t in result["traces"]] == ["AzureLLMInferenceTrace_code.csv",
                                                      "AzureLLMInferenceTrace_conv.csv"]
    for trace in result["traces"]:
        entries = trace["policies"]
        assert [e["policy"] for e in entries] == POLICIES
        requests = {e["requests"] for e in entries}
        assert len(requests) == 1 and requests.pop() > 0  # the same replay for every policy
        for e in entries:
            assert 0.0 <= e["slo_attainment"] <= 1.0
            assert e["gpu_hours"] > 0
            assert isinstance(e["scale_reversals"], int)
            assert set(e["ttft_ms"]) == {"p50", "p99", "p999"}
            assert e["ttft_ms"]["p50"] <= e["ttft_ms"]["p99"] <= e["ttft_ms"]["p999"]
            assert {"cold_starts", "warm_starts", "preemptions", "dropped", "ratio_to_bound"} <= e.keys()
        by = {e["policy"]: e for e in entries}
        bound = by["oracle"]["gpu_hours"]
        # The clairvoyant bound is the least GPU time that meets the SLO: every policy that serves at
        # least as many requests within the SLO as the oracle uses at least as many GPU-hours (a
        # policy that stays at one replica and misses the SLO may use fewer).
        at_least_as_good = [e for e in entries if e["slo_attainment"] >= by["oracle"]["slo_attainment"]]
        assert len(at_least_as_good) >= 2, entries  # static peak, at least, besides the oracle itself
        assert all(bound <= e["gpu_hours"] for e in at_least_as_good), entries
        assert by["oracle"]["slo_attainment"] >= 0.99
        assert by["oracle"]["ratio_to_bound"] == 1.0
        assert by["static"]["scale_reversals"] == 0
        assert set(trace["targets"]) >= {"slo_vs_best", "gpu_saving_vs_static", "reversal_cut_vs_hpa"}
    assert json.loads((out / "results.json").read_text()) == result
    report = (out / "report.md").read_text()
    assert "| policy | SLO attainment |" in report and "x bound" in report
    for name in ("replicas_code.png", "replicas_conv.png", "ttft_code.png", "ttft_conv.png", "tradeoff.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_bench_policies_rejects_a_missing_trace(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "bench", "policies", "--trace", str(tmp_path / "nope.csv"),
         "--out", str(tmp_path / "o")],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert res.returncode != 0
    assert "nope.csv" in res.stderr and "Traceback" not in res.stderr
