"""TickWatch: what a Raft member's tick thread went through: stalls (the gap between two ticks), GC
pauses, the elections it started and why, the leaders it followed, the lease epochs it saw.

Pure bookkeeping, fed by its owner with explicit times (seconds on the monotonic clock, which every
process on one host shares, so records of several members can be merged):

* ``observe_tick(now_s, role, term, leader)`` after every pysyncobj tick (tick thread);
* ``admit(sender, message, now_s)`` for every decoded inbound Raft message: the signature of the
  transport's ``InboundFilter``; TickWatch only looks and always admits;
* ``gc_callback(phase, info)`` as an entry of ``gc.callbacks`` (its clock is the one given at
  construction);
* ``observe_lease(now_s, holder, epoch)`` whenever its owner samples the applied lease record.

``summary()`` returns plain JSON-ready data. Used by ``controlplane bench stability``
(``controlplane/bench/stability.py``) and its tests; docs/reliability.md has the measurements.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

STALL_BUCKETS_MS = (50, 100, 150, 250, 450, 1000, 2000)
"""Tick gaps are counted per bucket (a gap >= the bucket's bound)."""
MAX_RECORDS = 10_000
"""Elections, leader changes and lease changes kept per kind (later ones are counted, not kept)."""


@dataclass(frozen=True, slots=True)
class Election:
    at_s: float
    term: int
    since_leader_msg_ms: float | None
    """Time since the last message, read by the end of the previous tick, from the last leader this
    member followed (None: it never followed one). Below the election timeout plus the tick gap: the
    timer expired because this member's own tick stalled, not because the leader went quiet."""
    since_any_msg_ms: float | None
    tick_gap_ms: float
    """The gap between the two ticks around the election: a stall longer than the election timeout
    means the timer may have expired while the tick thread was not running."""
    previous_role: str


@dataclass(frozen=True, slots=True)
class LeaderSeen:
    at_s: float
    term: int
    leader: str | None
    role: str


@dataclass(frozen=True, slots=True)
class LeaseSeen:
    at_s: float
    holder: str
    epoch: int


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


class TickWatch:
    def __init__(self, node_id: str, clock_s: Callable[[], float]) -> None:
        self.node_id = node_id
        self._clock = clock_s
        self._lock = threading.Lock()
        self._last_tick: float | None = None
        self._gaps: list[float] = []
        self._gap_max = 0.0
        self._gap_buckets = dict.fromkeys(STALL_BUCKETS_MS, 0)
        self._role = "follower"
        self._term = 0
        self._leader: str | None = None
        self._followed: str | None = None
        """The last leader other than this member."""
        self._heard_leader_before: float | None = None
        self._heard_any_before: float | None = None
        self._last_leader_msg: dict[str, float] = {}
        self._last_any_msg: float | None = None
        self._votes_seen: dict[str, int] = {}
        self.elections: list[Election] = []
        self.leaders: list[LeaderSeen] = []
        self.leases: list[LeaseSeen] = []
        self._dropped = 0
        self._gc_start: float | None = None
        self._gc: list[float] = []
        self._ticks = 0

    # --- feeds ---------------------------------------------------------------------------------
    def admit(self, sender: str, message: object, now_s: float) -> bool:
        """InboundFilter signature: note who spoke and when; always admit."""
        kind = message.get("type") if isinstance(message, Mapping) else None
        with self._lock:
            self._last_any_msg = now_s
            if kind == "append_entries":
                self._last_leader_msg[sender] = now_s
            elif kind == "request_vote":
                self._votes_seen[sender] = self._votes_seen.get(sender, 0) + 1
        return True

    def observe_tick(self, now_s: float, role: str, term: int, leader: str | None) -> None:
        with self._lock:
            gap = 0.0 if self._last_tick is None else (now_s - self._last_tick) * 1000.0
            self._last_tick = now_s
            self._ticks += 1
            if len(self._gaps) < 100_000:
                self._gaps.append(gap)
            self._gap_max = max(self._gap_max, gap)
            for b in STALL_BUCKETS_MS:
                if gap >= b:
                    self._gap_buckets[b] += 1
            if role == "candidate" and (term > self._term or self._role != "candidate"):
                # pysyncobj decides on an election at the start of a tick and reads the sockets at its
                # end, so judge by what had been heard when the previous tick ended
                lm, anym = self._heard_leader_before, self._heard_any_before
                self._keep(self.elections, Election(
                    now_s, term, None if lm is None else round((now_s - lm) * 1000.0, 1),
                    None if anym is None else round((now_s - anym) * 1000.0, 1),
                    round(gap, 1), self._role))
            if (leader, term) != (self._leader, self._term) and leader is not None:
                self._keep(self.leaders, LeaderSeen(now_s, term, leader, role))
            self._role, self._term = role, term
            if leader is not None:
                self._leader = leader
            if leader is not None and leader != self.node_id:
                self._followed = leader
            self._heard_leader_before = self._last_leader_msg.get(self._followed) if self._followed else None
            self._heard_any_before = self._last_any_msg

    def observe_lease(self, now_s: float, holder: str, epoch: int) -> None:
        with self._lock:
            if holder and (not self.leases or self.leases[-1].epoch != epoch):
                self._keep(self.leases, LeaseSeen(now_s, holder, epoch))

    def gc_callback(self, phase: str, info: Mapping[str, object]) -> None:
        """``gc.callbacks`` entry. Takes no lock: a collection runs in whichever thread allocates,
        also inside this watch's own locked sections (``summary`` allocates plenty), where taking the
        (non-reentrant) lock deadlocked that thread, and with it the tick thread. Only collections
        write ``_gc_start`` and append to ``_gc`` (one at a time, under the GIL); readers copy."""
        now = self._clock()
        if phase == "start":
            self._gc_start = now
        elif phase == "stop" and self._gc_start is not None:
            self._gc.append((now - self._gc_start) * 1000.0)
            self._gc_start = None

    def _keep(self, bucket: list, item: object) -> None:  # type: ignore[type-arg]
        if len(bucket) < MAX_RECORDS:
            bucket.append(item)
        else:
            self._dropped += 1

    # --- results -------------------------------------------------------------------------------
    def summary(self) -> dict[str, object]:
        with self._lock:
            gaps, gc_ms = list(self._gaps), list(self._gc)
            return {
                "node_id": self.node_id,
                "ticks": self._ticks,
                "tick_gap_ms": {"p50": _round(_percentile(gaps, 50)), "p99": _round(_percentile(gaps, 99)),
                                "p999": _round(_percentile(gaps, 99.9)), "max": round(self._gap_max, 1),
                                "at_least": {str(k): v for k, v in self._gap_buckets.items()}},
                "gc_pause_ms": {"n": len(gc_ms), "p99": _round(_percentile(gc_ms, 99)),
                                "max": _round(max(gc_ms) if gc_ms else None), "total": round(sum(gc_ms), 1)},
                "elections_started": [asdict(e) for e in self.elections],
                "leaders_seen": [asdict(x) for x in self.leaders],
                "leases_seen": [asdict(x) for x in self.leases],
                "vote_requests_received": dict(self._votes_seen),
                "final_term": self._term,
                "records_dropped": self._dropped,
            }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)
