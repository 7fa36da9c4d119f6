"""Replicated commands: frozen, versioned values. The codec (``raft/codec.py``) encodes them; they are
never pickled.

Every command that depends on time carries ``at_ms``, stamped by the proposer (the leader), so
``apply`` never reads a clock. Instance ids are chosen by the proposer too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, TenantId, ZoneId
from controlplane.domain.instances import InstanceEvent
from controlplane.domain.records import BreakerRecord, ModelCacheRecord, ScaleMemory
from controlplane.domain.tenants import Deployment, Tenant
from controlplane.domain.tokens import TokenRecord
from controlplane.domain.topology import Cluster, Zone

COMMAND_VERSION = 6
"""Bumped when a command's fields change incompatibly or a command kind is added (3: ``PutScaleMemories``;
4: ``max_per_tenant`` of ``PutDeployment`` and ``PutToken``; 5: a deployment id may be qualified,
``<tenant>/<name>``, see :func:`~controlplane.domain.ids.deployment_id_problem`; 6: ``RecordDemand`` and
``PutModelCache``, the snapshot's ``demand`` and ``model_caches`` tables); the codec refuses unknown versions. 5 only widens what an id may be: every entry and snapshot written at 4 decodes to the same
value (its unqualified ids stay valid legacy ids), so the wire format (``CODEC_VERSION``) is unchanged;
a build at 4 cannot decode an entry naming a qualified id, so a group is upgraded whole (docs/api.md
"Deployment names")."""

ANY_VERSION = -1
"""``expect_version`` for an unconditional write (the holder's bootstrap and internal writes)."""
MUST_NOT_EXIST = 0
"""``expect_version`` for a create: rejected with ``AlreadyExists`` when the object exists."""
# Any other ``expect_version`` (> 0) must equal the object's current ``resource_version``, else the
# command is rejected with ``VersionMismatch`` (optimistic concurrency, like Kubernetes).


@dataclass(frozen=True, slots=True)
class Command:
    kind: ClassVar[str] = "command"


@dataclass(frozen=True, slots=True)
class PutTenant(Command):
    kind: ClassVar[str] = "put_tenant"
    tenant: Tenant
    expect_version: int = ANY_VERSION
    at_ms: int = 0


@dataclass(frozen=True, slots=True)
class RemoveTenant(Command):
    kind: ClassVar[str] = "remove_tenant"
    tenant_id: TenantId
    expect_version: int = ANY_VERSION


@dataclass(frozen=True, slots=True)
class PutDeployment(Command):
    kind: ClassVar[str] = "put_deployment"
    deployment: Deployment
    expect_version: int = ANY_VERSION
    at_ms: int = 0
    max_per_tenant: int = 0
    """A create (the id is not the tenant's yet) is rejected (``LimitExceeded``) when the tenant
    already owns this many deployments; 0: no limit (the lease holder's own writes). Checked in the
    replicated apply, so two concurrent creates through different coordinators cannot both pass."""


@dataclass(frozen=True, slots=True)
class RemoveDeployment(Command):
    kind: ClassVar[str] = "remove_deployment"
    deployment_id: DeploymentId
    expect_version: int = ANY_VERSION


@dataclass(frozen=True, slots=True)
class PutCluster(Command):
    kind: ClassVar[str] = "put_cluster"
    cluster: Cluster
    expect_version: int = ANY_VERSION
    at_ms: int = 0


@dataclass(frozen=True, slots=True)
class RemoveCluster(Command):
    """Rejected (``Conflict``) while instances still run in the cluster."""

    kind: ClassVar[str] = "remove_cluster"
    cluster_id: ClusterId
    expect_version: int = ANY_VERSION


@dataclass(frozen=True, slots=True)
class PutZone(Command):
    kind: ClassVar[str] = "put_zone"
    zone: Zone
    expect_version: int = ANY_VERSION
    at_ms: int = 0


@dataclass(frozen=True, slots=True)
class RemoveZone(Command):
    """Rejected (``Conflict``) while a cluster is registered in the zone."""

    kind: ClassVar[str] = "remove_zone"
    zone_id: ZoneId
    expect_version: int = ANY_VERSION


@dataclass(frozen=True, slots=True)
class PutToken(Command):
    """Create an API token record (``AlreadyExists`` if the id is taken; records are never updated)."""

    kind: ClassVar[str] = "put_token"
    token: TokenRecord
    max_per_tenant: int = 0
    """Rejected (``LimitExceeded``) when the token's tenant already has this many; 0: no limit."""


@dataclass(frozen=True, slots=True)
class RemoveToken(Command):
    """Revoke a token: its record leaves the state, so it authenticates nothing any more."""

    kind: ClassVar[str] = "remove_token"
    token_id: str


@dataclass(frozen=True, slots=True)
class SetDesired(Command):
    """Declarative target of a deployment: ``replicas`` serving plus ``warm_pool`` sleeping."""

    kind: ClassVar[str] = "set_desired"
    deployment_id: DeploymentId
    replicas: int
    warm_pool: int
    reason: str
    at_ms: int
    message: str = ""
    """The decision's explanation with its inputs (what ``Scaling.Explain`` shows)."""


@dataclass(frozen=True, slots=True)
class PutScaleMemory(Command):
    kind: ClassVar[str] = "put_scale_memory"
    deployment_id: DeploymentId
    memory: ScaleMemory


@dataclass(frozen=True, slots=True)
class PutScaleMemories(Command):
    """Several deployments' scale memories as one command: what a tick's plan commits (only the
    memories its decisions changed). One :class:`PutScaleMemory` per deployment would be one
    command per deployment on every 1 s stabilization bucket: at 10,000 deployments a steady tick
    would fill a whole batch (``MAX_BATCH``) with them.

    Entries are applied in order (a repeated deployment: the last wins). An entry naming a
    deployment that no longer exists is skipped, not rejected: the deployment was removed between
    the plan and its commit, and its memory went with it (the other entries still apply)."""

    kind: ClassVar[str] = "put_scale_memories"
    memories: tuple[tuple[DeploymentId, ScaleMemory], ...]


@dataclass(frozen=True, slots=True)
class RecordDemand(Command):
    """Every deployment's peak demand in the history bucket ending at ``end_ms``
    (:mod:`controlplane.domain.demand`), as one command per bucket: ``(deployment id, deci-replicas)``
    pairs. An entry naming a deployment that no longer exists is skipped (removed since the bucket
    closed); a bucket not newer than a deployment's newest raises that bucket to the larger value."""

    kind: ClassVar[str] = "record_demand"
    end_ms: int
    entries: tuple[tuple[DeploymentId, int], ...]


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
class PutModelCache(Command):
    """What one cluster's node-local model cache holds, as its adapter last reported it (put by the
    lease holder when the report differs from the state: ``core/model_cache.py``)."""

    kind: ClassVar[str] = "put_model_cache"
    cluster_id: ClusterId
    record: ModelCacheRecord


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
        RemoveCluster,
        PutZone,
        RemoveZone,
        PutToken,
        RemoveToken,
        SetDesired,
        PutScaleMemory,
        PutScaleMemories,
        RecordDemand,
        CreateInstance,
        TransitionInstance,
        PutBreaker,
        PutModelCache,
        Batch,
    )
}
