"""The replicated state machine: :class:`ControlState` and :func:`apply`.

``apply(state, command)`` is deterministic and total: for any command it either changes the state
and returns ``ApplyResult(ok=True)``, or leaves the state untouched and returns a rejection with the
reason. It never raises, never reads a clock, never draws randomness, and never iterates an
unordered collection, so every replica that applies the same log reaches the same state.

Each handler validates everything first and mutates last, so a rejected command leaves no partial
write behind. The state is mutated in place (copying a fleet-sized state per command would make a
tick O(fleet x commands)); snapshots are taken by :func:`snapshot`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from controlplane.domain import commands as c
from controlplane.domain.errors import (
    AlreadyExists,
    Conflict,
    ControlPlaneError,
    NotFound,
    ValidationError,
)
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, id_problem
from controlplane.domain.instances import (
    InitMethod,
    Instance,
    InstanceState,
    Transitioned,
    transition,
)
from controlplane.domain.records import EMPTY_MEMORY, BreakerRecord, ScaleMemory
from controlplane.domain.tenants import Deployment, Tenant
from controlplane.domain.topology import Cluster

MAX_BATCH = 10_000
"""Most commands in one :class:`~controlplane.domain.commands.Batch`."""


@dataclass(frozen=True, slots=True)
class Desired:
    replicas: int
    warm_pool: int
    generation: int
    """Bumped on every change: adapters apply ``desired`` idempotently per generation."""
    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class ApplyResult:
    ok: bool
    error: str = ""
    transitions: tuple[Transitioned, ...] = ()
    results: tuple[ApplyResult, ...] = ()
    """For a batch: one result per command, in order."""


OK = ApplyResult(ok=True)


@dataclass
class ControlState:
    tenants: dict[TenantId, Tenant] = field(default_factory=dict)
    deployments: dict[DeploymentId, Deployment] = field(default_factory=dict)
    clusters: dict[ClusterId, Cluster] = field(default_factory=dict)
    instances: dict[InstanceId, Instance] = field(default_factory=dict)
    desired: dict[DeploymentId, Desired] = field(default_factory=dict)
    memory: dict[DeploymentId, ScaleMemory] = field(default_factory=dict)
    breakers: dict[str, BreakerRecord] = field(default_factory=dict)
    applied: int = 0
    """Number of commands applied successfully (a batch counts each member)."""
    # Derived indexes, kept in step by the handlers (dicts used as insertion-ordered sets).
    by_deployment: dict[DeploymentId, dict[InstanceId, None]] = field(default_factory=dict)
    gpus_used: dict[tuple[ClusterId, PoolId], int] = field(default_factory=dict)

    def instances_of(self, deployment_id: DeploymentId) -> Iterator[Instance]:
        for iid in self.by_deployment.get(deployment_id, {}):
            yield self.instances[iid]

    def free_gpus(self, cluster_id: ClusterId, pool: PoolId) -> int:
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            return 0
        return cluster.capacity.get(pool, 0) - self.gpus_used.get((cluster_id, pool), 0)

    def memory_of(self, deployment_id: DeploymentId) -> ScaleMemory:
        return self.memory.get(deployment_id, EMPTY_MEMORY)


def apply(state: ControlState, command: c.Command) -> ApplyResult:
    """Apply one replicated command. Deterministic and total: never raises."""
    if isinstance(command, c.Batch):
        return _apply_batch(state, command)
    return _apply_one(state, command)


def _apply_batch(state: ControlState, batch: c.Batch) -> ApplyResult:
    if not isinstance(batch.commands, (tuple, list)):
        return ApplyResult(False, f"malformed batch: commands must be a tuple, got {type(batch.commands).__name__}")
    if len(batch.commands) > MAX_BATCH:
        return ApplyResult(False, f"batch: {len(batch.commands)} commands exceed the limit of {MAX_BATCH}")
    results = []
    for cmd in batch.commands:
        if isinstance(cmd, c.Batch):
            results.append(ApplyResult(False, "batch: batches cannot be nested"))
        else:
            results.append(_apply_one(state, cmd))
    transitions = tuple(t for r in results for t in r.transitions)
    return ApplyResult(all(r.ok for r in results), "", transitions, tuple(results))


def _apply_one(state: ControlState, command: c.Command) -> ApplyResult:
    handler = _HANDLERS.get(type(command))
    if handler is None:
        return ApplyResult(False, f"unknown command type {type(command).__name__}")
    try:
        result = handler(state, command)
    except ControlPlaneError as exc:
        return ApplyResult(False, str(exc))
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        # A malformed command (wrong field types from a buggy or hostile proposer). Every replica
        # rejects it identically, so the log stays replayable.
        return ApplyResult(False, f"malformed {command.kind}: {exc}")
    state.applied += 1
    return result


def _put_tenant(state: ControlState, cmd: c.PutTenant) -> ApplyResult:
    t = cmd.tenant
    Tenant.__post_init__(t)  # re-validate: the command may come from the codec
    state.tenants[t.id] = t
    return OK


def _remove_tenant(state: ControlState, cmd: c.RemoveTenant) -> ApplyResult:
    if cmd.tenant_id not in state.tenants:
        raise NotFound("tenant", cmd.tenant_id)
    owned = [d.id for d in state.deployments.values() if d.tenant == cmd.tenant_id]
    if owned:
        raise Conflict(f"tenant {cmd.tenant_id!r} still owns deployments {sorted(owned)}")
    del state.tenants[cmd.tenant_id]
    return OK


def _put_deployment(state: ControlState, cmd: c.PutDeployment) -> ApplyResult:
    d = cmd.deployment
    Deployment.__post_init__(d)
    if d.tenant not in state.tenants:
        raise NotFound("tenant", d.tenant)
    old = state.deployments.get(d.id)
    if old is not None:
        if old.tenant != d.tenant:
            raise Conflict(f"deployment {d.id!r} belongs to tenant {old.tenant!r}")
        if (old.pool, old.gpus_per_instance) != (d.pool, d.gpus_per_instance):
            raise ValidationError("deployment.pool", "pool and gpus_per_instance cannot change; create a new deployment")
    state.deployments[d.id] = d
    state.by_deployment.setdefault(d.id, {})
    return OK


def _remove_deployment(state: ControlState, cmd: c.RemoveDeployment) -> ApplyResult:
    if cmd.deployment_id not in state.deployments:
        raise NotFound("deployment", cmd.deployment_id)
    live = [i for i in state.instances_of(cmd.deployment_id) if not i.state.terminal]
    if live:
        raise Conflict(f"deployment {cmd.deployment_id!r} still has {len(live)} instances; scale it to 0 first")
    for table in (state.deployments, state.desired, state.memory, state.by_deployment):
        table.pop(cmd.deployment_id, None)  # type: ignore[attr-defined]
    return OK


def _put_cluster(state: ControlState, cmd: c.PutCluster) -> ApplyResult:
    cl = cmd.cluster
    Cluster.__post_init__(cl)
    old = state.clusters.get(cl.id)
    if old is not None and old.zone != cl.zone:
        raise ValidationError("cluster.zone", f"cluster {cl.id!r} is in zone {old.zone!r}; zones cannot change")
    state.clusters[cl.id] = cl
    return OK


def _set_desired(state: ControlState, cmd: c.SetDesired) -> ApplyResult:
    d = state.deployments.get(cmd.deployment_id)
    if d is None:
        raise NotFound("deployment", cmd.deployment_id)
    if not 0 <= cmd.replicas <= d.max_replicas:
        raise ValidationError("replicas", f"must be between 0 and {d.max_replicas}, got {cmd.replicas}")
    if cmd.warm_pool < 0:
        raise ValidationError("warm_pool", f"must be >= 0, got {cmd.warm_pool}")
    old = state.desired.get(cmd.deployment_id)
    gen = 1 if old is None else old.generation + (
        (old.replicas, old.warm_pool) != (cmd.replicas, cmd.warm_pool)
    )
    state.desired[cmd.deployment_id] = Desired(cmd.replicas, cmd.warm_pool, gen, cmd.reason, cmd.at_ms)
    return OK


def _put_memory(state: ControlState, cmd: c.PutScaleMemory) -> ApplyResult:
    if cmd.deployment_id not in state.deployments:
        raise NotFound("deployment", cmd.deployment_id)
    state.memory[cmd.deployment_id] = cmd.memory
    return OK


def _create_instance(state: ControlState, cmd: c.CreateInstance) -> ApplyResult:
    problem = id_problem(cmd.instance_id)  # it becomes a pod name, and a key that snapshot() sorts
    if problem:
        raise ValidationError("instance_id", problem)
    if cmd.instance_id in state.instances:
        raise AlreadyExists("instance", cmd.instance_id)
    d = state.deployments.get(cmd.deployment_id)
    if d is None:
        raise NotFound("deployment", cmd.deployment_id)
    cl = state.clusters.get(cmd.cluster_id)
    if cl is None:
        raise NotFound("cluster", cmd.cluster_id)
    free = state.free_gpus(cl.id, d.pool)
    if free < d.gpus_per_instance:
        raise Conflict(f"cluster {cl.id!r} has {free} free {d.pool} GPUs, instance needs {d.gpus_per_instance}")
    inst = Instance(
        id=cmd.instance_id,
        deployment=d.id,
        tenant=d.tenant,
        cluster=cl.id,
        zone=cl.zone,
        pool=d.pool,
        gpus=d.gpus_per_instance,
        state=InstanceState.PENDING,
        init_method=InitMethod.COLD,
        created_ms=cmd.at_ms,
        state_since_ms=cmd.at_ms,
    )
    state.instances[inst.id] = inst
    state.by_deployment.setdefault(d.id, {})[inst.id] = None
    key = (cl.id, d.pool)
    state.gpus_used[key] = state.gpus_used.get(key, 0) + inst.gpus
    return OK


def _transition_instance(state: ControlState, cmd: c.TransitionInstance) -> ApplyResult:
    inst = state.instances.get(cmd.instance_id)
    if inst is None:
        raise NotFound("instance", cmd.instance_id)
    new, rec = transition(
        inst, cmd.event, cmd.at_ms, drain_deadline_ms=cmd.drain_deadline_ms, preempted=cmd.preempted
    )
    if new.state.terminal:
        # Terminal instances leave the state (the transition record is their epitaph), which keeps
        # the replicated state bounded by the live fleet.
        del state.instances[inst.id]
        state.by_deployment.get(inst.deployment, {}).pop(inst.id, None)
        key = (inst.cluster, inst.pool)
        state.gpus_used[key] = state.gpus_used.get(key, 0) - inst.gpus
    else:
        state.instances[inst.id] = new
    return ApplyResult(True, transitions=(rec,))


def _put_breaker(state: ControlState, cmd: c.PutBreaker) -> ApplyResult:
    if not isinstance(cmd.key, str) or not cmd.key:
        raise ValidationError("key", f"must be a non-empty string, got {cmd.key!r}")
    state.breakers[cmd.key] = cmd.record
    return OK


_HANDLERS: dict[type, Callable[[ControlState, object], ApplyResult]] = {
    c.PutTenant: _put_tenant,
    c.RemoveTenant: _remove_tenant,
    c.PutDeployment: _put_deployment,
    c.RemoveDeployment: _remove_deployment,
    c.PutCluster: _put_cluster,
    c.SetDesired: _set_desired,
    c.PutScaleMemory: _put_memory,
    c.CreateInstance: _create_instance,
    c.TransitionInstance: _transition_instance,
    c.PutBreaker: _put_breaker,
}  # type: ignore[dict-item]


def snapshot(state: ControlState) -> dict[str, object]:
    """A plain, order-stable view of the replicated part of the state (for tests and dumps)."""
    return {
        "tenants": dict(sorted(state.tenants.items())),
        "deployments": dict(sorted(state.deployments.items())),
        "clusters": dict(sorted(state.clusters.items())),
        "instances": dict(sorted(state.instances.items())),
        "desired": dict(sorted(state.desired.items())),
        "memory": dict(sorted(state.memory.items())),
        "breakers": dict(sorted(state.breakers.items())),
        "applied": state.applied,
    }
