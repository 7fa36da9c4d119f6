"""``controlplane bench engines``: the same trace served by vLLM, Triton and DeepSpeed-MII (issue 17).

Every row replays one trace (default: the two Azure traces ``bench policies`` uses, read in place)
with ``bench policies``' scenario (:func:`controlplane.bench.policies.scenario_for`: three zones of
16 H100s, one ``llama3-70b-h100x4`` deployment, 1..12 replicas, TTFT SLO 2 s, no warm pool), the
same seed and this project's policy with each engine's defaults (``domain.tenants.engine_policy``:
Triton queue p95 target 120 ms, MII token utilisation 0.85); only the engine (and its service model,
:mod:`controlplane.sim.service_models`) changes:

* ``vllm``: the reference (continuous batching, every load signal known);
* ``triton``: Triton's dynamic batcher with a batch-executing backend (the simulator's Triton default);
* ``deepspeed-mii``: MII FastGen seen through the request meter (the default);
* ``triton-trtllm``: Triton with the TensorRT-LLM backend's in-flight batching;
* ``deepspeed-mii-no-meter``: MII without its meter (no load known: never scaled down, scaled up on
  the probe-latency TTFT proxy only).

Target (:data:`TARGET_ROWS` against ``vllm``): SLO attainment within :data:`SLO_POINTS` point and
at most :data:`GPU_HOURS_RATIO` x the GPU-hours. Every row also reports its scale-downs and how many
were taken while the load was not wholly known (``scale_downs.load_not_known``, expected 0).
Output: JSON on stdout (``--json``) or a table; ``--out`` gets ``results.json``. The JSON carries
``/proc/loadavg`` at the start and the end of the run (wall time only depends on it; the figures,
being simulated, do not).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controlplane.bench.policies import default_traces, run_policy, scenario_for
from controlplane.bench.stability import _loadavg
from controlplane.domain.errors import ControlPlaneError
from controlplane.sim.scenario import Scenario, scenario_from_data

ROWS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("vllm", "vllm", {}),
    ("triton", "triton", {}),
    ("deepspeed-mii", "deepspeed-mii", {}),
    ("triton-trtllm", "triton", {"triton": {"batching": "inflight"}}),
    ("deepspeed-mii-no-meter", "deepspeed-mii", {"mii": {"meter": False}}),
)
"""(row, engine, deployment options)."""
REFERENCE = "vllm"
TARGET_ROWS = ("triton", "deepspeed-mii")
SLO_POINTS = 1.0
"""Attainment may be at most this many percentage points below the vLLM row's."""
GPU_HOURS_RATIO = 1.10
"""GPU-hours may be at most this multiple of the vLLM row's."""


def engine_scenario(trace: Path, engine: str, options: dict[str, Any], *, seed: int,
                    limit_s: float | None = None) -> Scenario:
    """``bench policies``' scenario for ``trace`` with its deployment served by ``engine``."""
    base = scenario_for(trace, seed=seed, limit_s=limit_s)
    raw = base.spec.model_dump(mode="python", exclude_unset=True, exclude={"deployments"})
    raw["deployments"] = [{**d.model_dump(mode="python", exclude_unset=True, exclude={"workload"}),
                           "workload": d.workload.model_dump(mode="python", exclude_unset=True),
                           "engine": engine, **options} for d in base.spec.deployments]
    return scenario_from_data(raw, source=f"bench engines:{engine}", base_dir=Path.cwd())


def row_of(name: str, engine: str, summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    (dep,) = summary["deployments"].values()
    return {
        "row": name, "engine": engine, "requests": dep["requests"], "completed": dep["completed"],
        "dropped": dep["dropped"], "slo_attainment": dep["slo_attainment"], "ttft_ms": dep["ttft_ms"],
        "gpu_hours": dep["gpu_hours"], "cold_starts": dep["cold_starts"], "scale_reversals": dep["scale_reversals"],
        "scale_downs": dep["scale_downs"], "wall_s": round(wall_s, 2),
    }


def targets(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each :data:`TARGET_ROWS` row against the vLLM row."""
    by = {r["row"]: r for r in rows}
    ref = by.get(REFERENCE)
    out: dict[str, Any] = {}
    if ref is None:
        return out
    for name, r in by.items():
        if name == REFERENCE:
            continue
        points = round((r["slo_attainment"] - ref["slo_attainment"]) * 100, 3)
        ratio = round(r["gpu_hours"] / ref["gpu_hours"], 4) if ref["gpu_hours"] else None
        out[name] = {
            "slo_points_vs_vllm": points, "gpu_hours_ratio_vs_vllm": ratio,
            "slo_ok": points >= -SLO_POINTS, "gpu_hours_ok": ratio is not None and ratio <= GPU_HOURS_RATIO,
            "met": points >= -SLO_POINTS and ratio is not None and ratio <= GPU_HOURS_RATIO,
            "target": name in TARGET_ROWS,
            "scale_downs_load_not_known": r["scale_downs"]["load_not_known"],
        }
    return out


def run_benchmark(traces: Sequence[Path], *, seed: int, limit_s: float | None = None,
                  rows: Sequence[str] | None = None) -> dict[str, Any]:
    chosen = [r for r in ROWS if rows is None or r[0] in rows]
    load_start = _loadavg()
    started = time.perf_counter()
    out_traces = []
    for trace in traces:
        entries = []
        for name, engine, options in chosen:
            scenario = engine_scenario(trace, engine, options, seed=seed, limit_s=limit_s)
            run = run_policy("controlplane", scenario, seed)
            entries.append(row_of(name, engine, run.result.summary, run.wall_s))
        out_traces.append({"trace": trace.name, "rows": entries, "targets": targets(entries)})
    met = [t["targets"][n]["met"] for t in out_traces for n in TARGET_ROWS if n in t["targets"]]
    return {
        "benchmark": "engines", "seed": seed, "limit_s": limit_s,
        "parameters": {"slo_points": SLO_POINTS, "gpu_hours_ratio": GPU_HOURS_RATIO, "reference": REFERENCE,
                       "target_rows": list(TARGET_ROWS)},
        "traces": out_traces, "all_targets_met": bool(met) and all(met),
        "loadavg": {"start": load_start, "end": _loadavg()}, "wall_s": round(time.perf_counter() - started, 2),
    }


def table(tr: dict[str, Any]) -> str:
    lines = [f"## {tr['trace']}", "", "| row | SLO attainment | GPU-hours | TTFT p99 ms | cold starts | "
             "scale-downs (load not known) | vs vLLM (points, GPU-h ratio) |", "|---|---|---|---|---|---|---|"]
    for r in tr["rows"]:
        t = tr["targets"].get(r["row"])
        vs = "" if t is None else f"{t['slo_points_vs_vllm']:+.2f}, {t['gpu_hours_ratio_vs_vllm']}" + (
            (" met" if t["met"] else " missed") if t["target"] else "")
        lines.append(f"| {r['row']} | {r['slo_attainment'] * 100:.2f} % | {r['gpu_hours']:.2f} | {r['ttft_ms']['p99']} | "
                     f"{r['cold_starts']} | {r['scale_downs']['taken']} ({r['scale_downs']['load_not_known']}) | {vs} |")
    return "\n".join(lines)


def run_cli(traces: Sequence[str] | None, out: str | None, as_json: bool, seed: int, *,
            limit_s: float | None = None, rows: str | None = None) -> int:
    if limit_s is not None and limit_s <= 0:
        raise ControlPlaneError(f"--limit-s: must be > 0, got {limit_s}")
    names = None
    if rows:
        names = [r.strip() for r in rows.split(",") if r.strip()]
        unknown = sorted(set(names) - {r[0] for r in ROWS})
        if unknown:
            raise ControlPlaneError(f"--rows: unknown {', '.join(unknown)} (known: {', '.join(r[0] for r in ROWS)})")
    paths = [Path(t) for t in traces] if traces else default_traces()
    for p in paths:
        if not p.is_file():
            raise ControlPlaneError(f"--trace: {p} is not a file")
    results = run_benchmark(paths, seed=seed, limit_s=limit_s, rows=names)
    if out:
        out_dir = Path(out)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        except OSError as exc:
            raise ControlPlaneError(f"--out: cannot write {out_dir}: {exc.strerror or exc}") from None
    if as_json:
        print(json.dumps(results, indent=2, sort_keys=True))
    else:
        for tr in results["traces"]:
            print(table(tr) + "\n")
        print(f"targets met: {results['all_targets_met']} (load average {results['loadavg']['start']})", file=sys.stdout)
    return 0


__all__ = ["ROWS", "TARGET_ROWS", "engine_scenario", "run_benchmark", "run_cli", "targets"]
