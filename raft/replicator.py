"""``controlplane.ports.Replicator`` over Raft: the same contract as ``LocalReplicator`` (commit = one
log entry holding the batch, applied in order; ``state`` = the applied state), plus lease commits.

Failures become the control plane's error tree (translation in :func:`raft.node.failure_error`):

=====================================================  =================================================
pysyncobj                                              raised here
=====================================================  =================================================
no leader known (``MISSING_LEADER``), ``NOT_LEADER``   :class:`NotLeader` (``leader_hint`` = the leader's
                                                       API address when known): definitely not committed
``LEADER_CHANGED``, ``DISCARDED``                      :class:`LeadershipLost`: outcome unknown
``QUEUE_FULL`` (or a batch over ``MAX_BATCH``)         :class:`QueueFull`
``Timeout``, ``UNKNOWN_OUTCOME``                       :class:`CommitTimeout` ("unknown outcome")
entry rejected by the FSM's fence check                :class:`NotLeader`: not applied anywhere
=====================================================  =================================================

Commits may be submitted on any member (pysyncobj forwards them to the leader and the submitter
returns once it applied the entry itself); the control loop only runs on the lease holder.

Fencing in the log: with ``fence`` (normally :meth:`LeaseGuard.fence`), every batch carries the
proposer's ``(holder, epoch)`` and the state machine rejects it unless the applied lease record
still names that holder and epoch. A coordinator that lost its lease therefore cannot change the
replicated state either, however late its entry reaches the log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from controlplane.config import CoordinatorConfig
from controlplane.domain.commands import Batch, Command
from controlplane.domain.errors import CommitTimeout, NotLeader, QueueFull
from controlplane.domain.instances import Transitioned
from controlplane.domain.state import MAX_BATCH, ApplyResult, ControlState
from raft import codec
from raft.fsm import FENCED_PREFIX
from raft.lease import LeaseCommand, LeaseOutcome
from raft.node import RaftNode

FenceSource = Callable[[], "tuple[str, int] | None"]


class RaftReplicator:
    def __init__(
        self,
        node: RaftNode,
        cfg: CoordinatorConfig | None = None,
        *,
        fence: FenceSource | None = None,
        on_transitions: Callable[[Sequence[Transitioned]], None] | None = None,
    ) -> None:
        self._node = node
        self._cfg = cfg or node.cfg
        self._fence = fence
        self._on_transitions = on_transitions
        self.entries = 0
        """Log entries this replicator committed."""

    @property
    def state(self) -> ControlState:
        """A consistent copy of the applied state (shared by readers until the next change: do not
        mutate it)."""
        return self._node.state_copy()

    def commit(self, commands: Sequence[Command], now_ms: int) -> ApplyResult:
        if not commands:
            return ApplyResult(ok=True)
        if len(commands) > MAX_BATCH:
            raise QueueFull(f"{len(commands)} commands exceed the batch limit of {MAX_BATCH}")
        payload = codec.encode(Batch(tuple(commands)))
        fence = None
        if self._fence is not None:
            fence = self._fence()
            if fence is None:
                raise NotLeader("this node does not hold a valid lease", leader_hint=self._node.leader_api_address())
        result = self._node.submit(payload, timeout_s=self._cfg.commit_timeout_ms / 1000.0, fence=fence)
        if not isinstance(result, ApplyResult):
            raise CommitTimeout(f"unexpected result {type(result).__name__} for a batch: unknown outcome")
        if not result.ok and result.error.startswith(FENCED_PREFIX):
            raise NotLeader(f"batch rejected by the log: {result.error}", leader_hint=self._node.leader_api_address())
        self.entries += 1
        if self._on_transitions is not None and result.transitions:
            self._on_transitions(result.transitions)
        return result

    def commit_lease(self, cmd: LeaseCommand, timeout_s: float | None = None) -> LeaseOutcome:
        """Commit one lease command; the outcome says whether the compare-and-set succeeded."""
        return self._node.commit_lease(cmd, timeout_s)
