"""The replicated state machine: :class:`ControlState` and :func:`apply`.

``apply(state, command)`` is deterministic and total: for any command it either changes the state
and returns ``ApplyResult(ok=True)``, or leaves the state untouched and returns a rejection with the
reason. It never raises, never reads a clock, never draws randomness, and never iterates an
unordered collection, so every replica that applies the same log reaches the same state.

Each handler validates everything first and mutates last, so a rejected command leaves no partial
write behind. A rejection carries a ``code`` (what kind: not found, version mismatch...) for callers
that map errors; a success carries its ``revision`` (``state.applied`` after it), which is also the
``resource_version`` of the tenant, deployment, cluster or zone it wrote (``ControlState.meta``).
Puts and removes of those honour ``expect_version`` (``commands.ANY_VERSION``, ``MUST_NOT_EXIST`` or
the version the writer read).

The state is mutated in place (copying a fleet-sized state per command would make a tick
O(fleet x commands)); snapshots are taken by :func:`snapshot`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from controlplane.domain import commands as c
from controlplane.domain.demand import BUCKET_MS, MAX_DECI, DemandHistory, appended
from controlplane.domain.errors import (
    AlreadyExists,
    Conflict,
    ControlPlaneError,
    IllegalTransition,
    LimitExceeded,
    NotFound,
    ValidationError,
    VersionMismatch,
)
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId, id_problem
from controlplane.domain.instances import InitMethod, Instance, InstanceEvent, InstanceState, Transitioned, transition
from controlplane.domain.records import EMPTY_MEMORY, BreakerRecord, ModelCacheRecord, ObjectMeta, ScaleMemory
from controlplane.domain.start_tiers import new_pod_tier, wake_tier
from controlplane.domain.tenants import Deployment, Tenant
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.domain.topology import Cluster, Zone

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
    """Why it was rejected (a batch: its first rejected member's error)."""
    transitions: tuple[Transitioned, ...] = ()
    results: tuple[ApplyResult, ...] = ()
    """For a batch: one result per command, in order."""
    code: str = ""
    """Why it was rejected, for callers that map errors (the API server): one of :data:`CODES`; ""
    when ``ok``. A batch carries its first rejected member's code."""
    revision: int = 0
    """``ControlState.applied`` right after this command (its objects' new ``resource_version``); 0
    when rejected. A batch carries its last applied member's (0 when it applied none)."""


CODES = ("", "invalid", "not_found", "already_exists", "conflict", "version_mismatch", "limit", "malformed", "unknown")
"""Values of :attr:`ApplyResult.code`: "malformed" is a command of the wrong shape (a proposer bug,
a nested batch); "unknown" a rejection this table does not classify."""
_CODE_OF: dict[type, str] = {
    ValidationError: "invalid",
    IllegalTransition: "conflict",
    NotFound: "not_found",
    AlreadyExists: "already_exists",
    Conflict: "conflict",
    VersionMismatch: "version_mismatch",
    LimitExceeded: "limit",
}




@dataclass
class ControlState:
    tenants: dict[TenantId, Tenant] = field(default_factory=dict)
    deployments: dict[DeploymentId, Deployment] = field(default_factory=dict)
    clusters: dict[ClusterId, Cluster] = field(default_factory=dict)
    instances: dict[InstanceId, Instance] = field(default_factory=dict)
    desired: dict[DeploymentId, Desired] = field(default_factory=dict)
    memory: dict[DeploymentId, ScaleMemory] = field(default_factory=dict)
    demand: dict[DeploymentId, DemandHistory] = field(default_factory=dict)
    """Recent peak demand per deployment (:mod:`controlplane.domain.demand`): what forecasts read."""
    breakers: dict[str, BreakerRecord] = field(default_factory=dict)
    zones: dict[ZoneId, Zone] = field(default_factory=dict)
    tokens: dict[str, TokenRecord] = field(default_factory=dict)
    """API token records by token id (hashed secrets only)."""
    meta: dict[str, ObjectMeta] = field(default_factory=dict)
    """Versions and times of tenants, deployments, clusters and zones, keyed ``"{kind}/{id}"``
    (:func:`meta_key`)."""
    model_caches: dict[ClusterId, ModelCacheRecord] = field(default_factory=dict)
    """What each cluster's node-local model cache holds (a cluster without a record: nothing)."""
    applied: int = 0
    """Number of commands applied successfully (a batch counts each member), plus the lease changes
    of holder or epoch ``raft/fsm.py`` applied (each is a revision of its own, for its watch event)."""
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


Observer = Callable[["ControlState", c.Command], object]
"""``apply``'s ``before`` hook: called with the state and each command about to be applied."""


def apply(state: ControlState, command: c.Command, before: Observer | None = None) -> ApplyResult:
    """Apply one replicated command. Deterministic and total: never raises.

    ``before(state, cmd)``, when given, is called right before each non-batch command is applied
    (each member of a well-formed batch, in order), while the state is still as that command finds
    it: the event log captures what a command removes (see ``controlplane/runtime/events.py``). It
    must not change the state.
    """
    if isinstance(command, c.Batch):
        return _apply_batch(state, command, before)
    if before is not None:
        before(state, command)
    return _apply_one(state, command)


def _apply_batch(state: ControlState, batch: c.Batch, before: Observer | None) -> ApplyResult:
    if not isinstance(batch.commands, (tuple, list)):
        return _rejected(f"malformed batch: commands must be a tuple, got {type(batch.commands).__name__}", "malformed")
    if len(batch.commands) > MAX_BATCH:
        return _rejected(f"batch: {len(batch.commands)} commands exceed the limit of {MAX_BATCH}", "invalid")
    results = []
    applied = state.applied
    for cmd in batch.commands:
        if isinstance(cmd, c.Batch):
            results.append(_rejected("batch: batches cannot be nested", "malformed"))
            continue
        if before is not None:
            before(state, cmd)
        results.append(_apply_one(state, cmd))
    transitions = tuple(t for r in results for t in r.transitions)
    first = next((r for r in results if not r.ok), None)
    error, code = ("", "") if first is None else (first.error, first.code)
    revision = state.applied if state.applied != applied else 0
    return ApplyResult(first is None, error, transitions, tuple(results), code, revision)


def _rejected(error: str, code: str) -> ApplyResult:
    return ApplyResult(False, error, code=code)


def _apply_one(state: ControlState, command: c.Command) -> ApplyResult:
    handler = _HANDLERS.get(type(command))
    if handler is None:
        return _rejected(f"unknown command type {type(command).__name__}", "malformed")
    try:
        transitions = handler(state, command)
    except ControlPlaneError as exc:
        return _rejected(str(exc), _CODE_OF.get(type(exc), "unknown"))
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        # A malformed command (wrong field types from a buggy or hostile proposer). Every replica
        # rejects it identically, so the log stays replayable.
        return _rejected(f"malformed {command.kind}: {exc}", "malformed")
    state.applied += 1
    return ApplyResult(True, transitions=transitions, revision=state.applied)


# --- handlers: validate everything, then mutate; return the transitions made ---------------------
#
# A handler that succeeds makes its command revision ``state.applied + 1`` (``_apply_one`` counts it
# after the handler returns): that is the ``resource_version`` it stamps on what it writes.

NO_TRANSITIONS: tuple[Transitioned, ...] = ()


def meta_key(kind: str, ident: str) -> str:
    """Key of an object's :class:`ObjectMeta` in ``ControlState.meta`` (``"deployment/chat"``)."""
    return f"{kind}/{ident}"


def _check_write(state: ControlState, kind: str, ident: str, exists: bool, expect: int, *, delete: bool) -> None:
    """The ``expect_version`` precondition of a put or remove (see ``commands.ANY_VERSION``)."""
    if isinstance(expect, bool) or not isinstance(expect, int) or expect < c.ANY_VERSION:
        raise ValidationError("expect_version", f"must be -1 (any), 0 (create) or a resource_version, got {expect!r}")
    if expect == c.ANY_VERSION:
        if delete and not exists:
            raise NotFound(kind, ident)
        return
    if expect == c.MUST_NOT_EXIST:
        if delete:
            raise ValidationError("expect_version", "must be -1 (any) or a resource_version for a delete, got 0")
        if exists:
            raise AlreadyExists(kind, ident)
        return
    if not exists:
        raise NotFound(kind, ident)
    meta = state.meta.get(meta_key(kind, ident))
    actual = meta.resource_version if meta is not None else 0
    if actual != expect:
        raise VersionMismatch(kind, ident, expect, actual)


def _check_at(at_ms: int) -> None:
    if isinstance(at_ms, bool) or not isinstance(at_ms, int) or at_ms < 0:
        raise ValidationError("at_ms", f"must be an integer >= 0, got {at_ms!r}")


def _stamp(state: ControlState, kind: str, ident: str, at_ms: int) -> None:
    """Record a successful put's revision and times (``created_ms`` survives updates)."""
    key = meta_key(kind, ident)
    old = state.meta.get(key)
    created = old.created_ms if old is not None else at_ms
    state.meta[key] = ObjectMeta(state.applied + 1, created, at_ms)


def check_limit(limit: int, what: str, tenant: str, count: Callable[[], int], *, creates: bool) -> None:
    """A command's per-tenant object limit (0: none), checked only when it creates an object."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValidationError("max_per_tenant", f"must be an integer >= 0, got {limit!r}")
    if limit and creates:
        n = count()
        if n >= limit:
            raise LimitExceeded(f"tenant {tenant!r} already has {n} {what}, the most allowed per tenant ({limit})")


def _put_tenant(state: ControlState, cmd: c.PutTenant) -> tuple[Transitioned, ...]:
    t = cmd.tenant
    Tenant.__post_init__(t)  # re-validate: the command may come from the codec
    _check_at(cmd.at_ms)
    _check_write(state, "tenant", t.id, t.id in state.tenants, cmd.expect_version, delete=False)
    state.tenants[t.id] = t
    _stamp(state, "tenant", t.id, cmd.at_ms)
    return NO_TRANSITIONS


def _remove_tenant(state: ControlState, cmd: c.RemoveTenant) -> tuple[Transitioned, ...]:
    tid = cmd.tenant_id
    _check_write(state, "tenant", tid, tid in state.tenants, cmd.expect_version, delete=True)
    owned = [d.id for d in state.deployments.values() if d.tenant == tid]
    if owned:
        raise Conflict(f"tenant {tid!r} still owns deployments {sorted(owned)}")
    del state.tenants[tid]
    state.meta.pop(meta_key("tenant", tid), None)
    for token_id in [k for k, tok in state.tokens.items() if tok.tenant == tid]:
        del state.tokens[token_id]  # its tokens would name a tenant that no longer exists
    return NO_TRANSITIONS


def _put_deployment(state: ControlState, cmd: c.PutDeployment) -> tuple[Transitioned, ...]:
    d = cmd.deployment
    Deployment.__post_init__(d)
    _check_at(cmd.at_ms)
    if d.tenant not in state.tenants:
        raise NotFound("tenant", d.tenant)
    old = state.deployments.get(d.id)
    check_limit(cmd.max_per_tenant, "deployments", d.tenant,
                 lambda: sum(1 for x in state.deployments.values() if x.tenant == d.tenant),
                 creates=old is None or old.tenant != d.tenant)
    _check_write(state, "deployment", d.id, old is not None, cmd.expect_version, delete=False)
    if old is None:
        if d.deleting:
            raise ValidationError("deployment.deleting", f"deployment {d.id!r} does not exist; it cannot be created deleting")
    else:
        if old.tenant != d.tenant:
            raise Conflict(f"deployment {d.id!r} belongs to tenant {old.tenant!r}")
        if (old.pool, old.gpus_per_instance) != (d.pool, d.gpus_per_instance):
            raise ValidationError("deployment.pool", "pool and gpus_per_instance cannot change; create a new deployment")
        if old.deleting and not d.deleting:
            raise Conflict(f"deployment {d.id!r} is being deleted; it cannot be updated")
    state.deployments[d.id] = d
    state.by_deployment.setdefault(d.id, {})
    _stamp(state, "deployment", d.id, cmd.at_ms)
    return NO_TRANSITIONS


def _remove_deployment(state: ControlState, cmd: c.RemoveDeployment) -> tuple[Transitioned, ...]:
    did = cmd.deployment_id
    _check_write(state, "deployment", did, did in state.deployments, cmd.expect_version, delete=True)
    live = [i for i in state.instances_of(did) if not i.state.terminal]
    if live:
        raise Conflict(f"deployment {did!r} still has {len(live)} instances; scale it to 0 first")
    for table in (state.deployments, state.desired, state.memory, state.demand, state.by_deployment):
        table.pop(did, None)  # type: ignore[attr-defined]
    state.meta.pop(meta_key("deployment", did), None)
    return NO_TRANSITIONS


def _put_cluster(state: ControlState, cmd: c.PutCluster) -> tuple[Transitioned, ...]:
    cl = cmd.cluster
    Cluster.__post_init__(cl)
    _check_at(cmd.at_ms)
    old = state.clusters.get(cl.id)
    _check_write(state, "cluster", cl.id, old is not None, cmd.expect_version, delete=False)
    if old is not None and old.zone != cl.zone:
        raise ValidationError("cluster.zone", f"cluster {cl.id!r} is in zone {old.zone!r}; zones cannot change")
    state.clusters[cl.id] = cl
    _stamp(state, "cluster", cl.id, cmd.at_ms)
    return NO_TRANSITIONS


def _remove_cluster(state: ControlState, cmd: c.RemoveCluster) -> tuple[Transitioned, ...]:
    cid = cmd.cluster_id
    _check_write(state, "cluster", cid, cid in state.clusters, cmd.expect_version, delete=True)
    running = sum(1 for i in state.instances.values() if i.cluster == cid)
    if running:
        raise Conflict(f"cluster {cid!r} still has {running} instances; drain it first")
    del state.clusters[cid]
    state.meta.pop(meta_key("cluster", cid), None)
    state.model_caches.pop(cid, None)
    for key in [k for k in state.gpus_used if k[0] == cid]:
        del state.gpus_used[key]  # all 0: no instance is left there
    return NO_TRANSITIONS


def _put_zone(state: ControlState, cmd: c.PutZone) -> tuple[Transitioned, ...]:
    z = cmd.zone
    Zone.__post_init__(z)
    _check_at(cmd.at_ms)
    _check_write(state, "zone", z.id, z.id in state.zones, cmd.expect_version, delete=False)
    state.zones[z.id] = z
    _stamp(state, "zone", z.id, cmd.at_ms)
    return NO_TRANSITIONS


def _remove_zone(state: ControlState, cmd: c.RemoveZone) -> tuple[Transitioned, ...]:
    zid = cmd.zone_id
    _check_write(state, "zone", zid, zid in state.zones, cmd.expect_version, delete=True)
    inside = [cl.id for cl in state.clusters.values() if cl.zone == zid]
    if inside:
        raise Conflict(f"zone {zid!r} still has clusters {sorted(inside)}")
    del state.zones[zid]
    state.meta.pop(meta_key("zone", zid), None)
    return NO_TRANSITIONS


def _put_token(state: ControlState, cmd: c.PutToken) -> tuple[Transitioned, ...]:
    tok = cmd.token
    TokenRecord.__post_init__(tok)
    if tok.id in state.tokens:
        raise AlreadyExists("token", tok.id)
    if tok.role is Role.TENANT and tok.tenant not in state.tenants:
        raise NotFound("tenant", tok.tenant)
    check_limit(cmd.max_per_tenant, "tokens", tok.tenant,
                 lambda: sum(1 for x in state.tokens.values() if x.tenant == tok.tenant),
                 creates=tok.role is Role.TENANT)
    state.tokens[tok.id] = tok
    return NO_TRANSITIONS


def _remove_token(state: ControlState, cmd: c.RemoveToken) -> tuple[Transitioned, ...]:
    if cmd.token_id not in state.tokens:
        raise NotFound("token", cmd.token_id)
    del state.tokens[cmd.token_id]
    return NO_TRANSITIONS


def _set_desired(state: ControlState, cmd: c.SetDesired) -> tuple[Transitioned, ...]:
    d = state.deployments.get(cmd.deployment_id)
    if d is None:
        raise NotFound("deployment", cmd.deployment_id)
    if not 0 <= cmd.replicas <= d.max_replicas:
        raise ValidationError("replicas", f"must be between 0 and {d.max_replicas}, got {cmd.replicas}")
    if cmd.warm_pool < 0:
        raise ValidationError("warm_pool", f"must be >= 0, got {cmd.warm_pool}")
    if not isinstance(cmd.message, str):
        raise ValidationError("message", f"must be a string, got {type(cmd.message).__name__}")
    old = state.desired.get(cmd.deployment_id)
    gen = 1 if old is None else old.generation + (
        (old.replicas, old.warm_pool) != (cmd.replicas, cmd.warm_pool)
    )
    state.desired[cmd.deployment_id] = Desired(cmd.replicas, cmd.warm_pool, gen, cmd.reason, cmd.at_ms)
    return NO_TRANSITIONS


def _put_memory(state: ControlState, cmd: c.PutScaleMemory) -> tuple[Transitioned, ...]:
    if cmd.deployment_id not in state.deployments:
        raise NotFound("deployment", cmd.deployment_id)
    state.memory[cmd.deployment_id] = cmd.memory
    return NO_TRANSITIONS


def _put_memories(state: ControlState, cmd: c.PutScaleMemories) -> tuple[Transitioned, ...]:
    entries = cmd.memories
    if not isinstance(entries, tuple):
        raise ValidationError("memories", f"must be a tuple, got {type(entries).__name__}")
    for k, entry in enumerate(entries):
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], ScaleMemory)):
            raise ValidationError(f"memories[{k}]", "must be a (deployment id, ScaleMemory) pair")
    deployments, memory = state.deployments, state.memory
    for deployment_id, mem in entries:
        if deployment_id in deployments:  # removed since the plan: its memory went with it
            memory[deployment_id] = mem
    return NO_TRANSITIONS


def _record_demand(state: ControlState, cmd: c.RecordDemand) -> tuple[Transitioned, ...]:
    end = cmd.end_ms
    if not isinstance(end, int) or isinstance(end, bool) or end < 0 or end % BUCKET_MS:
        raise ValidationError("end_ms", f"must be a non-negative multiple of {BUCKET_MS}, got {end!r}")
    entries = cmd.entries
    if not isinstance(entries, tuple):
        raise ValidationError("entries", f"must be a tuple, got {type(entries).__name__}")
    for k, entry in enumerate(entries):
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], int) and not isinstance(entry[1], bool) and 0 <= entry[1] <= MAX_DECI):
            raise ValidationError(f"entries[{k}]", f"must be a (deployment id, deci-replicas 0..{MAX_DECI}) pair")
    deployments, demand = state.deployments, state.demand
    for deployment_id, deci in entries:
        if deployment_id in deployments:  # removed since the bucket closed: its history went with it
            demand[deployment_id] = appended(demand.get(deployment_id), end, deci)
    return NO_TRANSITIONS


def _create_instance(state: ControlState, cmd: c.CreateInstance) -> tuple[Transitioned, ...]:
    problem = id_problem(cmd.instance_id)  # it becomes a pod name, and a key that snapshot() sorts
    if problem:
        raise ValidationError("instance_id", problem)
    if cmd.instance_id in state.instances:
        raise AlreadyExists("instance", cmd.instance_id)
    d = state.deployments.get(cmd.deployment_id)
    if d is None:
        raise NotFound("deployment", cmd.deployment_id)
    if d.deleting:
        raise Conflict(f"deployment {d.id!r} is being deleted; it gets no new instances")
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
    return NO_TRANSITIONS


def _transition_instance(state: ControlState, cmd: c.TransitionInstance) -> tuple[Transitioned, ...]:
    inst = state.instances.get(cmd.instance_id)
    if inst is None:
        raise NotFound("instance", cmd.instance_id)
    d = state.deployments.get(inst.deployment)
    if cmd.event is InstanceEvent.SLEEP and d is not None and not d.engine.can_sleep:
        raise Conflict(f"instance {inst.id!r} runs {d.engine.value}, which has no sleep mode; drain it instead")
    new, rec = transition(
        inst, cmd.event, cmd.at_ms, drain_deadline_ms=cmd.drain_deadline_ms, preempted=cmd.preempted,
        init=_start_tier(state, inst, cmd.event),
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
    return (rec,)


def _start_tier(state: ControlState, inst: Instance, event: InstanceEvent) -> InitMethod | None:
    """The start tier a warm-up transition records, from the replicated state: a new pod is
    ``cached`` when its cluster's model cache holds the deployment's model, else ``cold``; a wake is
    the engine's (``start_tiers.wake_tier``). None for every other transition."""
    d = state.deployments.get(inst.deployment)
    if d is None:
        return None
    if event is InstanceEvent.START_WARMUP and inst.state is InstanceState.PENDING:
        cache = state.model_caches.get(inst.cluster)
        return new_pod_tier(cache is not None and cache.holds(d.model))
    if event is InstanceEvent.WAKE and inst.state is InstanceState.STANDBY:
        return wake_tier(d.engine)
    return None


def _put_model_cache(state: ControlState, cmd: c.PutModelCache) -> tuple[Transitioned, ...]:
    if not isinstance(cmd.record, ModelCacheRecord):
        raise ValidationError("record", f"must be a ModelCacheRecord, got {type(cmd.record).__name__}")
    ModelCacheRecord.__post_init__(cmd.record)
    if cmd.cluster_id not in state.clusters:
        raise NotFound("cluster", cmd.cluster_id)
    state.model_caches[cmd.cluster_id] = cmd.record
    return NO_TRANSITIONS


def _put_breaker(state: ControlState, cmd: c.PutBreaker) -> tuple[Transitioned, ...]:
    if not isinstance(cmd.key, str) or not cmd.key:
        raise ValidationError("key", f"must be a non-empty string, got {cmd.key!r}")
    state.breakers[cmd.key] = cmd.record
    return NO_TRANSITIONS


_HANDLERS: dict[type, Callable[[ControlState, object], tuple[Transitioned, ...]]] = {
    c.PutTenant: _put_tenant,
    c.RemoveTenant: _remove_tenant,
    c.PutDeployment: _put_deployment,
    c.RemoveDeployment: _remove_deployment,
    c.PutCluster: _put_cluster,
    c.RemoveCluster: _remove_cluster,
    c.PutZone: _put_zone,
    c.RemoveZone: _remove_zone,
    c.PutToken: _put_token,
    c.RemoveToken: _remove_token,
    c.SetDesired: _set_desired,
    c.PutScaleMemory: _put_memory,
    c.PutScaleMemories: _put_memories,
    c.RecordDemand: _record_demand,
    c.CreateInstance: _create_instance,
    c.TransitionInstance: _transition_instance,
    c.PutBreaker: _put_breaker,
    c.PutModelCache: _put_model_cache,
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
        "demand": dict(sorted(state.demand.items())),
        "breakers": dict(sorted(state.breakers.items())),
        "zones": dict(sorted(state.zones.items())),
        "tokens": dict(sorted(state.tokens.items())),
        "meta": dict(sorted(state.meta.items())),
        "model_caches": dict(sorted(state.model_caches.items())),
        "applied": state.applied,
    }
