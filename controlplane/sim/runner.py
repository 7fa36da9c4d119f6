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
from controlplane.sim.rates import arrivals, lengths_from_pairs, plan, read_rate_series
from controlplane.sim.scenario import (
    MAX_GENERATED_REQUESTS,
    GeneratedWorkload,
    RateSeriesWorkload,
    Scenario,
    ScenarioError,
    TraceWorkload,
    load_scenario,
    scenario_from_data,
)
from controlplane.sim.workload import GeneratorSpec, Request, generate, lognormal_int, read_azure_trace

BUILTIN = ("demo", "fleet")


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
    """Each deployment's requests, in arrival order; seeded per deployment (``"<seed>:workload:<id>"``).
    A trace that is malformed raises its :class:`~controlplane.sim.workload.TraceError` naming
    ``FILE:LINE``."""
    out: dict[DeploymentId, list[Request]] = {}
    traces: dict[tuple[Path, float, float, float | None], list[Request]] = {}

    def trace(path: Path, rate_scale: float = 1.0, skip_s: float = 0.0, limit_s: float | None = None) -> list[Request]:
        key = (path, rate_scale, skip_s, limit_s)
        if key not in traces:
            traces[key] = read_azure_trace(path, rate_scale=rate_scale, skip_s=skip_s, limit_s=limit_s)
        return traces[key]

    for i, spec in enumerate(scenario.spec.deployments):
        w = spec.workload
        offset_ms = int(w.offset_s * 1000)
        rng = random.Random(f"{seed}:workload:{spec.id}")
        if isinstance(w, TraceWorkload):
            reqs = trace(scenario.path(w.trace), w.rate_scale, w.skip_s, w.limit_s)
            out[DeploymentId(spec.id)] = [Request(r.arrival_ms + offset_ms, r.prompt_tokens, r.output_tokens) for r in reqs]
        elif isinstance(w, RateSeriesWorkload):
            out[DeploymentId(spec.id)] = _rate_series(scenario, i, w, rng, offset_ms, trace)
        elif isinstance(w, GeneratedWorkload):
            gen = GeneratorSpec(**w.generator.model_dump())
            bursts = random.Random(f"{seed}:bursts:{gen.burst_group}") if gen.burst_group else None
            out[DeploymentId(spec.id)] = generate(gen, rng, start_ms=offset_ms, burst_rng=bursts)
    return out


def _rate_series(scenario: Scenario, i: int, w: RateSeriesWorkload, rng: random.Random, offset_ms: int,
                 trace: Callable[[Path], list[Request]]) -> list[Request]:
    series = read_rate_series(scenario.path(w.rates))
    rate_plan = plan(series, time_compression=w.time_compression, rate_scale=w.rate_scale, from_s=w.from_s,
                     to_s=w.to_s, linear=w.interpolation == "linear")
    expected = rate_plan.expected_requests()
    if expected > MAX_GENERATED_REQUESTS:
        where = scenario.where("deployments", i, "workload", "rate_scale")
        raise ScenarioError(f"{where}: deployments[{i}].workload: the series x rate_scale / time_compression "
                            f"asks for {expected:.3g} requests, more than {MAX_GENERATED_REQUESTS}")
    if w.lengths_from is not None:
        pairs = [(r.prompt_tokens, r.output_tokens) for r in trace(scenario.path(w.lengths_from))]
        if not pairs:
            where = scenario.where("deployments", i, "workload", "lengths_from")
            raise ScenarioError(f"{where}: deployments[{i}].workload.lengths_from: the trace has no requests")
        lengths = lengths_from_pairs(pairs)
    else:
        prompt, output = w.prompt_mean or 1200.0, w.output_mean or 200.0

        def lengths(r: random.Random) -> tuple[int, int]:
            return lognormal_int(r, prompt), lognormal_int(r, output)

    return arrivals(rate_plan, rng, lengths, start_ms=offset_ms)


def run(scenario: Scenario, seed: int, *, progress: Callable[[int, int], None] | None = None, logger=None) -> SimResult:
    sim = Simulation(scenario, workloads_of(scenario, seed), seed=seed, progress=progress, logger=logger)
    result = sim.run()
    result.summary["scenario"] = scenario.spec.name
    return result


def to_json(result: SimResult) -> str:
    """Canonical JSON: sorted keys, so equal results are byte-identical."""
    return json.dumps(result.summary, sort_keys=True, indent=2)
