"""The simulated backend: one cluster of simulated engine instances, in real time.

This is the embedded default when no Kubernetes is configured (``backend: simulated`` in the
adapter's configuration), and what the end-to-end tests drive. It reuses the simulator's service
model (:class:`controlplane.sim.cluster.SimFleet`: continuous batching with vLLM's admission
limits, KV-cache accounting, cold and warm starts with +-10 % spread, drains with deadlines) and
advances it to the wall clock whenever the adapter asks it something: the same code as the
virtual-time simulator, with the clock being real.

Load comes from an open-loop Poisson process per deployment whose rate follows a step schedule
(``load: [{at_s: 0, rps: 2}, {at_s: 30, rps: 40}, ...]``, seconds since the backend started), so a
configuration can script a burst and a calm. Requests wait at a per-deployment gateway while no
instance serves and are dropped after ``max_queue_ms``; the gateway queue is reported like a real
router's (llm-d / AIBrix) queue would be.
"""

from __future__ import annotations

import heapq
import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adapters.backend import MAX_GPUS_PER_INSTANCE, MAX_REPLICAS, InstanceCommand, ScaleCommand
from adapters.sim_gpu import SimGpuConfig, simulated_report
from controlplane.domain.engines import Engine
from controlplane.domain.errors import NotFound, ValidationError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, deployment_id_problem, instance_prefix
from controlplane.domain.observations import Observations
from controlplane.domain.profiles import PROFILES, ModelProfile
from controlplane.runtime.clock import wall_ms
from controlplane.sim.cluster import BATCH_DUE, COMPLETE, DRAIN_DEADLINE, WARM_DONE, SimFleet, SimRequest
from controlplane.sim.scenario import MiiSpec, TritonSpec
from controlplane.sim.workload import lognormal_int

TTFT_MEMORY = 10_000
"""TTFTs kept per deployment for :meth:`SimulatedBackend.statistics`."""
SCALE_DRAIN_TIMEOUT_MS = 30_000
"""How long instances removed by a ``Scale`` command may finish their in-flight requests."""
MAX_EVENTS_PER_ADVANCE = 2_000_000
"""Safety bound: a configuration asking for absurd rates cannot wedge the adapter."""


class LoadStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    at_s: float = Field(ge=0)
    rps: float = Field(ge=0, le=100_000)


class SimDeploymentConfig(BaseModel):
    """One deployment's simulated engines and its offered load."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    deployment: str = Field(min_length=1)
    """The deployment id (``team-a/chat`` for one created through the API, a configured id ``chat``),
    or ``*`` in ``default``."""
    model: str = "llama3-8b-h100"
    engine: Literal["vllm", "triton", "deepspeed-mii"] = "vllm"
    """The engine the instances run: its service model (``controlplane.sim.service_models``) and
    what its samples can report (``InstanceSample.unknown``), as in the virtual-time simulator."""
    triton: TritonSpec | None = None
    """Triton's batching (``engine: triton`` only; the dynamic batcher when absent)."""
    mii: MiiSpec | None = None
    """DeepSpeed-MII's request meter (``engine: deepspeed-mii`` only; metered when absent)."""
    cold_start_ms: int | None = Field(None, ge=0, le=3_600_000)
    """Overrides the model profile's cold start (image pull + weights + engine start)."""
    warm_start_ms: int | None = Field(None, ge=0, le=3_600_000)
    prompt_tokens: int = Field(512, ge=1, le=1_000_000)
    """Mean prompt length (log-normal)."""
    output_tokens: int = Field(128, ge=1, le=1_000_000)
    """Mean output length (log-normal)."""
    load: list[LoadStep] = Field(default_factory=lambda: [LoadStep(at_s=0, rps=1.0)])
    warmup_failure_probability: float = Field(0.0, ge=0, le=1)
    max_queue_ms: int = Field(30_000, gt=0)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in PROFILES:
            raise ValueError(f"unknown model profile {value!r} (known: {', '.join(sorted(PROFILES))})")
        return value

    @field_validator("load")
    @classmethod
    def _ordered(cls, steps: list[LoadStep]) -> list[LoadStep]:
        if not steps:
            raise ValueError("must have at least one step")
        if any(b.at_s <= a.at_s for a, b in zip(steps, steps[1:])):
            raise ValueError("steps must be in strictly increasing at_s order")
        return steps

    @model_validator(mode="after")
    def _engine_options(self) -> SimDeploymentConfig:
        if self.triton is not None and self.engine != "triton":
            raise ValueError(f"triton: only for engine triton, not {self.engine}")
        if self.mii is not None and self.engine != "deepspeed-mii":
            raise ValueError(f"mii: only for engine deepspeed-mii, not {self.engine}")
        return self

    @property
    def options(self) -> TritonSpec | MiiSpec | None:
        return self.triton if self.triton is not None else self.mii

    def profile(self) -> ModelProfile:
        p = PROFILES[self.model]
        return replace(p, cold_start_ms=self.cold_start_ms if self.cold_start_ms is not None else p.cold_start_ms,
                       warm_start_ms=self.warm_start_ms if self.warm_start_ms is not None else p.warm_start_ms)

    @field_validator("deployment")
    @classmethod
    def _deployment_id(cls, value: str) -> str:
        problem = None if value == "*" else deployment_id_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class SimulatedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    seed: int = 0
    deployments: list[SimDeploymentConfig] = Field(default_factory=list)
    model_cache: list[str] | None = None
    """Model profiles the cluster's node-local model cache holds at the start (None: every profile,
    as a pre-fetch DaemonSet gives); a new instance of another model is a ``cold`` start, after which
    the cache holds it. Reported to the coordinators with every observation batch."""
    gpu_memory: SimGpuConfig | None = None
    """Simulated per-GPU memory reported with every batch (:mod:`adapters.sim_gpu`); None: none."""
    default: SimDeploymentConfig | None = None
    """Template for deployments not listed (e.g. created later through the API), with
    ``deployment: "*"``: the first command for an unknown deployment adds it, and its load schedule
    starts then. Without it such commands are refused with NotFound."""

    @field_validator("model_cache")
    @classmethod
    def _known_models(cls, value: list[str] | None) -> list[str] | None:
        for model in value or ():
            if model not in PROFILES:
                raise ValueError(f"unknown model profile {model!r} (known: {', '.join(sorted(PROFILES))})")
        return value

    @model_validator(mode="after")
    def _unique(self) -> SimulatedConfig:
        seen: set[str] = set()
        for d in self.deployments:
            if d.deployment in seen:
                raise ValueError(f"deployments: duplicate deployment {d.deployment!r}")
            seen.add(d.deployment)
        if self.default is not None and self.default.deployment != "*":
            raise ValueError(f"default.deployment: must be '*', got {self.default.deployment!r}")
        if not self.deployments and self.default is None:
            raise ValueError("deployments: list at least one deployment, or give a default")
        return self


@dataclass(frozen=True, slots=True)
class _Ref:
    id: InstanceId
    deployment: DeploymentId
    cluster: ClusterId
    gpus: int


@dataclass(slots=True)
class _Stats:
    arrived: int = 0
    completed: int = 0
    dropped: int = 0


class SimulatedBackend:
    """:class:`~adapters.backend.Backend` over a real-time :class:`SimFleet` (thread-safe)."""

    def __init__(self, cluster_id: str, config: SimulatedConfig, clock_ms: Callable[[], int] | None = None, *,
                 on_request_done: Callable[[SimRequest, int], None] | None = None) -> None:
        self.cluster_id = ClusterId(cluster_id)
        self._on_request_done = on_request_done
        """Called (lock held) with every finished or dropped request: the demo scores TTFTs with it."""
        self._clock_ms = clock_ms or wall_ms
        self._cfg = {DeploymentId(d.deployment): d for d in config.deployments}
        self._default = config.default
        self._gpu = config.gpu_memory
        self._lock = threading.RLock()
        self._rng = random.Random(config.seed)
        self._load_rng = random.Random(config.seed + 1)
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._start_ms = self._clock_ms()
        self._origin_ms: dict[DeploymentId, float] = {d: float(self._start_ms) for d in self._cfg}
        """Where each deployment's load schedule starts (added deployments: when first commanded)."""
        self._now_ms = self._start_ms
        self._last_observe_ms = self._start_ms
        self._rid = 0
        self._next_arrival: dict[DeploymentId, float] = {}
        self._stats = {d: _Stats() for d in self._cfg}
        self._ttfts: dict[DeploymentId, deque[int]] = {d: deque(maxlen=TTFT_MEMORY) for d in self._cfg}
        self.fleet = SimFleet(
            {d: c.profile() for d, c in self._cfg.items()}, self._schedule, self._rng,
            lambda cluster, dep, now: self._cfg[dep].warmup_failure_probability, self._done,
            caches={self.cluster_id: PROFILES if config.model_cache is None else config.model_cache},
            engines={d: Engine(c.engine) for d, c in self._cfg.items()},
            service_options={d: c.options for d, c in self._cfg.items() if c.options is not None},
        )
        for dep in self._cfg:
            self._next_arrival[dep] = self._draw_arrival(dep, float(self._start_ms))

    # -- the event heap -------------------------------------------------------------------------
    def _schedule(self, at_ms: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_ms, self._seq, kind, payload))

    def _done(self, req: SimRequest, now_ms: int) -> None:
        st = self._stats[req.deployment]
        if req.dropped:
            st.dropped += 1
        else:
            st.completed += 1
            self._ttfts[req.deployment].append(req.first_token_ms - req.arrival_ms)
        if self._on_request_done is not None:
            self._on_request_done(req, now_ms)

    def _rate(self, dep: DeploymentId, t_ms: float) -> tuple[float, float]:
        """(requests/s at ``t_ms``, when that rate next changes: inf if never)."""
        origin = self._origin_ms[dep]
        rel_s = (t_ms - origin) / 1000
        rate, change = 0.0, float("inf")
        for step in self._cfg[dep].load:
            if step.at_s <= rel_s:
                rate = step.rps
            else:
                change = origin + step.at_s * 1000
                break
        return rate, change

    def _draw_arrival(self, dep: DeploymentId, t_ms: float) -> float:
        """The next arrival after ``t_ms`` of a Poisson process with a piecewise-constant rate
        (exact: the exponential is memoryless, so a draw that crosses a rate change restarts there)."""
        while True:
            rate, change = self._rate(dep, t_ms)
            if rate <= 0:
                if change == float("inf"):
                    return float("inf")
                t_ms = change
                continue
            at = t_ms + self._load_rng.expovariate(rate) * 1000
            if at <= change:
                return at
            t_ms = change

    def _advance(self, now_ms: int) -> None:
        """Process arrivals and engine events up to ``now_ms`` in time order."""
        now_ms = max(now_ms, self._now_ms)
        for _ in range(MAX_EVENTS_PER_ADVANCE):
            dep = min(self._next_arrival, key=lambda d: self._next_arrival[d]) if self._next_arrival else None
            arrival = self._next_arrival[dep] if dep is not None else float("inf")
            event = self._heap[0][0] if self._heap else float("inf")
            if min(arrival, event) > now_ms:
                break
            self._expire(int(min(arrival, event)))  # in time order: a warm-up must not serve expired requests
            if dep is not None and arrival <= event:
                self._arrive(dep, arrival)
                self._next_arrival[dep] = self._draw_arrival(dep, arrival)
            else:
                at, _, kind, payload = heapq.heappop(self._heap)
                t = int(at)
                if kind == COMPLETE:
                    self.fleet.on_complete(payload, t)
                elif kind == WARM_DONE:
                    self.fleet.on_warm_done(payload, t)
                elif kind == DRAIN_DEADLINE:
                    self.fleet.on_drain_deadline(payload, t)
                elif kind == BATCH_DUE:
                    self.fleet.on_batch_due(payload, t)
        self._expire(now_ms)
        self._now_ms = now_ms

    def _expire(self, at_ms: int) -> None:
        for dep, cfg in self._cfg.items():
            self.fleet.drop_expired(dep, cfg.max_queue_ms, at_ms)

    def _arrive(self, dep: DeploymentId, at_ms: float) -> None:
        cfg = self._cfg[dep]
        self._rid += 1
        self._stats[dep].arrived += 1
        req = SimRequest(self._rid, dep, int(at_ms), lognormal_int(self._load_rng, cfg.prompt_tokens),
                         lognormal_int(self._load_rng, cfg.output_tokens))
        self.fleet.arrive(req, int(at_ms))

    # -- the Backend port -------------------------------------------------------------------------
    def apply(self, command: InstanceCommand, now_ms: int) -> None:
        inst = command.instance
        dep = DeploymentId(inst.deployment_id)
        if not 1 <= inst.gpus <= MAX_GPUS_PER_INSTANCE:
            raise ValidationError("instance.gpus", f"must be between 1 and {MAX_GPUS_PER_INSTANCE}, got {inst.gpus}")
        with self._lock:
            self._advance(now_ms)
            self._known(dep, "deployment")
            sim = self.fleet.instances.get(InstanceId(inst.instance_id))
            # as the Kubernetes backend: waking or sleeping an instance this cluster does not run is
            # NotFound; removing one that is gone already is done; never act on another deployment's
            if (sim is not None and sim.deployment != dep) or (
                    command.action in ("wake", "sleep") and (sim is None or sim.phase == "gone")):
                raise NotFound("instance", f"{inst.instance_id!r} of {dep!r} is not on cluster {self.cluster_id!r}")
            self.fleet.execute(command.action, _Ref(InstanceId(inst.instance_id), dep, self.cluster_id, inst.gpus),
                               command.deadline_ms, self._now_ms)

    def scale(self, command: ScaleCommand, now_ms: int) -> None:
        """Drain ``victims`` first, then create or drain instances until ``replicas`` are not
        draining; drained instances finish their requests for up to ``SCALE_DRAIN_TIMEOUT_MS``. New
        instances are named ``<deployment>-<request id>-<k>`` (a qualified id: its ``instance_prefix``)."""
        dep = DeploymentId(command.deployment_id)
        if not 0 <= command.replicas <= MAX_REPLICAS:
            raise ValidationError("replicas", f"must be between 0 and {MAX_REPLICAS}, got {command.replicas}")
        with self._lock:
            self._advance(now_ms)
            self._known(dep, "deployment_id")
            live = self.fleet.by_deployment[dep]
            unknown = [v for v in command.victims if v not in live]
            if unknown:
                raise NotFound("victims", f"no instance {unknown[0]!r} of {dep!r} on cluster {self.cluster_id!r}")
            deadline = self._now_ms + SCALE_DRAIN_TIMEOUT_MS
            for victim in command.victims:
                self.fleet.execute("drain", _Ref(InstanceId(victim), dep, self.cluster_id, 1), deadline, self._now_ms)
            active = sorted(i for i, s in live.items() if s.phase != "draining")
            gpus = PROFILES[self._cfg[dep].model].gpus_per_instance
            prefix = instance_prefix(dep) if "/" in dep else dep  # a qualified id's '/' stays out; others as before
            for k in range(command.replicas - len(active)):
                ref = _Ref(InstanceId(f"{prefix}-{command.request_id}-{k}"), dep, self.cluster_id, gpus)
                self.fleet.execute("create", ref, 0, self._now_ms)
            for extra in active[command.replicas:] if len(active) > command.replicas else []:
                self.fleet.execute("drain", _Ref(InstanceId(extra), dep, self.cluster_id, gpus), deadline, self._now_ms)

    def _known(self, dep: DeploymentId, field: str) -> None:
        """Refuse an unknown deployment, or add it from the ``default`` template (lock held)."""
        if dep in self._cfg:
            return
        if self._default is None:
            raise NotFound(field, f"{dep!r} is not simulated on cluster {self.cluster_id!r}")
        cfg = self._default.model_copy(update={"deployment": dep})
        self._cfg[dep] = cfg
        self._origin_ms[dep] = float(self._now_ms)
        self._stats[dep] = _Stats()
        self._ttfts[dep] = deque(maxlen=TTFT_MEMORY)
        self.fleet.add_deployment(dep, cfg.profile(), Engine(cfg.engine), cfg.options)
        self._next_arrival[dep] = self._draw_arrival(dep, float(self._now_ms))

    def observe(self, now_ms: int) -> Observations:
        with self._lock:
            self._advance(now_ms)
            interval = max(1, self._now_ms - self._last_observe_ms)
            self._last_observe_ms = self._now_ms
            obs = self.fleet.gather(self._now_ms, interval)
            if self._gpu is None:
                return obs
            report = simulated_report(self._gpu, self.fleet.instances.values(), self._now_ms)
            return replace(obs, gpu_memory=((self.cluster_id, report),))

    def close(self) -> None:
        pass

    # -- for tests and the demo -------------------------------------------------------------------
    def lose(self, instance_id: str) -> None:
        """Fault injection: the instance's pod disappears (reported ``lost``)."""
        with self._lock:
            self._advance(self._clock_ms())
            sim = self.fleet.instances.get(InstanceId(instance_id))
            if sim is None:
                raise NotFound("instance_id", f"{instance_id!r} is not running on cluster {self.cluster_id!r}")
            self.fleet.lose_instance(sim.id, self._now_ms)

    def restart_load(self, origin_ms: int) -> None:
        """Make ``origin_ms`` time zero of every deployment's load schedule (arrivals are drawn from
        now on): a demo starts its workload when the group is ready, not when the adapter starts."""
        with self._lock:
            self._advance(self._clock_ms())
            for dep in self._cfg:
                self._origin_ms[dep] = float(origin_ms)
                self._next_arrival[dep] = self._draw_arrival(dep, float(max(self._now_ms, origin_ms)))

    def statistics(self) -> dict[str, dict[str, object]]:
        with self._lock:
            self._advance(self._clock_ms())
            out: dict[str, dict[str, object]] = {}
            for dep, st in self._stats.items():
                ttfts = sorted(self._ttfts[dep])
                phases: dict[str, int] = {}
                for sim in self.fleet.by_deployment[dep].values():
                    phases[sim.phase] = phases.get(sim.phase, 0) + 1
                out[dep] = {
                    "arrived": st.arrived, "completed": st.completed, "dropped": st.dropped,
                    "gateway_waiting": len(self.fleet.gateway[dep]), "instances": phases,
                    "ttft_p50_ms": ttfts[len(ttfts) // 2] if ttfts else None,
                    "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] if ttfts else None,
                    "gpu_ms": self.fleet.gpu_ms[dep] + self.fleet.live_gpu_ms(dep, self._now_ms),
                }
            return out
