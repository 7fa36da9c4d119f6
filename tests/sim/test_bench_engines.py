"""``controlplane bench engines``, CI-short: the first minutes of a trace per engine, JSON out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.bench import engines


def test_bench_engines_short_prints_json_with_targets_and_load_average(traces_dir: Path) -> None:
    trace = str(traces_dir / "AzureLLMInferenceTrace_code.csv")
    res = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "bench", "engines", "--json", "--trace", trace,
                          "--limit-s", "240", "--rows", "vllm,triton,deepspeed-mii,deepspeed-mii-no-meter"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["benchmark"] == "engines" and out["seed"] == 0 and out["limit_s"] == 240
    assert set(out["loadavg"]) == {"start", "end"}
    (tr,) = out["traces"]
    rows = {r["row"]: r for r in tr["rows"]}
    assert list(rows) == ["vllm", "triton", "deepspeed-mii", "deepspeed-mii-no-meter"]
    assert len({r["requests"] for r in rows.values()}) == 1  # the same trace slice for every engine
    for r in rows.values():
        assert r["scale_downs"]["load_not_known"] == 0
    assert rows["deepspeed-mii-no-meter"]["scale_downs"]["taken"] == 0
    t = tr["targets"]
    assert set(t) == {"triton", "deepspeed-mii", "deepspeed-mii-no-meter"}
    assert t["triton"]["target"] and not t["deepspeed-mii-no-meter"]["target"]
    for name in t:
        r = rows[name]
        assert t[name]["slo_points_vs_vllm"] == pytest.approx((r["slo_attainment"] - rows["vllm"]["slo_attainment"]) * 100, abs=1e-3)
    assert out["all_targets_met"] == all(t[n]["met"] for n in engines.TARGET_ROWS)


def test_targets_compare_with_the_vllm_row() -> None:
    def row(name, slo, gpu):
        return {"row": name, "slo_attainment": slo, "gpu_hours": gpu, "scale_downs": {"load_not_known": 0}}

    t = engines.targets([row("vllm", 0.97, 10.0), row("triton", 0.962, 11.0), row("deepspeed-mii", 0.97, 11.01)])
    assert t["triton"]["met"] and t["triton"]["slo_points_vs_vllm"] == pytest.approx(-0.8)
    assert not t["deepspeed-mii"]["met"] and t["deepspeed-mii"]["slo_ok"] and not t["deepspeed-mii"]["gpu_hours_ok"]
    assert engines.targets([row("triton", 0.9, 1.0)]) == {}


def test_unknown_row_is_one_clear_line() -> None:
    res = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "bench", "engines", "--rows", "vllm,tgi"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "--rows: unknown tgi" in res.stderr
