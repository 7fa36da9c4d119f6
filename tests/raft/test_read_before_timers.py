"""A stall of a follower's own tick thread (as an fsync under disk contention causes) must not start an
election while the leader is alive: ``raft/timers.py read_before_timers`` reads the heartbeats that
arrived during the stall before pysyncobj looks at its election timer. With the option off the same
stall starts an election (so the test can fail). Three real members in this process, 127.0.0.1."""

from __future__ import annotations

import inspect
import threading
import time
from pathlib import Path

import pytest
from pysyncobj import SyncObj

from controlplane.config import CoordinatorConfig
from raft.node import RaftStatus
from tests.raft.cluster import Member, cluster_configs, leader_of, running
from tests.support.waiting import wait_until

STALL_S = 1.2  # twice the test timings' raft_max_timeout_ms (600)


def test_pysyncobj_ticks_timers_before_reading_and_has_the_poller_we_use() -> None:
    src = inspect.getsource(SyncObj._onTick)
    assert src.index("__raftElectionDeadline < monotonicTime()") < src.index("self._poller.poll(timeToWait)")
    assert src.index("leaderFallbackTimeout") < src.index("self._poller.poll(timeToWait)")
    assert "self._poller = createPoller(" in inspect.getsource(SyncObj.__init__)


def _stall_once(flag: threading.Event, done: threading.Event):  # noqa: ANN202
    def observer(_st: RaftStatus) -> None:
        if flag.is_set() and not done.is_set():
            done.set()
            time.sleep(STALL_S)  # the tick thread is stuck, as in a slow fsync

    return observer


@pytest.mark.parametrize("read_first", [True, False])
def test_follower_stall_longer_than_the_election_timeout(tmp_path: Path, read_first: bool) -> None:
    ms = [Member(CoordinatorConfig(**d), guard=False)
          for d in cluster_configs(tmp_path, 3, raft_read_before_timers=read_first)]
    flags = {m.cfg.node_id: (threading.Event(), threading.Event()) for m in ms}
    for m in ms:
        m.node.add_tick_observer(_stall_once(*flags[m.cfg.node_id]))
    with running(ms):
        leader = wait_until(lambda: leader_of(ms), 15, "a leader")
        term = leader.node.status().term
        follower = next(m for m in ms if m is not leader)
        # the group is settled: every member follows this leader at this term
        wait_until(lambda: all(m.node.status().leader_id == leader.cfg.node_id and m.node.status().term == term
                               for m in ms), 10, "all members following the leader")
        flag, done = flags[follower.cfg.node_id]
        flag.set()
        wait_until(done.is_set, 5, "the follower's stall to begin")
        # watch every member's term from the start of the stall until well after it ended
        deadline = time.monotonic() + STALL_S + 2.0
        moved = False
        while time.monotonic() < deadline and not moved:
            moved = any(m.node.status().term != term for m in ms)
            time.sleep(0.02)
        if read_first:
            assert not moved, [m.node.status() for m in ms]
            assert leader_of(ms) is leader
        else:
            assert moved, "without reading first, the stalled follower should have started an election"
