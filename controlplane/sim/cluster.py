"""Simulated clusters: engine instances with a service model, a gateway per deployment, failures.

This is the simulator's side of two ports: it is the :class:`~controlplane.ports.ClusterAdapter`
(fenced, idempotent commands: create / wake / sleep / drain / cancel) and the
:class:`~controlplane.ports.ObservationSource` (engine-native samples, lifecycle reports, gateway
queues) that the production control loop talks to.

Service model of one instance (documented in ``docs/simulator.md``):

* Continuous batching with vLLM's admission limits: at most ``max_num_seqs`` running requests and
  their prompt + output tokens must fit in the KV cache; the rest wait in the engine queue (FIFO).
* Prefill is serialised per instance at ``prefill_tokens_per_s`` (no chunked-prefill overlap).
* The first token comes one decode step after the prefill; the remaining tokens follow at the step
  time of the batch size at admission (``ModelProfile.step_ms``).
* TTFT = first token - arrival, including time at the gateway while no instance was serving.

That is vLLM's service model, and it serves every ``vllm`` deployment with exactly this code. A
``triton`` or ``deepspeed-mii`` deployment's requests and samples go to its engine's
:class:`~controlplane.sim.service_models.ServiceModel` (Triton's dynamic batcher or TensorRT-LLM
in-flight batching; MII FastGen seen through its request meter or not at all), which reuses
:meth:`SimFleet.admit_continuous` where the engine batches continuously.

Starts take their tier's latency (:mod:`controlplane.domain.start_tiers`) with +-10 % jitter: a new
instance on a cluster whose node-local model cache (``caches``) holds its model is a ``cached``
start, otherwise a ``cold`` one, after whose success the cluster's cache holds the model; a wake
takes the wake tier of the deployment's engine. The caches are reported in every gather
(``Observations.model_caches``), the way an adapter reports its cluster's, and reach the replicated
state through the same facts.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controlplane.domain.errors import StaleEpoch, Unavailable
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId
from controlplane.domain.instances import InitMethod, InstanceEvent
from controlplane.domain.observations import InstanceReport, InstanceSample, Observations
from controlplane.domain.profiles import ModelProfile
from controlplane.domain.start_tiers import new_pod_tier, start_ms, wake_tier
from controlplane.domain.tenants import Engine
from controlplane.ports import AdapterCommand, Fence
from controlplane.sim.service_models import BATCH_DUE, ServiceModel, service_model

# Event kinds of the simulator's heap (BATCH_DUE = 4, a Triton batcher's queue delay, in service_models).
COMPLETE, WARM_DONE, DRAIN_DEADLINE = 1, 2, 3
__all__ = ["BATCH_DUE", "COMPLETE", "DRAIN_DEADLINE", "WARM_DONE", "SimFleet", "SimInstance", "SimRequest"]

MAX_SEEN_REQUEST_IDS = 100_000
"""Bound on the idempotency memory of the simulated adapter."""


class InstanceRef(Protocol):
    """What a command needs to know about its instance (a domain ``Instance`` is one)."""

    @property
    def id(self) -> InstanceId: ...
    @property
    def deployment(self) -> DeploymentId: ...
    @property
    def cluster(self) -> ClusterId: ...
    @property
    def gpus(self) -> int: ...


@dataclass(slots=True)
class SimRequest:
    rid: int
    deployment: DeploymentId
    arrival_ms: int
    prompt: int
    output: int
    first_token_ms: int = -1
    dropped: bool = False


@dataclass(slots=True)
class SimInstance:
    id: InstanceId
    deployment: DeploymentId
    cluster: ClusterId
    profile: ModelProfile
    gpus: int
    created_ms: int
    phase: str = "starting"  # starting | serving | sleeping | draining | lost | gone
    gen: int = 0
    """Incarnation: bumped to invalidate scheduled events (a warm-up cancelled by a drain)."""
    running: dict[int, SimRequest] = field(default_factory=dict)
    queue: deque = field(default_factory=deque)
    kv_used: int = 0
    prefill_free_ms: float = 0.0
    first_tokens: deque = field(default_factory=deque)
    """(first_token_ms, ttft_ms) of admitted requests, in order: for the TTFT sample."""
    prompt_tokens_since_sample: int = 0
    gone_ms: int = -1
    tier: InitMethod = InitMethod.CACHED
    """The tier of the latest start (``cold`` fills the cluster's model cache once it succeeds)."""

    def load(self) -> int:
        return len(self.running) + len(self.queue)


class SimFleet:
    """All simulated clusters. ``schedule(at_ms, kind, payload)`` pushes onto the simulator's heap."""

    def __init__(
        self,
        profiles: dict[DeploymentId, ModelProfile],
        schedule: Callable[[float, int, object], None],
        rng: random.Random,
        warmup_failure: Callable[[ClusterId, DeploymentId, int], float],
        on_request_done: Callable[[SimRequest, int], None],
        *,
        caches: Mapping[ClusterId, Iterable[str]] | None = None,
        engines: Mapping[DeploymentId, Engine] | None = None,
        service_options: Mapping[DeploymentId, object] | None = None,
    ) -> None:
        """``caches``: the model names each cluster's node-local model cache holds at the start
        (None: every model on every cluster, and nothing reported). ``engines``: each deployment's
        engine, for its wake tier and its service model (vLLM when absent; Triton and DeepSpeed-MII
        are served by :mod:`controlplane.sim.service_models`, configured by ``service_options``:
        a deployment's ``TritonSpec`` / ``MiiSpec``, their defaults when absent)."""
        self._profiles = profiles
        self.caches: dict[ClusterId, set[str]] | None = (
            None if caches is None else {cid: set(models) for cid, models in caches.items()})
        self._engines = dict(engines or {})
        self._options = dict(service_options or {})
        self._models: dict[DeploymentId, ServiceModel | None] = {
            d: service_model(e.value, self._options.get(d), profiles[d].max_num_seqs)
            for d, e in self._engines.items() if d in profiles}
        self._schedule = schedule
        self._rng = rng
        self._warmup_failure = warmup_failure
        self._on_request_done = on_request_done
        self.instances: dict[InstanceId, SimInstance] = {}
        self.by_deployment: dict[DeploymentId, dict[InstanceId, SimInstance]] = {d: {} for d in profiles}
        self.gateway: dict[DeploymentId, deque] = {d: deque() for d in profiles}
        self.down: set[ClusterId] = set()
        self.gpu_ms: dict[DeploymentId, float] = {d: 0.0 for d in profiles}
        self._reports: list[InstanceReport] = []
        self._highest_epoch = 0
        self._seen: dict[str, None] = {}
        self.stale_rejected = 0

    # -- the adapter port -------------------------------------------------------------------
    def add_deployment(self, dep: DeploymentId, profile: ModelProfile, engine: Engine = Engine.VLLM,
                       options: object = None) -> None:
        """Serve a deployment that was not known at construction (no-op when it is); ``options``: its
        ``TritonSpec`` / ``MiiSpec`` (the defaults when None)."""
        if dep in self._profiles:
            return
        self._profiles[dep] = profile
        self._engines[dep] = engine
        if options is not None:
            self._options[dep] = options
        self._models[dep] = service_model(engine.value, self._options.get(dep), profile.max_num_seqs)
        self.by_deployment[dep] = {}
        self.gateway[dep] = deque()
        self.gpu_ms[dep] = 0.0

    def send(self, cluster_id: ClusterId, cmd: AdapterCommand, fence: Fence, now_ms: int) -> None:
        if fence.epoch < self._highest_epoch:
            self.stale_rejected += 1
            raise StaleEpoch(fence.epoch, self._highest_epoch)
        self._highest_epoch = fence.epoch
        if cluster_id in self.down:
            raise Unavailable(f"cluster {cluster_id} is unreachable")
        if cmd.request_id in self._seen:
            return  # idempotent: applied already
        self._seen[cmd.request_id] = None
        if len(self._seen) > MAX_SEEN_REQUEST_IDS:
            del self._seen[next(iter(self._seen))]
        self.execute(cmd.action, cmd.instance, cmd.deadline_ms, now_ms)

    def execute(self, action: str, inst: InstanceRef, deadline_ms: int, now_ms: int) -> None:
        """Carry out one command (fencing and idempotency are the caller's): ``create``, ``wake``,
        ``sleep``, ``drain`` (abort what still runs at ``deadline_ms``), ``cancel`` or ``terminate``."""
        if action == "create":
            self._do_create(inst, now_ms)
        elif action == "drain":
            self._do_drain(inst.id, deadline_ms, now_ms)
        elif action in ("cancel", "terminate"):
            self._do_cancel(inst.id, now_ms)
        elif action == "wake":
            self._do_wake(inst.id, now_ms)
        elif action == "sleep":
            self._do_sleep(inst.id, now_ms)
        else:
            raise ValueError(f"action: unknown {action!r}")

    def preprovision(self, inst, now_ms: int) -> None:
        """An instance that is already serving when the simulation starts."""
        sim = SimInstance(inst.id, inst.deployment, inst.cluster, self._profiles[inst.deployment], inst.gpus, now_ms)
        sim.phase = "serving"
        self.instances[sim.id] = sim
        self.by_deployment[sim.deployment][sim.id] = sim

    def _do_create(self, inst: InstanceRef, now_ms: int) -> None:
        if inst.id in self.instances:
            return  # created already (a repeated command after an adapter restart)
        sim = SimInstance(inst.id, inst.deployment, inst.cluster, self._profiles[inst.deployment], inst.gpus, now_ms)
        self.instances[sim.id] = sim
        self.by_deployment[sim.deployment][sim.id] = sim
        self._report(sim, InstanceEvent.START_WARMUP, now_ms)
        sim.tier = new_pod_tier(self.cached(sim.cluster, sim.profile.name))
        self._start_warmup(sim, now_ms, start_ms(sim.profile, sim.tier))

    def _do_wake(self, iid: InstanceId, now_ms: int) -> None:
        sim = self.instances.get(iid)
        if sim is not None and sim.phase == "sleeping":
            sim.tier = wake_tier(self._engines.get(sim.deployment, Engine.VLLM)) or InitMethod.WARM
            self._start_warmup(sim, now_ms, start_ms(sim.profile, sim.tier))

    def cached(self, cluster_id: ClusterId, model: str) -> bool:
        """``cluster_id``'s model cache holds ``model``."""
        return self.caches is None or model in self.caches.get(cluster_id, ())

    def _do_sleep(self, iid: InstanceId, now_ms: int) -> None:
        sim = self.instances.get(iid)
        if sim is not None and sim.phase == "serving":
            sim.phase = "sleeping"
            self._requeue(sim, now_ms)

    def _do_drain(self, iid: InstanceId, deadline_ms: int, now_ms: int) -> None:
        sim = self.instances.get(iid)
        if sim is None or sim.phase in ("draining", "gone"):
            return
        sim.phase = "draining"
        sim.gen += 1  # cancels a warm-up in progress
        self._requeue(sim, now_ms)
        if sim.running:
            self._schedule(max(now_ms, deadline_ms), DRAIN_DEADLINE, (sim.id, sim.gen))
        else:
            self._finish(sim, InstanceEvent.DRAINED, now_ms)

    def _do_cancel(self, iid: InstanceId, now_ms: int) -> None:
        sim = self.instances.get(iid)
        if sim is not None and sim.phase != "gone":
            self._requeue(sim, now_ms)
            self._finish(sim, None, now_ms)

    # -- lifecycle ----------------------------------------------------------------------------
    def _start_warmup(self, sim: SimInstance, now_ms: int, duration_ms: int) -> None:
        sim.phase = "starting"
        sim.gen += 1
        # +-10 % spread so that instances started together do not become ready in lock-step.
        jitter = duration_ms * 0.1 * (2 * self._rng.random() - 1)
        self._schedule(now_ms + duration_ms + jitter, WARM_DONE, (sim.id, sim.gen))

    def on_warm_done(self, payload: tuple[InstanceId, int], now_ms: int) -> None:
        sim = self.instances.get(payload[0])
        if sim is None or sim.gen != payload[1] or sim.phase != "starting":
            return
        if self._rng.random() < self._warmup_failure(sim.cluster, sim.deployment, now_ms):
            self._finish(sim, InstanceEvent.WARMUP_FAILED, now_ms)
            return
        sim.phase = "serving"
        if sim.tier is InitMethod.COLD and self.caches is not None:
            self.caches.setdefault(sim.cluster, set()).add(sim.profile.name)  # the weights stay on the node
        self._report(sim, InstanceEvent.WARMED, now_ms)
        self.dispatch_gateway(sim.deployment, now_ms)

    def on_drain_deadline(self, payload: tuple[InstanceId, int], now_ms: int) -> None:
        sim = self.instances.get(payload[0])
        if sim is not None and sim.gen == payload[1] and sim.phase == "draining":
            self._finish(sim, InstanceEvent.DRAINED, now_ms)

    def cluster_down(self, cluster_id: ClusterId, now_ms: int) -> None:
        self.down.add(cluster_id)
        lost = [s for s in self.instances.values() if s.cluster == cluster_id]
        for sim in lost:
            sim.phase = "lost"  # first, so requeued requests are not routed to another doomed instance
        for sim in lost:
            self._requeue(sim, now_ms)
            self._finish(sim, InstanceEvent.LOST, now_ms)

    def lose_instance(self, iid: InstanceId, now_ms: int) -> None:
        """One instance's pod disappears (node failure, OOM kill): its requests go back through the
        gateway, in-flight ones are aborted, and ``lost`` is reported."""
        sim = self.instances.get(iid)
        if sim is None:
            return
        sim.phase = "lost"
        self._requeue(sim, now_ms)
        self._finish(sim, InstanceEvent.LOST, now_ms)

    def cluster_up(self, cluster_id: ClusterId) -> None:
        self.down.discard(cluster_id)

    def _finish(self, sim: SimInstance, event: InstanceEvent | None, now_ms: int) -> None:
        for req in sim.running.values():
            req.dropped = True  # aborted mid-flight
            self._on_request_done(req, now_ms)
        sim.running.clear()
        sim.phase = "gone"
        sim.gen += 1
        sim.gone_ms = now_ms
        self.gpu_ms[sim.deployment] += (now_ms - sim.created_ms) * sim.gpus
        del self.instances[sim.id]
        del self.by_deployment[sim.deployment][sim.id]
        if event is not None:
            self._report(sim, event, now_ms)

    def _report(self, sim: SimInstance, event: InstanceEvent, now_ms: int) -> None:
        self._reports.append(InstanceReport(sim.id, event.value, now_ms))

    # -- requests -----------------------------------------------------------------------------
    def arrive(self, req: SimRequest, now_ms: int) -> None:
        target = self._pick(req.deployment)
        if target is None:
            self.gateway[req.deployment].append(req)
        else:
            self._enqueue(target, req, now_ms)

    def _pick(self, deployment: DeploymentId) -> SimInstance | None:
        best, best_load = None, 0
        for sim in self.by_deployment[deployment].values():
            if sim.phase == "serving" and (best is None or sim.load() < best_load):
                best, best_load = sim, sim.load()
        return best

    def dispatch_gateway(self, deployment: DeploymentId, now_ms: int) -> None:
        queue = self.gateway[deployment]
        while queue:
            target = self._pick(deployment)
            if target is None:
                return
            self._enqueue(target, queue.popleft(), now_ms)

    def drop_expired(self, deployment: DeploymentId, max_queue_ms: int, now_ms: int) -> None:
        queue = self.gateway[deployment]
        while queue and now_ms - queue[0].arrival_ms > max_queue_ms:
            req = queue.popleft()
            req.dropped = True
            self._on_request_done(req, now_ms)

    def _requeue(self, sim: SimInstance, now_ms: int) -> None:
        """Requests not yet admitted on ``sim`` go back through the gateway."""
        waiting, sim.queue = sim.queue, deque()
        for req in waiting:
            self.arrive(req, now_ms)

    def _enqueue(self, sim: SimInstance, req: SimRequest, now_ms: int) -> None:
        model = self._models.get(sim.deployment)
        if model is not None:
            model.enqueue(self, sim, req, now_ms)
            return
        sim.queue.append(req)
        self._admit(sim, now_ms)

    # The service models' access to the fleet (controlplane.sim.service_models).
    def admit_continuous(self, sim: SimInstance, now_ms: int) -> None:
        """vLLM's continuous-batching admission on ``sim`` (MII FastGen and TensorRT-LLM use it too)."""
        self._admit(sim, now_ms)

    def schedule_complete(self, at_ms: float, sim: SimInstance, req: SimRequest) -> None:
        self._schedule(at_ms, COMPLETE, (sim.id, sim.gen, req.rid))

    def schedule_event(self, at_ms: float, kind: int, payload: object) -> None:
        self._schedule(at_ms, kind, payload)

    def request_done(self, req: SimRequest, now_ms: int) -> None:
        self._on_request_done(req, now_ms)

    def on_batch_due(self, payload: tuple[InstanceId, int], now_ms: int) -> None:
        sim = self.instances.get(payload[0])
        model = self._models.get(sim.deployment) if sim is not None else None
        if sim is not None and model is not None and sim.gen == payload[1] and sim.phase == "serving":
            model.due(self, sim, now_ms)

    def _admit(self, sim: SimInstance, now_ms: int) -> None:
        p = sim.profile
        while sim.queue and len(sim.running) < p.max_num_seqs:
            req = sim.queue[0]
            need = req.prompt + req.output
            if sim.kv_used + need > p.kv_capacity_tokens and sim.running:
                return  # wait for KV blocks (a request larger than the cache runs alone)
            sim.queue.popleft()
            start = max(float(now_ms), sim.prefill_free_ms)
            prefill_end = start + req.prompt * 1000.0 / p.prefill_tokens_per_s
            sim.prefill_free_ms = prefill_end
            step = p.step_ms(len(sim.running) + 1)
            first = prefill_end + step
            req.first_token_ms = int(first)
            sim.running[req.rid] = req
            sim.kv_used += need
            sim.prompt_tokens_since_sample += req.prompt
            sim.first_tokens.append((req.first_token_ms, req.first_token_ms - req.arrival_ms))
            self._schedule(first + (req.output - 1) * step, COMPLETE, (sim.id, sim.gen, req.rid))

    def on_complete(self, payload: tuple[InstanceId, int, int], now_ms: int) -> None:
        sim = self.instances.get(payload[0])
        if sim is None:
            return
        req = sim.running.pop(payload[2], None)
        if req is None:
            return
        model = self._models.get(sim.deployment)
        if model is not None:
            model.complete(self, sim, req, now_ms)
        else:
            sim.kv_used -= req.prompt + req.output
            self._on_request_done(req, now_ms)
            self._admit(sim, now_ms)
        if sim.phase == "draining" and not sim.running:
            self._finish(sim, InstanceEvent.DRAINED, now_ms)

    # -- the observation port -----------------------------------------------------------------
    def gather(self, now_ms: int, interval_ms: int = 250) -> Observations:
        samples = [self._sample(sim, now_ms, interval_ms) for sim in self.instances.values() if sim.phase == "serving"]
        reports, self._reports = tuple(self._reports), []
        gateway = tuple((d, len(q)) for d, q in self.gateway.items() if q)
        return Observations(now_ms, tuple(samples), reports, gateway, self.model_caches())

    def model_caches(self) -> tuple[tuple[ClusterId, tuple[str, ...]], ...]:
        """What each reachable cluster's model cache holds, as its adapter would report it."""
        if self.caches is None:
            return ()
        return tuple((cid, tuple(sorted(self.caches[cid]))) for cid in sorted(self.caches) if cid not in self.down)

    def _sample(self, sim: SimInstance, now_ms: int, interval_ms: int) -> InstanceSample:
        model = self._models.get(sim.deployment)
        if model is not None:
            return model.sample(sim, now_ms, interval_ms)
        p = sim.profile
        ttfts = []
        while sim.first_tokens and sim.first_tokens[0][0] <= now_ms:
            ttfts.append(sim.first_tokens.popleft()[1])
        waiting_prefill = len(sim.first_tokens)  # admitted, first token still to come
        decoding = max(0, len(sim.running) - waiting_prefill)
        prompt_tps = sim.prompt_tokens_since_sample * 1000.0 / interval_ms
        sim.prompt_tokens_since_sample = 0
        return InstanceSample(
            instance_id=sim.id,
            deployment=sim.deployment,
            at_ms=now_ms,
            running=decoding,
            waiting=len(sim.queue) + waiting_prefill,
            kv_usage=min(1.0, sim.kv_used / p.kv_capacity_tokens),
            prompt_tokens_per_s=prompt_tps,
            generation_tokens_per_s=p.decode_tokens_per_s(decoding) if decoding else 0.0,
            ttft_p99_ms=float(max(ttfts)) if ttfts else None,
            gpu_mem_used_bytes=int(p.gpu_memory_bytes * 0.9),  # vLLM pre-allocates gpu_memory_utilization
            gpu_mem_total_bytes=p.gpu_memory_bytes,
        )

    def live_gpu_ms(self, deployment: DeploymentId, now_ms: int) -> float:
        return sum((now_ms - s.created_ms) * s.gpus for s in self.by_deployment[deployment].values())
