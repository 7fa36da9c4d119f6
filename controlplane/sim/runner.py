"""Build a simulation from a scenario (or a trace), run it, and render its results."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from controlplane.domain.ids import DeploymentId
from controlplane.sim.engine import Simulation
from controlplane.sim.metrics import SimResult
from controlplane.sim.scenario import (
    GeneratedWorkload,
    Scenario,
    TraceWorkload,
    load_scenario,
    scenario_from_data,
)
from controlplane.sim.workload import GeneratorSpec, Request, generate, read_azure_trace

BUILTIN = ("demo",)


def builtin_scenario(name: str) -> Scenario:
    if name not in BUILTIN:
        raise ValueError(f"unknown built-in scenario {name!r} (known: {', '.join(BUILTIN)})")
    ref = resources.files("controlplane.sim") / "scenarios" / f"{name}.yaml"
    with resources.as_file(ref) as path:
        return load_scenario(path)


def trace_scenario(trace: str, *, model: str, engine: str, rate_scale: float, seed: int) -> Scenario:
    """A single-tenant scenario around one trace: three zones with 16 H100s each."""
    data = {
        "name": f"trace:{Path(trace).name}",
        "seed": seed,
        "clusters": [
            {"id": f"gpu-{z}1", "zone": f"az-{z}", "capacity": {"h100": 16}} for z in ("a", "b", "c")
        ],
        "tenants": [{"id": "tenant", "priority": 100, "quota": {"h100": 48}, "slo": {"ttft_p99_ms": 2000}}],
        "deployments": [
            {
                "id": "trace",
                "tenant": "tenant",
                "engine": engine,
                "model": model,
                "pool": "h100",
                "min_replicas": 1,
                "max_replicas": 12,
                "warm_pool": 0,  # a 4-GPU model: a sleeping instance costs more than it saves here (docs/performance.md)
                "workload": {"trace": str(Path(trace).resolve()), "rate_scale": rate_scale},
            }
        ],
    }
    return scenario_from_data(data, source="--trace", base_dir=Path.cwd())


def workloads_of(scenario: Scenario, seed: int) -> dict[DeploymentId, list[Request]]:
    out: dict[DeploymentId, list[Request]] = {}
    for spec in scenario.spec.deployments:
        w = spec.workload
        offset_ms = int(w.offset_s * 1000)
        if isinstance(w, TraceWorkload):
            path = Path(w.trace)
            path = path if path.is_absolute() else scenario.base_dir / path
            reqs = read_azure_trace(path, rate_scale=w.rate_scale, limit_s=w.limit_s)
            out[DeploymentId(spec.id)] = [Request(r.arrival_ms + offset_ms, r.prompt_tokens, r.output_tokens) for r in reqs]
        elif isinstance(w, GeneratedWorkload):
            gen = GeneratorSpec(**w.generator.model_dump())
            out[DeploymentId(spec.id)] = generate(gen, random.Random(f"{seed}:workload:{spec.id}"), start_ms=offset_ms)
    return out


def run(scenario: Scenario, seed: int, *, progress: Callable[[int, int], None] | None = None, logger=None) -> SimResult:
    sim = Simulation(scenario, workloads_of(scenario, seed), seed=seed, progress=progress, logger=logger)
    result = sim.run()
    result.summary["scenario"] = scenario.spec.name
    return result


def to_json(result: SimResult) -> str:
    """Canonical JSON: sorted keys, so equal results are byte-identical."""
    return json.dumps(result.summary, sort_keys=True, indent=2)
