"""A coordinator's Raft member and lease guard, built and started before the rest of the coordinator.

Start-up order of a coordinator process (``controlplane coordinator``, :func:`launch`):

1. load the configuration, build and start the Raft member (``raft.node.RaftNode``) and its lease
   guard: this module imports only what they need (the configuration model, pysyncobj, the Raft
   transport's TLS, the replicated state);
2. then import and build the rest (:mod:`controlplane.coordinator`: the gRPC API, the control loop,
   the adapter clients, Prometheus metrics) and start it.

Step 2 costs about twice the CPU time of step 1 (imports, measured in docs/reliability.md "Fresh
start on a busy machine"); it now runs while the first election timer (1000-1500 ms) is running
instead of before it. Nothing about Raft or the lease changes: the same timeouts, check-quorum and
lease rules; a member that holds the lease before its control loop runs acts at its first tick, as
it would after a slow tick. If step 2 fails, the member is stopped (lease released) before the
error propagates, so a half-built coordinator never keeps renewing a lease it cannot use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from controlplane.config import CoordinatorConfig
from controlplane.runtime.lease_guard import LeaseGuard
from raft.node import RaftNode, dial_override_node_class
from raft.transport import InboundFilter

if TYPE_CHECKING:  # the heavy half of a coordinator: imported by launch() after Raft has started
    from controlplane.coordinator import Coordinator


@dataclass(frozen=True, slots=True)
class RaftMember:
    """One coordinator's Raft node and lease guard (not started until :meth:`start`)."""

    node: RaftNode
    guard: LeaseGuard

    def start(self) -> None:
        self.node.start()
        self.guard.start()

    def stop(self) -> None:
        """Give the lease back (best effort) and leave: the order of ``Coordinator.stop``."""
        self.guard.stop(release=True)
        self.node.stop()


def build_member(cfg: CoordinatorConfig, *, node_class=None, inbound_filter: InboundFilter | None = None) -> RaftMember:
    """The Raft node (dialing through ``raft_dial_overrides`` when configured) and its lease guard."""
    if node_class is None and cfg.raft_dial_overrides:
        node_class = dial_override_node_class(dict(cfg.raft_dial_overrides))
    node = RaftNode(cfg, node_class=node_class, inbound_filter=inbound_filter)
    return RaftMember(node, LeaseGuard(node, cfg))


def launch(cfg: CoordinatorConfig, *, before_start: Callable[[RaftMember], None] | None = None,
           after_member: Callable[[RaftMember], None] | None = None) -> Coordinator:
    """Start a coordinator Raft first (see the module docstring) and return it started.

    ``before_start(member)`` runs before the member starts (tick observers must be added then);
    ``after_member(member)`` right after it started (the stability bench records the time)."""
    member = build_member(cfg)
    if before_start is not None:
        before_start(member)
    member.start()
    if after_member is not None:
        after_member(member)
    try:
        from controlplane.coordinator import Coordinator, topology_of

        coordinator = Coordinator(cfg, topology_of(cfg), member=member)
        coordinator.start()
    except BaseException:
        member.stop()
        raise
    return coordinator
