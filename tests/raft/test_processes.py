"""Real coordinator processes (tests/raft/harness.py) on 127.0.0.1: kill -9 and restarts.

Each test starts three processes with fresh ports and data dirs, and stops or SIGKILLs all of them
in ``finally``. Waits poll with deadlines.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import long_mode
from tests.raft.cluster import cluster_configs
from tests.support.waiting import wait_until
from tests.raft.procs import HarnessProc, sigkill_all, stop_all, wait_holder

HOLDER_S = 30.0
FAILOVER_BOUND_S = 15.0


def start_cluster(tmp_path: Path) -> list[HarnessProc]:
    procs = [HarnessProc(cfg, tmp_path) for cfg in cluster_configs(tmp_path / "data", 3)]
    for p in procs:
        p.start()
    return procs


def dumps_agree(procs: list[HarnessProc]) -> list[dict[str, object]] | None:
    dumps = [p.ask("dump") for p in procs]
    if all(d["digest"] == dumps[0]["digest"] for d in dumps):
        return dumps
    return None


def test_kill_leader_new_holder_commits(tmp_path: Path) -> None:
    procs = start_cluster(tmp_path)
    try:
        old, old_epoch = wait_holder(procs, HOLDER_S)
        assert old.ask("status")["role"] == "leader"
        assert old.ask("commit 0 20", timeout_s=30) == {"ok": True, "done": 20}
        t_kill = time.monotonic()
        old.kill()
        rest = [p for p in procs if p is not old]
        new, new_epoch = wait_holder(rest, FAILOVER_BOUND_S, newer_than=old_epoch)
        assert new.ask("commit 100 1", timeout_s=FAILOVER_BOUND_S)["ok"]
        failover_s = time.monotonic() - t_kill
        print(f"kill -9 of the holder -> new holder (epoch {old_epoch} -> {new_epoch}) committed after {failover_s:.2f}s")
        assert failover_s < FAILOVER_BOUND_S
        keys = set(new.ask("dump")["keys"])
        assert {f"w{i:06d}" for i in range(20)} | {"w000100"} <= keys
        wait_until(lambda: dumps_agree(rest), 10, "the two survivors to agree")
    finally:
        stop_all(procs)


@pytest.mark.slow
def test_sigkill_all_mid_stream_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    rounds, writes_per_round = (3, 400) if long_mode() else (1, 120)
    procs = start_cluster(tmp_path)
    acked: set[int] = set()
    first = 0
    try:
        for _ in range(rounds):
            holder, _ = wait_holder(procs, HOLDER_S)
            assert holder.ask(f"stream {first}")["ok"]
            wait_until(lambda: len(holder.acks) >= writes_per_round, 60, f"{writes_per_round} acknowledged writes")
            spread = sigkill_all(procs)  # mid-stream: the stream thread is committing right now
            acked |= set(holder.acks)
            assert spread < 0.5
            first = max(acked) + 1000
            for p in procs:
                p.start()
            wait_holder(procs, HOLDER_S)
            dumps = wait_until(lambda: dumps_agree(procs), 20, "identical state on all three after restart")
            for d in dumps:
                keys = {int(k[1:]) for k in d["keys"]}  # type: ignore[union-attr]
                missing = acked - keys
                assert not missing, f"acknowledged writes lost: {sorted(missing)[:10]}"
    finally:
        sigkill_all(procs)
    print(f"{len(acked)} acknowledged writes survived {rounds} SIGKILL-all + restart round(s)")
