"""The in-process replicator: applies commands to a local :class:`ControlState` directly.

Used by the simulator and by single-node embedded mode. It has the same contract as the Raft
replicator in ``raft/replicator.py`` (commit = apply the batch as one entry, in order), so the control
loop cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from controlplane.domain.commands import Batch, Command
from controlplane.domain.errors import QueueFull
from controlplane.domain.instances import Transitioned
from controlplane.domain.state import MAX_BATCH, ApplyResult, ControlState, apply


class LocalReplicator:
    def __init__(
        self, state: ControlState | None = None, on_transitions: Callable[[Sequence[Transitioned]], None] | None = None
    ) -> None:
        self._state = state if state is not None else ControlState()
        self._on_transitions = on_transitions
        self.entries = 0
        """Log entries committed."""

    @property
    def state(self) -> ControlState:
        return self._state

    def commit(self, commands: Sequence[Command], now_ms: int) -> ApplyResult:
        if not commands:
            return ApplyResult(ok=True)
        if len(commands) > MAX_BATCH:
            raise QueueFull(f"{len(commands)} commands exceed the batch limit of {MAX_BATCH}")
        self.entries += 1
        result = apply(self._state, Batch(tuple(commands)))
        if self._on_transitions is not None and result.transitions:
            self._on_transitions(result.transitions)
        return result
