"""Model/GPU service profiles: how fast one engine instance serves, and how long it takes to start.

Numbers are derived from published hardware specifications and model shapes, so the derivation can be
checked and redone for another model or GPU; they are simulator inputs and the capacity figures the
scaling decision normalises tokens/s against. The simulator's service model is documented in
``docs/simulator.md``.

``llama3-8b-h100`` (Meta Llama 3 8B, BF16, one NVIDIA H100 SXM 80 GB, vLLM):

* Weights: 8.03e9 parameters x 2 bytes = 16.1 GB (Meta's model card).
* Prefill is compute-bound: ~2 FLOP per parameter per token = 16 GFLOP/token. H100 SXM dense BF16
  peak is 989 TFLOP/s (NVIDIA H100 datasheet); at a realistic 40 % model-FLOPs utilisation that is
  ~24,000 prompt tokens/s per instance.
* Decode is memory-bound: every step reads the weights once (16.1 GB) from 3.35 TB/s HBM3
  (datasheet) = 4.8 ms ideal; with KV reads and kernel overheads we use 7 ms per step at batch 1,
  growing 1.5 % per extra sequence in the batch (KV-cache reads grow with the batch).
* KV cache: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 128 KiB per token. vLLM's
  default ``gpu_memory_utilization=0.9`` leaves 72 GB - 16.1 GB weights - ~4 GB activations/graphs
  = ~52 GB for KV = ~400,000 tokens.
* ``max_num_seqs`` is vLLM's default of 256 (``SchedulerConfig``).
* Cold start 30 s, warm start 1 s: the defaults of ``shared/design/BENCHMARKS.md`` (a cold start is
  pod scheduling + image already cached + weights from local NVMe; waking a level-1-sleeping vLLM
  copies 16 GB back from pinned CPU memory at ~25 GB/s).

``llama3-70b-h100x4``: the same derivation for 70.6e9 parameters with tensor parallelism 4
(141 GB weights over 4 x 80 GB; 4 x 989 TFLOP/s at 40 % -> ~11,000 prompt tokens/s; decode reads
35 GB per GPU per step at 3.35 TB/s = 10.5 ms ideal, 16 ms modelled; KV 320 KiB/token over
~4 x 20 GB free = ~250,000 tokens); cold start 90 s (141 GB of weights), warm start 4 s.

``llama3-8b-a100`` and ``llama3-70b-a100x4`` (NVIDIA A100 SXM 80 GB): the same derivations with the
A100 datasheet's figures, 312 TFLOP/s dense BF16 (vs 989) and 2,039 GB/s HBM2e (vs 3,350), and the
same realism factors as the H100 profiles (40 % MFU; modelled/ideal decode step 1.46 for 8B, 1.52 for
70B), so the two GPU types differ only by the datasheets:

* 8B: prefill 312e12 x 0.4 / 16.1e9 FLOP/token = ~7,800 tokens/s; decode 16.1 GB / 2.039 TB/s =
  7.9 ms ideal -> 11.5 ms; KV as on H100 (same 80 GB) = 400,000 tokens.
* 70B (TP 4): prefill 4 x 312e12 x 0.4 / 141e9 = ~3,500 tokens/s; decode 35 GB / 2.039 TB/s = 17.3 ms
  ideal -> 26 ms; KV 250,000 tokens as on H100.
* Cold start as on H100 (30 s / 90 s: pod start and weights from local NVMe do not depend on the
  GPU). Warm start 1.5 s / 6 s instead of 1 s / 4 s: A100 hosts are PCIe Gen4 (32 GB/s per direction)
  against H100's Gen5 (64 GB/s), so copying the offloaded weights back takes longer; we scale the
  H100 figures by 1.5 rather than 2 because those already assume ~25 GB/s effective, a Gen4-class rate.
* Cross-check (conservative for A100): the model gives H100 1.6x A100 in decode (the bandwidth ratio)
  and 3.2x in prefill (the compute ratio). Published measurements fall in that range: MLPerf Inference
  v4.1 (MLCommons, Nov 2024), Llama 2 70B offline, 8 GPUs: H100 SXM 84.2 samples/s vs A100 SXM 32.1
  (2.6x, with FP8 on H100, which these BF16 profiles do not assume).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    gpus_per_instance: int
    prefill_tokens_per_s: float
    decode_step_ms: float
    """Time of one decode step at batch size 1."""
    decode_batch_slowdown: float
    """Relative growth of the step time per additional running sequence."""
    max_num_seqs: int
    kv_capacity_tokens: int
    gpu_memory_bytes: int
    cold_start_ms: int
    """A new pod whose weights are on the node's local disk already: the ``cached`` start tier
    (:mod:`controlplane.domain.start_tiers`; the name predates the tiers and is kept so every published
    benchmark stays comparable)."""
    warm_start_ms: int
    """Waking a vLLM instance from sleep level 1: the ``warm`` start tier."""
    weights_bytes: int = 0
    """Size of the model's weights (BF16), which the remote-cold and reload tiers move."""

    def step_ms(self, batch: int) -> float:
        """Decode step time with ``batch`` running sequences."""
        return self.decode_step_ms * (1.0 + self.decode_batch_slowdown * max(0, batch - 1))

    def decode_tokens_per_s(self, batch: int) -> float:
        """Aggregate generated tokens/s with ``batch`` running sequences."""
        return 1000.0 * max(1, batch) / self.step_ms(batch)


PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        ModelProfile(
            name="llama3-8b-h100",
            gpus_per_instance=1,
            prefill_tokens_per_s=24_000.0,
            decode_step_ms=7.0,
            decode_batch_slowdown=0.015,
            max_num_seqs=256,
            kv_capacity_tokens=400_000,
            gpu_memory_bytes=80 * 1024**3,
            cold_start_ms=30_000,
            warm_start_ms=1_000,
            weights_bytes=16_060_000_000,
        ),
        ModelProfile(
            name="llama3-70b-h100x4",
            gpus_per_instance=4,
            prefill_tokens_per_s=11_000.0,
            decode_step_ms=16.0,
            decode_batch_slowdown=0.015,
            max_num_seqs=256,
            kv_capacity_tokens=250_000,
            gpu_memory_bytes=80 * 1024**3,
            cold_start_ms=90_000,
            warm_start_ms=4_000,
            weights_bytes=141_200_000_000,
        ),
        ModelProfile(
            name="llama3-8b-a100",
            gpus_per_instance=1,
            prefill_tokens_per_s=7_800.0,
            decode_step_ms=11.5,
            decode_batch_slowdown=0.015,
            max_num_seqs=256,
            kv_capacity_tokens=400_000,
            gpu_memory_bytes=80 * 1024**3,
            cold_start_ms=30_000,
            warm_start_ms=1_500,
            weights_bytes=16_060_000_000,
        ),
        ModelProfile(
            name="llama3-70b-a100x4",
            gpus_per_instance=4,
            prefill_tokens_per_s=3_500.0,
            decode_step_ms=26.0,
            decode_batch_slowdown=0.015,
            max_num_seqs=256,
            kv_capacity_tokens=250_000,
            gpu_memory_bytes=80 * 1024**3,
            cold_start_ms=90_000,
            warm_start_ms=6_000,
            weights_bytes=141_200_000_000,
        ),
    )
}
