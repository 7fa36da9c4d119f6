"""``controlplane bench tick``: the CPU cost of one leader tick, without I/O, for 100, 1,000 and 10,000
deployments of 10 serving instances each, on one core, and its memory.

What one tick is here: exactly what :meth:`controlplane.runtime.loop.ControlLoop.tick` computes
between the adapters' observations and the commit, on a :class:`~controlplane.domain.state.ControlState`
held in memory:

* ``filter``: the loop's own :meth:`ControlLoop._filter` (per-instance loads, per-deployment
  aggregate, the signal filters' update and views) over one sample per instance;
* ``facts``: :func:`controlplane.core.reconcile.facts` (reports, stuck instances, Ready/Busy from
  the samples);
* ``plan``: :func:`controlplane.core.reconcile.plan` (a scaling decision per deployment, tenant
  allocation and preemption, warm pools, breakers, placement).

The headline, ``tick`` = ``facts`` + ``plan`` + ``forecast`` (decide + plan; the issue's definition);
``full`` adds ``filter``, what the loop also spends per tick. ``forecast`` (issue 16) is what the loop
adds with its forecaster: reading the forecasts (recomputed from the replicated demand history once
per 10 s bucket, so one tick in 40 pays for it) and recording the bucket's demand. Every size is
measured twice in one run, with the forecaster (the production default; each deployment starts with
an hour of history) and without (``reactive``), and the table gives their ratio. Gathering, the fence RPCs, the Raft commit and the
adapter sends (I/O) are not part of it (``controlplane bench reaction`` and ``bench raft`` measure
those).

The fleet: ``N`` deployments (``llama3-8b-h100``, 1 GPU per instance, ``min_replicas`` 1,
``max_replicas`` 40, no warm pool, the default scaling policy) of 10 Ready or Busy instances each,
owned by ``ceil(N / 100)`` tenants of mixed priority whose quotas cover their deployments, spread
over clusters of 1,024 GPUs in three zones with 20 % headroom. Every tick gets a fresh sample per
instance (``at`` = the tick's time, 250 ms apart) whose load keeps each deployment inside its
tolerance band with noise (concurrency 0.9..1.05 x the target per instance), the way a steady
fleet looks; the commands a tick plans and the transitions its facts imply are applied to the state
between ticks (not timed), so scale memories and instance states evolve as on a leader.

Timing: ``time.perf_counter_ns`` around each part, after :data:`WARMUP_TICKS` untimed ticks, in
this process pinned to one CPU (``sched_setaffinity``) with the garbage collector running as
usual. Memory: a separate pass under ``tracemalloc``: the state's size, the extra memory held by the
signal filters, and the peak allocated during one tick above what was held before it.

Output: a rich progress bar on stderr; ``--json``: the result on stdout; always ``--out``/bench-tick.md
and bench-tick.json.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SIZES = (100, 1_000, 10_000)
INSTANCES_PER_DEPLOYMENT = 10
TICK_MS = 250
WARMUP_TICKS = 3
TICKS = {100: 200, 1_000: 60, 10_000: 20}
"""Timed ticks per size (the whole default run takes about a minute on one core)."""
TARGET_MS = {1_000: 100.0, 10_000: 1_000.0}
CLUSTER_GPUS = 1_024
TENANT_SIZE = 100
"""Deployments per tenant."""
SEED = 20260901
MODEL = "llama3-8b-h100"
POOL = "h100"
FILES = ("bench-tick.md", "bench-tick.json")
PARTS = ("filter", "facts", "plan", "forecast", "tick", "full")
FORECAST_GOAL = 1.10
"""Issue 16: the tick with the forecaster at most 10 % slower than without."""


class _Replicator:
    """Just enough of a Replicator for :meth:`ControlLoop._filter` (reads ``state``)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def commit(self, commands: Any, now_ms: int) -> Any:  # pragma: no cover - never called
        raise AssertionError("the tick benchmark commits nothing")


def build_state(n: int, now_ms: int) -> Any:
    """A steady fleet of ``n`` deployments x 10 serving instances (see the module docstring)."""
    from controlplane.domain import commands as c
    from controlplane.domain.instances import InstanceEvent as E
    from controlplane.domain.state import ControlState, apply
    from controlplane.domain.tenants import Deployment, Engine, Tenant
    from controlplane.domain.topology import Cluster

    state = ControlState()
    instances = n * INSTANCES_PER_DEPLOYMENT
    n_clusters = max(3, math.ceil(instances * 1.2 / CLUSTER_GPUS))
    n_tenants = max(1, math.ceil(n / TENANT_SIZE))
    per_tenant = math.ceil(n / n_tenants) * INSTANCES_PER_DEPLOYMENT

    def must(cmd: Any) -> None:
        r = apply(state, cmd)
        if not r.ok:
            raise RuntimeError(f"bench tick: building the state: {cmd.kind}: {r.error}")

    clusters = [f"gpu-{k:03d}" for k in range(n_clusters)]
    for k, cid in enumerate(clusters):
        must(c.PutCluster(Cluster(cid, f"az-{'abc'[k % 3]}", capacity={POOL: CLUSTER_GPUS}), at_ms=now_ms))
    for t in range(n_tenants):
        must(c.PutTenant(Tenant(f"tenant-{t:03d}", priority=100 + 10 * (t % 5), quota={POOL: per_tenant},
                                borrow_limit={POOL: per_tenant}), at_ms=now_ms))
    t0 = now_ms - 600_000
    slot = 0
    for i in range(n):
        did = f"dep-{i:05d}"
        must(c.PutDeployment(Deployment(did, f"tenant-{i // TENANT_SIZE:03d}", Engine.VLLM, MODEL, POOL, 1,
                                        min_replicas=1, max_replicas=40, warm_pool=0), at_ms=t0))
        must(c.SetDesired(did, INSTANCES_PER_DEPLOYMENT, 0, "scale_up", t0))
        for k in range(INSTANCES_PER_DEPLOYMENT):
            iid = f"{did}-i{k}"
            must(c.CreateInstance(iid, did, clusters[slot % n_clusters], t0))
            slot += 1
            must(c.TransitionInstance(iid, E.START_WARMUP, t0 + 1))
            must(c.TransitionInstance(iid, E.WARMED, t0 + 2))
            must(c.TransitionInstance(iid, E.WORK, t0 + 3))
    return state


def add_history(state: Any, now_ms: int, rng: random.Random) -> None:
    """An hour of demand history per deployment, about its 10 replicas with noise (a steady fleet)."""
    from controlplane.domain.demand import BUCKET_MS, HISTORY_BUCKETS, DemandHistory

    end = (now_ms // BUCKET_MS) * BUCKET_MS
    for did in state.deployments:
        data = b"".join(int(rng.uniform(80, 105)).to_bytes(2, "little") for _ in range(HISTORY_BUCKETS))
        state.demand[did] = DemandHistory(end, data)


def samples_at(state: Any, now_ms: int, rng: random.Random) -> Any:
    """One sample per serving instance at ``now_ms``: each deployment inside its tolerance band."""
    from controlplane.domain.observations import InstanceSample, Observations

    out = []
    for inst in state.instances.values():
        if not inst.state.serving:
            continue
        conc = rng.uniform(0.90, 1.05) * 24.0
        running = int(conc)
        out.append(InstanceSample(inst.id, inst.deployment, now_ms, running, 0, min(1.0, 0.3 + rng.random() * 0.3),
                                  running * 40.0, running * 12.0, rng.uniform(100.0, 400.0)))
    return Observations(now_ms, tuple(out))


class TickHarness:
    """The state, a control loop's filters and the clock of one fleet size."""

    def __init__(self, n: int, seed: int = SEED, *, forecast: bool = True) -> None:
        from controlplane.core import reconcile
        from controlplane.forecast.recorder import DemandRecorder
        from controlplane.forecast.service import HistoryForecaster
        from controlplane.runtime.loop import ControlLoop

        self.n = n
        self.now_ms = 1_800_000_000_000
        self.state = build_state(n, self.now_ms)
        self.forecaster = HistoryForecaster() if forecast else None
        self.recorder = DemandRecorder() if forecast else None
        if forecast:
            add_history(self.state, self.now_ms, random.Random(seed))
        self.rng = random.Random(seed)
        self.cfg = reconcile.ReconcileConfig()
        self.loop = ControlLoop(_Replicator(self.state), None, None, rng=random.Random(seed))  # type: ignore[arg-type]
        self.commands = 0
        self.max_commands = 0

    def tick(self) -> dict[str, int]:
        """One tick; returns the nanoseconds of each part. Applies its commands afterwards (untimed)."""
        from controlplane.core import reconcile

        self.now_ms += TICK_MS
        now = self.now_ms
        obs = samples_at(self.state, now, self.rng)
        pc = time.perf_counter_ns
        t0 = pc()
        filtered, loads = self.loop._filter(self.state, obs, now)
        t1 = pc()
        facts = reconcile.facts(self.state, obs, [], now, self.cfg, self.rng)
        t2 = pc()
        _apply_all(self.state, facts)  # the loop commits the facts before it plans
        t3 = pc()
        forecasts = self.forecaster.forecasts(self.state, now) if self.forecaster is not None else None
        t4 = pc()
        plan = reconcile.plan(self.state, filtered, loads, now, self.cfg, forecasts)
        t5 = pc()
        commands = plan.commands
        if self.recorder is not None:
            closed = self.recorder.observe(plan.decisions, now)
            if closed is not None:
                commands = commands + (closed,)
        t6 = pc()
        _apply_all(self.state, commands)
        self.commands += len(facts) + len(commands)
        self.max_commands = max(self.max_commands, len(facts) + len(commands))
        return {"filter": t1 - t0, "facts": t2 - t1, "plan": t5 - t4, "forecast": (t4 - t3) + (t6 - t5)}


def _apply_all(state: Any, commands: Any) -> None:
    """Apply a tick's commands (in batches of at most ``MAX_BATCH``, as a replicator splits them)."""
    from controlplane.domain import commands as c
    from controlplane.domain.state import MAX_BATCH, apply

    for i in range(0, len(commands), MAX_BATCH):
        apply(state, c.Batch(tuple(commands[i:i + MAX_BATCH])))


def pin_one_core() -> int | None:
    """Pin this process to one CPU it may use; returns it (None where not supported)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})
    return cpus[-1]


def measure(n: int, ticks: int, warmup: int = WARMUP_TICKS, *, forecast: bool = True) -> dict[str, Any]:
    from controlplane.bench.raft import summary

    t_build = time.perf_counter()
    h = TickHarness(n, forecast=forecast)
    build_s = time.perf_counter() - t_build
    for _ in range(warmup):
        h.tick()
    h.commands = h.max_commands = 0
    rows: list[dict[str, float]] = []
    for _ in range(ticks):
        ns = h.tick()
        ms = {k: v / 1e6 for k, v in ns.items()}
        ms["tick"] = ms["facts"] + ms["plan"] + ms["forecast"]
        ms["full"] = ms["tick"] + ms["filter"]
        rows.append(ms)
    out: dict[str, Any] = {
        "deployments": n, "forecast": forecast, "instances": len(h.state.instances), "clusters": len(h.state.clusters),
        "tenants": len(h.state.tenants), "ticks": ticks, "warmup_ticks": warmup, "build_s": round(build_s, 2),
        "commands_per_tick_mean": round(h.commands / max(1, ticks), 2), "commands_per_tick_max": h.max_commands,
    }
    for part in PARTS:
        vals = [r[part] for r in rows]
        s = summary(vals)
        s["median"] = s.get("p50")
        out[f"{part}_ms"] = s
    target = TARGET_MS.get(n) if forecast else None
    if target is not None:
        p99 = out["tick_ms"]["p99"]
        out["target_ms"] = target
        out["target_met"] = p99 < target
        out["target_ratio"] = round(p99 / target, 3)
    del h
    gc.collect()
    return out


def measure_memory(n: int) -> dict[str, Any]:
    """Under tracemalloc (slow; not timed): state size, filter memory, and one tick's peak."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        h = TickHarness(n)
        gc.collect()
        state_bytes = tracemalloc.get_traced_memory()[0] - base
        h.tick()  # filters populated
        h.tick()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        h.tick()
        peak = tracemalloc.get_traced_memory()[1]
        steady = held - base
    finally:
        tracemalloc.stop()
    del h
    gc.collect()
    mib = 2**20
    return {"state_mib": round(state_bytes / mib, 2), "held_mib": round(steady / mib, 2),
            "filters_and_memory_mib": round((steady - state_bytes) / mib, 2),
            "tick_peak_extra_mib": round((peak - held) / mib, 2), "peak_mib": round((peak - base) / mib, 2),
            "note": "tick_peak_extra includes the tick's sample batch (built outside the timed region)"}


def run_bench(sizes: tuple[int, ...], out_dir: Path, *, ticks: dict[int, int] | None = None,
              memory: bool = True, show_progress: bool = True, pin: bool = True, command: str = "") -> dict[str, Any]:
    from controlplane.bench.raft import _progress, machine

    started = time.monotonic()
    core = pin_one_core() if pin else None
    ticks = ticks or {}
    result: dict[str, Any] = {
        "benchmark": "tick", "command": command or "controlplane bench tick",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
        "params": {"sizes": list(sizes), "instances_per_deployment": INSTANCES_PER_DEPLOYMENT,
                   "tick_interval_ms": TICK_MS, "warmup_ticks": WARMUP_TICKS, "pinned_cpu": core,
                   "tick": "reconcile.facts + reconcile.plan (decide + plan, no I/O)",
                   "full": "tick + the loop's signal filtering (ControlLoop._filter)",
                   "percentiles": "nearest rank", "seed": SEED, "model": MODEL,
                   "targets_ms": {str(k): v for k, v in TARGET_MS.items()}},
        "sizes": [],
    }
    with _progress(show_progress) as advance:
        define = getattr(advance, "define", None)
        for n in sizes:
            if define is not None:
                define(f"{n:,} deployments", ticks.get(n, TICKS.get(n, 20)) + (1 if memory else 0))
        for n in sizes:
            k = ticks.get(n, TICKS.get(n, 20))
            row = measure(n, k)
            reactive = measure(n, k, forecast=False)
            advance(f"{n:,} deployments", k)
            if memory:
                row["memory"] = measure_memory(n)
                advance(f"{n:,} deployments", 1)
            row["reactive_tick_ms"] = reactive["tick_ms"]
            ratio = {q: round(row["tick_ms"][q] / reactive["tick_ms"][q], 3) if reactive["tick_ms"][q] else None
                     for q in ("p50", "p99")}
            row["forecast_ratio"] = {**ratio, "goal": FORECAST_GOAL,
                                     "met": all(v is not None and v <= FORECAST_GOAL for v in ratio.values())}
            result["sizes"].append(row)
    result["verdict"] = {
        str(r["deployments"]): {"tick_p99_ms": r["tick_ms"]["p99"], "target_ms": r["target_ms"], "met": r["target_met"]}
        for r in result["sizes"] if "target_ms" in r
    }
    result["duration_s"] = round(time.monotonic() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / FILES[0], out_dir / FILES[1]
    result["files"] = {"markdown": str(md), "json": str(js)}
    md.write_text(render_markdown(result), encoding="utf-8")
    js.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _f(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}" if v < 100 else f"{v:,.0f}"
    return f"{v:,}"


def table_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for r in result["sizes"]:
        mem = r.get("memory", {})
        target = r.get("target_ms")
        verdict = "-" if target is None else (f"met (< {target:g} ms)" if r["target_met"]
                                              else f"MISSED x{r['target_ratio']:.2f} of {target:g} ms")
        fr = r.get("forecast_ratio") or {}
        ratio = "-" if not fr else f"{fr['p50']:.2f} / {fr['p99']:.2f}" + ("" if fr["met"] else " (MISSED)")
        rows.append((f"{r['deployments']:,}", f"{r['instances']:,}", _f(r["tick_ms"]["p50"]), _f(r["tick_ms"]["p99"]),
                     _f(r.get("reactive_tick_ms", {}).get("p50")), _f(r.get("reactive_tick_ms", {}).get("p99")), ratio,
                     _f(r["facts_ms"]["p50"]), _f(r["plan_ms"]["p50"]), _f(r["forecast_ms"]["p50"]),
                     _f(r["forecast_ms"]["max"]), _f(r["filter_ms"]["p50"]),
                     _f(r["full_ms"]["p50"]), _f(r["full_ms"]["p99"]), _f(mem.get("held_mib")),
                     _f(mem.get("tick_peak_extra_mib")), verdict))
    return rows


HEADERS = ("deployments", "instances", "tick p50 (ms)", "tick p99 (ms)", "reactive p50", "reactive p99",
           "x reactive p50 / p99", "facts p50", "plan p50", "forecast p50", "forecast max", "filter p50", "full p50", "full p99", "memory held (MiB)", "tick peak extra (MiB)", "target")


def render_markdown(result: dict[str, Any]) -> str:
    m, p = result["machine"], result["params"]
    lines = [
        "# Control-loop tick cost", "",
        f"`{result['command']}` — {result['started_at']}, {result['duration_s']} s", "",
        (f"Machine: {m['cpu_model']}, pinned to CPU {p['pinned_cpu']} (one core), {m['platform']}, Python {m['python']}, "
        f"load average at start {m['loadavg_at_start']}."), "",
        (f"`tick` = {p['tick']}; `full` = {p['full']}. {p['instances_per_deployment']} Ready/Busy instances per "
        f"deployment, a fresh sample per instance every tick ({p['tick_interval_ms']} ms apart), steady load inside "
        f"the tolerance band; {p['warmup_ticks']} warm-up ticks, then the timed ticks (percentiles by nearest rank). "
        "Memory under tracemalloc: held = state + signal filters + scale memories; tick peak extra = the most "
        "allocated during one tick above that."), "",
        "| " + " | ".join(HEADERS) + " |", "|" + "---:|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    lines += ["", "Timed ticks: " + ", ".join(f"{r['deployments']:,}: {r['ticks']}" for r in result["sizes"]) + ".", ""]
    return "\n".join(lines)


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Leader tick cost (one core, no I/O)")
    for col in HEADERS:
        table.add_column(col, justify="right")
    for row in table_rows(result):
        table.add_row(*row)
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    console.print(f"written: {result['files']['markdown']}, {result['files']['json']}")


def run_cli(out: str, as_json: bool, sizes: list[int] | None = None, ticks: int | None = None,
            command: str = "") -> int:
    """``controlplane bench tick``: 0 when every size with a target met it, 1 otherwise."""
    from controlplane.domain.errors import ControlPlaneError

    chosen = tuple(sizes) if sizes else SIZES
    if any(not 1 <= n <= 100_000 for n in chosen):
        raise ControlPlaneError(f"--deployments: each must be between 1 and 100000, got {list(chosen)}")
    if ticks is not None and not 1 <= ticks <= 100_000:
        raise ControlPlaneError(f"--ticks: must be between 1 and 100000, got {ticks}")
    command = command or ("controlplane bench tick" + "".join(f" --deployments {n}" for n in (sizes or []))
                          + (f" --ticks {ticks}" if ticks else "") + f" --out {out}" + (" --json" if as_json else ""))
    result = run_bench(chosen, Path(out), ticks={n: ticks for n in chosen} if ticks else None, command=command)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0 if all(v["met"] for v in result["verdict"].values()) else 1
