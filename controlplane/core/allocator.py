"""The allocation seam of :func:`controlplane.core.reconcile.plan`.

By default (``ReconcileConfig.allocator`` None) the plan allocates scarce GPUs with the product's
own rules (:func:`controlplane.core.preemption.allocate` with tenant quotas and borrowing, then
:func:`~controlplane.core.preemption.choose_victims`, then the warm-pool grants) and places new
instances with :func:`controlplane.core.placement.place`. A benchmark that compares the product
with another allocator (``controlplane.sim.kube.KubeScheduler``: what the Kubernetes scheduler does
when GPUs run out) plugs an :class:`Allocator` in instead. It replaces all three steps and also
chooses the cluster of every instance it lets the plan create (its *bindings*): the rest of the
plan (the scaling decision, draining the victims, converging each deployment to its grant,
breakers, evacuation) is the same for every allocator.

An allocator may keep memory across ticks (a benchmark object, not replicated state), but it must
be deterministic given the same sequence of inputs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controlplane.core import placement
from controlplane.core.preemption import Victim
from controlplane.domain.ids import ClusterId, DeploymentId
from controlplane.domain.instances import Instance
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment
from controlplane.domain.topology import Cluster, Zone

__all__ = ["AllocationRequest", "Allocator", "ExternalAllocation", "bound_placer"]


@dataclass(frozen=True, slots=True)
class AllocationRequest:
    """What the plan knows when it allocates (nothing here may be mutated)."""

    state: ControlState
    """The replicated state the plan is made from (victims chosen this tick are still serving-bound)."""
    deployments: Sequence[Deployment]
    """Every deployment, sorted by id."""
    targets: Mapping[DeploymentId, int]
    """The scaling decision's replica target per deployment."""
    have: Mapping[DeploymentId, int]
    """Serving-bound (Pending, Warming, Ready, Busy) instances per deployment outside evacuating
    clusters: what ``plan`` converges from."""
    evacuating: frozenset[ClusterId]
    """Clusters whose instances are being replaced elsewhere (drained themselves or by their zone)."""
    now_ms: int
    grace_ms: int
    """``ReconcileConfig.preemption_grace_ms``."""


@dataclass(frozen=True, slots=True)
class ExternalAllocation:
    """An allocator's answer for one tick."""

    grants: Mapping[DeploymentId, int]
    """Serving replicas each deployment may hold (a deployment left out is granted its target)."""
    victims: tuple[Victim, ...] = ()
    """Instances to drain with ``preempted=True`` by their ``drain_deadline_ms``."""
    preemptions: tuple[tuple[DeploymentId, DeploymentId, int], ...] = ()
    """``(beneficiary, victim, replicas)`` of this tick, sorted."""
    bindings: Mapping[DeploymentId, tuple[ClusterId, ...]] = field(default_factory=dict)
    """The clusters of the instances the plan may create this tick, per deployment, in order."""


class Allocator(Protocol):
    def allocate(self, request: AllocationRequest) -> ExternalAllocation: ...


class _BoundPlacer:
    """:func:`placement.place`'s signature, answering with an allocator's bindings of this tick."""

    __slots__ = ("_bindings",)

    def __init__(self, bindings: Mapping[DeploymentId, tuple[ClusterId, ...]]) -> None:
        self._bindings = bindings

    def __call__(
        self,
        deployment: Deployment,
        count: int,
        clusters: Sequence[Cluster],
        free_gpus: Mapping[ClusterId, int],
        existing: Sequence[Instance],
        blocked: Collection[ClusterId],
        zones: Mapping[object, Zone] | None = None,
        cached: Collection[ClusterId] = frozenset(),
        memory_limited: Mapping[ClusterId, str] | None = None,
    ) -> placement.Placement:
        bound = self._bindings.get(deployment.id, ())[: max(0, count)]
        unplaced = max(0, count) - len(bound)
        if unplaced == 0:
            return placement.Placement(bound, 0, f"placed {count} of {count} (allocator bindings)")
        return placement.Placement(
            bound, unplaced, f"placed {len(bound)} of {count}, {unplaced} unplaced: the allocator bound only "
            f"{len(bound)} (the others stay Pending)", placement.PlacementOutcome.NO_CAPACITY,
        )


def bound_placer(bindings: Mapping[DeploymentId, tuple[ClusterId, ...]]) -> _BoundPlacer:
    return _BoundPlacer(bindings)
