"""Leader stickiness for pysyncobj: an inbound filter that keeps a member with a live leader from being
dragged into an election by a disruptive peer (Raft thesis §4.2.3 "disruptive servers"; etcd's
CheckQuorum behaviour: "a follower that heard from a live leader within the minimum election timeout
ignores RequestVote with a higher term").

pysyncobj has neither pre-vote nor stickiness: any ``request_vote`` with a higher term makes the
receiver adopt that term and, if it was the leader, step down, even when the candidate only timed out
because *its own* tick thread stalled (fsync, CPU) while the leader was healthy. The transport calls
:meth:`Stickiness.admit` for every decoded inbound message; a ``False`` drops it before pysyncobj
sees it. Pure: every time is passed in (seconds on a monotonic clock); the role and term come from
:meth:`observe_tick` (wire it to ``RaftNode.add_tick_observer``).

What pysyncobj does with the messages involved (0.3.17 ``syncobj.py``), which fixes the rules below:

* ``request_vote {term, last_log_index, last_log_term}``: a higher term is adopted at once (a
  leader steps down); the vote is granted if the log is up to date and no vote was cast.
* ``append_entries {term, ...}`` with ``term >= ours``: follow the sender; a lower term is ignored
  without an answer. ``next_node_idx`` (the follower's answer) carries **no term**, and
  ``response_vote`` only counts at the candidate's current term. So a member whose term ran ahead
  (it was partitioned, or it stalled and campaigned) can never rejoin on the old term: it ignores the
  leader, and only a ``request_vote`` at its higher term can raise everyone else's term.
* ``timeout_now {term}`` (``transferLeadership``) from the leader: the receiver campaigns at once.

Rules (``R`` = ``min_election_timeout_s``):

1. Anything but a ``request_vote`` whose term is above ours is admitted unchanged.
2. **No live leader known** (fresh group start, or the leader went quiet for ``R``): admitted. A
   follower "knows a live leader" when it admitted an ``append_entries`` at a term >= its own within
   ``R``; the leader itself when a majority of the group (itself included) answered it
   (``next_node_idx``) within ``R``.
3. **A live leader is known**: dropped, so the healthy leader keeps its term and leadership, and a
   healthy follower keeps following it.
4. **Leadership transfer**: :meth:`expect_transfer` (call it right before ``transferLeadership``)
   admits the target's ``request_vote`` for ``transfer_window_s``. Other followers still drop it
   until they have not heard the old leader for ``R``; the target's campaign succeeds with the old
   leader's vote (3 members) or on its next attempt (5 members: the old leader stopped heartbeating
   when it stepped down).
5. **Rejoin**: a peer that keeps asking for votes at terms above ours for ``rejoin_after_s``
   (its term ran ahead and it cannot rejoin otherwise, see above) is admitted once per
   ``rejoin_after_s``. That costs one election, which it normally loses: by then its log is behind the
   leader's (renewals kept committing), so the old leader is usually re-elected at the higher term and
   keeps its lease (same holder, same epoch: ``LeaseGuard`` adopts it). Without this rule the member
   would stay out of the group for good.

Stickiness never affects safety (dropping a message is always allowed in Raft); it trades a slower
reaction to a genuinely dead leader seen by only one member (at most ``R`` later) for not deposing a
live one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StickinessStats:
    admitted_votes: int
    dropped_votes: int
    rejoin_admits: int
    transfer_admits: int


class Stickiness:
    """``InboundFilter`` (``admit(sender, message, now_s) -> bool``) for one member of a group of
    ``group_size`` voters. ``sender`` is the peer's identity as the transport names it (any stable
    name: contact with a leader is learnt from its ``append_entries`` here, not from
    :meth:`observe_tick`)."""

    def __init__(self, group_size: int, min_election_timeout_s: float, *, rejoin_after_s: float,
                 transfer_window_s: float | None = None) -> None:
        if group_size < 1:
            raise ValueError(f"group_size: must be >= 1, got {group_size}")
        if min_election_timeout_s <= 0:
            raise ValueError(f"min_election_timeout_s: must be > 0, got {min_election_timeout_s}")
        if rejoin_after_s < min_election_timeout_s:
            raise ValueError(f"rejoin_after_s: must be >= min_election_timeout_s ({min_election_timeout_s}), got {rejoin_after_s}")
        self.group_size = group_size
        self.window_s = min_election_timeout_s
        self.rejoin_after_s = rejoin_after_s
        self.transfer_window_s = transfer_window_s if transfer_window_s is not None else 2 * min_election_timeout_s
        self._lock = threading.Lock()
        self._role = "follower"
        self._term = 0
        self._leader: str | None = None
        self._leader_heard_s: float | None = None
        self._answers: dict[str, float] = {}
        self._disrupting_since: dict[str, float] = {}
        self._last_rejoin: dict[str, float] = {}
        self._transfer: tuple[str, float] | None = None
        self._n = {"admitted": 0, "dropped": 0, "rejoin": 0, "transfer": 0}

    # --- feeds -----------------------------------------------------------------------------------
    def observe_tick(self, now_s: float, role: str, term: int, leader: str | None) -> None:
        """This member's role, term and leader after a tick (from ``RaftNode.add_tick_observer``)."""
        with self._lock:
            if role == "leader" and self._role != "leader":
                self._answers.clear()  # a new leadership: only answers to *this* leader count
            if term != self._term:
                self._disrupting_since.clear()
            self._role, self._term = role, term
            if role != "follower" or leader is None:
                # campaigning, leading, or the leader was lost: no other leader is known to be live
                # (contact is recorded only by admit(), when an append_entries arrives)
                self._leader, self._leader_heard_s = None, None

    def expect_transfer(self, target: str, now_s: float) -> None:
        """We (the leader) are about to send ``timeout_now`` to ``target``: admit its campaign."""
        with self._lock:
            self._transfer = (target, now_s)

    # --- the filter ------------------------------------------------------------------------------
    def admit(self, sender: str, message: object, now_s: float) -> bool:
        if not isinstance(message, Mapping):
            return True
        kind = message.get("type")
        term = message.get("term")
        with self._lock:
            if kind == "append_entries" and isinstance(term, int) and term >= self._term:
                self._leader, self._leader_heard_s = sender, now_s
                self._disrupting_since.pop(sender, None)
                return True
            if kind == "next_node_idx":
                self._answers[sender] = now_s
                return True
            if kind != "request_vote" or not isinstance(term, int) or term <= self._term:
                return True
            return self._decide_vote(sender, now_s)

    def _decide_vote(self, sender: str, now_s: float) -> bool:
        if not self._live_leader(now_s):
            self._disrupting_since.pop(sender, None)
            self._n["admitted"] += 1
            return True
        if self._transfer is not None and self._transfer[0] == sender and now_s - self._transfer[1] <= self.transfer_window_s:
            self._transfer = None
            self._n["transfer"] += 1
            self._n["admitted"] += 1
            return True
        since = self._disrupting_since.setdefault(sender, now_s)
        last = self._last_rejoin.get(sender)
        if now_s - since >= self.rejoin_after_s and (last is None or now_s - last >= self.rejoin_after_s):
            self._last_rejoin[sender] = now_s
            self._disrupting_since.pop(sender, None)
            self._n["rejoin"] += 1
            self._n["admitted"] += 1
            return True
        self._n["dropped"] += 1
        return False

    def _live_leader(self, now_s: float) -> bool:
        if self._role == "leader":
            fresh = sum(1 for t in self._answers.values() if now_s - t < self.window_s)
            return 2 * (fresh + 1) > self.group_size
        return self._leader_heard_s is not None and now_s - self._leader_heard_s < self.window_s

    def statistics(self) -> StickinessStats:
        with self._lock:
            n = dict(self._n)
        return StickinessStats(n["admitted"], n["dropped"], n["rejoin"], n["transfer"])
