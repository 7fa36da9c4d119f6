"""``controlplane bench stability --fresh-starts N``: how long a fresh group takes to have a lease holder.

Each trial is one :func:`controlplane.bench.stability.run_stability` run (a new 3-member group, new
data directories, the background load started 2 s before the first member is spawned and stopped
after the trial), measured for a few seconds. Per trial, in milliseconds:

* ``first_holder_from_spawn_ms``: the first lease holder after the first member process was spawned
  (interpreter start-up, imports and setup included): the honest "start" of a group;
* ``first_holder_from_first_raft_start_ms`` / ``..._from_last_raft_start_ms``: after the first and
  after the last member's ``RaftNode.start()`` (the second is the bench's old ``first_holder_s``);
* ``holder_ready_from_spawn_ms``: the first time a member held the lease and had started everything
  it runs (for ``--mode coordinator``: the API and the control loop too);
* ``last_raft_start_from_spawn_ms``: when the last member's Raft started (the start-up spread);

plus the final term, leader changes and the 1-minute load average before the load and when the
first member was spawned. ``summary`` gives the median and max of every ``..._ms`` figure over the
trials that had one, and ``missing``: trials without one (no holder within the measured seconds).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

FRESH_SECONDS = 6.0
"""Measured seconds per trial: the 5 s target plus margin (a holder later than this is 'missing')."""
MAX_TRIALS = 50

_MS_FIELDS = ("first_holder_from_spawn_ms", "first_holder_from_first_raft_start_ms",
              "first_holder_from_last_raft_start_ms", "holder_ready_from_spawn_ms", "last_raft_start_from_spawn_ms")


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def _load1(sample: str) -> float | None:
    """The 1-minute figure of a ``/proc/loadavg`` line, or None."""
    try:
        return float(sample.split()[0])
    except (IndexError, ValueError):
        return None


def trial_view(r: dict[str, Any]) -> dict[str, Any]:
    """One fresh start's figures from a ``run_stability`` result."""
    st = r["startup"]
    last_raft = max((m["raft_started_s"] for m in st["members"] if m.get("raft_started_s") is not None), default=None)
    return {
        "first_holder_from_spawn_ms": _ms(st["first_holder_from_spawn_s"]),
        "first_holder_from_first_raft_start_ms": _ms(st["first_holder_from_first_raft_start_s"]),
        "first_holder_from_last_raft_start_ms": _ms(st["first_holder_from_last_raft_start_s"]),
        "holder_ready_from_spawn_ms": _ms(st["holder_ready_from_spawn_s"]),
        "last_raft_start_from_spawn_ms": _ms(last_raft),
        "final_term": r["final_term"], "leader_changes": r["leader_changes"],
        "load1_before": _load1(r["loadavg"][0]) if r["loadavg"] else None,
        "load1_at_spawn": _load1(r["loadavg"][1]) if len(r["loadavg"]) > 1 else None,
        "members": st["members"],
    }


def summarize_trials(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and max of every ``..._ms`` figure (over the trials that have it), ``missing`` the rest;
    the same for the 1-minute load average at spawn, and the highest final term."""
    out: dict[str, Any] = {}
    for key in (*_MS_FIELDS, "load1_at_spawn"):
        values = [t[key] for t in trials if t.get(key) is not None]
        out[key] = {"n": len(values), "missing": len(trials) - len(values),
                    "median": statistics.median(values) if values else None, "max": max(values) if values else None}
    out["max_final_term"] = max((t["final_term"] for t in trials), default=None)
    return out


def run_fresh_starts(trials: int, *, cpu: int = 0, disk: bool = False, mode: str = "node",
                     seconds: float = FRESH_SECONDS, overrides: dict[str, Any] | None = None,
                     bytecode: str = "compiled", log: Any = None) -> dict[str, Any]:
    from controlplane.bench.stability import run_stability

    if not 1 <= trials <= MAX_TRIALS:
        raise ValueError(f"fresh starts: must be between 1 and {MAX_TRIALS}, got {trials}")
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    runs = []
    for i in range(trials):
        t = trial_view(run_stability(seconds, cpu=cpu, disk=disk, overrides=overrides, mode=mode,
                                      bytecode=bytecode, log=say))
        say(f"fresh start {i + 1}/{trials}: holder {t['first_holder_from_spawn_ms']} ms from spawn, "
            f"{t['first_holder_from_first_raft_start_ms']} ms from the first Raft start (load {t['load1_at_spawn']})")
        runs.append(t)
    return {"fresh_starts": trials, "mode": mode, "bytecode": bytecode, "seconds": seconds, "cpu_burners": cpu,
            "disk_writer": disk, "overrides": dict(overrides or {}), "summary": summarize_trials(runs), "trials": runs}


def write_result(result: dict[str, Any], out: str | None) -> None:
    text = json.dumps(result, indent=2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
    print(text)
