"""``controlplane bench chaos``: randomized fault schedules (Jepsen-style nemesis) on real processes on
127.0.0.1, each checked for safety; see ``controlplane/chaos/`` and docs/reliability.md.

``--runs N --seed S`` runs schedules ``S, S+1, ..., S+N-1`` on one group of processes (3 or 5
coordinators, 2 simulated adapters, a client writing through the API). Every failure prints
``seed=... run=...``; ``controlplane bench chaos --runs 1 --seed <seed>`` replays that schedule.

Writes ``--out``/results.json (every run, every fault, the totals), report.md and recovery.png
(recovery time per fault by kind). ``--json`` prints the totals: ``runs``,
``stale_commands_accepted``, ``lost_writes``, ``illegal_transitions``, ``lease_overlaps``,
``isolation_violations`` (tenant isolation probed under the faults: ``controlplane/chaos/isolation.py``),
``isolation_probes``, ``convergence_failures``, ``recovery_ms`` (p50/p99/max/n, and per fault kind), ``faults``
(injected, by kind). Exit status 0 when no safety property was violated (convergence failures are
reported, and make the status 1 too).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MAX_RUNS = 10_000


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def summarize(runs: list[Any], counts: dict[str, int], min_gap_ms: float | None, *, seed: int, command: str,
              wall_s: float, writes: dict[str, int]) -> dict[str, Any]:
    faults = [f for r in runs for f in r.faults]
    rec = [f.recovery_ms for f in faults if f.recovery_ms is not None]
    outages = [f.outage_ms for f in faults if f.outage_ms is not None]
    by_kind: dict[str, list[float]] = {}
    for f in faults:
        if f.recovery_ms is not None:
            by_kind.setdefault(f.kind, []).append(f.recovery_ms)
    return {
        "command": command,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": seed,
        "runs": len(runs),
        "runs_failed": [{"run": r.run, "seed": r.seed, "violations": r.violations, "convergence": r.convergence}
                        for r in runs if r.violations or r.convergence],
        "stale_commands_accepted": counts.get("stale", 0),
        "lost_writes": counts.get("lost_write", 0),
        "illegal_transitions": counts.get("transition", 0),
        "lease_overlaps": counts.get("lease", 0),
        "isolation_violations": counts.get("isolation", 0),
        "isolation_probes": sum(getattr(r, "isolation_probes", 0) for r in runs),
        "harness_errors": counts.get("harness", 0),
        "convergence_failures": counts.get("convergence", 0),
        "min_lease_gap_ms": None if min_gap_ms is None else round(min_gap_ms, 1),
        "faults": dict(Counter(f.kind for f in faults)),
        "unrecovered_faults": sum(1 for f in faults if f.recovered is None),
        "recovery_ms": {
            "p50": _r(percentile(rec, 50)), "p99": _r(percentile(rec, 99)), "max": _r(max(rec) if rec else None),
            "n": len(rec),
            "by_kind": {k: {"p50": _r(percentile(v, 50)), "p99": _r(percentile(v, 99)), "n": len(v)}
                        for k, v in sorted(by_kind.items())},
        },
        "write_outage_ms": {"p50": _r(percentile(outages, 50)), "p99": _r(percentile(outages, 99)),
                            "max": _r(max(outages) if outages else None)},
        "writes": writes,
        "run_s": {"p50": _r(percentile([r.duration_s for r in runs], 50)), "max": _r(max((r.duration_s for r in runs), default=None))},
        "wall_s": round(wall_s, 1),
    }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def render_markdown(summary: dict[str, Any]) -> str:
    rec = summary["recovery_ms"]
    lines = [
        "# Chaos run", "", f"`{summary['command']}` ({summary['started']}, wall {summary['wall_s']} s)", "",
        "| property | count |", "|---|---|",
        f"| runs | {summary['runs']} |",
        f"| stale commands accepted | {summary['stale_commands_accepted']} |",
        f"| acknowledged writes lost | {summary['lost_writes']} |",
        f"| illegal transitions | {summary['illegal_transitions']} |",
        f"| overlapping lease validity intervals | {summary['lease_overlaps']} |",
        (f"| tenant isolation violations (bravo probing alpha, every method) | "
         f"{summary.get('isolation_violations', 0)} ({summary.get('isolation_probes', 0)} probes) |"),
        f"| convergence failures | {summary['convergence_failures']} |",
        f"| runs stopped by a harness error | {summary['harness_errors']} |",
        f"| smallest gap between validity intervals of consecutive epochs | {summary['min_lease_gap_ms']} ms |",
        (f"| writes acknowledged / failed / unknown outcome | {summary['writes']['acked']} / "
         f"{summary['writes']['failed']} / {summary['writes']['unknown']} |"),
        "", "| fault | injected | recovery p50 (ms) | p99 (ms) |", "|---|---|---|---|",
    ]
    for kind, n in sorted(summary["faults"].items()):
        k = rec["by_kind"].get(kind, {})
        lines.append(f"| {kind} | {n} | {k.get('p50')} | {k.get('p99')} |")
    out = summary["write_outage_ms"]
    ev = summary.get("evidence", {})
    lines += ["", (f"Write outage per fault (longest time without an acknowledged write, from the injection until "
                   f"recovered): p50 {out['p50']} ms, p99 {out['p99']} ms, max {out['max']} ms."),
              "", "Evidence checked: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in ev.items()) + "."]
    lines += ["", (f"All faults: recovery p50 {rec['p50']} ms, p99 {rec['p99']} ms, max {rec['max']} ms (n={rec['n']}); "
                   f"unrecovered within the wait: {summary['unrecovered_faults']}. "
                   f"Run time p50 {summary['run_s']['p50']} s."), ""]
    if summary["runs_failed"]:
        lines += ["## Failed runs", ""]
        for f in summary["runs_failed"]:
            lines.append(f"- seed={f['seed']} run={f['run']}: " + "; ".join(f["violations"] + ([f["convergence"]] if f["convergence"] else [])))
        lines.append("")
    return "\n".join(lines)


def write_plot(runs: list[Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_kind: dict[str, list[float]] = {}
    for r in runs:
        for f in r.faults:
            if f.recovery_ms is not None:
                by_kind.setdefault(f.kind, []).append(f.recovery_ms)
    fig, ax = plt.subplots(figsize=(8, 4))
    kinds = sorted(by_kind)
    if kinds:
        ax.boxplot([by_kind[k] for k in kinds], showfliers=True)
        ax.set_xticks(range(1, len(kinds) + 1), kinds, rotation=20)
    ax.set_ylabel("recovery after the fault ended (ms)")
    ax.set_title("chaos: time to a lease holder and an acknowledged write, per fault kind")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_bench(runs: int, seed: int, out: Path, *, nodes: int = 3, faults: int = 3, command: str = "",
              show_progress: bool = True, keep: bool = False, log_runs: bool = True) -> dict[str, Any]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from controlplane.chaos.runner import ChaosError, Harness

    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="controlplane-chaos-"))
    results: list[Any] = []

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    harness = Harness(root, nodes=nodes, faults_per_run=faults, log=say)
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    t0 = time.monotonic()
    failed_dir = False
    try:
        harness.start(seed)
        with Progress(TextColumn("chaos"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), disable=not show_progress, transient=False,
                      console=None) as progress:
            task = progress.add_task("", total=runs)
            for k in range(runs):
                s = seed + k
                try:
                    r = harness.run_one(k, s)
                except (OSError, RuntimeError, TimeoutError, ValueError, KeyError) as exc:
                    # the harness tripped (a proxy that did not answer in time...): counted, healed, go on
                    say(f"chaos: run {k} (seed={s}) stopped by a harness error:\n{traceback.format_exc()}")
                    r = harness.abort_run(k, s, f"{type(exc).__name__}: {exc}")
                results.append(r)
                for v in r.violations + ([r.convergence] if r.convergence else []):
                    say(f"FAILED seed={s} run={k}: {v}  (replay: controlplane bench chaos --runs 1 --seed {s})")
                    failed_dir = True
                progress.update(task, advance=1, description=f"seed={s} {r.duration_s:.1f}s {r.description[:70]}")
                if not show_progress and log_runs:
                    say(f"chaos run {k + 1}/{runs} seed={s} {r.duration_s:.1f}s "
                        f"{'ok' if r.ok and not r.convergence else 'FAILED'}: {r.description}")
    except ChaosError as exc:
        failed_dir = True
        raise SystemExit(f"controlplane: error: bench chaos: {exc}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        harness.close()
        client = harness.client
        writes = {"acked": len(client.writes.acked), "failed": client.writes.failed, "unknown": client.writes.unknown,
                  "errors": dict(client.codes)} \
            if client is not None else {"acked": 0, "failed": 0, "unknown": 0}
        summary = summarize(results, harness.counts, harness.min_gap_ms, seed=seed, command=command,
                            wall_s=time.monotonic() - t0, writes=writes)
        summary["nodes"] = nodes
        summary["evidence"] = harness.evidence()
        summary["isolation_answers"] = {m: dict(sorted(v.items())) for m, v in sorted(harness.isolation.answers.items())}
        detail = {"summary": summary, "runs": [
            {"run": r.run, "seed": r.seed, "schedule": r.schedule, "duration_s": round(r.duration_s, 2),
             "violations": r.violations, "convergence": r.convergence, "isolation_probes": r.isolation_probes,
             "faults": [{"kind": f.kind, "target": f.target, "detail": f.detail,
                         "recovery_ms": None if f.recovery_ms is None else round(f.recovery_ms, 1),
                         "outage_ms": None if f.outage_ms is None else round(f.outage_ms, 1)} for f in r.faults]}
            for r in results]}
        (out / "results.json").write_text(json.dumps(detail, indent=2), encoding="utf-8")
        (out / "report.md").write_text(render_markdown(summary), encoding="utf-8")
        try:
            write_plot(results, out / "recovery.png")
        except Exception as exc:  # a plot must not lose the numbers
            say(f"controlplane: bench chaos: no plot: {exc}")
        if failed_dir or keep:
            say(f"chaos: journals and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return summary


def run_cli(runs: int, seed: int, out: str, as_json: bool, *, nodes: int = 3, faults: int = 3, keep: bool = False) -> int:
    from controlplane.domain.errors import ControlPlaneError

    if not 1 <= runs <= MAX_RUNS:
        raise ControlPlaneError(f"--runs: must be between 1 and {MAX_RUNS}, got {runs}")
    if nodes not in (3, 5):
        raise ControlPlaneError(f"--nodes: 3 or 5, got {nodes}")
    if not 1 <= faults <= 8:
        raise ControlPlaneError(f"--faults: must be between 1 and 8, got {faults}")
    command = (f"controlplane bench chaos --runs {runs} --seed {seed}" + (f" --nodes {nodes}" if nodes != 3 else "")
               + (f" --faults {faults}" if faults != 3 else "") + f" --out {out}" + (" --json" if as_json else ""))
    summary = run_bench(runs, seed, Path(out), nodes=nodes, faults=faults, command=command,
                        show_progress=sys.stderr.isatty(), keep=keep)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print(render_markdown(summary))
    ev = summary.get("evidence", {})
    if not all(ev.get(k) for k in ("fencing_verdicts_accepted", "lease_intervals", "transitions",
                                   "isolation_probes", "isolation_pairs_compared")):
        print(f"controlplane: bench chaos: the history is missing evidence: {summary.get('evidence')}", file=sys.stderr)
        return 1
    bad = (summary["stale_commands_accepted"] + summary["lost_writes"] + summary["illegal_transitions"]
           + summary["lease_overlaps"] + summary["isolation_violations"] + summary["convergence_failures"]
           + summary["harness_errors"])
    return 0 if bad == 0 else 1
