"""Start tiers: the ways an engine instance can begin serving, as the engines really offer them, and
how long each takes per model profile and GPU type.

A tier is an :class:`~controlplane.domain.instances.InitMethod` (``StartTier`` here, the same enum):

============  ==================================================  ================================
tier          what happens                                        held while waiting
============  ==================================================  ================================
``cold``      new pod: image pull, weights downloaded from        the GPUs of the new pod (from
              remote storage, load, CUDA graph capture            scheduling on)
``cached``    new pod on a node whose model cache holds the       the GPUs of the new pod
              weights: local read, load, CUDA graph capture
``warm``      vLLM ``POST /wake_up`` after ``/sleep?level=1``:    the GPUs all along (asleep)
              weights copied back from pinned host RAM            + host RAM for the weights
``sleep_l2``  vLLM ``/wake_up`` after ``/sleep?level=2``:         the GPUs all along (asleep)
              weights reloaded from the node cache into the
              live process (CUDA graphs and allocator kept)
``reload``    Triton ``POST /v2/repository/models/<m>/load``      the GPUs all along (the server
              after ``.../unload``, from the local repository     pod stays)
============  ==================================================  ================================

DeepSpeed-MII has no sleep: it has no warm path but a node-cached restart (``cached``), so it never
gets a Standby instance (``Engine.can_sleep``; ``apply`` refuses to put one to sleep).

Figures (all derived; the two that existed before the tiers are kept, so every published benchmark
stays comparable):

* ``cached`` = ``ModelProfile.cold_start_ms`` (30 s for 8B, 90 s for 70B TP 4). Its derivation in
  :mod:`controlplane.domain.profiles` already reads the weights from local NVMe. A budget of the
  30 s: pod scheduled and container started with the image present ~3 s; Python imports, CUDA
  context ~7 s (:data:`PROCESS_START_MS`); 16.1 GB read at :data:`CACHE_READ_BYTES_PER_S` 1.6 s;
  memory profiling, KV-cache allocation, ``torch.compile`` from its cache and CUDA graph capture the
  rest. For 70B TP 4 the 90 s add NCCL initialisation of the TP group (:data:`TP_INIT_MS`), 14 s of
  reads and four ranks' graph capture.
* ``warm`` = ``ModelProfile.warm_start_ms`` (H100 1 s / 4 s, A100 1.5 s / 6 s: the weights copied
  back from pinned host RAM over PCIe; vLLM's sleep-mode post publishes 0.1-6 s by model size,
  ``shared/design/BENCHMARKS.md`` C).
* ``cold`` = ``cached`` + :data:`IMAGE_PULL_MS` + ``weights_bytes`` / :data:`REMOTE_BYTES_PER_S`:
  the engine images (``vllm/vllm-openai:v0.33.0``, ``tritonserver:25.10-py3``) are ~10 GB
  compressed, pulled and unpacked at ~250 MB/s (containerd unpacks layers one at a time) = 40 s;
  the weights come from object storage or the Hugging Face Hub at 1 GB/s per node (parallel range
  reads; the store's per-client throughput, not the NIC, is the bound). 8B: 30 + 40 + 16.1 =
  86.1 s; 70B: 90 + 40 + 141.2 = 271.2 s, on either GPU type.
* ``sleep_l2`` = ``weights_bytes`` / :data:`CACHE_READ_BYTES_PER_S` + :data:`WAKE_REINIT_MS`: at
  level 2 the weights are gone from the GPU and from host RAM; ``/wake_up`` reloads them from disk
  into the live process (no process start, no graph capture) and re-allocates the KV cache. The
  node cache reads at 10 GB/s (a local NVMe RAID; a DGX H100 has eight Gen4 U.2 drives), the copy
  to the GPU (25 GB/s) overlaps the read. 8B: 1.6 + 0.5 = 2.1 s, the top of the published 0.8-2.6 s
  for level 2 (measured on models up to 8B); 70B TP 4: the four ranks read their shards from the
  same node disk, 141.2 GB / 10 GB/s + 0.5 = 14.6 s. The disk, not PCIe, is the bound, so A100
  equals H100.
* ``reload`` (Triton) = ``cached`` - :data:`POD_START_MS` - :data:`PROCESS_START_MS` (-
  :data:`TP_INIT_MS` with tensor parallelism): an explicit unload destroys the model instance (its
  weights and CUDA graphs) but keeps the server process and its CUDA context; loading it again from
  the local model repository reads the weights (like level 2) and then re-profiles memory and
  captures the graphs again. 8B: 30 - 3 - 7 = 20 s; 70B: 90 - 3 - 7 - 5 = 75 s.
* DeepSpeed-MII restart = ``cached`` (a new process on the node's cached weights).

vLLM's sleep level: :data:`VLLM_SLEEP_LEVEL` (1). Level 1 wakes 2-4x faster than level 2 but keeps
the weights in pinned host RAM while asleep (16 GB for 8B, 141 GB for 70B per instance: an 8-GPU
H100 host has 2 TB); level 2 frees that RAM at the cost of the slower wake. One product-wide
constant, so the planner's lead times and the adapters' ``/sleep?level=N`` always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.domain.instances import NEW_POD_METHODS, InitMethod
from controlplane.domain.profiles import ModelProfile
from controlplane.domain.tenants import Engine

StartTier = InitMethod
"""The start tier of an instance: the same enum as ``Instance.init_method``."""

VLLM_SLEEP_LEVEL = 1
"""The level of ``POST /sleep?level=N`` every vLLM instance is put to sleep with (see the module doc)."""
SLEEP_LEVELS = (1, 2)

IMAGE_PULL_MS = 40_000
"""~10 GB compressed engine image pulled and unpacked at ~250 MB/s."""
REMOTE_BYTES_PER_S = 1.0e9
"""Weights download from remote storage (object store, Hugging Face Hub) per node."""
CACHE_READ_BYTES_PER_S = 10.0e9
"""Sequential read of the node-local model cache (local NVMe RAID)."""
WAKE_REINIT_MS = 500
"""vLLM level-2 wake beyond the weights: KV-cache re-allocation and a rank barrier."""
POD_START_MS = 3_000
"""Pod scheduled and container started, image present."""
PROCESS_START_MS = 7_000
"""Engine process: Python imports, CUDA context."""
TP_INIT_MS = 5_000
"""NCCL initialisation of a tensor-parallel group (more than one GPU per instance)."""


@dataclass(frozen=True, slots=True)
class StartTimes:
    """Every tier's start latency of one profile, in ms (whether an engine offers a tier is
    :func:`wake_tier`'s question)."""

    cold_ms: int
    cached_ms: int
    warm_ms: int
    sleep_l2_ms: int
    reload_ms: int


def times_of(profile: ModelProfile) -> StartTimes:
    """All tiers of ``profile`` (see the module doc for the derivations)."""
    cached = profile.cold_start_ms
    cold = cached + IMAGE_PULL_MS + _ms(profile.weights_bytes / REMOTE_BYTES_PER_S)
    sleep_l2 = _ms(profile.weights_bytes / CACHE_READ_BYTES_PER_S) + WAKE_REINIT_MS
    process = POD_START_MS + PROCESS_START_MS + (TP_INIT_MS if profile.gpus_per_instance > 1 else 0)
    reload = max(sleep_l2, cached - process)
    return StartTimes(cold, cached, profile.warm_start_ms, sleep_l2, reload)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def start_ms(profile: ModelProfile, tier: InitMethod) -> int:
    """How long a start of ``tier`` takes with ``profile`` (to Ready, before the simulator's jitter)."""
    t = times_of(profile)
    return {
        InitMethod.COLD: t.cold_ms, InitMethod.CACHED: t.cached_ms, InitMethod.WARM: t.warm_ms,
        InitMethod.SLEEP_L2: t.sleep_l2_ms, InitMethod.RELOAD: t.reload_ms,
    }[tier]


def wake_tier(engine: Engine, level: int = VLLM_SLEEP_LEVEL) -> InitMethod | None:
    """The tier a wake of ``engine`` is (``level``: vLLM's sleep level); None: it cannot sleep."""
    if not engine.can_sleep:
        return None
    if engine is Engine.VLLM:
        return InitMethod.WARM if level == 1 else InitMethod.SLEEP_L2
    if engine is Engine.TRITON:
        return InitMethod.RELOAD
    return None


def wake_ms(profile: ModelProfile, engine: Engine, level: int = VLLM_SLEEP_LEVEL) -> int | None:
    """How long waking a sleeping instance takes; None: ``engine`` cannot sleep (no Standby for it)."""
    tier = wake_tier(engine, level)
    return None if tier is None else start_ms(profile, tier)


def new_pod_tier(cached: bool) -> InitMethod:
    """The tier of a new pod: ``cached`` when its cluster's model cache holds the weights."""
    return InitMethod.CACHED if cached else InitMethod.COLD


def restart_ms(profile: ModelProfile, cached: bool) -> int:
    """How long a new pod takes (DeepSpeed-MII's only way back after a scale-in)."""
    return start_ms(profile, new_pod_tier(cached))


__all__ = [
    "CACHE_READ_BYTES_PER_S", "IMAGE_PULL_MS", "NEW_POD_METHODS", "REMOTE_BYTES_PER_S", "SLEEP_LEVELS",
    "VLLM_SLEEP_LEVEL", "StartTier", "StartTimes", "new_pod_tier", "restart_ms", "start_ms",
    "times_of", "wake_ms", "wake_tier",
]
