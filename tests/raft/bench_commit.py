"""Commit latency with and without fsync: 3 harness processes on 127.0.0.1, N single-write commits
submitted on the lease holder (the Raft leader), one at a time. Numbers go into docs/lease.md.

    python -m tests.raft.bench_commit [N] [ROUNDS]

Production default timings (CoordinatorConfig defaults), ``fsync: entry`` vs ``fsync: none``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.raft.cluster import cluster_configs
from tests.raft.procs import HarnessProc, stop_all, wait_holder

DEFAULTS_ONLY = dict(
    raft_min_timeout_ms=150, raft_max_timeout_ms=450, append_entries_period_ms=40,
    leader_fallback_timeout_ms=140, lease_duration_ms=1200, lease_renew_ms=250, lease_margin_ms=100,
    commit_timeout_ms=1000, step_down_timeout_ms=2000,
)


def run(mode: str, n: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{mode}-") as tmp:
        base = Path(tmp)
        procs = [HarnessProc(c, base) for c in cluster_configs(base, 3, fsync=mode, **DEFAULTS_ONLY)]
        try:
            for p in procs:
                p.start()
            holder, _ = wait_holder(procs, 20.0)
            holder.ask("bench 50", timeout_s=60)  # warm-up
            return holder.ask(f"bench {n}", timeout_s=120)
        finally:
            stop_all(procs)


def main(argv: list[str]) -> int:
    n = int(argv[1]) if len(argv) > 1 else 300
    rounds = int(argv[2]) if len(argv) > 2 else 1
    for _ in range(rounds):
        for mode in ("entry", "none"):
            print(json.dumps({"mode": mode, **run(mode, n)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
