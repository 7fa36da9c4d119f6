"""Service models of the engines other than vLLM: how a simulated Triton or DeepSpeed-MII instance
serves its requests and what its samples look like (``shared/design/CONTRACTS.md`` sections 2 and 3).

:class:`~controlplane.sim.cluster.SimFleet` serves a vLLM deployment with its own code (continuous
batching, vLLM-shaped samples: unchanged, the published figures depend on it) and hands every other
deployment's requests to its :class:`ServiceModel`:

* :class:`TritonDynamicBatcher` (``triton.batching: dynamic``, the default): requests wait in
  Triton's scheduler queue (``SimInstance.queue``, ``nv_inference_pending_request_count``); a free
  model instance (``instance_count`` of them) takes up to ``max_batch_size`` queued requests whose
  prompt + output tokens fit the KV cache, at once when the batch is full or ``max_queue_delay_ms``
  after the oldest one was queued (Triton's default 0: at once). A batch executes to its end: its
  prompts are prefilled together, then every request decodes at the step time of the batch size
  and leaves with its last token; the model instance is free again when the batch's longest
  request is done (a backend's ``execute`` returns after the whole batch). Samples: ``waiting`` =
  pending requests, ``running`` = the requests executing, ``queue_p95_ms`` = p95 of the queue time
  (queued -> batch start) of the requests that left the queue in the interval, ``ttft_p99_ms`` from
  the first-response histogram (None with ``first_response_histogram: false``); KV use and token
  rates are unknown (plain Triton exports neither).
* :class:`TritonInflight` (``triton.batching: inflight``): the TensorRT-LLM backend's in-flight
  batching, served as continuous batching (the vLLM admission code); its backend exports KV use
  (``kv_cache_block_metrics{fraction}``) and the batch (``request_metrics``), but no token counters
  (``adapters/triton.py`` reads them only from Triton's vLLM backend), so both token rates are unknown.
* :class:`MiiService`: DeepSpeed-MII FastGen's continuous batching (the vLLM admission code), seen
  through the request meter (``adapters/mii_meter.py``, ``mii.meter: true``, the default):
  ``running`` = requests the pod holds (its batch *and* its internal queue: the meter cannot tell
  them apart), ``waiting`` = 0 (no ``max_concurrent``), prompt / generated token rates counted from
  the replies (at each request's end; unknown at an instance's first scrape, which has no previous
  counter), KV use unknown. Without the meter every load field is unknown. ``ttft_p99_ms`` is the
  driver's probe-latency proxy: the latency a one-token probe would see now (its wait behind the
  pod's queue, estimated by the age of the oldest queued request, + prefill + one decode step).
  No GPU memory figures (MII exports none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from controlplane.domain.engines import LOAD_FIELDS
from controlplane.domain.observations import InstanceSample

if TYPE_CHECKING:
    from controlplane.sim.cluster import SimFleet, SimInstance, SimRequest
    from controlplane.sim.scenario import MiiSpec, TritonSpec

BATCH_DUE = 4
"""Heap event: a Triton instance's ``max_queue_delay`` passed (payload ``(instance, gen)``)."""

TRITON_UNKNOWN = tuple(sorted(("kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s")))
MII_UNKNOWN_WITHOUT_METER = tuple(sorted(LOAD_FIELDS))
MII_UNKNOWN_WITH_METER = ("kv_usage",)
MII_UNKNOWN_FIRST_SCRAPE = TRITON_UNKNOWN
PROBE_PROMPT_TOKENS = 1
"""The driver's probe: ``{"prompts": ["ping"], "max_new_tokens": 1}`` (one prompt token, one output)."""


class ServiceModel(Protocol):
    """How one engine serves requests on a :class:`SimInstance` and what it reports."""

    def enqueue(self, fleet: SimFleet, sim: SimInstance, req: SimRequest, now_ms: int) -> None:
        """``req`` reaches ``sim`` (queue it, start what can start)."""
        ...

    def complete(self, fleet: SimFleet, sim: SimInstance, req: SimRequest, now_ms: int) -> None:
        """``req`` (already out of ``sim.running``) is done: report it, free its resources, start more."""
        ...

    def due(self, fleet: SimFleet, sim: SimInstance, now_ms: int) -> None:
        """A timer this model asked for (:data:`BATCH_DUE`) fired."""
        ...

    def sample(self, sim: SimInstance, now_ms: int, interval_ms: int) -> InstanceSample:
        ...


def p95(values: list[float]) -> float | None:
    """Nearest-rank p95 (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)])


def _take_ttfts(sim: SimInstance, now_ms: int) -> list[int]:
    out = []
    while sim.first_tokens and sim.first_tokens[0][0] <= now_ms:
        out.append(sim.first_tokens.popleft()[1])
    return out


@dataclass(slots=True)
class _TritonState:
    free: int
    """Model instances without a batch."""
    batch_of: dict[int, int] = field(default_factory=dict)
    """Request id -> its batch id."""
    left: dict[int, int] = field(default_factory=dict)
    """Batch id -> requests of it still executing."""
    tokens: dict[int, int] = field(default_factory=dict)
    """Batch id -> the KV tokens it holds until it ends."""
    queued_ms: dict[int, int] = field(default_factory=dict)
    """Request id -> when it entered Triton's queue."""
    queue_times: list[float] = field(default_factory=list)
    """Queue times of the requests that left the queue since the last sample."""
    next_batch: int = 0
    due_at: tuple[float, int] = (-1.0, -1)
    """The pending BATCH_DUE timer: (due, instance incarnation); (-1, -1): none."""


class TritonDynamicBatcher:
    """Triton's dynamic batcher in front of a batch-executing backend (see the module doc)."""

    def __init__(self, spec: TritonSpec, max_num_seqs: int) -> None:
        self.max_batch = spec.max_batch_size or max_num_seqs
        self.delay_ms = spec.max_queue_delay_ms
        self.instances = spec.instance_count
        self.histogram = spec.first_response_histogram
        self._state: dict[str, _TritonState] = {}

    def _st(self, sim: SimInstance) -> _TritonState:
        st = self._state.get(sim.id)
        if st is None or st.free + len(st.left) != self.instances:
            # A fresh instance, or one whose batches were aborted (drain, sleep, loss): start clean.
            st = self._state[sim.id] = _TritonState(self.instances)
        return st

    def enqueue(self, fleet: SimFleet, sim: SimInstance, req: SimRequest, now_ms: int) -> None:
        st = self._st(sim)
        st.queued_ms[req.rid] = now_ms
        sim.queue.append(req)
        self._dispatch(fleet, sim, st, now_ms)

    def due(self, fleet: SimFleet, sim: SimInstance, now_ms: int) -> None:
        st = self._st(sim)
        st.due_at = (-1.0, -1)
        self._dispatch(fleet, sim, st, now_ms)

    def _dispatch(self, fleet: SimFleet, sim: SimInstance, st: _TritonState, now_ms: int) -> None:
        p = sim.profile
        while sim.queue and st.free > 0:
            if len(sim.queue) < self.max_batch and self.delay_ms > 0:
                oldest = st.queued_ms.get(sim.queue[0].rid, now_ms)
                due = oldest + self.delay_ms
                if now_ms < due:
                    if st.due_at != (due, sim.gen):
                        st.due_at = (due, sim.gen)
                        fleet.schedule_event(due, BATCH_DUE, (sim.id, sim.gen))
                    return
            batch: list[SimRequest] = []
            tokens = 0
            while sim.queue and len(batch) < self.max_batch:
                need = sim.queue[0].prompt + sim.queue[0].output
                if batch and sim.kv_used + tokens + need > p.kv_capacity_tokens:
                    break  # the rest waits for the next batch (a request larger than the cache runs alone)
                batch.append(sim.queue.popleft())
                tokens += need
            self._execute(fleet, sim, st, batch, tokens, now_ms)

    def _execute(self, fleet: SimFleet, sim: SimInstance, st: _TritonState, batch: list[SimRequest],
                 tokens: int, now_ms: int) -> None:
        p = sim.profile
        bid = st.next_batch
        st.next_batch += 1
        st.free -= 1
        st.left[bid] = len(batch)
        st.tokens[bid] = tokens
        sim.kv_used += tokens
        prefill_end = now_ms + sum(r.prompt for r in batch) * 1000.0 / p.prefill_tokens_per_s
        step = p.step_ms(len(batch))
        first = prefill_end + step
        for req in batch:
            st.queue_times.append(float(now_ms - st.queued_ms.pop(req.rid, now_ms)))
            req.first_token_ms = int(first)
            sim.running[req.rid] = req
            st.batch_of[req.rid] = bid
            sim.first_tokens.append((req.first_token_ms, req.first_token_ms - req.arrival_ms))
            fleet.schedule_complete(first + (req.output - 1) * step, sim, req)

    def complete(self, fleet: SimFleet, sim: SimInstance, req: SimRequest, now_ms: int) -> None:
        st = self._st(sim)
        fleet.request_done(req, now_ms)
        bid = st.batch_of.pop(req.rid, None)
        if bid is None:
            return
        st.left[bid] -= 1
        if st.left[bid] == 0:  # the batch's longest request ended: the model instance is free
            del st.left[bid]
            sim.kv_used -= st.tokens.pop(bid)
            st.free += 1
            self._dispatch(fleet, sim, st, now_ms)

    def sample(self, sim: SimInstance, now_ms: int, interval_ms: int) -> InstanceSample:
        st = self._st(sim)
        ttfts = _take_ttfts(sim, now_ms)
        queue_p95, st.queue_times = p95(st.queue_times), []
        return InstanceSample(
            instance_id=sim.id, deployment=sim.deployment, at_ms=now_ms,
            running=len(sim.running), waiting=len(sim.queue), kv_usage=0.0,
            prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0,
            ttft_p99_ms=float(max(ttfts)) if ttfts and self.histogram else None,
            gpu_mem_used_bytes=int(sim.profile.gpu_memory_bytes * 0.9), gpu_mem_total_bytes=sim.profile.gpu_memory_bytes,
            queue_p95_ms=queue_p95, unknown=TRITON_UNKNOWN,
        )


class _Continuous:
    """Continuous batching with vLLM's admission (FastGen and TensorRT-LLM's in-flight batcher alike),
    recording each request's time in the engine queue."""

    def __init__(self) -> None:
        self._queued: dict[str, dict[int, int]] = {}
        self._queue_times: dict[str, list[float]] = {}

    def enqueue(self, fleet: SimFleet, sim: SimInstance, req: SimRequest, now_ms: int) -> None:
        self._queued.setdefault(sim.id, {})[req.rid] = now_ms
        sim.queue.append(req)
        self._admit(fleet, sim, now_ms)

    def _admit(self, fleet: SimFleet, sim: SimInstance, now_ms: int) -> None:
        fleet.admit_continuous(sim, now_ms)
        queued = self._queued.get(sim.id)
        if queued:
            times = self._queue_times.setdefault(sim.id, [])
            for rid in [r for r in queued if r in sim.running]:
                times.append(float(now_ms - queued.pop(rid)))

    def complete(self, fleet: SimFleet, sim: SimInstance, req: SimRequest, now_ms: int) -> None:
        sim.kv_used -= req.prompt + req.output
        self.completed(sim, req)
        fleet.request_done(req, now_ms)
        self._admit(fleet, sim, now_ms)

    def completed(self, sim: SimInstance, req: SimRequest) -> None:
        """Hook: a request of ``sim`` ended."""

    def due(self, fleet: SimFleet, sim: SimInstance, now_ms: int) -> None:
        return None

    def take_queue_p95(self, sim: SimInstance) -> float | None:
        queued = self._queued.get(sim.id)
        if queued:  # requeued elsewhere (sleep, drain) or dropped: forget them
            waiting = {r.rid for r in sim.queue}
            for rid in [r for r in queued if r not in waiting and r not in sim.running]:
                del queued[rid]
        return p95(self._queue_times.pop(sim.id, []))


class TritonInflight(_Continuous):
    """Triton with the TensorRT-LLM backend's in-flight batching (see the module doc)."""

    def __init__(self, spec: TritonSpec) -> None:
        super().__init__()
        self.histogram = spec.first_response_histogram

    def sample(self, sim: SimInstance, now_ms: int, interval_ms: int) -> InstanceSample:
        p = sim.profile
        ttfts = _take_ttfts(sim, now_ms)
        prefilling = len(sim.first_tokens)
        decoding = max(0, len(sim.running) - prefilling)
        prompt_tps = sim.prompt_tokens_since_sample * 1000.0 / interval_ms
        sim.prompt_tokens_since_sample = 0
        return InstanceSample(
            instance_id=sim.id, deployment=sim.deployment, at_ms=now_ms,
            running=len(sim.running), waiting=len(sim.queue),  # request_metrics scheduled / waiting
            kv_usage=min(1.0, sim.kv_used / p.kv_capacity_tokens), prompt_tokens_per_s=prompt_tps,
            generation_tokens_per_s=p.decode_tokens_per_s(decoding) if decoding else 0.0,
            ttft_p99_ms=float(max(ttfts)) if ttfts and self.histogram else None,
            gpu_mem_used_bytes=int(p.gpu_memory_bytes * 0.9), gpu_mem_total_bytes=p.gpu_memory_bytes,
            queue_p95_ms=self.take_queue_p95(sim), unknown=TRT_LLM_UNKNOWN,
        )


TRT_LLM_UNKNOWN = ("generation_tokens_per_s", "prompt_tokens_per_s")
"""What Triton with the TensorRT-LLM backend cannot report (no token counters), as the driver says."""


class MiiService(_Continuous):
    """DeepSpeed-MII, observed through its request meter or not at all (see the module doc)."""

    def __init__(self, spec: MiiSpec) -> None:
        super().__init__()
        self.meter = spec.meter
        self._tokens: dict[str, list[int]] = {}
        """Instance -> [prompt, generated] tokens of the replies since the last scrape."""
        self._scraped: set[str] = set()

    def completed(self, sim: SimInstance, req: SimRequest) -> None:
        counts = self._tokens.setdefault(sim.id, [0, 0])
        counts[0] += req.prompt
        counts[1] += req.output

    def probe_latency_ms(self, sim: SimInstance, now_ms: int) -> float:
        """What the driver's one-token probe would take if sent now."""
        p = sim.profile
        # Behind a queue it waits at least as long as the oldest queued request has (a lower bound;
        # a full batch with nothing queued is not counted: the probe would wait for one slot).
        wait = float(now_ms - sim.queue[0].arrival_ms) if sim.queue else 0.0
        prefill_start = max(float(now_ms) + wait, sim.prefill_free_ms)
        prefill = PROBE_PROMPT_TOKENS * 1000.0 / p.prefill_tokens_per_s
        return prefill_start - now_ms + prefill + p.step_ms(min(p.max_num_seqs, len(sim.running) + 1))

    def sample(self, sim: SimInstance, now_ms: int, interval_ms: int) -> InstanceSample:
        _take_ttfts(sim, now_ms)  # MII exports no TTFT: the probe stands in for it
        self.take_queue_p95(sim)
        sim.prompt_tokens_since_sample = 0
        prompt, generated = self._tokens.pop(sim.id, [0, 0])
        running = prompt_tps = gen_tps = 0.0
        if not self.meter:
            unknown: tuple[str, ...] = MII_UNKNOWN_WITHOUT_METER
        else:
            running = len(sim.running) + len(sim.queue)
            if sim.id in self._scraped:
                unknown = MII_UNKNOWN_WITH_METER
                prompt_tps = prompt * 1000.0 / interval_ms
                gen_tps = generated * 1000.0 / interval_ms
            else:
                unknown = MII_UNKNOWN_FIRST_SCRAPE  # a counter needs a previous scrape for a rate
                self._scraped.add(sim.id)
        return InstanceSample(
            instance_id=sim.id, deployment=sim.deployment, at_ms=now_ms,
            running=int(running), waiting=0, kv_usage=0.0, prompt_tokens_per_s=prompt_tps,
            generation_tokens_per_s=gen_tps, ttft_p99_ms=self.probe_latency_ms(sim, now_ms),
            unknown=unknown,
        )


def service_model(engine_value: str, options: TritonSpec | MiiSpec | None, max_num_seqs: int) -> ServiceModel | None:
    """The service model of a deployment's engine (None: vLLM, served by ``SimFleet`` itself)."""
    from controlplane.sim.scenario import MiiSpec, TritonSpec

    if engine_value == "triton":
        spec = options if isinstance(options, TritonSpec) else TritonSpec()
        return TritonInflight(spec) if spec.batching == "inflight" else TritonDynamicBatcher(spec, max_num_seqs)
    if engine_value == "deepspeed-mii":
        return MiiService(options if isinstance(options, MiiSpec) else MiiSpec())
    return None


__all__ = ["BATCH_DUE", "MiiService", "ServiceModel", "TritonDynamicBatcher", "TritonInflight", "p95", "service_model"]
