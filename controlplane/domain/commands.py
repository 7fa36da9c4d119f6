"""Replicated commands: frozen, versioned values. The codec (``raft/codec.py``) encodes them; they are
never pickled.

Every command that depends on time carries ``at_ms``, stamped by the proposer (the leader), so
``apply`` never reads a clock. Instance ids are chosen by the proposer too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, TenantId
from controlplane.domain.instances import InstanceEvent
from controlplane.domain.records import BreakerRecord, ScaleMemory
from controlplane.domain.tenants import Deployment, Tenant
from controlplane.domain.topology import Cluster

COMMAND_VERSION = 1
"""Bumped when a command's fields change incompatibly; the codec refuses unknown versions."""


@dataclass(frozen=True, slots=True)
class Command:
    kind: ClassVar[str] = "command"


@dataclass(frozen=True, slots=True)
class PutTenant(Command):
    kind: ClassVar[str] = "put_tenant"
    tenant: Tenant


@dataclass(frozen=True, slots=True)
class RemoveTenant(Command):
    kind: ClassVar[str] = "remove_tenant"
    tenant_id: TenantId


@dataclass(frozen=True, slots=True)
class PutDeployment(Command):
    kind: ClassVar[str] = "put_deployment"
    deployment: Deployment


@dataclass(frozen=True, slots=True)
class RemoveDeployment(Command):
    kind: ClassVar[str] = "remove_deployment"
    deployment_id: DeploymentId


@dataclass(frozen=True, slots=True)
class PutCluster(Command):
    kind: ClassVar[str] = "put_cluster"
    cluster: Cluster


@dataclass(frozen=True, slots=True)
class SetDesired(Command):
    """Declarative target of a deployment: ``replicas`` serving plus ``warm_pool`` sleeping."""

    kind: ClassVar[str] = "set_desired"
    deployment_id: DeploymentId
    replicas: int
    warm_pool: int
    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class PutScaleMemory(Command):
    kind: ClassVar[str] = "put_scale_memory"
    deployment_id: DeploymentId
    memory: ScaleMemory


@dataclass(frozen=True, slots=True)
class CreateInstance(Command):
    kind: ClassVar[str] = "create_instance"
    instance_id: InstanceId
    deployment_id: DeploymentId
    cluster_id: ClusterId
    at_ms: int


@dataclass(frozen=True, slots=True)
class TransitionInstance(Command):
    kind: ClassVar[str] = "transition_instance"
    instance_id: InstanceId
    event: InstanceEvent
    at_ms: int
    drain_deadline_ms: int = 0
    preempted: bool = False


@dataclass(frozen=True, slots=True)
class PutBreaker(Command):
    kind: ClassVar[str] = "put_breaker"
    key: str
    record: BreakerRecord


@dataclass(frozen=True, slots=True)
class Batch(Command):
    """Several commands committed as one log entry (one tick's plan). Each is applied in order and
    independently: a rejected one does not undo the others (see ``ApplyResult.results``)."""

    kind: ClassVar[str] = "batch"
    commands: tuple[Command, ...]


COMMAND_TYPES: dict[str, type[Command]] = {
    c.kind: c
    for c in (
        PutTenant,
        RemoveTenant,
        PutDeployment,
        RemoveDeployment,
        PutCluster,
        SetDesired,
        PutScaleMemory,
        CreateInstance,
        TransitionInstance,
        PutBreaker,
        Batch,
    )
}
