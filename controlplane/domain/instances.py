"""The instance lifecycle as one transition table.

::

    Pending --start_warmup--> Warming --warmed--> Ready <--work/idle--> Busy
       |                         |                  |                    |
       | cancel                  | warmup_failed    | sleep              | drain, sleep
       v                         v                  v                    v
    Terminated                 Failed            Standby --wake--> Warming
                                                    | drain
    Ready/Busy/Warming/Standby --drain--> Draining --drained--> Terminated
    every non-terminal state --lost--> Failed

``Standby`` is a warm-pool member: the pod keeps its GPUs but the engine sleeps (vLLM sleep level 1:
weights offloaded to CPU memory, KV cache discarded; level 2: weights discarded too; Triton: model
unloaded under explicit model control; DeepSpeed-MII cannot sleep). Waking it is a *warm* start
(about 1 s at level 1); a new pod is a *cold* or *cached* start (tens of seconds). Every start records
its tier in ``Instance.init_method`` (:mod:`controlplane.domain.start_tiers`).

The table is the single source of truth: :func:`transition` is the only way to change a state, and
``docs/lifecycle.md`` is generated from :data:`TRANSITIONS` by :func:`mermaid_diagram`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from controlplane.domain.errors import IllegalTransition
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId


class InstanceState(enum.Enum):
    PENDING = "Pending"
    WARMING = "Warming"
    READY = "Ready"
    BUSY = "Busy"
    STANDBY = "Standby"
    DRAINING = "Draining"
    TERMINATED = "Terminated"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def serving(self) -> bool:
        """Counts as serving capacity: accepts and processes requests."""
        return self in SERVING_STATES

    @property
    def holds_gpus(self) -> bool:
        """Holds its GPU allocation (every non-terminal state: a Pending pod has been scheduled)."""
        return self not in TERMINAL_STATES


# Fast lookup tables for hot loops: the same members the properties above test, so they can never
# disagree. Tuples, not sets: ``in`` on a tuple compares by identity first, while hashing a member
# calls ``Enum.__hash__`` (Python code in 3.11), so for two members a tuple is ~3x faster than a
# frozenset and ~5x faster than the property (a method call plus class attribute accesses).
TERMINAL_STATES: tuple[InstanceState, ...] = (InstanceState.TERMINATED, InstanceState.FAILED)
"""States :attr:`InstanceState.terminal` is true for."""
SERVING_STATES: tuple[InstanceState, ...] = (InstanceState.READY, InstanceState.BUSY)
"""States :attr:`InstanceState.serving` is true for."""


class InstanceEvent(enum.Enum):
    START_WARMUP = "start_warmup"
    WARMED = "warmed"
    WARMUP_FAILED = "warmup_failed"
    WORK = "work"
    IDLE = "idle"
    SLEEP = "sleep"
    WAKE = "wake"
    DRAIN = "drain"
    DRAINED = "drained"
    CANCEL = "cancel"
    LOST = "lost"


class InitMethod(enum.Enum):
    """How an instance started: its *start tier* (latencies and derivations in
    :mod:`controlplane.domain.start_tiers`). ``COLD`` and ``CACHED`` are new pods (``Pending ->
    Warming``); the others wake a ``Standby`` instance (``Standby -> Warming``)."""

    COLD = "cold"
    """A new pod on a node whose model cache lacks the weights: image pull, weights from remote
    storage, load, CUDA graph capture."""
    CACHED = "cached"
    """A new pod on a node whose model cache holds the weights (local disk): load and graph capture."""
    WARM = "warm"
    """A vLLM engine woken from sleep level 1 (weights copied back from host RAM)."""
    SLEEP_L2 = "sleep_l2"
    """A vLLM engine woken from sleep level 2 (weights reloaded from the node's model cache into the
    live process; CUDA graphs kept)."""
    RELOAD = "reload"
    """A Triton model loaded again under explicit model control (``POST /v2/repository/models/<m>/load``)
    from the local model repository."""

    @property
    def new_pod(self) -> bool:
        """A start that created a pod (``cold_starts`` counts these); the others are wakes."""
        return self in NEW_POD_METHODS


NEW_POD_METHODS: tuple[InitMethod, ...] = (InitMethod.COLD, InitMethod.CACHED)
WAKE_METHODS: tuple[InitMethod, ...] = (InitMethod.WARM, InitMethod.SLEEP_L2, InitMethod.RELOAD)


S, E = InstanceState, InstanceEvent

TRANSITIONS: dict[tuple[InstanceState, InstanceEvent], InstanceState] = {
    (S.PENDING, E.START_WARMUP): S.WARMING,
    (S.PENDING, E.CANCEL): S.TERMINATED,
    (S.WARMING, E.WARMED): S.READY,
    (S.WARMING, E.WARMUP_FAILED): S.FAILED,
    (S.WARMING, E.DRAIN): S.DRAINING,
    (S.READY, E.WORK): S.BUSY,
    (S.BUSY, E.IDLE): S.READY,
    (S.READY, E.SLEEP): S.STANDBY,
    (S.BUSY, E.SLEEP): S.STANDBY,  # the adapter stops routing, lets in-flight requests finish, then sleeps
    (S.STANDBY, E.WAKE): S.WARMING,
    (S.READY, E.DRAIN): S.DRAINING,
    (S.BUSY, E.DRAIN): S.DRAINING,
    (S.STANDBY, E.DRAIN): S.DRAINING,
    (S.DRAINING, E.DRAINED): S.TERMINATED,
}
for _s in InstanceState:
    if not _s.terminal:
        TRANSITIONS[(_s, E.LOST)] = S.FAILED
del _s

INIT_METHOD_OF: dict[tuple[InstanceState, InstanceEvent], InitMethod] = {
    (S.PENDING, E.START_WARMUP): InitMethod.COLD,
    (S.STANDBY, E.WAKE): InitMethod.WARM,
}
"""Transitions that begin a warm-up, and the start tier they record when the caller names none."""
ALLOWED_METHODS: dict[tuple[InstanceState, InstanceEvent], tuple[InitMethod, ...]] = {
    (S.PENDING, E.START_WARMUP): NEW_POD_METHODS,
    (S.STANDBY, E.WAKE): WAKE_METHODS,
}
"""The tiers each warm-up transition may record (``transition(init=...)``)."""


def next_state(instance_id: str, state: InstanceState, event: InstanceEvent) -> InstanceState:
    """Look ``(state, event)`` up in :data:`TRANSITIONS`; raise :class:`IllegalTransition` if absent."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(instance_id, state.value, event.value) from None


@dataclass(frozen=True, slots=True)
class Instance:
    """One inference engine instance (a pod) as the replicated state knows it."""

    id: InstanceId
    deployment: DeploymentId
    tenant: TenantId
    cluster: ClusterId
    zone: ZoneId
    pool: PoolId
    gpus: int
    state: InstanceState
    init_method: InitMethod
    created_ms: int
    state_since_ms: int
    drain_deadline_ms: int = 0
    preempted: bool = False
    """Set when the instance was sent to Draining to free GPUs for a higher-priority tenant."""


@dataclass(frozen=True, slots=True)
class Transitioned:
    """The record of one transition: what the shell logs and counts."""

    instance_id: InstanceId
    from_state: InstanceState
    to_state: InstanceState
    event: InstanceEvent
    latency_ms: int
    """Time spent in ``from_state``."""
    init_method: InitMethod
    at_ms: int


def transition(
    inst: Instance, event: InstanceEvent, at_ms: int, *, drain_deadline_ms: int = 0, preempted: bool = False,
    init: InitMethod | None = None,
) -> tuple[Instance, Transitioned]:
    """Apply ``event`` to ``inst`` at ``at_ms``. Pure; raises :class:`IllegalTransition`.

    ``init``: the start tier a warm-up transition records (one of :data:`ALLOWED_METHODS` for it; a
    tier of the other kind is ignored); None, or any other transition: :data:`INIT_METHOD_OF`'s, or
    the instance's own."""
    to = next_state(inst.id, inst.state, event)
    key = (inst.state, event)
    if init is None or init not in ALLOWED_METHODS.get(key, ()):
        init = INIT_METHOD_OF.get(key, inst.init_method)
    new = replace(
        inst,
        state=to,
        init_method=init,
        state_since_ms=at_ms,
        drain_deadline_ms=drain_deadline_ms if to is S.DRAINING else inst.drain_deadline_ms,
        preempted=inst.preempted or (preempted and to is S.DRAINING),
    )
    rec = Transitioned(inst.id, inst.state, to, event, max(0, at_ms - inst.state_since_ms), init, at_ms)
    return new, rec


def mermaid_diagram() -> str:
    """The lifecycle as a Mermaid state diagram, generated from :data:`TRANSITIONS`."""
    lines = ["stateDiagram-v2", "    [*] --> Pending"]
    for (src, ev), dst in sorted(TRANSITIONS.items(), key=lambda kv: (kv[0][0].value, kv[0][1].value)):
        lines.append(f"    {src.value} --> {dst.value}: {ev.value}")
    lines += ["    Terminated --> [*]", "    Failed --> [*]"]
    return "\n".join(lines) + "\n"
