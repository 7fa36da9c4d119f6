"""Ports: the small interfaces between the control loop and the world. Each has an in-memory
implementation (``controlplane.runtime`` and ``controlplane.sim``); ``main.py`` wires the real ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from controlplane.domain.commands import Command
from controlplane.domain.ids import ClusterId
from controlplane.domain.instances import Instance
from controlplane.domain.observations import Observations
from controlplane.domain.state import ApplyResult, ControlState


class Clock(Protocol):
    def now_ms(self) -> int: ...


class Replicator(Protocol):
    """Commits commands through the replicated log and exposes the applied state (read-only)."""

    @property
    def state(self) -> ControlState: ...

    def commit(self, commands: Sequence[Command], now_ms: int) -> ApplyResult:
        """Commit ``commands`` as one log entry; return once applied locally. Raises a
        :class:`~controlplane.domain.errors.TemporaryError` (NotLeader, CommitTimeout...) on failure."""
        ...


@dataclass(frozen=True, slots=True)
class Fence:
    """Fencing token: the lease epoch and a per-epoch sequence number."""

    epoch: int
    seq: int
    holder: str = ""
    """The lease holder's node id: an adapter rejects an equal epoch from another holder."""
    signature: bytes = b""
    """Ed25519 signature of (epoch, holder) by the coordinators' fence key (``controlplane.fencing``);
    empty when this coordinator has no ``fence_key_file`` (accepted only by a loopback dev adapter)."""
    key_id: str = ""


class FenceIssuer(Protocol):
    """Signs a lease epoch for its holder (``controlplane.fencing.FenceSigner``)."""

    def sign(self, epoch: int, holder: str) -> "FenceSignature": ...


class FenceSignature(Protocol):
    key_id: str
    signature: bytes


@dataclass(frozen=True, slots=True)
class AdapterCommand:
    """A declarative, idempotent command for one cluster's adapter."""

    request_id: str
    """Unique per command; an adapter applies a request id at most once."""
    action: str
    """``create`` | ``wake`` | ``sleep`` | ``drain`` | ``cancel``."""
    instance: Instance
    deadline_ms: int = 0
    """For ``drain``: when running requests are aborted."""


ADAPTER_ACTIONS = ("create", "wake", "sleep", "drain", "cancel")


class ClusterAdapter(Protocol):
    """The per-cluster side. ``send`` raises Unavailable (cannot reach) or StaleEpoch (fenced)."""

    def send(self, cluster_id: ClusterId, command: AdapterCommand, fence: Fence, now_ms: int) -> None: ...


class FencedAdapter(ClusterAdapter, Protocol):
    """An adapter that also takes a bare fence (a no-op carrying the epoch)."""

    def fence(self, cluster_id: ClusterId, fence: Fence, now_ms: int) -> None: ...


class ObservationSource(Protocol):
    """Samples, lifecycle reports and gateway queues since the last call."""

    def gather(self, now_ms: int) -> Observations: ...


class ReplayableSource(ObservationSource, Protocol):
    """A source that also keeps a ring buffer of recent samples (the adapters keep ~2 minutes)."""

    def recent(self, since_ms: int) -> list[Observations]:
        """Observations (samples only) newer than ``since_ms``, oldest first."""
        ...
