"""``controlplane bench hostile``: hostile-input attacks (a poisoned fence, oversized and trickled
Raft frames, descriptor exhaustion, journal corruption, a full disk, watch and object floods) as
seeded faults against real processes on 127.0.0.1, each judged by the checker's verdict; see
``controlplane/chaos/hostile.py`` and docs/reliability.md, "Hostile input".

``--attacks a,b`` picks attacks (default: all, in :data:`~controlplane.chaos.hostile.KINDS` order),
``--seed`` their plan, ``--short`` the CI sizes (a few seconds each). Writes ``--out``/results.json
(every verdict with its checks and figures) and report.md; ``--json`` prints the results. Exit
status 0 only when every attack passed.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.chaos import hostile as h


def summarize(verdicts: list[h.Verdict], *, seed: int, command: str, wall_s: float, short: bool) -> dict[str, Any]:
    return {
        "command": command, "started": datetime.now(UTC).isoformat(timespec="seconds"), "seed": seed,
        "sizes": "short" if short else "full", "attacks": len(verdicts),
        "passed": sum(v.passed for v in verdicts), "failed": [v.attack for v in verdicts if not v.passed],
        "verdicts": {v.attack: "pass" if v.passed else "fail" for v in verdicts},
        "results": [v.to_json() for v in verdicts], "wall_s": round(wall_s, 1),
    }


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    return "-" if value is None else str(value)


def render_markdown(summary: dict[str, Any]) -> str:
    lines = ["# Hostile input", "", f"`{summary['command']}` ({summary['started']}, wall {summary['wall_s']} s, "
             f"{summary['sizes']} sizes): {summary['passed']} of {summary['attacks']} attacks withstood.", "",
             "| attack | verdict | failed checks |", "|---|---|---|"]
    for r in summary["results"]:
        lines.append(f"| {r['attack']} | **{r['verdict']}** | {'; '.join(r['failed']) or '-'} |")
    for r in summary["results"]:
        lines += ["", f"## {r['attack']}: {r['verdict']}", "", "| check | ok | measured | bound | detail |",
                  "|---|---|---|---|---|"]
        for c in r["checks"]:
            lines.append(f"| {c['name']} | {'yes' if c['ok'] else '**no**'} | {_fmt(c['measured'])} | "
                         f"{_fmt(c['bound'])} | {c['detail']} |")
        g = r["figures"].get("global", {})
        if g:
            lines += ["", f"First commit after the start {_fmt(g.get('first_commit_ms'))} ms; writes "
                          f"{g.get('writes', {})}."]
    lines.append("")
    return "\n".join(lines)


def run_bench(kinds: list[str], seed: int, out: Path, *, short: bool = False, command: str = "",
              show_progress: bool = True, keep: bool = False) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from controlplane.chaos.hostile_run import run_attack

    specs = h.plan(seed, kinds, h.SHORT if short else h.FULL)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="controlplane-hostile-"))

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    verdicts: list[h.Verdict] = []
    t0 = time.monotonic()
    try:
        with Progress(TextColumn("hostile"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), disable=not show_progress) as progress:
            task = progress.add_task("", total=len(specs))
            for spec in specs:
                progress.update(task, description=spec.kind)
                v = run_attack(spec, root / spec.kind, log=say)
                verdicts.append(v)
                if not v.passed:
                    say(f"FAILED {spec.kind} (seed={seed}): " + "; ".join(v.failed_checks))
                elif not show_progress:
                    say(f"hostile {spec.kind}: pass")
                progress.update(task, advance=1)
    finally:
        summary = summarize(verdicts, seed=seed, command=command, wall_s=time.monotonic() - t0, short=short)
        (out / "results.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        (out / "report.md").write_text(render_markdown(summary), encoding="utf-8")
        if keep or summary["failed"]:
            say(f"hostile: logs and data directories kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return summary


def run_cli(attacks: str | None, seed: int, out: str, as_json: bool, *, short: bool = False, keep: bool = False) -> int:
    from controlplane.domain.errors import ControlPlaneError

    kinds = [k.strip() for k in attacks.split(",") if k.strip()] if attacks else list(h.KINDS)
    unknown = [k for k in kinds if k not in h.KINDS]
    if unknown or not kinds:
        raise ControlPlaneError(f"--attacks: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(h.KINDS)}")
    command = (f"controlplane bench hostile --seed {seed}" + (f" --attacks {','.join(kinds)}" if attacks else "")
               + (" --short" if short else "") + f" --out {out}" + (" --json" if as_json else ""))
    summary = run_bench(kinds, seed, Path(out), short=short, command=command, show_progress=sys.stderr.isatty(), keep=keep)
    print(json.dumps(summary, indent=2, default=str) if as_json else render_markdown(summary))
    return 0 if not summary["failed"] and summary["attacks"] == len(kinds) else 1
