"""``controlplane bench fleet``: a fleet of tenants on one GPU pool, replayed once per policy.

Every policy (:mod:`controlplane.bench.fleet_policies`) runs on the same fleet file, seed and
service model, in its own process (``--jobs``). Request figures come from the simulator's
:class:`~controlplane.sim.metrics.Collector`; the fleet figures (claims and preemption success,
loops, time to capacity, warm-pool hit rate, time held below quota, the pool invariant) from a
:class:`~controlplane.sim.fleet_metrics.FleetObserver`. Definitions: docs/fleet-bench.md.

Outputs, all in ``--out`` and written into a temporary folder beside it that replaces it only when
everything is written (a failed run leaves ``--out`` as it was): ``results.json`` (schema
``docs/fleet-results.schema.json``; same fleet and seed give byte-identical files: nothing
machine-dependent is in it), ``report.md``, ``gpus_by_tenant.png``, ``attainment_vs_gpu_hours.png``
and ``timings.json`` (wall times and load average: machine-dependent, so kept apart).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from controlplane.bench import fleet_policies as fp
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.ids import DeploymentId
from controlplane.domain.profiles import PROFILES
from controlplane.sim import baselines as b
from controlplane.sim import runner
from controlplane.sim.engine import Simulation
from controlplane.sim.fleet_metrics import LOOP_WINDOW_MS, FleetObserver
from controlplane.sim.scenario import Scenario, load_scenario
from controlplane.sim.workload import Request

SCHEMA_ID = "controlplane.fleet-results/1"
BUILTIN_FLEET = "fleet"
"""The built-in fleet's resource name in ``controlplane/sim/scenarios`` (until fleet.yaml lands: demo)."""
TOP_ATTAINMENT_GOAL = 0.99
PREEMPTION_SUCCESS_GOAL = 0.993
load_fleet_file: Callable[[str | Path], Scenario] = load_scenario
"""How a ``--fleet`` file is read (the fleet-file loader replaces the scenario loader at merge)."""
workloads_of: Callable[[Scenario, int], dict[DeploymentId, list[Request]]] = runner.workloads_of


def _shortfall(scenario: Scenario, workloads: Mapping[DeploymentId, Sequence[Request]]) -> Mapping[str, Any]:
    from controlplane.sim.fleet import fleet_shortfall

    return {pool: s.as_dict() for pool, s in fleet_shortfall(scenario, workloads).items()}


shortfall_of: Callable[[Scenario, Mapping[DeploymentId, Sequence[Request]]], Mapping[str, Any]] | None = _shortfall
"""Per pool, peak demand (what the oracle holds) against the pool (:func:`controlplane.sim.fleet.fleet_shortfall`,
JSON-able); None: not reported (``fleet.shortfall`` is null)."""


def builtin_fleet_text() -> str:
    return (resources.files("controlplane.sim") / "scenarios" / f"{BUILTIN_FLEET}.yaml").read_text(encoding="utf-8")


def load_fleet(path: str | None) -> Scenario:
    if path is None:
        ref = resources.files("controlplane.sim") / "scenarios" / f"{BUILTIN_FLEET}.yaml"
        with resources.as_file(ref) as p:
            return load_fleet_file(p)
    return load_fleet_file(path)


def cut(scenario: Scenario, workloads: Mapping[DeploymentId, Sequence[Request]], limit_s: float | None):
    """The fleet and workloads limited to the first ``limit_s`` simulated seconds (None: all)."""
    if limit_s is None:
        return scenario, dict(workloads)
    dur = scenario.spec.duration_s
    end_s = limit_s if dur is None else min(dur, limit_s)
    spec = scenario.spec.model_copy(update={"duration_s": end_s})
    limit_ms = int(end_s * 1000)
    kept = {k: [r for r in v if r.arrival_ms < limit_ms] for k, v in workloads.items()}
    return dataclasses.replace(scenario, spec=spec), kept


def required_of(scenario: Scenario, workloads: Mapping[DeploymentId, Sequence[Request]]) -> dict[DeploymentId, list[float]]:
    """Per deployment, the clairvoyant per-second need (``baselines.required_replicas``)."""
    slo = {t.id: t.slo.ttft_p99_ms for t in scenario.tenants}
    out = {}
    for d in scenario.deployments:
        reqs = [b.RequestShape(r.arrival_ms, r.prompt_tokens, r.output_tokens) for r in workloads.get(d.id, [])]
        last_s = max((r.arrival_ms for r in reqs), default=0) // 1000 + 1
        out[d.id] = b.required_replicas(reqs, PROFILES[d.model], slo_ms=slo[d.tenant], duration_s=last_s)
    return out


# --- one policy (runs in a worker process) ---------------------------------------------------------

def prepare(fleet_path: str | None, seed: int, limit_s: float | None):
    """The fleet and its workloads as every policy replays them (bad files and traces fail here)."""
    scenario = load_fleet(fleet_path)
    return cut(scenario, workloads_of(scenario, seed), limit_s)


def run_policy(name: str, fleet_path: str | None, seed: int, limit_s: float | None,
               progress: Callable[[int, int], None] | None = None, prepared=None) -> dict[str, Any]:
    """One policy's replay. ``prepared``: :func:`prepare`'s result when the caller has it (a worker
    process rebuilds it: the workloads are seeded, so every process gets the same requests)."""
    scenario, workloads = prepared if prepared is not None else prepare(fleet_path, seed, limit_s)
    policy = fp.registry()[name]
    if policy.build is None:
        raise ControlPlaneError(f"policy {name}: unavailable: {policy.unavailable}")
    started = time.perf_counter()
    setup = policy.build(fp.FleetContext(scenario, workloads, seed))
    extra = {"allocator": setup.allocator} if setup.allocator is not None else {}
    observer = FleetObserver(scenario, required_of(scenario, workloads))
    sim = Simulation(scenario, workloads, seed=seed, progress=progress, policy=setup.policy, observers=(observer,), **extra)
    try:
        result = sim.run()
    finally:
        if setup.policy is not None:
            setup.policy.close()  # Dynamo's planners own asyncio event loops
    return {"name": name, "summary": result.summary, "fleet": observer.finish(sim.end_ms),
            "timeline": {"t_s": observer.timeline_t_s, "gpus_by_tenant": observer.gpus_by_tenant},
            "wall_s": time.perf_counter() - started}


_QUEUE = None


def _worker_init(queue) -> None:
    global _QUEUE
    _QUEUE = queue


def _worker(name: str, fleet_path: str | None, seed: int, limit_s: float | None) -> dict[str, Any]:
    queue = _QUEUE

    def progress(now_ms: int, end_ms: int) -> None:
        if queue is not None:
            queue.put((name, now_ms, end_ms))

    return run_policy(name, fleet_path, seed, limit_s, progress)


def run_all(names: Sequence[str], fleet_path: str | None, seed: int, limit_s: float | None, *, jobs: int,
            show_progress: bool, prepared=None) -> dict[str, dict[str, Any]]:
    with _Bars(show_progress, names) as bars:
        if jobs <= 1 or len(names) <= 1:
            runs = {}
            for n in names:
                runs[n] = run_policy(n, fleet_path, seed, limit_s, bars.callback(n), prepared)
                bars.finish(n)
            return runs
        import concurrent.futures as cf
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue() if show_progress else None
        out: dict[str, dict[str, Any]] = {}
        with cf.ProcessPoolExecutor(max_workers=min(jobs, len(names)), mp_context=ctx,
                                    initializer=_worker_init, initargs=(queue,)) as pool:
            futures = {pool.submit(_worker, n, fleet_path, seed, limit_s): n for n in names}
            pending = set(futures)
            while pending:
                done, pending = cf.wait(pending, timeout=0.25, return_when=cf.FIRST_COMPLETED)
                bars.drain(queue)
                for f in done:
                    out[futures[f]] = f.result()  # a worker's exception ends the benchmark here
                    bars.finish(futures[f])
        return {n: out[n] for n in names}


class _Bars:
    """One rich progress bar per policy on stderr (hidden when not a terminal / --no-progress)."""

    def __init__(self, show: bool, names: Sequence[str]) -> None:
        self._show, self._names = show, list(names)
        self._bar = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> _Bars:
        if self._show:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]{task.description:<18}"), BarColumn(), TextColumn("{task.fields[sim]}"),
                                 TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
            self._bar.__enter__()
            self._tasks = {n: self._bar.add_task(n, total=1.0, sim="waiting") for n in self._names}
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def update(self, name: str, now_ms: int, end_ms: int) -> None:
        if self._bar is not None:
            self._bar.update(self._tasks[name], completed=now_ms / max(1, end_ms),
                             sim=f"{now_ms / 1000:,.0f}/{end_ms / 1000:,.0f} s simulated")

    def finish(self, name: str) -> None:
        if self._bar is not None:
            self._bar.update(self._tasks[name], completed=1.0, sim="done")

    def callback(self, name: str) -> Callable[[int, int], None] | None:
        if self._bar is None:
            return None
        return lambda now, end: self.update(name, now, end)

    def drain(self, queue) -> None:
        import queue as q

        while queue is not None:
            try:
                name, now, end = queue.get_nowait()
            except q.Empty:
                return
            self.update(name, now, end)


# --- results -----------------------------------------------------------------------------------

_REQUEST_FIELDS = ("requests", "completed", "dropped", "slo_attainment", "ttft_ms", "gpu_hours", "preemptions",
                   "scale_reversals", "cold_starts", "warm_starts")


def _merge(collector: Mapping[str, Any], fleet: Mapping[str, Any]) -> dict[str, Any]:
    row = {k: collector[k] for k in _REQUEST_FIELDS}
    row["ttft_ms"] = {"p50": collector["ttft_ms"]["p50"], "p99": collector["ttft_ms"]["p99"]}
    if "slo_ttft_ms" in collector:
        row["slo_ttft_ms"] = collector["slo_ttft_ms"]
    return {**row, **fleet}


def policy_entry(policy: fp.FleetPolicy, run: Mapping[str, Any] | None) -> dict[str, Any]:
    if run is None:
        return {"policy": policy.name, "available": False, "description": policy.description, "reason": policy.unavailable}
    s, f = run["summary"], run["fleet"]
    return {
        "policy": policy.name, "available": True, "description": policy.description, "reason": None,
        "simulated_s": s["simulated_s"], "ticks": s["ticks"],
        "total": _merge(s["total"], f["total"]),
        "tenants": {t: _merge(s["tenants"][t], f["tenants"][t]) for t in sorted(s["tenants"])},
        "deployments": {d: _merge(s["deployments"][d], f["deployments"][d]) for d in sorted(s["deployments"])},
        "invariants": f["invariants"],
    }


def fleet_entry(scenario: Scenario, source: str, limit_s: float | None,
                shortfall: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "shortfall": None if shortfall is None else json.loads(json.dumps(shortfall, sort_keys=True)),
        "name": scenario.spec.name,
        "source": source,
        "limit_s": limit_s,
        "tick_ms": scenario.spec.tick_ms,
        "preemption_grace_ms": scenario.spec.preemption_grace_ms,
        "pools": dict(sorted(fp.pool_capacity(scenario).items())),
        "clusters": [{"id": c.id, "zone": c.zone, "capacity": dict(sorted(c.capacity.items()))}
                     for c in sorted(scenario.clusters, key=lambda c: c.id)],
        "tenants": [{"id": t.id, "priority": t.priority, "quota": dict(sorted(t.quota.items())),
                     "borrow_limit": dict(sorted(t.borrow_limit.items())), "ttft_slo_ms": t.slo.ttft_p99_ms}
                    for t in sorted(scenario.tenants, key=lambda t: (-t.priority, t.id))],
        "deployments": [{"id": d.id, "tenant": d.tenant, "engine": d.engine.value, "model": d.model, "pool": d.pool,
                         "gpus_per_instance": d.gpus_per_instance, "min_replicas": d.min_replicas,
                         "max_replicas": d.max_replicas, "warm_pool": d.warm_pool}
                        for d in sorted(scenario.deployments, key=lambda d: d.id)],
    }


def top_tenant(fleet: Mapping[str, Any]) -> str:
    return fleet["tenants"][0]["id"]  # sorted by priority descending, then id


def targets(entries: Sequence[Mapping[str, Any]], fleet: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's targets for ``controlplane`` against the baselines that ran (empty without it)."""
    by = {e["policy"]: e for e in entries if e["available"]}
    ours = by.get("controlplane")
    if ours is None:
        return {}
    top = top_tenant(fleet)
    bases = [by[n] for n in fp.BASELINES if n in by]
    att = ours["tenants"][top]["slo_attainment"]
    base_att = {e["policy"]: e["tenants"][top]["slo_attainment"] for e in bases}
    best = max((v for v in base_att.values() if v is not None), default=None)
    same = [e for e in bases if (e["tenants"][top]["slo_attainment"] or 0) >= (att or 0)]
    gh = ours["total"]["gpu_hours"]
    success = ours["total"]["preemption_success"]
    starved = ours["invariants"]["no_tenant_starved_below_quota"]["starved_s"]
    return {
        "top_tenant": top,
        "baselines_run": [e["policy"] for e in bases],
        "baselines_missing": [e["policy"] for e in entries if not e["available"] and e["policy"] in fp.BASELINES],
        "top_tenant_attainment": {"ours": att, "goal": TOP_ATTAINMENT_GOAL, "baselines": base_att, "best_baseline": best,
                                  "met": att is not None and att >= TOP_ATTAINMENT_GOAL and (best is None or att >= best)},
        "gpu_hours_vs_baselines": {"ours": gh, "compared": {e["policy"]: e["total"]["gpu_hours"] for e in same},
                                   "met": all(gh <= e["total"]["gpu_hours"] for e in same)},
        "preemption_success": {"ours": success, "goal": PREEMPTION_SUCCESS_GOAL,
                               "claims": ours["total"]["claims"],
                               "met": None if success is None else success >= PREEMPTION_SUCCESS_GOAL},
        "preemption_loops": {"ours": ours["total"]["preemption_loops"], "met": ours["total"]["preemption_loops"] == 0},
        "no_tenant_starved": {"starved_s": starved, "met": not starved},
    }


def build_results(scenario: Scenario, source: str, seed: int, limit_s: float | None,
                  selected: Sequence[fp.FleetPolicy], runs: Mapping[str, Mapping[str, Any]],
                  shortfall: Mapping[str, Any] | None = None) -> dict[str, Any]:
    fleet = fleet_entry(scenario, source, limit_s, shortfall)
    entries = [policy_entry(p, runs.get(p.name)) for p in selected]
    return {
        "schema": SCHEMA_ID,
        "seed": seed,
        "fleet": fleet,
        "parameters": {"loop_window_s": LOOP_WINDOW_MS / 1000, "top_attainment_goal": TOP_ATTAINMENT_GOAL,
                       "preemption_success_goal": PREEMPTION_SUCCESS_GOAL},
        "policies": entries,
        "targets": targets(entries, fleet),
    }


def canonical(results: Mapping[str, Any]) -> str:
    return json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n"


# --- the command -----------------------------------------------------------------------------------

def _atomic_out(out: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a new folder beside ``out``, then swap it in; on any error ``out`` is untouched."""
    out = out.resolve()
    parent = out.parent
    if out == parent:
        raise ControlPlaneError(f"--out: {out} cannot be replaced (give a folder of its own)")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise ControlPlaneError(f"--out: cannot create a folder in {parent}: {exc.strerror or exc}") from None
    try:
        write(tmp)
        old = None
        if out.exists() or out.is_symlink():
            if not out.is_dir():
                raise ControlPlaneError(f"--out: {out} exists and is not a folder")
            old = parent / f".{out.name}.{os.getpid()}.old"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ControlPlaneError(f"--out: cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def run_cli(*, fleet: str | None, out: str, as_json: bool, seed: int | None, limit_s: float | None,
            policies: str | None, jobs: int | None, print_fleet: bool, progress: bool | None = None) -> int:
    from controlplane.bench import fleet_report

    if print_fleet:
        sys.stdout.write(builtin_fleet_text())
        return 0
    if limit_s is not None and not (limit_s > 0 and math.isfinite(limit_s)):
        raise ControlPlaneError(f"--limit-s: must be a positive number of seconds, got {limit_s}")
    if Path(out).exists() and not Path(out).is_dir():
        raise ControlPlaneError(f"--out: {out} exists and is not a folder")
    if Path(out).resolve() == Path(out).resolve().parent:
        raise ControlPlaneError(f"--out: {out} cannot be replaced (give a folder of its own)")
    if jobs is not None and jobs < 1:
        raise ControlPlaneError(f"--jobs: must be >= 1, got {jobs}")
    jobs = jobs or min(2, os.cpu_count() or 1)
    selected = fp.select(policies)
    if seed is None:
        seed = load_fleet(fleet).spec.seed
    started = time.perf_counter()
    # Bad fleet files and traces fail here, before anything is simulated or written.
    prepared = prepare(fleet, seed, limit_s)
    scenario = prepared[0]
    runnable = [p.name for p in selected if p.build is not None]
    show = sys.stderr.isatty() if progress is None else progress
    runs = run_all(runnable, fleet, seed, limit_s, jobs=jobs, show_progress=show, prepared=prepared)
    wall = time.perf_counter() - started
    source = f"builtin:{BUILTIN_FLEET}" if fleet is None else Path(fleet).name
    shortfall = shortfall_of(*prepared) if shortfall_of is not None else None
    results = build_results(scenario, source, seed, limit_s, selected, runs, shortfall)
    text = canonical(results)
    load = [round(x, 2) for x in os.getloadavg()]
    timings = {"wall_s": round(wall, 3), "jobs": jobs, "cpus": os.cpu_count(), "load_average": load,
               "policies_wall_s": {n: round(r["wall_s"], 3) for n, r in runs.items()}}

    def write(tmp: Path) -> None:
        (tmp / "results.json").write_text(text, encoding="utf-8")
        (tmp / "timings.json").write_text(json.dumps(timings, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (tmp / "report.md").write_text(fleet_report.markdown(results), encoding="utf-8")
        fleet_report.plots(results, runs, tmp)

    out_dir = Path(out)
    _atomic_out(out_dir, write)
    print(f"bench fleet: {len(runnable)} policies in {wall:.1f} s wall (jobs {jobs}, load average "
          f"{' '.join(f'{x:.2f}' for x in load)})", file=sys.stderr)
    if as_json:
        sys.stdout.write(text)
    else:
        print(fleet_report.totals_table(results))
        print(f"\nwrote {out_dir / 'results.json'}, {out_dir / 'report.md'} and plots")
    broken = [e["policy"] for e in results["policies"]
              if e["available"] and not e["invariants"]["pool_never_exceeded"]["ok"]]
    if broken:
        print(f"bench fleet: GPUs in use exceeded the pool under {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


__all__ = ["run_all", "run_cli", "run_policy", "build_results", "canonical"]
