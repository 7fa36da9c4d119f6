"""Stable leadership on a busy machine (issue 14 item 6; docs/reliability.md "Leadership under load"):
what ``RaftNode``'s tick loop does around pysyncobj's timers."""

from __future__ import annotations

import time

from pysyncobj import SyncObj

READ_BEFORE_TIMERS_ROUNDS = 4
"""At most this many non-blocking reads before a tick (each one may itself stall in an fsync)."""
READ_BEFORE_TIMERS_SLOW_S = 0.02
"""A read that took longer than this may have let more messages arrive: read again (up to the rounds)."""


def read_before_timers(obj: SyncObj) -> None:
    """Read and handle what is already waiting on the sockets *before* pysyncobj's timers run.

    pysyncobj's tick checks the follower's election deadline and the leader's check-quorum
    (``leaderFallbackTimeout``) first and reads the sockets only at its end. So when the tick thread
    stalled (an fsync under disk contention, CPU starvation) for longer than the election timeout, the
    next tick starts an election, or the leader steps down, although the leader's heartbeats or the
    followers' answers are sitting unread in the socket buffers. Reading them first resets the
    deadline / the response times, and the timers then judge the peers, not our own stall. A real
    silence (dead leader, partition) leaves nothing to read, so failover is unchanged.

    Uses pysyncobj's poller (``SyncObj._poller``, the one its transport registers every socket with;
    ``tests/raft/test_read_before_timers.py`` checks that it exists and that the stall case works)."""
    poller = getattr(obj, "_poller", None)
    if poller is None:
        return
    for _ in range(READ_BEFORE_TIMERS_ROUNDS):
        t0 = time.monotonic()
        poller.poll(0)
        if time.monotonic() - t0 < READ_BEFORE_TIMERS_SLOW_S:
            return
