"""The chaos checker: pure functions (and incremental checkers) over the recorded history.

The history is what the processes wrote (``controlplane/chaos/node.py``), never inferred by the
harness: the adapters' fencing verdicts and commands, the coordinators' lease validity intervals and
the instance transitions of their change feeds, plus the writes the client saw acknowledged and the
tenant ids each coordinator's replicated state holds after heal-and-settle.

Properties (each checker returns :class:`Violation` values; an empty list means it holds):

* **No stale command accepted** (:class:`StaleChecker`): per adapter, in the order the adapter
  decided (its journal order), every accepted epoch is >= every epoch it accepted before, and an
  equal epoch comes from the same holder; a command carried out (``cmd``) never carries an epoch
  below one already accepted.
* **At most one lease holder at any instant** (:class:`LeaseChecker`): docs/lease.md's guarantee is
  that the holder validity intervals ``[t_send, valid_until)`` of different epochs never overlap
  (both ends on the host's monotonic clock, with clock rates within the drift bound). Per
  ``(node, epoch)`` the interval is [earliest start, latest end] of its records; an epoch held by two
  nodes, or two intervals of different epochs that overlap, is a violation. An interval ends early
  where the node recorded that it gave the authority up or lost it (``lease_end``: its guard zeroes
  the validity before, e.g., releasing the lease on a step-down, after which another node may
  acquire at once). The smallest gap between
  consecutive intervals is reported (the safety margin left).
* **No illegal transition** (:class:`TransitionChecker`): every transition of every instance is a
  row of :data:`controlplane.domain.instances.TRANSITIONS` (or the ``create`` into Pending); per
  instance, in revision order, each transition starts in the state the previous one ended in when a
  coordinator's feed covered both revisions without a gap; nothing follows a terminal state; and
  every replica derived the same event for the same revision.
* **No lost writes** (:func:`lost_writes`): every acknowledged write is present on every node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from controlplane.domain.instances import TRANSITIONS, InstanceEvent, InstanceState

TERMINAL = {InstanceState.TERMINATED.value, InstanceState.FAILED.value}
LEGAL = {(s.value, e.value): d.value for (s, e), d in TRANSITIONS.items()}
EVENT_NAMES = {e.value for e in InstanceEvent}

Record = Mapping[str, Any]


@dataclass(frozen=True)
class Violation:
    prop: str
    """``stale``, ``lease``, ``transition``, ``lost_write`` or ``convergence``."""
    detail: str

    def __str__(self) -> str:
        return f"{self.prop}: {self.detail}"


class StaleChecker:
    """Fencing at the adapters, fed journal records of each adapter in file order."""

    def __init__(self) -> None:
        self.highest: dict[str, tuple[int, str]] = {}
        self.accepted = 0
        self.rejected = 0
        self.violations: list[Violation] = []

    def feed(self, cluster: str, records: Iterable[Record]) -> None:
        for r in records:
            kind = r.get("k")
            if kind == "admit":
                epoch, holder = int(r["epoch"]), str(r["holder"])
                if not r["ok"]:
                    self.rejected += 1
                    continue
                self.accepted += 1
                top, top_holder = self.highest.get(cluster, (0, ""))
                if epoch < top or (epoch == top and top_holder and holder != top_holder):
                    self.violations.append(Violation(
                        "stale", f"{cluster} accepted epoch {epoch} of {holder!r} after epoch {top} of {top_holder!r} "
                                 f"(t={r.get('t')})"))
                if epoch > top:
                    self.highest[cluster] = (epoch, holder)
            elif kind == "cmd":
                epoch = int(r["epoch"])
                top, _ = self.highest.get(cluster, (0, ""))
                if epoch < top:
                    self.violations.append(Violation(
                        "stale", f"{cluster} carried out {r.get('verb')} {r.get('rid')} of epoch {epoch} after accepting "
                                 f"epoch {top} (t={r.get('t')})"))


@dataclass
class Interval:
    node: str
    epoch: int
    start_ms: float
    until_ms: float


class LeaseChecker:
    """Holder validity intervals, fed the coordinators' ``lease`` records."""

    def __init__(self) -> None:
        self.intervals: dict[tuple[str, int], Interval] = {}
        self.ended: dict[tuple[str, int], float] = {}
        """When a node gave up or lost an epoch's authority (it stops acting then, whatever its
        validity said): the interval ends there."""

    def feed(self, records: Iterable[Record]) -> None:
        for r in records:
            if r.get("k") == "lease_end":
                key = (str(r["node"]), int(r["epoch"]))
                self.ended[key] = min(self.ended.get(key, float("inf")), float(r["at_ms"]))
                continue
            if r.get("k") != "lease":
                continue
            key = (str(r["node"]), int(r["epoch"]))
            iv = self.intervals.get(key)
            start, until = float(r["start_ms"]), float(r["until_ms"])
            if iv is None:
                self.intervals[key] = Interval(key[0], key[1], start, until)
            else:
                iv.start_ms, iv.until_ms = min(iv.start_ms, start), max(iv.until_ms, until)

    def check(self) -> tuple[list[Violation], float | None]:
        """(violations, smallest gap in ms between consecutive validity intervals)."""
        out: list[Violation] = []
        holders: dict[int, str] = {}
        for (node, epoch) in sorted(self.intervals, key=lambda k: k[1]):
            if epoch in holders and holders[epoch] != node:
                out.append(Violation("lease", f"epoch {epoch} held by {holders[epoch]} and {node}"))
            holders.setdefault(epoch, node)
        ivs = [Interval(i.node, i.epoch, i.start_ms, min(i.until_ms, self.ended.get((i.node, i.epoch), i.until_ms)))
               for i in self.intervals.values()]
        ivs = [i for i in ivs if i.until_ms > i.start_ms]
        ivs.sort(key=lambda i: (i.start_ms, i.epoch))
        gap: float | None = None
        reach: Interval | None = None  # the interval reaching furthest so far
        for iv in ivs:
            if reach is not None:
                if reach.epoch != iv.epoch and iv.start_ms < reach.until_ms:
                    out.append(Violation("lease", f"{reach.node}@{reach.epoch} valid until {reach.until_ms:.1f} ms but "
                                                  f"{iv.node}@{iv.epoch} valid from {iv.start_ms:.1f} ms "
                                                  f"(overlap {reach.until_ms - iv.start_ms:.1f} ms)"))
                elif reach.epoch != iv.epoch:
                    g = iv.start_ms - reach.until_ms
                    gap = g if gap is None else min(gap, g)
                if iv.epoch != reach.epoch and iv.epoch < reach.epoch and iv.start_ms >= reach.until_ms:
                    out.append(Violation("lease", f"epoch {iv.epoch} ({iv.node}) valid after the newer epoch "
                                                  f"{reach.epoch} ({reach.node})"))
            if reach is None or iv.until_ms > reach.until_ms:
                reach = iv
        return out, gap


@dataclass
class _Segment:
    start: int
    end: int


@dataclass
class TransitionChecker:
    """Instance transitions from the coordinators' change feeds."""

    events: dict[int, dict[str, Any]] = field(default_factory=dict)
    segments: dict[str, list[_Segment]] = field(default_factory=dict)
    divergent: list[Violation] = field(default_factory=list)

    def feed(self, node: str, records: Iterable[Record]) -> None:
        segs = self.segments.setdefault(node, [])
        for r in records:
            kind = r.get("k")
            if kind == "start":
                segs.append(_Segment(-1, -1))  # a new process: nothing covered until its first seg
            elif kind == "seg":
                segs.append(_Segment(int(r["rev"]), int(r["rev"])))
            elif kind in ("cov", "tr") and segs and segs[-1].start >= 0:
                segs[-1].end = max(segs[-1].end, int(r["rev"]))
            if kind != "tr":
                continue
            ev = {"inst": r["inst"], "frm": r["frm"], "to": r["to"], "ev": r["ev"], "dep": r.get("dep", "")}
            rev = int(r["rev"])
            seen = self.events.get(rev)
            if seen is None:
                self.events[rev] = ev
            elif seen != ev:
                self.divergent.append(Violation("transition", f"revision {rev}: {node} derived {ev}, another node {seen}"))

    def covered(self, r1: int, r2: int) -> bool:
        """Some node's feed saw every revision in ``[r1, r2]`` without a restart or a gap."""
        return any(s.start >= 0 and s.start < r1 and r2 <= s.end for segs in self.segments.values() for s in segs)

    def check(self) -> list[Violation]:
        out = list(self.divergent)
        chains: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for rev in sorted(self.events):
            ev = self.events[rev]
            chains.setdefault(ev["inst"], []).append((rev, ev))
            if ev["ev"] == "create":
                if ev["frm"] != "" or ev["to"] != InstanceState.PENDING.value:
                    out.append(Violation("transition", f"{ev['inst']} created as {ev['frm']!r}->{ev['to']!r} (rev {rev})"))
            elif LEGAL.get((ev["frm"], ev["ev"])) != ev["to"]:
                out.append(Violation("transition", f"{ev['inst']}: {ev['frm']} --{ev['ev']}--> {ev['to']} is not in "
                                                   f"the lifecycle table (rev {rev})"))
        for inst, chain in chains.items():
            for (r1, a), (r2, b) in pairwise(chain):
                if b["ev"] == "create":
                    out.append(Violation("transition", f"{inst} created again at rev {r2} (first event at rev {r1})"))
                elif a["to"] in TERMINAL:
                    out.append(Violation("transition", f"{inst}: {b['frm']} --{b['ev']}--> {b['to']} at rev {r2} after "
                                                       f"the terminal {a['to']} at rev {r1}"))
                elif a["to"] != b["frm"] and self.covered(r1, r2):
                    out.append(Violation("transition", f"{inst}: ended in {a['to']} at rev {r1} but the next "
                                                       f"transition starts from {b['frm']} at rev {r2}"))
        return out


def check_stale(adapter_journals: Mapping[str, Iterable[Record]]) -> list[Violation]:
    checker = StaleChecker()
    for cluster, records in adapter_journals.items():
        checker.feed(cluster, records)
    return checker.violations


def check_lease(coordinator_journals: Mapping[str, Iterable[Record]]) -> list[Violation]:
    checker = LeaseChecker()
    for records in coordinator_journals.values():
        checker.feed(records)
    return checker.check()[0]


def check_transitions(coordinator_journals: Mapping[str, Iterable[Record]]) -> list[Violation]:
    checker = TransitionChecker()
    for node, records in coordinator_journals.items():
        checker.feed(node, records)
    return checker.check()


def lost_writes(acked: Iterable[str], present_by_node: Mapping[str, Iterable[str]]) -> list[Violation]:
    """Every acknowledged write (a tenant id) must be in every node's replicated state."""
    acked = list(acked)
    out = []
    for node, present in sorted(present_by_node.items()):
        have = set(present)
        missing = [w for w in acked if w not in have]
        if missing:
            out.append(Violation("lost_write", f"{node} lacks {len(missing)} acknowledged writes: {missing[:5]}"))
    return out


def converged(expected: int, desired_by_node: Mapping[str, int | None], serving: int) -> Violation | None:
    """Replicas converged to ``expected`` (the decision for the final load): every node's replicated
    desired count and the instances serving at the adapters."""
    values = set(desired_by_node.values())
    if values == {expected} and serving == expected:
        return None
    return Violation("convergence", f"expected {expected} replicas: desired by node {dict(desired_by_node)}, "
                                    f"serving at the adapters {serving}")
