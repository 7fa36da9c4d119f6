"""Driver for one Triton Inference Server (``shared/design/CONTRACTS.md`` section 2).

``TritonDriver(base_url, metrics_url, model, timeout_s)`` talks plain HTTP through ``urllib`` (HTTP
port 8000 for health/repository, metrics port 8002 for ``/metrics``) with a bounded timeout on every
request, and translates every library error at the boundary:

* connection refused / reset / timeout / DNS -> :class:`~controlplane.domain.errors.Unavailable`
  (Triton starts its HTTP endpoint only after the initial model load; on SIGTERM it stops accepting);
* ``/v2/health/live|ready``: 200 -> ``True``, 400 -> ``False``; 503 ``{"error":"Server exiting"}``
  -> :class:`EngineExiting` (a ``PermanentError``: this process is going away, do not retry it).
  Any route answering 503 "Server exiting" raises :class:`EngineExiting`.
* ``/v2/models/{m}/ready``: 200 -> ``True``; 400 "Model version not ready", 404 (no available
  version), 503 (version not at ready state / server not ready) -> ``False``; 400 "unknown model"
  -> :class:`ModelUnknown` (a ``NotFound``).
* ``POST /v2/repository/models/{m}/load|unload`` is the warm path (explicit model control mode only).
  In none/poll mode Triton answers 503 "explicit model load / unload is not allowed if polling is
  enabled" -> :class:`WarmPathUnavailable` (callers degrade to cold starts). 500 (load failed) ->
  :class:`ModelLoadFailed`; 400 -> :class:`EngineRejected`. Bodies are the ones tritonclient sends:
  load ``{}`` or ``{"parameters":{"config":"<json>"}}``, unload
  ``{"parameters":{"unload_dependents":false}}``.

Metrics (:meth:`TritonDriver.sample`), parsed with ``prometheus_client.parser``; per-model metrics are
summed over ``version`` and ``gpu_uuid`` labels for ``model``:

* ``waiting`` = ``nv_inference_pending_request_count`` (Triton's scheduler queue), plus the TensorRT-LLM
  backend's own queue ``nv_trt_llm_request_metrics{request_type="waiting"}`` when that family is
  present (the two queues are disjoint: a request leaves Triton's queue when the backend receives it).
* ``running``: Triton has no running gauge. With TensorRT-LLM metrics present it is
  ``nv_trt_llm_request_metrics{request_type="scheduled"}`` (the mapping the gateway-api inference
  extension uses). Otherwise it is derived by Little's law from counter deltas between two successful
  scrapes: ``round(Δ(nv_inference_request_duration_us - nv_inference_queue_duration_us) / Δt_us)``,
  i.e. inference rate x mean time past the queue = mean number of requests being executed over the
  interval. It lags (durations are recorded when a request completes) and is 0 on the first scrape
  (``statistics()["running_source"] == "no_baseline"``).
* Mean queue time over the interval = ``Δnv_inference_queue_duration_us / Δnv_inference_request_success``
  (Triton's k8s example uses the same ratio); ``None`` when no request succeeded; kept in
  ``statistics()["mean_queue_ms"]``; the compute side apart from it, the mean time of one model
  execution ``Δnv_inference_compute_infer_duration_us / Δnv_inference_exec_count``, in
  ``statistics()["mean_compute_ms"]``.
* ``queue_p95_ms`` (the demand signal Triton deployments scale on against a 120 ms target): the
  ``quantile="0.95"`` sample of ``nv_inference_queue_summary_us`` when Triton runs with
  ``--metrics-config summary_latencies=true`` (the deploy manifests set it; largest over versions; a
  NaN quantile, which prometheus-cpp reports for an empty window, is no value), else the interval's
  mean queue time above. A mean is a *lower bound* of the p95 for queue times, so it is safe for the
  only use the signal has (asking for more replicas when it is over the target): it may ask late,
  never wrongly. ``statistics()["queue_source"]`` says which (``summary``/``interval_mean``/``none``).
* ``gpu_mem_used_bytes`` / ``gpu_mem_total_bytes`` = ``nv_gpu_memory_used_bytes`` /
  ``nv_gpu_memory_total_bytes`` summed over ``gpu_uuid`` (all GPUs the server sees). Absent (GPU
  metrics disabled / CPU only) -> 0 with ``statistics()["gpu_metrics"] == False``.
* ``kv_usage`` = ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`` (0..1) when
  present, else 0.0 with ``statistics()["kv_source"] == "absent"`` (no other backend exports KV use).
* ``ttft_p99_ms``: Triton has no TTFT metric as such. The opt-in histogram
  ``nv_inference_first_response_histogram_ms`` (``--metrics-config histogram_latencies=true``) is the
  time to the first response, which is TTFT for decoupled/streaming LLM models: when present, p99 is
  the upper bound (ms) of the first bucket whose cumulative *delta* reaches ``ceil(0.99 n)`` (the same
  rule as the vLLM driver). ``None`` when absent (the default), on the first scrape, or with no new
  first responses.
* Token rates: Triton's core has no token counters. A model on Triton's vLLM backend exports vLLM's
  ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total`` with ``model``/``version`` labels;
  with them the rates are counter deltas as in the vLLM driver (``statistics()["token_source"]``).
* ``InstanceSample.unknown`` names what this server cannot tell (never a fake 0 that could scale a
  deployment down): ``kv_usage`` without TensorRT-LLM's KV metric, both token rates without the vLLM
  backend's counters or on the first scrape, ``running`` on the first scrape (or without latency
  counters) without TensorRT-LLM.
* Counters that went down (server restart) count from zero, as Prometheus' ``rate()`` does.

Malformed metrics policy (never an unhandled exception): an unparseable page, or a required metric
(``nv_inference_pending_request_count``, ``nv_inference_request_success``, ``nv_inference_count``)
missing for ``model``, any
used value NaN/infinite/negative, a KV fraction outside 0..1, or GPU used > total, raises
:class:`MetricsMalformed` (a ``TemporaryError``) naming the field. Latency counters disabled
(``counter_latencies=false``: ``nv_inference_queue_duration_us`` / ``_request_duration_us`` absent)
leave ``running`` unknown without TensorRT-LLM (``running_source: no_latency_counters``) and the queue
time to the summary, if any. The failed scrape
does not replace the previous baseline. Every failure is one structlog event (``triton.metrics_malformed``,
``triton.warm_path_unavailable``, ``triton.unreachable``, ``triton.exiting``).
"""

from __future__ import annotations

import json
import math
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

import structlog

from adapters import engine_http
from adapters.engine_http import (
    EngineRejected,
    MetricsMalformed,
    UnexpectedResponse,
    WarmPathUnavailable,
    check_count,
    count_unreachable,
    counter_delta,
    cumulative_buckets,
    histogram_delta_quantile,
    http_request,
)
from controlplane.domain.errors import (
    NotFound,
    PermanentError,
    Unavailable,
    ValidationError,
)
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.observations import InstanceSample

__all__ = [
    "EngineExiting", "EngineRejected", "MetricsMalformed", "ModelIndexEntry", "ModelLoadFailed", "ModelUnknown",
    "TritonDriver", "UnexpectedResponse", "WarmPathUnavailable", "parse_exposition",
]

log = structlog.get_logger("adapters.triton")

ENGINE = "Triton"

MAX_RESPONSE_BYTES = 8 * 1024 * 1024
TTFT_QUANTILE = 0.99

PENDING = "nv_inference_pending_request_count"
SUCCESS = "nv_inference_request_success"
COUNT = "nv_inference_count"
EXEC_COUNT = "nv_inference_exec_count"
COMPUTE_INFER_US = "nv_inference_compute_infer_duration_us"
QUEUE_US = "nv_inference_queue_duration_us"
REQUEST_US = "nv_inference_request_duration_us"
GPU_TOTAL = "nv_gpu_memory_total_bytes"
GPU_USED = "nv_gpu_memory_used_bytes"
TRT_REQUESTS = "nv_trt_llm_request_metrics"
TRT_KV = "nv_trt_llm_kv_cache_block_metrics"
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
QUEUE_SUMMARY = "nv_inference_queue_summary_us"
QUEUE_QUANTILE = "0.95"
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens"
"""Triton's vLLM backend exports vLLM's counters with ``model``/``version`` labels."""
VLLM_GENERATION_TOKENS = "vllm:generation_tokens"
TOKEN_FIELDS = ("generation_tokens_per_s", "prompt_tokens_per_s")

EXITING_MESSAGE = "Server exiting"
NOT_EXPLICIT_MESSAGE = "explicit model load / unload is not allowed if polling is enabled"


class EngineExiting(PermanentError):
    """The server answered 503 "Server exiting" (SIGTERM received): it will not serve again."""

    def __init__(self, base_url: str, route: str) -> None:
        super().__init__(f"Triton {base_url}{route}: server exiting")
        self.base_url = base_url
        self.route = route


class ModelUnknown(NotFound):
    """The model name is not in the server's model repository (400 "Request for unknown model")."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__("triton model", model)
        self.message = message


class ModelLoadFailed(PermanentError):
    """``load`` answered 500 (model directory missing, backend error)."""

    def __init__(self, model: str, status: int, message: str) -> None:
        super().__init__(f"Triton load of {model!r} failed (HTTP {status}): {message}")
        self.model = model
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class ModelIndexEntry:
    """One row of ``POST /v2/repository/index``; ``version``/``reason`` are "" when Triton omits them."""

    name: str
    state: str
    version: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class _Scrape:
    at_ms: int
    success: float
    count: float
    queue_us: float | None
    """Cumulative queue µs; None when Triton runs with ``counter_latencies=false``."""
    request_us: float | None
    first_response: tuple[tuple[float, float], ...] | None
    tokens: tuple[float, float] | None = None
    """(prompt, generation) token counters of the vLLM backend; None when not exported."""
    compute: tuple[float, float] | None = None
    """(executions, compute-infer µs) counters; None without the latency counters."""


@dataclass(slots=True)
class DriverStatistics:
    scrapes: int = 0
    malformed: int = 0
    unreachable: int = 0
    exiting: int = 0
    last_error: str = ""
    mean_queue_ms: float | None = None
    mean_compute_ms: float | None = None
    """Mean time of one model execution over the interval (``Δcompute_infer_duration_us /
    Δexec_count``): the compute side of a request's latency, apart from its queue time."""
    inferences_per_s: float = 0.0
    running_source: str = "no_baseline"
    kv_source: str = "absent"
    gpu_metrics: bool = False
    ttft_source: str = "absent"
    queue_source: str = "none"
    """Where ``queue_p95_ms`` came from: ``summary`` (the 0.95 quantile of
    ``nv_inference_queue_summary_us``), ``interval_mean`` (a lower bound of the p95) or ``none``."""
    token_source: str = "absent"


class TritonDriver:
    """One Triton server and one model on it. Thread-safe; keeps the previous good scrape for deltas."""

    def __init__(self, base_url: str, metrics_url: str, model: str, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValidationError("timeout_s", "must be > 0")
        if not model or "/" in model:
            raise ValidationError("model", "must be a non-empty repository model name without '/'")
        self.base_url = base_url.rstrip("/")
        self.metrics_url = metrics_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._previous: _Scrape | None = None
        self._stats = DriverStatistics()

    # -- HTTP boundary --------------------------------------------------------------------------
    def _request(self, method: str, route: str, body: bytes | None = None, *,
                 base: str | None = None) -> tuple[int, bytes]:
        """(status, body) for any HTTP answer; Unavailable when there is no answer."""
        base = self.base_url if base is None else base
        data = (body if body is not None else b"") if method == "POST" else None

        def unreachable(reason: object) -> None:
            count_unreachable(self._lock, self._stats, route, reason)
            log.warning("triton.unreachable", base_url=base, route=route, reason=str(reason))

        status, payload, _ = http_request(ENGINE, method, base + route, timeout_s=self.timeout_s,
                                          max_bytes=MAX_RESPONSE_BYTES, data=data, on_unreachable=unreachable)
        return status, payload

    def _call(self, method: str, route: str, body: bytes | None = None) -> tuple[int, str]:
        """(status, error message) after turning 503 "Server exiting" into :class:`EngineExiting`."""
        status, payload = self._request(method, route, body)
        message = _error_message(payload)
        if status == 503 and message == EXITING_MESSAGE:
            with self._lock:
                self._stats.exiting += 1
                self._stats.last_error = f"{route}: {EXITING_MESSAGE}"
            log.warning("triton.exiting", base_url=self.base_url, route=route)
            raise EngineExiting(self.base_url, route)
        return status, message

    def _model_route(self, suffix: str) -> str:
        return f"/v2/repository/models/{urllib.parse.quote(self.model, safe='')}/{suffix}"

    # -- health ---------------------------------------------------------------------------------
    def _health(self, which: str) -> bool:
        route = f"/v2/health/{which}"
        status, message = self._call("GET", route)
        if status == 200:
            return True
        if status == 400:
            return False
        raise UnexpectedResponse(f"Triton {route}: HTTP {status} {message!r}")

    def live(self) -> bool:
        return self._health("live")

    def ready(self) -> bool:
        """Server readiness (with ``--strict-readiness``: every model that should be loaded is)."""
        return self._health("ready")

    def model_ready(self, version: str | None = None) -> bool:
        m = urllib.parse.quote(self.model, safe="")
        route = f"/v2/models/{m}" + (f"/versions/{version}" if version else "") + "/ready"
        status, message = self._call("GET", route)
        if status == 200:
            return True
        if status == 400 and message.startswith("Request for unknown model"):
            raise ModelUnknown(self.model, message)
        if status in (400, 404, 503):
            return False
        raise UnexpectedResponse(f"Triton {route}: HTTP {status} {message!r}")

    # -- repository -----------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[ModelIndexEntry]:
        route = "/v2/repository/index"
        status, payload = self._request("POST", route, b'{"ready":true}' if ready_only else b"")
        if status != 200:
            self._raise_for(route, status, payload)
        try:
            rows = json.loads(payload)
            if not isinstance(rows, list):
                raise TypeError("not a JSON array")
            return [ModelIndexEntry(name=str(r["name"]), state=str(r["state"]),
                                    version=str(r.get("version", "")), reason=str(r.get("reason", "")))
                    for r in rows]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UnexpectedResponse(f"Triton {route}: unexpected body {payload[:200]!r}: {exc}") from exc

    def load_model(self, config: dict[str, Any] | None = None) -> None:
        """Warm path: load (or reload) ``model``; synchronous. Explicit model control mode only."""
        body: dict[str, Any] = {} if config is None else {"parameters": {"config": json.dumps(config)}}
        self._control(self._model_route("load"), json.dumps(body, separators=(",", ":")).encode())

    def unload_model(self, unload_dependents: bool = False) -> None:
        """Warm path: unload ``model`` (keeps the server up); synchronous. Explicit mode only."""
        body = {"parameters": {"unload_dependents": unload_dependents}}
        self._control(self._model_route("unload"), json.dumps(body, separators=(",", ":")).encode())

    def _control(self, route: str, body: bytes) -> None:
        status, payload = self._request("POST", route, body)
        if status != 200:
            self._raise_for(route, status, payload)
        log.info("triton.model_control", base_url=self.base_url, route=route)

    def _raise_for(self, route: str, status: int, payload: bytes) -> None:
        message = _error_message(payload)
        if status == 503 and message == EXITING_MESSAGE:
            with self._lock:
                self._stats.exiting += 1
            log.warning("triton.exiting", base_url=self.base_url, route=route)
            raise EngineExiting(self.base_url, route)
        if status == 503 and message == NOT_EXPLICIT_MESSAGE:
            log.warning("triton.warm_path_unavailable", base_url=self.base_url, route=route, status=status,
                        fallback="cold_start")
            raise WarmPathUnavailable(self.base_url, route, f": {message} (model control mode is not explicit)",
                                      message=message)
        if status == 500 and route.endswith("/load"):
            raise ModelLoadFailed(self.model, status, message)
        if status == 400:
            raise EngineRejected(route, message, status=status)
        if status == 503:
            raise Unavailable(f"Triton {route}: HTTP 503 {message!r}")
        raise UnexpectedResponse(f"Triton {route}: HTTP {status} {message!r}")

    # -- EngineDriver (adapters/engines.py) -----------------------------------------------------
    def is_ready(self) -> bool:
        """The model is ready (``/v2/models/{model}/ready``): what serving needs."""
        return self.model_ready()

    def warm_down(self) -> None:
        self.unload_model()

    def warm_up(self) -> None:
        self.load_model()

    def in_flight(self) -> int | None:
        """Requests the server holds now, from one ``/metrics`` scrape (the :meth:`sample` baseline is
        left alone): ``nv_inference_pending_request_count`` (Triton's scheduler queue: queued only)
        + the TensorRT-LLM backend's ``nv_trt_llm_request_metrics{request_type="waiting"}`` (its own
        queue) + ``{request_type="active"}`` (requests in its batch manager, scheduled or paused;
        disjoint from the queues). Without the TensorRT-LLM gauges nothing counts the requests a
        backend is executing (the Little's-law ``running`` is a mean over the last interval, and
        lags), so the answer is None: the caller cannot tell."""
        status, body = self._request("GET", "/metrics", base=self.metrics_url)
        if status != 200:
            raise UnexpectedResponse(f"Triton {self.metrics_url}/metrics: HTTP {status}")
        families = parse_exposition(body)

        def model_sum(name: str, **match: str) -> float | None:
            samples = [(s.labels, float(s.value)) for s in families.get(name, [])
                       if s.name == name and s.labels.get("model") == self.model
                       and all(s.labels.get(k) == v for k, v in match.items())]
            return _finite_sum(_field(name, match), samples) if samples else None

        active = model_sum(TRT_REQUESTS, request_type="active")
        if active is None:
            return None
        pending = model_sum(PENDING)
        if pending is None:
            raise MetricsMalformed(PENDING, "missing", engine=ENGINE)
        waiting = model_sum(TRT_REQUESTS, request_type="waiting") or 0.0
        return check_count(f"{PENDING} + {TRT_REQUESTS}", pending + waiting + active, engine=ENGINE)

    # -- metrics --------------------------------------------------------------------------------
    def sample(self, instance_id: InstanceId, deployment: DeploymentId, now_ms: int) -> InstanceSample:
        status, body = self._request("GET", "/metrics", base=self.metrics_url)
        if status != 200:
            raise UnexpectedResponse(f"Triton {self.metrics_url}/metrics: HTTP {status}")
        try:
            parsed = self._parse(body, now_ms)
        except MetricsMalformed as exc:
            with self._lock:
                self._stats.malformed += 1
                self._stats.last_error = str(exc)
            log.warning("triton.metrics_malformed", base_url=self.metrics_url, field=exc.field, problem=exc.problem)
            raise
        current = parsed.scrape
        with self._lock:
            previous, self._previous = self._previous, current
            s = self._stats
            s.scrapes += 1
            running, s.running_source, s.mean_queue_ms, s.inferences_per_s = _derived(previous, current)
            if parsed.trt_running is not None:
                running, s.running_source = parsed.trt_running, "trt_llm"
            s.kv_source = "trt_llm" if parsed.kv is not None else "absent"
            s.gpu_metrics = parsed.gpu is not None
            s.ttft_source = "first_response_histogram" if current.first_response is not None else "absent"
            mean_queue_ms = s.mean_queue_ms
            s.mean_compute_ms = _mean_compute_ms(previous, current)
            if parsed.queue_p95_us is not None:
                queue_p95_ms, s.queue_source = parsed.queue_p95_us / 1000.0, "summary"
            else:
                queue_p95_ms, s.queue_source = mean_queue_ms, "interval_mean" if mean_queue_ms is not None else "none"
            rates = _token_rates(previous, current)
            s.token_source = "vllm_backend" if current.tokens is not None else "absent"
            unknown = set() if rates is not None else set(TOKEN_FIELDS)
            if parsed.kv is None:
                unknown.add("kv_usage")
            if s.running_source in ("no_baseline", "no_latency_counters"):
                unknown.add("running")  # Little's law needs two scrapes and the latency counters
        ttft = _first_response_p99_ms(previous, current)
        used, total = parsed.gpu if parsed.gpu is not None else (0, 0)
        log.debug("triton.sample", base_url=self.metrics_url, model=self.model, waiting=parsed.waiting,
                  running=running, mean_queue_ms=mean_queue_ms, queue_p95_ms=queue_p95_ms)
        prompt_rate, gen_rate = rates if rates is not None else (0.0, 0.0)
        return InstanceSample(
            instance_id=instance_id, deployment=deployment, at_ms=now_ms,
            running=running, waiting=parsed.waiting, kv_usage=parsed.kv if parsed.kv is not None else 0.0,
            prompt_tokens_per_s=prompt_rate, generation_tokens_per_s=gen_rate, ttft_p99_ms=ttft,
            gpu_mem_used_bytes=used, gpu_mem_total_bytes=total, queue_p95_ms=queue_p95_ms,
            unknown=tuple(sorted(unknown)),
        )

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            s = self._stats
            return {"scrapes": s.scrapes, "malformed": s.malformed, "unreachable": s.unreachable,
                    "exiting": s.exiting, "last_error": s.last_error, "mean_queue_ms": s.mean_queue_ms,
                    "mean_compute_ms": s.mean_compute_ms,
                    "inferences_per_s": s.inferences_per_s, "running_source": s.running_source,
                    "kv_source": s.kv_source, "gpu_metrics": s.gpu_metrics, "ttft_source": s.ttft_source,
                    "queue_source": s.queue_source, "token_source": s.token_source}

    def _queue_p95_us(self, families: dict[str, list[Any]]) -> float | None:
        """The largest 0.95 quantile of the queue-time summary over versions; None when absent or
        when the summary has no observation in its window (prometheus-cpp reports NaN then).
        A negative or infinite quantile is a broken exporter: :class:`MetricsMalformed`."""
        values = [float(s.value) for s in families.get(QUEUE_SUMMARY, [])
                  if s.name == QUEUE_SUMMARY and s.labels.get("model") == self.model
                  and s.labels.get("quantile") == QUEUE_QUANTILE and not math.isnan(float(s.value))]
        field = _field(QUEUE_SUMMARY, {"quantile": QUEUE_QUANTILE})
        for v in values:
            if not math.isfinite(v) or v < 0:
                raise MetricsMalformed(field, f"{v} is not a duration in microseconds", engine=ENGINE)
        return max(values) if values else None

    def _parse(self, body: bytes, now_ms: int) -> _Parsed:
        families = parse_exposition(body)

        def model_sum(name: str, required: bool = True, **match: str) -> float | None:
            samples = [(s.labels, float(s.value)) for s in families.get(name, [])
                       if s.name in (name, name + "_total") and s.labels.get("model") == self.model
                       and all(s.labels.get(k) == v for k, v in match.items())]
            if not samples:
                if required:
                    raise MetricsMalformed(name, "missing", engine=ENGINE)
                return None
            return _finite_sum(_field(name, match), samples)

        pending = model_sum(PENDING)
        success, count = model_sum(SUCCESS), model_sum(COUNT)
        queue_us, request_us = model_sum(QUEUE_US, False), model_sum(REQUEST_US, False)
        if queue_us is None or request_us is None:  # counter_latencies=false: both go together
            queue_us = request_us = None
        assert pending is not None and success is not None and count is not None
        waiting = pending
        trt_waiting = model_sum(TRT_REQUESTS, False, request_type="waiting")
        trt_scheduled = model_sum(TRT_REQUESTS, False, request_type="scheduled")
        if trt_waiting is not None:
            waiting += trt_waiting
        kv_frac = model_sum(TRT_KV, False, kv_cache_block_type="fraction")
        if kv_frac is not None and not 0.0 <= kv_frac <= 1.0:
            raise MetricsMalformed(_field(TRT_KV, {"kv_cache_block_type": "fraction"}), f"{kv_frac} is not a 0..1 fraction", engine=ENGINE)
        gpu = _gpu(families)
        queue_p95 = self._queue_p95_us(families)
        prompt, generated = model_sum(VLLM_PROMPT_TOKENS, False), model_sum(VLLM_GENERATION_TOKENS, False)
        tokens = None if prompt is None or generated is None else (prompt, generated)
        execs, infer_us = model_sum(EXEC_COUNT, False), model_sum(COMPUTE_INFER_US, False)
        compute = None if execs is None or infer_us is None else (execs, infer_us)
        first = cumulative_buckets([(s.labels, float(s.value)) for s in families.get(FIRST_RESPONSE, [])
                                     if s.name == FIRST_RESPONSE + "_bucket" and s.labels.get("model") == self.model])
        return _Parsed(
            scrape=_Scrape(now_ms, success, count, queue_us, request_us, first, tokens, compute),
            waiting=check_count(PENDING if trt_waiting is None else f"{PENDING} + {TRT_REQUESTS}", waiting, engine=ENGINE),
            trt_running=(None if trt_scheduled is None else
                         check_count(_field(TRT_REQUESTS, {"request_type": "scheduled"}), trt_scheduled, engine=ENGINE)),
            kv=kv_frac, gpu=gpu, queue_p95_us=queue_p95,
        )


@dataclass(frozen=True, slots=True)
class _Parsed:
    scrape: _Scrape
    waiting: int
    trt_running: int | None
    kv: float | None
    gpu: tuple[int, int] | None
    queue_p95_us: float | None = None
    """The 0.95 quantile of ``nv_inference_queue_summary_us`` (``summary_latencies=true``); None without."""


def _field(name: str, match: dict[str, str]) -> str:
    if not match:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(match.items())) + "}"


def _error_message(payload: bytes) -> str:
    """The ``error`` field of Triton's ``{"error": "<msg>"}`` body; "" for an empty/other body."""
    if not payload:
        return ""
    try:
        obj = json.loads(payload)
    except ValueError:
        return payload[:200].decode(errors="replace")
    if isinstance(obj, dict) and isinstance(obj.get("error"), str):
        return obj["error"]
    return payload[:200].decode(errors="replace")


def parse_exposition(body: bytes) -> dict[str, list[Any]]:
    """Family name -> samples. Any parse failure becomes :class:`MetricsMalformed`."""
    return engine_http.parse_exposition(body, engine=ENGINE)


def _finite_sum(name: str, samples: list[tuple[dict[str, str], float]]) -> float:
    total = 0.0
    for labels, value in samples:
        if not math.isfinite(value):
            raise MetricsMalformed(name, f"non-finite value {value} for {labels}", engine=ENGINE)
        if value < 0:
            raise MetricsMalformed(name, f"negative value {value} for {labels}", engine=ENGINE)
        total += value
    return total


def _gpu(families: dict[str, list[Any]]) -> tuple[int, int] | None:
    """(used, total) bytes summed over gpu_uuid; None when the server exports no GPU metrics."""
    used = [(s.labels, float(s.value)) for s in families.get(GPU_USED, []) if s.name == GPU_USED]
    total = [(s.labels, float(s.value)) for s in families.get(GPU_TOTAL, []) if s.name == GPU_TOTAL]
    if not used and not total:
        return None
    if not used:
        raise MetricsMalformed(GPU_USED, "missing", engine=ENGINE)
    if not total:
        raise MetricsMalformed(GPU_TOTAL, "missing", engine=ENGINE)
    u, t = _finite_sum(GPU_USED, used), _finite_sum(GPU_TOTAL, total)
    if u > t:
        raise MetricsMalformed(GPU_USED, f"used {u} exceeds total {t}", engine=ENGINE)
    return (check_count(GPU_USED, u, engine=ENGINE, limit=engine_http.MAX_BYTES),
            check_count(GPU_TOTAL, t, engine=ENGINE, limit=engine_http.MAX_BYTES))


def _derived(previous: _Scrape | None, current: _Scrape) -> tuple[int, str, float | None, float]:
    """(running by Little's law, its source, mean queue ms, inferences/s) between two scrapes."""
    if previous is None or current.at_ms <= previous.at_ms:
        return 0, "no_baseline", None, 0.0
    latencies = (previous.queue_us, previous.request_us, current.queue_us, current.request_us)
    if (current.success < previous.success or current.count < previous.count
            or (None not in latencies and (current.queue_us < previous.queue_us  # type: ignore[operator]
                                           or current.request_us < previous.request_us))):  # type: ignore[operator]
        zero = None if current.queue_us is None else 0.0
        previous = _Scrape(previous.at_ms, 0.0, 0.0, zero, zero, None)  # restart: every counter from zero
    elapsed_us = (current.at_ms - previous.at_ms) * 1000.0
    rate = (current.count - previous.count) / (elapsed_us / 1e6)
    if None in (previous.queue_us, previous.request_us, current.queue_us, current.request_us):
        return 0, "no_latency_counters", None, rate  # running cannot be told: unknown, not 0
    assert previous.queue_us is not None and previous.request_us is not None
    assert current.queue_us is not None and current.request_us is not None
    d_success = current.success - previous.success
    d_queue = current.queue_us - previous.queue_us
    d_busy = max(0.0, (current.request_us - previous.request_us) - d_queue)
    running = min(engine_http.MAX_COUNT, math.floor(d_busy / elapsed_us + 0.5))  # an estimate: capped to the wire
    mean_queue_ms = d_queue / d_success / 1000.0 if d_success > 0 else None
    return running, "littles_law", mean_queue_ms, rate


def _mean_compute_ms(previous: _Scrape | None, current: _Scrape) -> float | None:
    """Mean ms of one execution between two scrapes; None without both counters or executions."""
    if previous is None or previous.compute is None or current.compute is None:
        return None
    d_exec = counter_delta(previous.compute[0], current.compute[0])
    d_us = counter_delta(previous.compute[1], current.compute[1])
    return d_us / d_exec / 1000.0 if d_exec > 0 else None


def _token_rates(previous: _Scrape | None, current: _Scrape) -> tuple[float, float] | None:
    """(prompt, generation) tokens/s of the vLLM backend between two scrapes; None when either scrape
    lacks its counters or there is no earlier scrape (unknown, not 0)."""
    if previous is None or previous.tokens is None or current.tokens is None or current.at_ms <= previous.at_ms:
        return None
    seconds = (current.at_ms - previous.at_ms) / 1000.0
    return (counter_delta(previous.tokens[0], current.tokens[0]) / seconds,
            counter_delta(previous.tokens[1], current.tokens[1]) / seconds)


def _first_response_p99_ms(previous: _Scrape | None, current: _Scrape) -> float | None:
    if previous is None:
        return None
    return histogram_delta_quantile(TTFT_QUANTILE, previous.first_response, current.first_response)
