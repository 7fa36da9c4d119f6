"""Observations: soft state sampled by the adapters (never replicated through Raft).

An :class:`InstanceSample` carries the engine-native signals of one instance at one moment, named
after the engines' own metrics (``shared/design/CONTRACTS.md``): vLLM ``num_requests_running``,
``num_requests_waiting``, ``kv_cache_usage_perc`` (a 0..1 fraction), the ``time_to_first_token_seconds``
histogram, token counters, and NVML memory. Triton and DeepSpeed-MII drivers map their metrics onto
the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId


@dataclass(frozen=True, slots=True)
class InstanceSample:
    instance_id: InstanceId
    deployment: DeploymentId
    at_ms: int
    running: int
    """Requests in the engine's running batch."""
    waiting: int
    """Requests queued in the engine (not yet scheduled)."""
    kv_usage: float
    """KV-cache usage fraction, 0..1."""
    prompt_tokens_per_s: float
    """Prompt tokens prefilled per second over the last sample interval (``vllm:prompt_tokens``)."""
    generation_tokens_per_s: float
    """Tokens generated per second over the last sample interval (``vllm:generation_tokens``)."""
    ttft_p99_ms: float | None = None
    """p99 of time to first token over the last sample interval; None when no request started."""
    gpu_mem_used_bytes: int = 0
    gpu_mem_total_bytes: int = 0
    healthy: bool = True
    queue_p95_ms: float | None = None
    """p95 of the time requests waited in the engine's queue before being scheduled, over the last
    sample interval (vLLM ``request_queue_time_seconds``, Triton queue duration); None when the
    engine cannot tell or no request left the queue."""
    unknown: tuple[str, ...] = ()
    """The :data:`~controlplane.domain.engines.LOAD_FIELDS` this sample cannot supply (sorted): the
    engine does not export them (DeepSpeed-MII without its meter, KV use on plain Triton) or the
    scrape failed. Their values are 0 and mean nothing: an unknown signal never scales down."""

    def knows(self, name: str) -> bool:
        return name not in self.unknown


@dataclass(frozen=True, slots=True)
class DeploymentSignals:
    """One deployment's load at one moment, aggregated over its serving instances and its gateway."""

    at_ms: int
    serving: int
    """Instances in Ready or Busy."""
    running: int
    waiting: int
    """Requests queued in engines plus requests held at the gateway waiting for any instance."""
    kv_usage: float
    """Mean KV-cache usage fraction over serving instances (0 when none)."""
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    ttft_p99_ms: float | None
    gpu_mem_frac: float = 0.0
    """Highest GPU memory fraction among serving instances (NVML), for headroom checks."""
    queue_p95_ms: float | None = None
    """An upper bound of the deployment's engine queue-time p95 (the largest instance p95)."""
    unknown: frozenset[str] = frozenset()
    """Load signal names (:data:`controlplane.core.signals.LOAD_SIGNALS`) that no serving instance
    could report (the engine cannot: plain Triton's KV use, DeepSpeed-MII without its meter): their
    value here is 0 and means nothing."""
    partial: frozenset[str] = frozenset()
    """Load signals some serving instances reported and some could not (a failed scrape, an
    unhealthy or unsampled instance): their value is only a lower bound."""

    @property
    def concurrency(self) -> int:
        return self.running + self.waiting


@dataclass(frozen=True, slots=True)
class InstanceReport:
    """A lifecycle fact reported by an adapter: the engine started warming, is ready, failed, drained,
    or was lost. The leader turns reports into replicated ``TransitionInstance`` commands."""

    instance_id: InstanceId
    event: str
    """An :class:`~controlplane.domain.instances.InstanceEvent` value."""
    at_ms: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GpuUnit:
    """One unit of GPU memory an instance can be given: a whole GPU, or one MIG device of a GPU in
    MIG mode (each MIG device is its own unit with its own memory), on one node."""

    node: str
    unit: str
    """The GPU's or MIG device's UUID (NVML), or ``gpu<index>`` / ``gpu<index>/mig<slot>`` without one."""
    free_bytes: int
    """Free *for us*: ``total - used - reserved`` (NVML v2; v1 ``used`` includes ``reserved``).
    Memory any process holds counts as not free (ours or not). 0 for a lost GPU or an NVML error."""
    total_bytes: int
    pool: str = ""
    """The GPU pool of its node (the agent's ``--pool``); ``""``: the cluster's only pool."""
    problem: str = ""
    """Why the unit offers nothing (``lost``, an NVML error); ``""`` when it read fine."""


@dataclass(frozen=True, slots=True)
class GpuReport:
    """A cluster's GPU memory as its adapter last read it (:mod:`adapters.gpu_report`)."""

    at_ms: int
    units: tuple[GpuUnit, ...] = ()
    """Sorted by (node, unit). Empty: no GPU node reported (the cluster then falls back to counting)."""


@dataclass(frozen=True, slots=True)
class Observations:
    """Everything one tick gathers from the adapters."""

    at_ms: int
    samples: tuple[InstanceSample, ...] = ()
    reports: tuple[InstanceReport, ...] = ()
    gateway_waiting: tuple[tuple[DeploymentId, int], ...] = ()
    """Requests held at the gateway per deployment because no instance could take them."""
    model_caches: tuple[tuple[ClusterId, tuple[str, ...]], ...] = ()
    """``(cluster, models)`` for each cluster whose adapter reported its node-local model cache
    (sorted by cluster; models sorted). A cluster missing here did not report: its record stays."""
    gpu_memory: tuple[tuple[ClusterId, GpuReport], ...] = ()
    """``(cluster, report)`` for each cluster whose adapter reported per-GPU memory (NVML through the
    node agents, or simulated), sorted by cluster. Soft state: passed to placement, never replicated."""
