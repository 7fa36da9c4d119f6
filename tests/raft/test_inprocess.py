"""Three (or four) real pysyncobj members in this process, on 127.0.0.1 with fresh ports per test.

Bounded: every wait polls with a deadline; every member is stopped in ``finally``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from controlplane.config import CoordinatorConfig
from controlplane.domain import commands as c
from controlplane.domain.errors import Conflict, NotLeader, QueueFull, TemporaryError, ValidationError
from controlplane.domain.state import MAX_BATCH
from controlplane.domain.topology import Cluster
from raft.fsm import read_snapshot_file
from raft.lease import AcquireLease, ReleaseLease, RenewLease, contender_may_acquire_at_ms
from raft.node import SNAPSHOT_FILE
from raft.replicator import RaftReplicator
from tests.raft.cluster import Member, breaker_write, cluster_configs, holder_of, leader_of, running
from tests.support.waiting import wait_until

ELECT_S = 15.0


def members(tmp_path: Path, n: int = 3, extra: int = 0, guard: bool = True, **overrides: object) -> list[Member]:
    return [Member(CoordinatorConfig(**d), guard=guard) for d in cluster_configs(tmp_path, n, extra, **overrides)]


def all_equal(ms: list[Member]) -> bool:
    snaps = [m.snap() for m in ms]
    return all(s == snaps[0] for s in snaps)


def test_batch_replicates_with_per_command_results(tmp_path: Path) -> None:
    ms = members(tmp_path, guard=False)
    with running(ms):
        leader = wait_until(lambda: leader_of(ms), ELECT_S, "a leader")
        repl = RaftReplicator(leader.node)
        batch = [
            c.PutCluster(Cluster(id="cl-1", zone="az-1", capacity={"h100": 8})),
            breaker_write(1),
            c.SetDesired(deployment_id="nope", replicas=1, warm_pool=0, reason="test", at_ms=5),
        ]
        res = repl.commit(batch, now_ms=5)
        assert [r.ok for r in res.results] == [True, True, False]
        assert not res.ok and "not found" in res.results[2].error
        assert repl.state.clusters["cl-1"].capacity == {"h100": 8}

        follower = next(m for m in ms if m is not leader)
        assert RaftReplicator(follower.node).commit([breaker_write(2)], 6).ok  # forwarded to the leader
        assert "w000002" in follower.node.state_copy().breakers  # applied locally before returning

        assert repl.commit([], 7).ok  # nothing to commit: no entry
        with pytest.raises(QueueFull):
            repl.commit([breaker_write(i) for i in range(MAX_BATCH + 1)], 8)
        wait_until(lambda: all_equal(ms), 10, "identical state on all members")
        assert ms[0].snap()["applied"] == 3


def test_lease_epoch_is_the_log_index_and_cas_rules(tmp_path: Path) -> None:
    ms = members(tmp_path, guard=False)
    with running(ms):
        leader = wait_until(lambda: leader_of(ms), ELECT_S, "a leader")
        node = leader.node
        out = node.commit_lease(AcquireLease("coord-x", 0, 1200))
        assert out.ok and out.record.holder == "coord-x" and out.record.version == 1
        wait_until(lambda: node.status().applied_index >= out.record.epoch, 5, "the acquire applied")
        assert out.record.epoch == node.status().log_len  # no compaction yet: the last index == log length

        assert not node.commit_lease(AcquireLease("coord-y", 0, 1200)).ok  # stale expected version
        assert not node.commit_lease(RenewLease("coord-x", out.record.epoch + 1)).ok  # wrong epoch
        renewed = node.commit_lease(RenewLease("coord-x", out.record.epoch))
        assert renewed.ok and renewed.record.version == 3 - 1  # failed CAS does not bump the version
        assert RaftReplicator(node).commit([breaker_write(1)], 0).ok
        second = node.commit_lease(AcquireLease("coord-y", renewed.record.version, 1200))
        assert second.ok and second.record.epoch > out.record.epoch
        wait_until(lambda: node.status().applied_index >= second.record.epoch, 5, "the acquire applied")
        assert second.record.epoch == node.status().log_len
        assert node.commit_lease(ReleaseLease("coord-y", second.record.epoch)).ok
        wait_until(lambda: all(m.node.lease_view()[0] == node.lease_view()[0] for m in ms), 5, "same lease record")
        assert node.lease_view()[0].holder == ""


def test_fenced_commits_rejected_after_the_lease_moved(tmp_path: Path) -> None:
    ms = members(tmp_path, guard=False)
    with running(ms):
        node = wait_until(lambda: leader_of(ms), ELECT_S, "a leader").node
        out = node.commit_lease(AcquireLease("coord-a", 0, 1200))
        fence: list[tuple[str, int] | None] = [("coord-a", out.record.epoch)]
        repl = RaftReplicator(node, fence=lambda: fence[0])
        assert repl.commit([breaker_write(1)], 0).ok
        node.commit_lease(AcquireLease("coord-b", out.record.version, 1200))  # someone else took it
        with pytest.raises(NotLeader, match="fenced"):
            repl.commit([breaker_write(2)], 0)
        fence[0] = None
        with pytest.raises(NotLeader, match="does not hold a valid lease"):
            repl.commit([breaker_write(3)], 0)
        assert set(node.state_copy().breakers) == {"w000001"}


def test_leader_acquires_and_renews(tmp_path: Path) -> None:
    ms = members(tmp_path)
    with running(ms):
        holder = wait_until(lambda: holder_of(ms), ELECT_S, "a lease holder")
        assert holder.node.is_leader()
        stats = holder.guard.statistics()  # type: ignore[union-attr]
        assert stats.epoch is not None and stats.last_acquire_allowed_ms is None  # the lease was free
        v0 = holder.node.lease_view()[0].version
        stats = wait_until(
            lambda: (s := holder.guard.statistics()).renewals >= v0 + 2 and s,  # type: ignore[union-attr]
            5, "renewals",
        )
        assert stats.losses == 0 and holder.node.lease_view()[0].version >= v0 + 2  # renewals bump the version
        assert stats.valid_until_ms > holder.node.clock_ms()
        others = [m for m in ms if m is not holder]
        assert all(m.guard.authority(m.node.clock_ms()) is None for m in others)  # type: ignore[union-attr]
        wait_until(lambda: all(m.node.lease_view()[0].holder == holder.cfg.node_id for m in others), 5, "followers see it")


def test_holder_stop_then_new_holder_only_after_contender_wait(tmp_path: Path) -> None:
    ms = members(tmp_path)
    with running(ms):
        old = wait_until(lambda: holder_of(ms), ELECT_S, "a lease holder")
        old_epoch = old.guard.statistics().epoch  # type: ignore[union-attr]
        assert old_epoch is not None
        old.guard.stop()  # type: ignore[union-attr]  # a crash: no release
        old_valid_until = old.guard.statistics().last_valid_until_ms  # type: ignore[union-attr]
        t_stop = time.monotonic()
        old.node.stop()
        rest = [m for m in ms if m is not old]
        new = wait_until(lambda: holder_of(rest), ELECT_S, "a new lease holder")
        failover_s = time.monotonic() - t_stop
        st = new.guard.statistics()  # type: ignore[union-attr]
        assert st.epoch is not None and st.epoch > old_epoch
        assert st.last_acquire_allowed_ms is not None and st.last_acquire_t_obs_ms is not None
        cfg = new.cfg
        assert st.last_acquire_allowed_ms == contender_may_acquire_at_ms(
            st.last_acquire_t_obs_ms, cfg.lease_duration_ms, cfg.drift_rho, cfg.lease_margin_ms
        )
        assert st.last_acquire_sent_ms is not None and st.last_acquire_sent_ms >= st.last_acquire_allowed_ms
        # one process, one monotonic clock: the validity intervals of the two epochs do not overlap
        assert old_valid_until > 0 and st.last_acquire_sent_ms > old_valid_until
        print(f"lease failover after stopping the holder: {failover_s:.2f}s; gap between validity intervals "
              f"{st.last_acquire_sent_ms - old_valid_until} ms")
        assert RaftReplicator(new.node, fence=new.guard.fence).commit([breaker_write(1)], 0).ok  # type: ignore[union-attr]


def test_membership_change_while_committing(tmp_path: Path) -> None:
    ms = members(tmp_path, n=3, extra=1, guard=False)
    core, spare = ms[:3], ms[3]
    done, errors, ok = threading.Event(), [], []

    def writer() -> None:
        i = 0
        while not done.is_set():
            ld = leader_of(live)
            if ld is None:
                time.sleep(0.02)
                continue
            try:
                RaftReplicator(ld.node).commit([breaker_write(i)], 0)
                ok.append(i)
            except TemporaryError as exc:
                errors.append(exc)
                time.sleep(0.02)
            i += 1
            time.sleep(0.005)

    live = list(core)
    with running(core):
        leader = wait_until(lambda: leader_of(core), ELECT_S, "a leader")
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        try:
            spare.start()
            live.append(spare)

            def change(op: str, m: Member) -> bool:
                try:
                    if op == "add":
                        leader.node.add_member(m.cfg.raft_address, node_id=m.cfg.node_id, api_address=m.cfg.api_address)
                    else:
                        leader.node.remove_member(m.cfg.raft_address)
                    return True
                except Conflict:  # a change still settling, or an earlier attempt with unknown outcome won
                    peers = dict(leader.node.status().peers)
                    return (m.cfg.raft_address in peers or m.cfg.node_id in peers) == (op == "add")
                except TemporaryError:  # leadership moved or unknown outcome: ask again
                    return False

            wait_until(lambda: change("add", spare), 15, "the addition to be accepted")
            with pytest.raises((Conflict, ValidationError)):
                leader.node.remove_member(leader.cfg.raft_address)
            n_before = len(ok)
            wait_until(lambda: len(ok) > n_before + 5, 10, "commits after the add")
            victim = next(m for m in core if m is not leader)
            wait_until(lambda: change("remove", victim), 15, "the removal to be accepted")
            live.remove(victim)
            victim.stop()
            n_before = len(ok)
            wait_until(lambda: len(ok) > n_before + 5, 10, "commits after the removal")
            done.set()
            t.join(10)
            try:
                wait_until(lambda: all_equal(live), 10, "identical state on the remaining members")
            except AssertionError:
                for m in live:
                    print(m.cfg.node_id, m.node.running, m.node.status(), m.snap()["applied"])
                raise
            peers = dict(leader.node.status().peers)
            assert {spare.cfg.node_id, spare.cfg.raft_address} & set(peers) and victim.cfg.node_id not in peers
            assert len(peers) == 2
        finally:
            done.set()
            t.join(10)
            spare.stop()
        assert len(set(live[0].node.state_copy().breakers)) >= len(ok)


def test_snapshot_then_fresh_member_catches_up(tmp_path: Path) -> None:
    ms = members(tmp_path, n=3, extra=1, guard=False, log_compaction_min_entries=20)
    core, fresh = ms[:3], ms[3]
    with running(core):
        leader = wait_until(lambda: leader_of(core), ELECT_S, "a leader")
        repl = RaftReplicator(leader.node)
        leader.node.commit_lease(AcquireLease(leader.cfg.node_id, 0, 1200))
        for i in range(60):
            assert repl.commit([breaker_write(i)], i).ok
        wait_until(lambda: leader.node.status().log_len < 20, 10, "log compaction on the leader")
        snap = read_snapshot_file(str(leader.cfg.data_dir / SNAPSHOT_FILE))
        assert snap.last[1] >= 40 and len(snap.cluster) == 3
        try:
            fresh.start()
            leader.node.add_member(fresh.cfg.raft_address, node_id=fresh.cfg.node_id)
            wait_until(lambda: fresh.snap() == leader.snap(), 15, "the fresh member to catch up")
            assert fresh.node.fsm.statistics().snapshots_installed >= 1
            assert fresh.node.lease_view()[0] == leader.node.lease_view()[0]
            assert repl.commit([breaker_write(1000)], 0).ok
            wait_until(lambda: all_equal([*core, fresh]), 10, "identical state on all four")
        finally:
            fresh.stop()


def test_restart_from_data_dirs(tmp_path: Path) -> None:
    cfgs = [CoordinatorConfig(**d) for d in cluster_configs(tmp_path, 3, log_compaction_min_entries=30)]
    ms = [Member(cfg, guard=False) for cfg in cfgs]
    with running(ms):
        leader = wait_until(lambda: leader_of(ms), ELECT_S, "a leader")
        repl = RaftReplicator(leader.node)
        for i in range(80):  # crosses the compaction threshold: restart loads a snapshot + journal tail
            assert repl.commit([breaker_write(i)], i).ok
        wait_until(lambda: all_equal(ms), 10, "identical state")
        before = ms[0].snap()
    again = [Member(cfg, guard=False) for cfg in cfgs]
    with running(again):
        wait_until(lambda: leader_of(again), ELECT_S, "a leader after restart")
        wait_until(lambda: all(m.snap() == before for m in again), 10, "the state back on every member")
