"""Hostile-input attacks as seeded faults, and their verdicts (pure: no clock, no I/O).

``controlplane bench hostile`` (``controlplane/bench/hostile.py``) runs each attack against a fresh
group of real processes on 127.0.0.1 (``hostile_run.py`` drives them, ``attacks.py`` holds the
attackers); this module decides *what* each attack does (:func:`plan`, from a seed) and *whether the
group withstood it* (:func:`verdict`, from the measured figures). The same seed always gives the
same plan (``random.Random(seed)``); which process "the leader" is gets resolved when the attack
starts.

Attacks (:data:`KINDS`; docs/reliability.md, "Hostile input"):

* ``poisoned_fence`` -- ``Fence(epoch=2**63-1)`` to one adapter with the adapter token, then a
  forged ``Scale`` carrying the live holder's epoch and name (as read from ``Admin.Status``) to the
  other adapter; then the offered load steps up. Passes when both are refused, the huge epoch is
  not persisted and the holder still decides (the scale-out is committed).
* ``raft_frames`` -- against one member's Raft port: two senders announce 2 GiB frames and trickle
  their bodies at ~0.8 MB/s, a third sends half of a 1 MiB frame and holds it open. Passes when the
  group keeps committing, the member's RSS stays bounded and the Raft term does not explode.
* ``fd_exhaustion`` -- the member's ``RLIMIT_NOFILE`` lowered to its open descriptors plus a
  headroom, then connections to its API and Raft ports until refused (bounded), held, released.
  Passes when it accepts again and a quorum that needs it (one other member restarted, the third
  paused) commits.
* ``journal_corruption`` -- per variant (``flip`` a digit inside a committed entry, ``garbage``
  over the entries, ``empty_meta``, ``truncate`` the journal) a follower is stopped, its files
  changed, it is restarted. Passes per variant when it either stops cleanly (exits or answers
  NOT_SERVING, one line naming the journal, no traceback) or recovers (SERVING, caught up), and
  never diverges silently (an object with the same resource_version but another value on two
  members).
* ``disk_full`` -- the member's data directory on a small tmpfs (mounted by the bench, as root),
  filled up. Passes when the member survives (no SIGBUS), reports it (NOT_SERVING or a log line
  about the disk) and the rest go on.
* ``watch_flood`` -- one tenant opens ``Watch(once=True)`` streams and live watches on every
  coordinator. Passes when another tenant can still watch, admin ``Status`` answers within a bound
  on every coordinator and the lease does not move.
* ``object_flood`` -- one tenant creates deployments in a loop (bounded). Passes when it is refused
  (RESOURCE_EXHAUSTED) at a per-tenant cap below the bound and another tenant can still create one.

Global checks (every attack): the group keeps committing -- the longest time without an
acknowledged write from the attack's start until the end of its observation is at most
:data:`COMMIT_GAP_MS` -- no acknowledged write lost, no silent divergence, no ``Traceback`` in any
process's log.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from controlplane.config import CoordinatorConfig

KINDS = ("poisoned_fence", "raft_frames", "fd_exhaustion", "journal_corruption", "disk_full", "watch_flood",
         "object_flood")
JOURNAL_VARIANTS = ("flip", "garbage", "empty_meta", "truncate")

# --- the bounds of the verdicts (documented in docs/reliability.md) ---------------------------------
COMMIT_GAP_MS = 2000.0
"""Longest time without an acknowledged write from the attack's start to the end of its observation."""
RSS_GROWTH_MIB = 16.0
"""Most the attacked member's resident memory may grow during ``raft_frames``."""
TERM_GROWTH = 2
"""Most the Raft term may grow during an attack (one election, plus one that split)."""
STATUS_BOUND_MS = 1000.0
"""Admin ``Status`` must answer within this on every coordinator during ``watch_flood``."""
WATCH_OPEN_MS = 1500.0
"""Another tenant's watch must be answered (or stay open, not refused) within this."""
QUORUM_S = 10.0
"""After ``fd_exhaustion`` is released, a quorum that needs the member must commit within this."""
DECIDE_S = 10.0
"""``poisoned_fence``: after the attack the offered load steps up; the scale-out must be decided within this."""
POISON_EPOCH = 2**63 - 1
RECOVER_S = 20.0
"""``disk_full``: after the space is freed, a restarted member must hold every acknowledged write within this."""


DEFAULT_DEPLOYMENT_CAP: int = CoordinatorConfig.model_fields["api_max_deployments_per_tenant"].default


@dataclass(frozen=True)
class Sizes:
    """How hard and how long: :data:`FULL` reproduces the issue's figures, :data:`SHORT` is the
    CI version (every attack in a few seconds)."""

    duration_s: float
    frame_senders: int = 2
    frame_rate_bps: int = 800_000
    frame_preload_mib: int = 0
    """Bytes each frame sender pushes at full speed before trickling (the short version compresses
    minutes of trickling into a preload)."""
    half_frame_bytes: int = 512 * 1024
    fd_headroom: int = 64
    fd_max_connections: int = 1024
    fd_api_connections: int = 256
    tmpfs_mib: int = 16
    once_watches: int = 200
    live_watches: int = 48
    max_objects: int = 3000
    journal_observe_s: float = 15.0


FULL = Sizes(duration_s=30.0)
SHORT = Sizes(duration_s=4.0, frame_preload_mib=24, max_objects=DEFAULT_DEPLOYMENT_CAP + 10, journal_observe_s=6.0)
"""The short object flood goes just past the product's default per-tenant cap (it must meet it)."""


@dataclass(frozen=True)
class AttackSpec:
    kind: str
    seed: int
    start_s: float
    """Seconds after the group is ready (a holder and an acknowledged write) that the attack starts."""
    duration_s: float
    target: str
    """``leader``, ``follower``, ``dialled`` (the member every peer dials: the smallest Raft address),
    an adapter index, or ``tenant``."""
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan(seed: int, kinds: Sequence[str] = KINDS, sizes: Sizes = FULL) -> list[AttackSpec]:
    """The attacks of ``seed``, in the order given."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"attacks: unknown {unknown} (known: {', '.join(KINDS)})" if unknown else "attacks: empty")
    out = []
    for i, kind in enumerate(kinds):
        rng = random.Random(seed * 1000 + i)
        start = round(rng.uniform(0.5, 1.5), 2)
        d = sizes.duration_s
        if kind == "poisoned_fence":
            poisoned = rng.randrange(2)
            out.append(AttackSpec(kind, seed, start, d, str(poisoned), {"forged_scale_adapter": 1 - poisoned}))
        elif kind == "raft_frames":
            out.append(AttackSpec(kind, seed, start, d, rng.choice(("leader", "leader", "follower")), {
                "senders": sizes.frame_senders, "rate_bps": sizes.frame_rate_bps, "announced": 2**31 - 1,
                "preload_mib": sizes.frame_preload_mib, "half_frame_bytes": sizes.half_frame_bytes}))
        elif kind == "fd_exhaustion":
            out.append(AttackSpec(kind, seed, start, min(d, 10.0), "dialled", {
                "headroom": sizes.fd_headroom, "max_connections": sizes.fd_max_connections,
                "api_connections": sizes.fd_api_connections}))
        elif kind == "journal_corruption":
            variants = list(JOURNAL_VARIANTS)
            rng.shuffle(variants)
            out.append(AttackSpec(kind, seed, start, sizes.journal_observe_s, "follower", {
                "variants": variants, "garbage_seed": rng.randrange(2**32)}))
        elif kind == "disk_full":
            # the tmpfs is mounted before the group starts: a member index, not a role
            out.append(AttackSpec(kind, seed, start, d, str(rng.randrange(3)), {"tmpfs_mib": sizes.tmpfs_mib}))
        elif kind == "watch_flood":
            out.append(AttackSpec(kind, seed, start, d, "tenant", {"once": sizes.once_watches, "live": sizes.live_watches}))
        elif kind == "object_flood":
            out.append(AttackSpec(kind, seed, start, d, "tenant", {"max_objects": sizes.max_objects}))
    return out


# --- verdicts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    measured: Any
    bound: Any = None
    detail: str = ""


@dataclass
class Verdict:
    attack: str
    checks: list[Check]
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed_checks(self) -> list[str]:
        return [f"{c.name}: measured {c.measured}" + (f", bound {c.bound}" if c.bound is not None else "")
                + (f" ({c.detail})" if c.detail else "") for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        return {"attack": self.attack, "verdict": "pass" if self.passed else "fail",
                "checks": [asdict(c) for c in self.checks], "failed": self.failed_checks, "figures": self.figures}


def global_checks(obs: Mapping[str, Any]) -> list[Check]:
    """The issue's targets, for every attack. ``obs``: ``max_commit_gap_ms`` (None: no write was
    acknowledged at all after the start), ``lost_writes`` (names), ``divergent`` (descriptions),
    ``tracebacks`` (process -> count)."""
    gap = obs.get("max_commit_gap_ms")
    tracebacks = {p: n for p, n in dict(obs.get("tracebacks", {})).items() if n}
    lost = list(obs.get("lost_writes", []))
    divergent = list(obs.get("divergent", []))
    return [
        Check("keeps_committing", gap is not None and gap <= COMMIT_GAP_MS, None if gap is None else round(gap, 1),
              COMMIT_GAP_MS, "longest time without an acknowledged write (ms)"),
        Check("no_lost_writes", not lost, len(lost), 0, ", ".join(lost[:5])),
        Check("no_silent_divergence", not divergent, len(divergent), 0, "; ".join(divergent[:3])),
        Check("no_traceback", not tracebacks, sum(tracebacks.values()), 0, ", ".join(f"{p}: {n}" for p, n in tracebacks.items())),
    ]


def _code_refused(code: str | None) -> bool:
    return code is not None and code != "OK"


def poisoned_fence_checks(obs: Mapping[str, Any]) -> list[Check]:
    """``fence_code``/``scale_code``: gRPC code names the adapters answered; ``persisted_epoch``: the
    poisoned adapter's highest epoch afterwards; ``scale_carried_out``: the forged request id is in
    the adapter's command journal; ``decided_ms``: after the attack the offered load steps up, and
    this is the time until the holder committed the scale-out (None: not within :data:`DECIDE_S`)."""
    persisted = obs.get("persisted_epoch")
    return [
        Check("poisoned_fence_refused", _code_refused(obs.get("fence_code")), obs.get("fence_code"), "not OK"),
        Check("poisoned_epoch_not_persisted", persisted is not None and persisted < POISON_EPOCH, persisted,
              f"< {POISON_EPOCH}"),
        Check("forged_scale_refused", _code_refused(obs.get("scale_code")) and not obs.get("scale_carried_out"),
              f"{obs.get('scale_code')}, carried out: {bool(obs.get('scale_carried_out'))}", "not OK, not carried out",
              f"epoch {obs.get('scale_epoch')} of {obs.get('scale_holder')!r} read from {obs.get('scale_source')}"),
        Check("decisions_continue", obs.get("decided_ms") is not None, obs.get("decided_ms"), f"<= {DECIDE_S * 1000:.0f}",
              f"ms from the load step to the scale-out decision committed; commands at the other adapter: "
              f"{obs.get('other_commands')}"),
    ]


def raft_frames_checks(obs: Mapping[str, Any]) -> list[Check]:
    """``rss_before_mib``/``rss_after_mib`` (max during the attack) of the attacked member,
    ``term_before``/``term_after`` (max over the members)."""
    before, after = obs.get("rss_before_mib"), obs.get("rss_max_mib")
    growth = None if before is None or after is None else round(after - before, 1)
    tb, ta = obs.get("term_before"), obs.get("term_after")
    dterm = None if tb is None or ta is None else ta - tb
    return [
        Check("rss_bounded", growth is not None and growth <= RSS_GROWTH_MIB, growth, RSS_GROWTH_MIB,
              f"{before} -> max {after} MiB"),
        Check("term_stable", dterm is not None and dterm <= TERM_GROWTH, dterm, TERM_GROWTH, f"term {tb} -> {ta}"),
        Check("member_alive", bool(obs.get("alive_after")), obs.get("alive_after"), True),
    ]


def fd_exhaustion_checks(obs: Mapping[str, Any]) -> list[Check]:
    """``reached_limit``: the member ran out of descriptors (or refused connections) during the
    attack; ``reaccepts``: its Raft port accepted a connection after the release; ``quorum_ms``:
    time for a write to commit with the member needed for the quorum (None: none within
    :data:`QUORUM_S`)."""
    q = obs.get("quorum_ms")
    return [
        Check("attack_reached_the_limit", bool(obs.get("reached_limit")), obs.get("member_fds_peak"),
              obs.get("limit"), f"the member's open descriptors at most / its RLIMIT_NOFILE; "
                                f"{obs.get('open_connections')} connections held"),
        Check("reaccepts_after_release", bool(obs.get("reaccepts")), obs.get("reaccepts"), True),
        Check("quorum_with_the_member", q is not None and q <= QUORUM_S * 1000, q, QUORUM_S * 1000,
              "ms until a write committed with one other member restarted and the third paused"),
        Check("member_alive", bool(obs.get("alive_after")), obs.get("alive_after"), True),
    ]


def journal_outcome(obs: Mapping[str, Any]) -> tuple[str, bool, str]:
    """One corruption variant: ``(outcome, ok, why)``. ``obs``: ``returncode`` (None: still
    running), ``health`` (``SERVING``, ``NOT_SERVING`` or None: no answer), ``caught_up``,
    ``diverged`` (descriptions), ``tracebacks``, ``clear_line`` (a log line naming the journal),
    ``requires_notice`` (the variant destroyed durable Raft state -- the term and vote of an emptied
    metadata file -- so running on is correct only if the member noticed and said so)."""
    if obs.get("diverged"):
        return "diverged", False, "silent divergence: " + "; ".join(list(obs["diverged"])[:2])
    if int(obs.get("tracebacks", 0)):
        return "traceback", False, f"{obs['tracebacks']} traceback(s) in its log"
    rc, health = obs.get("returncode"), obs.get("health")
    if rc is not None and rc < 0:
        return "killed", False, f"died of signal {-rc}"
    stopped = rc is not None or health == "NOT_SERVING"
    if stopped:
        if obs.get("clear_line"):
            return "stopped_cleanly", True, f"exit {rc}" if rc is not None else "NOT_SERVING"
        return "stopped_silently", False, "stopped without a log line naming the journal"
    if health == "SERVING" and obs.get("caught_up"):
        if obs.get("requires_notice") and not obs.get("clear_line"):
            return "recovered_silently", False, "runs on without a word although its term and vote were lost"
        return "recovered", True, "SERVING and caught up"
    if health == "SERVING":
        return "serving_but_stuck", False, "answers SERVING but did not catch up with the group"
    return "unresponsive", False, f"health {health}, running"


def journal_checks(obs: Mapping[str, Any]) -> list[Check]:
    checks = []
    for variant, v in dict(obs.get("variants", {})).items():
        outcome, ok, why = journal_outcome(v)
        checks.append(Check(f"journal_{variant}", ok, outcome, "stopped_cleanly or recovered", why))
    if not checks:
        checks.append(Check("journal_variants_run", False, 0, ">= 1"))
    return checks


def disk_full_checks(obs: Mapping[str, Any]) -> list[Check]:
    """``returncode`` (None: alive), ``filled`` (the tmpfs reached ENOSPC), ``reported`` (NOT_SERVING
    or a log line about the disk)."""
    rc = obs.get("returncode")
    return [
        Check("disk_was_full", bool(obs.get("filled")), obs.get("free_bytes"), 0, "bytes free on the tmpfs"),
        Check("no_sigbus", rc is None or rc >= 0, rc, "not a signal", "exit status (None: alive)"),
        Check("member_survives", rc is None, rc, None, "still running after the disk filled"),
        Check("member_reports_it", bool(obs.get("reported")), obs.get("report"), "NOT_SERVING or a log line"),
        Check("recovers_after_space_freed", obs.get("recovered_ms") is not None, obs.get("recovered_ms"),
              f"<= {RECOVER_S * 1000:.0f}", "ms from the restart to every acknowledged write on the member"),
    ]


def watch_flood_checks(obs: Mapping[str, Any]) -> list[Check]:
    """``other_watch``: what another tenant's watch got (``OK``, ``OPEN`` -- still open when the bound
    passed, or a code name); ``status_ms``: per coordinator, the slowest admin Status during the
    flood (None: no answer); ``holder_before``/``holder_after``: (epoch, holder)."""
    other = obs.get("other_watch")
    status = dict(obs.get("status_ms", {}))
    slow = {ep: ms for ep, ms in status.items() if ms is None or ms > STATUS_BOUND_MS}
    worst = max((ms for ms in status.values() if ms is not None), default=None)
    return [
        Check("other_tenant_can_watch", other in ("OK", "OPEN"), other, "OK or OPEN"),
        Check("admin_status_answers", bool(status) and not slow, None if worst is None else round(worst, 1),
              STATUS_BOUND_MS, f"slow or silent: {sorted(slow)}" if slow else ""),
        Check("lease_does_not_move", obs.get("holder_before") is not None and obs.get("holder_before") == obs.get("holder_after"),
              f"{obs.get('holder_before')} -> {obs.get('holder_after')}", "unchanged"),
        Check("flood_was_sent", int(obs.get("streams_opened", 0)) > 0, obs.get("streams_opened", 0), "> 0"),
    ]


def object_flood_checks(obs: Mapping[str, Any]) -> list[Check]:
    """``created``: deployments the flooding tenant got; ``refused_code``: the first refusal's code
    (None: never refused); ``other_code``: another tenant's create afterwards."""
    created, cap = int(obs.get("created", 0)), int(obs.get("max_objects", 0))
    return [
        Check("refused_at_a_cap", obs.get("refused_code") == "RESOURCE_EXHAUSTED", obs.get("refused_code"),
              "RESOURCE_EXHAUSTED", f"after {created} deployments (the bench stops at {cap})"),
        Check("other_tenant_unaffected", obs.get("other_code") == "OK", obs.get("other_code"), "OK"),
    ]


ATTACK_CHECKS = {
    "poisoned_fence": poisoned_fence_checks, "raft_frames": raft_frames_checks,
    "fd_exhaustion": fd_exhaustion_checks, "journal_corruption": journal_checks, "disk_full": disk_full_checks,
    "watch_flood": watch_flood_checks, "object_flood": object_flood_checks,
}


def verdict(kind: str, attack_obs: Mapping[str, Any], global_obs: Mapping[str, Any],
            figures: Mapping[str, Any] | None = None) -> Verdict:
    """The attack's own checks followed by the global ones; it passes only when every check does.
    An attack that could not run (``attack_obs["error"]``) fails with that error."""
    if kind not in ATTACK_CHECKS:
        raise ValueError(f"attack: unknown {kind!r}")
    checks = []
    if attack_obs.get("error"):
        checks.append(Check("attack_ran", False, attack_obs["error"], "no error"))
    checks += ATTACK_CHECKS[kind](attack_obs) + global_checks(global_obs)
    return Verdict(kind, checks, dict(figures or {}))


def divergence(views: Mapping[str, Mapping[str, tuple[int, str]]]) -> list[str]:
    """Silent divergence across members: ``views`` is, per member, object name -> (resource_version,
    value as text). The same name at the same resource_version with another value on another member
    is divergence (a member that lags has an older resource_version or lacks the object: not)."""
    seen: dict[tuple[str, int], tuple[str, str]] = {}
    out = []
    for member in sorted(views):
        for name, (rv, value) in sorted(views[member].items()):
            first = seen.setdefault((name, rv), (member, value))
            if first[1] != value:
                out.append(f"{name}@{rv}: {first[0]} has {first[1][:60]!r}, {member} has {value[:60]!r}")
    return out


def max_gap_ms(ack_times: Sequence[float], t0: float, t1: float) -> float | None:
    """Longest time in ``[t0, t1]`` (seconds) without an acknowledgement, in ms; None when no write
    was acknowledged in that window at all."""
    times = sorted(t for t in ack_times if t0 <= t <= t1)
    if not times:
        return None
    edges = [t0, *times, t1]
    return max(b - a for a, b in zip(edges, edges[1:], strict=False)) * 1000
