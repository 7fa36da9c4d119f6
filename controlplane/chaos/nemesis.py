"""Fault schedules, generated from a seed (pure: no clock, no I/O).

One schedule is what one chaos run does: the offered load at the start, a short sequence of faults,
the load during heal-and-settle (whose scaling decision the checker expects the replicas to reach).
The same seed always gives the same schedule (``random.Random(seed)``); which node "the holder" is
gets resolved when the fault is injected, so a target may be a role (``holder``, ``follower``) or a
node index.

Fault kinds (:data:`KINDS`):

* ``kill`` -- SIGKILL a coordinator, restart it from its data directory after ``duration_s``;
* ``pause`` -- SIGSTOP a coordinator for ``duration_s`` (always longer than the lease), then SIGCONT;
* ``isolate`` -- cut every Raft link of one node (the holder: "leader isolated", or a follower);
* ``split`` -- partition the nodes into a minority and a majority (with 3 nodes: one against two;
  with 5: two against three);
* ``one_way`` -- bytes from one node to another stop, the reverse direction flows;
* ``clock`` -- jump a coordinator's lease clock by ``value`` ms within the drift bound
  (``|value| <= drift_rho * lease_duration_ms``), undone at heal;
* ``slow_disk`` -- delay every fsync of a coordinator's Raft journal by ``value`` ms;
* ``kill_adapter`` -- SIGKILL an adapter (its simulated instances are gone), restart after ``duration_s``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

KINDS = ("kill", "pause", "isolate", "split", "one_way", "clock", "slow_disk", "kill_adapter")
WEIGHTS = {"kill": 3, "pause": 3, "isolate": 3, "split": 2, "one_way": 2, "clock": 2, "slow_disk": 2, "kill_adapter": 1}
LOAD_LEVELS = ("low", "high")
MAX_FAULTS = 8


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    """``holder``, ``follower``, ``any`` or a node / adapter index as a string."""
    duration_s: float
    gap_s: float
    """Quiet time after the fault ended and the group recovered, before the next fault."""
    value: int = 0
    """Clock jump in ms (``clock``), fsync delay in ms (``slow_disk``)."""
    peer: str = ""
    """``one_way``: the receiving side; ``split``: the minority as comma-separated node indices."""


@dataclass(frozen=True)
class Schedule:
    seed: int
    nodes: int
    adapters: int
    start_load: str
    final_load: str
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        parts = []
        for f in self.faults:
            extra = f" {f.value}" if f.value else ""
            peer = f"->{f.peer}" if f.peer else ""
            parts.append(f"{f.kind}({f.target}{peer}{extra}, {f.duration_s:.1f}s)")
        return f"seed={self.seed} load {self.start_load}->{self.final_load}: " + ", ".join(parts)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def generate(seed: int, *, nodes: int = 3, adapters: int = 2, faults: int = 3, lease_ms: int = 1200,
             drift_bound_ms: int = 12, kinds: tuple[str, ...] = KINDS) -> Schedule:
    """The schedule of ``seed``: ``faults`` faults drawn by :data:`WEIGHTS` over ``kinds``."""
    if nodes not in (3, 5):
        raise ValueError(f"nodes: 3 or 5, got {nodes}")
    if not 1 <= faults <= MAX_FAULTS:
        raise ValueError(f"faults: 1..{MAX_FAULTS}, got {faults}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"kinds: unknown {unknown}" if unknown else "kinds: empty")
    rng = random.Random(seed)
    pool = [k for k in kinds for _ in range(WEIGHTS[k])]
    out: list[Fault] = []
    lease_s = lease_ms / 1000
    for _ in range(faults):
        kind = rng.choice(pool)
        duration = round(rng.uniform(1.0, 2.5), 2)
        gap = round(rng.uniform(0.2, 0.8), 2)
        target, peer, value = "any", "", 0
        if kind in ("kill", "isolate"):
            target = rng.choice(("holder", "holder", "follower"))
        elif kind == "pause":
            target = rng.choice(("holder", "holder", "follower"))
            duration = round(rng.uniform(1.5 * lease_s, 2.5 * lease_s), 2)  # longer than the lease
        elif kind == "split":
            minority = rng.sample(range(nodes), (nodes - 1) // 2)
            target, peer = "minority", ",".join(str(i) for i in sorted(minority))
        elif kind == "one_way":
            src, dst = rng.sample(range(nodes), 2)
            target, peer = rng.choice(("holder", str(src))), str(dst)
        elif kind == "clock":
            target = rng.choice(("holder", "follower"))
            value = rng.choice((-1, 1)) * rng.randint(max(1, drift_bound_ms // 2), max(1, drift_bound_ms))
        elif kind == "slow_disk":
            target = rng.choice(("holder", "follower"))
            value = rng.choice((20, 50, 100, 200))
        elif kind == "kill_adapter":
            target = str(rng.randrange(adapters))
            duration = round(rng.uniform(0.5, 1.5), 2)
        out.append(Fault(kind, target, duration, gap, value, peer))
    return Schedule(seed, nodes, adapters, rng.choice(LOAD_LEVELS), rng.choice(LOAD_LEVELS), tuple(out))
