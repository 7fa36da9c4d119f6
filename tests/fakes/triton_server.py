"""A protocol-faithful fake of Triton Inference Server's HTTP and metrics endpoints (CONTRACTS.md section 2).

What it reproduces exactly (``server:src/http_server.cc``, ``core:src/metrics.cc``):

* Two listeners on 127.0.0.1: the HTTP endpoint (Triton's 8000) and the metrics endpoint (8002).
* ``GET /v2/health/live`` / ``ready``: 200 empty body if true, 400 empty body if false, 503
  ``{"error":"Server exiting"}`` once ``exiting``; non-GET 405 ``{"error":"Method Not Allowed"}``.
  Server ready follows ``--strict-readiness``: every model READY, ignoring models unloaded on purpose.
* ``GET /v2/models/{m}[/versions/{v}]/ready``: 200 empty if READY; LOADING/UNLOADING -> 400
  ``{"error":"Model version not ready"}``; known but no loaded version -> 404
  ``{"error":"Request for unknown model: 'm' has no available versions"}``; not in the repository -> 400
  ``{"error":"Request for unknown model: 'm' is not found"}``.
* ``POST /v2/repository/index`` (body optional ``{"ready": bool}``) -> 200 JSON array sorted by name,
  ``version`` omitted when none, ``reason`` omitted when empty (unloaded: UNAVAILABLE / "unloaded").
* ``POST /v2/repository/models/{m}/load|unload``: explicit mode -> 200 empty body with content type
  ``application/json``; none/poll -> 503 ``{"error":"explicit model load / unload is not allowed if
  polling is enabled"}``; load of a model absent from ``repository`` (or listed in ``load_failures``) ->
  500 ``{"error":"failed to load 'm', ..."}``; ``/v2/repository/<name>/...`` -> 501.
* Unknown path -> 404 ``{"error":"Not Found"}``; every error body is ``{"error": "<msg>"}``.
* ``GET /metrics`` on the metrics port: prometheus-cpp style text (labels sorted, integral values without
  decimals, counters without ``_total``), per-model metrics labelled ``model``/``version`` (+ ``gpu_uuid``
  when ``gpu_uuid`` is set), GPU gauges keyed by ``gpu_uuid``; TensorRT-LLM gauges when ``trt_llm=True``;
  the opt-in ``nv_inference_first_response_histogram_ms`` when ``histogram_latencies=True``.
* Startup: ``start(loading=True)`` binds without listening, so connections are refused until
  :meth:`finish_loading` (Triton starts its endpoints after the initial model load).

Knobs: ``model_control_mode``, ``models`` (name -> state), ``repository`` (names on disk),
``load_failures``, ``exiting``, ``pending``, ``success``, ``inference_count``, ``queue_us``, ``request_us``,
``gpu_used``/``gpu_total`` (None = no GPU metrics), ``trt_llm``, ``trt_waiting``, ``trt_scheduled``, ``trt_paused``,
``kv_fraction``, :meth:`observe_first_response`, ``garbage_line``, ``nan_metrics``, ``missing_metrics``.
``requests`` records (method, path, body) of every request served on the HTTP port.
"""

from __future__ import annotations

import json
import math
import re

from tests.fakes.base import (
    FakeHandler,
    FakeHttpServer,
    FakeServer,
    Listener,
    http_factory,
)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4"
FIRST_RESPONSE_BUCKETS: tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)
"""Triton's default ``nv_inference_first_response_histogram_ms`` buckets (+Inf implied)."""

NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"

_SERVER_RE = re.compile(r"/v2(?:/health/(live|ready))?")
_MODEL_RE = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?")
_CONTROL_RE = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")


def _num(value: float) -> str:
    """prometheus-cpp formatting: integral values without decimals."""
    if math.isnan(value):
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class _Server(FakeHttpServer):
    fake: FakeTritonServer


class FakeTritonServer(FakeServer):
    """One fake Triton on 127.0.0.1. Use :meth:`start` / :meth:`stop` (or a ``with`` block)."""

    def __init__(self, *, models: dict[str, str] | None = None, model_control_mode: str = "none",
                 gpu_uuid: str | None = "GPU-0000") -> None:
        if model_control_mode not in ("none", "poll", "explicit"):
            raise ValueError(model_control_mode)
        super().__init__()
        self.model_control_mode = model_control_mode
        self.models: dict[str, str] = dict(models if models is not None else {"llm": "READY"})
        self.versions: dict[str, str] = {m: "1" for m, s in self.models.items() if s != "UNAVAILABLE"}
        self.reasons: dict[str, str] = {}
        self.repository: set[str] = set(self.models)
        self.load_failures: dict[str, str] = {}
        self.metrics_model = next(iter(self.models), "")
        """The model the per-model metric knobs describe (the first one given); other models report 0."""
        self.exiting = False
        self.gpu_uuid = gpu_uuid
        self.pending = 0
        self.success = 0
        self.inference_count = 0
        self.queue_us = 0
        self.request_us = 0
        self.gpu_used: int | None = 10 * 2**30
        self.gpu_total: int | None = 80 * 2**30
        self.trt_llm = False
        self.trt_waiting = 0
        self.trt_scheduled = 0
        self.trt_paused = 0
        """Requests in TensorRT-LLM's batch manager not scheduled this iteration: counted in
        ``request_type="active"`` (scheduled + paused), never in ``"waiting"`` (the executor's queue)."""
        self.kv_fraction = 0.0
        self.histogram_latencies = False
        self._first_response: list[float] = []
        self.summary_latencies = False
        """``--metrics-config summary_latencies=true``: ``nv_inference_queue_summary_us`` with quantiles."""
        self._queue_times: list[float] = []
        self.vllm_backend = False
        """The model runs on Triton's vLLM backend, which exports vLLM's counters with model/version labels."""
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.garbage_line: str | None = None
        self.nan_metrics: set[str] = set()
        self.missing_metrics: set[str] = set()
        self.requests: list[tuple[str, str, bytes]]
        self._http = Listener(http_factory(_Server, _HttpHandler, self), "fake-triton-http")
        self._metrics = Listener(http_factory(_Server, _MetricsHandler, self), "fake-triton-metrics")

    # -- lifecycle (start / stop / begin_loading / finish_loading: tests.fakes.base.FakeServer) --------
    def listeners(self) -> tuple[Listener, ...]:
        return (self._http, self._metrics)

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._http.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self._metrics.port}"

    # -- knobs ----------------------------------------------------------------------------------
    def observe_first_response(self, *ms: float) -> None:
        with self.lock:
            self._first_response.extend(ms)

    def observe_queue(self, *us: float) -> None:
        """Queue times (µs) of finished requests for the queue summary (its window: everything seen)."""
        with self.lock:
            self._queue_times.extend(us)

    def server_ready(self) -> bool:
        """--strict-readiness: all models READY, ignoring ones unloaded on purpose."""
        return all(state == "READY" or self.reasons.get(m) == "unloaded" for m, state in self.models.items())

    # -- metrics --------------------------------------------------------------------------------
    def render_metrics(self) -> bytes:
        with self.lock:
            lines: list[str] = []

            def family(name: str, kind: str, doc: str, rows: list[tuple[dict[str, str], float]]) -> None:
                if name in self.missing_metrics:
                    return
                lines.append(f"# HELP {name} {doc}")
                lines.append(f"# TYPE {name} {kind}")
                for labels, value in rows:
                    v = float("nan") if name in self.nan_metrics else value
                    lbl = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
                    lines.append(f"{name}{{{lbl}}} {_num(v)}" if lbl else f"{name} {_num(v)}")

            loaded = [m for m, s in sorted(self.models.items()) if m in self.versions]
            first = self.metrics_model if self.metrics_model in loaded else None

            def per_model(value: float, extra: dict[str, str] | None = None) -> list[tuple[dict[str, str], float]]:
                rows = []
                for m in loaded:
                    labels = {"model": m, "version": self.versions[m], **(extra or {})}
                    if self.gpu_uuid is not None:
                        labels["gpu_uuid"] = self.gpu_uuid
                    rows.append((labels, value if m == first else 0.0))
                return rows

            family("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
                   per_model(self.success))
            failure: list[tuple[dict[str, str], float]] = []
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                failure += per_model(0, {"reason": reason})
            family("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes", failure)
            family("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)",
                   per_model(self.inference_count))
            family("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)",
                   per_model(self.inference_count))
            family("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds (includes cached requests)",
                   per_model(self.request_us))
            family("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds (includes cached requests)",
                   per_model(self.queue_us))
            compute = max(0, self.request_us - self.queue_us)
            family("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds (does not include cached requests)",
                   per_model(0))
            family("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds (does not include cached requests)",
                   per_model(compute))
            family("nv_inference_compute_output_duration_us", "counter", "Cumulative inference compute output duration in microseconds (does not include cached requests)",
                   per_model(0))
            family("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model.",
                   per_model(self.pending))
            family("nv_model_load_duration_secs", "gauge", "Model load time in seconds", per_model(1.5))
            if self.histogram_latencies and loaded:
                self._first_response_family(lines, loaded, first)
            if self.summary_latencies and loaded:
                self._queue_summary_family(lines, loaded, first)
            if self.vllm_backend and first is not None:
                base = {"model": first, "version": self.versions[first]}
                family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
                       [(base, self.prompt_tokens)])
                family("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
                       [(base, self.generation_tokens)])
            if self.gpu_uuid is not None and self.gpu_used is not None and self.gpu_total is not None:
                g = {"gpu_uuid": self.gpu_uuid}
                family("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", [(g, 0.5)])
                family("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", [(g, self.gpu_total)])
                family("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", [(g, self.gpu_used)])
                family("nv_gpu_power_usage", "gauge", "GPU power usage in watts", [(g, 300.5)])
                family("nv_gpu_power_limit", "gauge", "GPU power management limit in watts", [(g, 700)])
                family("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started",
                       [(g, 12345)])
            family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]", [({}, 0.25)])
            if self.trt_llm and first is not None:
                base = {"model": first, "version": self.versions[first]}
                req = [({**base, "request_type": t}, v) for t, v in (
                    ("waiting", self.trt_waiting), ("context", 0), ("scheduled", self.trt_scheduled), ("max", 512),
                    ("active", self.trt_scheduled + self.trt_paused))]
                family("nv_trt_llm_request_metrics", "gauge", "TRT LLM request metrics", req)
                kv = [({**base, "kv_cache_block_type": t}, v) for t, v in (
                    ("fraction", self.kv_fraction), ("tokens_per", 64), ("used", round(self.kv_fraction * 1000)),
                    ("free", 1000 - round(self.kv_fraction * 1000)), ("max", 1000))]
                family("nv_trt_llm_kv_cache_block_metrics", "gauge", "TRT LLM KV cache block metrics", kv)
            text = "\n".join(lines) + "\n"
            if self.garbage_line is not None:
                text += self.garbage_line + "\n"
            return text.encode()

    def _queue_summary_family(self, lines: list[str], loaded: list[str], first: str | None) -> None:
        """prometheus-cpp's summary: quantiles 0.5 .. 0.999 over its window, NaN when it saw nothing."""
        name = "nv_inference_queue_summary_us"
        if name in self.missing_metrics:
            return
        lines.append(f"# HELP {name} Summary of inference queuing duration in microseconds (includes cached requests)")
        lines.append(f"# TYPE {name} summary")
        for m in loaded:
            obs = sorted(self._queue_times) if m == first else []
            base = f'model="{m}",version="{self.versions[m]}"'
            for q in (0.5, 0.9, 0.95, 0.99, 0.999):
                if name in self.nan_metrics or not obs:
                    value = float("nan")
                else:
                    value = obs[min(len(obs) - 1, max(0, math.ceil(q * len(obs)) - 1))]
                lines.append(f'{name}{{{base},quantile="{q}"}} {_num(value)}')
            lines.append(f"{name}_sum{{{base}}} {_num(sum(obs))}")
            lines.append(f"{name}_count{{{base}}} {_num(len(obs))}")

    def _first_response_family(self, lines: list[str], loaded: list[str], first: str | None) -> None:
        name = "nv_inference_first_response_histogram_ms"
        if name in self.missing_metrics:
            return
        nan = name in self.nan_metrics
        lines.append(f"# HELP {name} Duration from request to first response in milliseconds")
        lines.append(f"# TYPE {name} histogram")
        for m in loaded:
            obs = self._first_response if m == first else []
            base = f'model="{m}",version="{self.versions[m]}"'
            for bound in (*FIRST_RESPONSE_BUCKETS, float("inf")):
                count = float("nan") if nan else sum(1 for v in obs if v <= bound)
                le = "+Inf" if bound == float("inf") else _num(bound)
                lines.append(f'{name}_bucket{{le="{le}",{base}}} {_num(count)}')
            lines.append(f"{name}_sum{{{base}}} {_num(sum(obs))}")
            lines.append(f"{name}_count{{{base}}} {_num(len(obs))}")

    def index_body(self, ready_only: bool) -> list[dict[str, str]]:
        rows = []
        for m in sorted(self.models):
            state = self.models[m]
            if ready_only and state != "READY":
                continue
            row = {"name": m}
            if m in self.versions:
                row["version"] = self.versions[m]
            row["state"] = state
            if self.reasons.get(m):
                row["reason"] = self.reasons[m]
            rows.append(row)
        return rows


class _Base(FakeHandler):
    server: _Server
    server_version = "triton"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def _error(self, status: int, message: str) -> None:
        self._send(status, json.dumps({"error": message}, separators=(",", ":")).encode(), "application/json")


class _MetricsHandler(_Base):
    def do_GET(self) -> None:
        self._body()
        if self.path.split("?")[0] != "/metrics":
            self._send(404, b"Not Found", "text/plain")
            return
        self._send(200, self.server.fake.render_metrics(), METRICS_CONTENT_TYPE)


class _HttpHandler(_Base):
    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        body = self._body()
        path = self.path.split("?")[0]
        with fake.lock:
            fake.requests.append((method, self.path, body))
            if m := _SERVER_RE.fullmatch(path):
                self._server_route(method, m.group(1))
            elif m := _MODEL_RE.fullmatch(path):
                self._model_route(method, m.group(1), m.group(2), m.group(3))
            elif m := _CONTROL_RE.fullmatch(path):
                self._control_route(method, m.group(1), m.group(2), m.group(3), m.group(4), body)
            else:
                self._error(404, "Not Found")

    def _server_route(self, method: str, which: str | None) -> None:
        fake = self.server.fake
        if method != "GET":
            self._error(405, "Method Not Allowed")
            return
        if fake.exiting:
            self._error(503, "Server exiting")
            return
        if which is None:
            body = {"name": "triton", "version": "2.61.0",
                    "extensions": ["classification", "sequence", "model_repository", "model_repository(unload_dependents)",
                                   "schedule_policy", "model_configuration", "system_shared_memory",
                                   "cuda_shared_memory", "binary_tensor_data", "parameters", "statistics", "trace",
                                   "logging"]}
            self._send(200, json.dumps(body).encode(), "application/json")
            return
        ok = True if which == "live" else fake.server_ready()
        self._send(200 if ok else 400)

    def _model_route(self, method: str, model: str, version: str | None, action: str | None) -> None:
        fake = self.server.fake
        if action != "ready":
            self._error(404, "Not Found")  # only readiness is faked
            return
        if method != "GET":
            self._error(405, "Method Not Allowed")
            return
        if fake.exiting:
            self._error(503, "Server exiting")
            return
        if model not in fake.models:
            self._error(400, f"Request for unknown model: '{model}' is not found")
            return
        state = fake.models[model]
        if model not in fake.versions or state == "UNAVAILABLE":
            self._error(404, f"Request for unknown model: '{model}' has no available versions")
            return
        if version is not None and version != fake.versions[model]:
            self._error(404, f"Request for unknown model: '{model}' version {version} is not found")
            return
        if state != "READY":
            self._error(400, "Model version not ready")
            return
        self._send(200)

    def _control_route(self, method: str, repo: str | None, what: str, model: str | None, action: str | None,
                       body: bytes) -> None:
        fake = self.server.fake
        if method != "POST":
            self._error(405, "Method Not Allowed")
            return
        if repo is not None:
            self._error(501, "'repository_name' specification is not supported")
            return
        if fake.exiting:
            self._error(503, "Server exiting")
            return
        try:
            params = json.loads(body) if body else {}
        except ValueError:
            self._error(400, "failed to parse the request JSON buffer: Invalid value. at 0")
            return
        if what == "index":
            ready_only = bool(params.get("ready", False)) if isinstance(params, dict) else False
            self._send(200, json.dumps(fake.index_body(ready_only), separators=(",", ":")).encode(), "application/json")
            return
        assert model is not None
        if fake.model_control_mode != "explicit":
            self._error(503, NOT_EXPLICIT)
            return
        if action == "load":
            if model not in fake.repository or model in fake.load_failures:
                reason = fake.load_failures.get(model, "failed to poll from model repository")
                self._error(500, f"failed to load '{model}', {reason}")
                return
            fake.models[model] = "READY"
            fake.versions[model] = "1"
            fake.reasons.pop(model, None)
        else:
            if model in fake.models:
                fake.models[model] = "UNAVAILABLE"
                fake.versions.pop(model, None)
                fake.reasons[model] = "unloaded"
        self._send(200, b"", "application/json")
