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
* **Tenant isolation** (:class:`IsolationChecker`): the tenant ``bravo`` calls every API method
  against ``alpha``'s objects and against objects that do not exist (``isolation.py`` records the
  probes); alpha's objects must answer exactly like missing ones. A probe is a violation when either
  answer is UNKNOWN or INTERNAL; an answer holds alpha's names (a reply to a request that did not
  name alpha, or a successful reply to one that did); a mutation naming alpha's objects (or any
  admin-only method) succeeds; an admin-only method answers anything but PERMISSION_DENIED; the
  status code about alpha's object differs from the one about the missing object, or the two give
  the same refusal in other words (error texts compared with the names asked about and all numbers
  blanked; successful replies are compared by code only, as they carry live fields such as a
  node's role). After settling, alpha's objects must be unchanged on every node (the runner). Pairs where
  either side is UNAVAILABLE or DEADLINE_EXCEEDED (a node failing over, paused, killed, cut off) are
  not compared (counted as ``skipped``); the other rules still apply to the side that answered.
"""

from __future__ import annotations

import re
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
    """``stale``, ``lease``, ``transition``, ``lost_write``, ``convergence`` or ``isolation``."""
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


# --- tenant isolation ----------------------------------------------------------------------------

ISO_ALPHA, ISO_ALPHA_DEP = "alpha-secret", "alpha-dep-secret"
"""The tenant whose objects bravo aims at, and its deployment (distinctive names: they must never
appear in an answer to bravo except echoed back in an error about a request that named them)."""
ISO_BRAVO, ISO_BRAVO_DEP = "bravo", "bravo-dep"
ISO_GHOST, ISO_GHOST_DEP = "ghost-secret", "ghost-dep-secret"
"""A tenant and a deployment that never exist: what bravo gets for alpha's must be what it gets for these."""
ADMIN_ONLY = frozenset({
    "CreateTenant", "UpdateTenant", "DeleteTenant", "CreateToken", "ListTokens", "RevokeToken", "AddMember",
    "RemoveMember", "RegisterCluster", "GetCluster", "ListClusters", "DeleteCluster", "CordonCluster",
    "DrainCluster", "RegisterZone", "GetZone", "ListZones", "DeleteZone", "CordonZone", "DrainZone"})
MUTATING = frozenset({
    "CreateTenant", "UpdateTenant", "DeleteTenant", "ApplyDeployment", "DeleteDeployment", "RegisterCluster",
    "DeleteCluster", "CordonCluster", "DrainCluster", "RegisterZone", "DeleteZone", "CordonZone", "DrainZone",
    "CreateToken", "RevokeToken", "AddMember", "RemoveMember"})
"""Methods that change state: bravo's call naming alpha's objects must never succeed."""
FAILOVER_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
"""What a node without a leader (or paused, killed, cut off) may answer instead: not compared."""
BROKEN_CODES = frozenset({"UNKNOWN", "INTERNAL"})


def normal(text: str, tenant: str, dep: str) -> str:
    """An error text with the names asked about replaced and numbers (revisions, indexes) blanked."""
    return re.sub(r"\d+", "N", text.replace(dep, "<DEP>").replace(tenant, "<TENANT>"))


@dataclass
class IsolationChecker:
    """Tenant isolation from the prober's records (:class:`~controlplane.chaos.history.Probe`)."""

    alpha_names: tuple[str, ...] = (ISO_ALPHA, ISO_ALPHA_DEP)
    probes: int = 0
    compared: int = 0
    skipped: int = 0
    answered_ok: int = 0
    """Probes where bravo got a real answer (OK) about its own view: the prober was not only refused."""
    methods: set[str] = field(default_factory=set)
    answers: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per method, how often bravo's request naming alpha got each status code (the evidence)."""
    violations: list[Violation] = field(default_factory=list)

    def _leaks(self, text: str) -> list[str]:
        return [n for n in self.alpha_names if n in text]

    def feed(self, probes: Iterable[Any]) -> list[Violation]:
        """Check ``probes``; returns the new violations (also kept in :attr:`violations`)."""
        new: list[Violation] = []
        for p in probes:
            self.probes += 1
            self.methods.add(f"{p.service}.{p.method}")
            where = f"{p.service}.{p.method} on {p.endpoint} (t={p.t:.3f})"
            a_code, a_text = p.alpha
            tally = self.answers.setdefault(f"{p.service}.{p.method}" + ("" if p.ghost is not None else " (neutral)"), {})
            tally[a_code] = tally.get(a_code, 0) + 1
            sides = [("alpha", a_code, a_text)] + ([("ghost", *p.ghost)] if p.ghost is not None else [])
            for side, code, text in sides:
                if code in BROKEN_CODES:
                    new.append(Violation("isolation", f"{where}: {side} request answered {code}: {text[:200]}"))
                if p.method in ADMIN_ONLY and code not in FAILOVER_CODES and code != "PERMISSION_DENIED":
                    new.append(Violation("isolation", f"{where}: admin-only method answered bravo's {side} request "
                                                      f"{code} (expected PERMISSION_DENIED): {text[:200]}"))
                # a request naming alpha may get its names echoed in an error; nothing else may hold them
                leaked = self._leaks(text) if (side != "alpha" or p.ghost is None or code == "OK") else []
                if leaked:
                    new.append(Violation("isolation", f"{where}: the answer to bravo's {side} request holds alpha's "
                                                      f"{leaked}: {code}: {text[:300]}"))
            if a_code == "OK":
                self.answered_ok += 1
                if p.method in MUTATING and p.ghost is not None:
                    new.append(Violation("isolation", f"{where}: bravo's mutation of alpha's object succeeded: "
                                                      f"{a_text[:200]}"))
            if p.ghost is None:
                continue
            g_code, g_text = p.ghost
            if a_code in FAILOVER_CODES or g_code in FAILOVER_CODES:
                self.skipped += 1
                continue
            self.compared += 1
            if a_code != g_code:
                new.append(Violation("isolation", f"{where}: alpha's objects answer {a_code} but objects that do not "
                                                  f"exist answer {g_code}: alpha: {a_text[:200]!r}; "
                                                  f"ghost: {g_text[:200]!r}"))
            elif a_code != "OK" and (normal(a_text, ISO_ALPHA, ISO_ALPHA_DEP)
                                     != normal(g_text, ISO_GHOST, ISO_GHOST_DEP)):
                # same refusal, other words ("exists but is not yours" vs "not found"): it tells
                new.append(Violation("isolation", f"{where}: the same {a_code} in other words: alpha: "
                                                  f"{a_text[:200]!r}; ghost: {g_text[:200]!r}"))
        self.violations += new
        return new
