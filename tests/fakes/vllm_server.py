"""A protocol-faithful fake of vLLM 0.33.0's OpenAI-compatible HTTP server (CONTRACTS.md section 1).

What it reproduces exactly:

* ``GET /health`` and ``GET|POST /ping``: ``200`` with an empty body, ``503`` with an empty body once the
  engine is dead (``dead=True``).
* ``GET /version`` -> ``{"version": "0.33.0"}``; ``GET /load`` -> ``{"server_load": 0}``; ``GET /v1/models``.
* ``GET /metrics``: Prometheus text rendered by ``prometheus_client`` itself, content type
  ``prometheus_client.CONTENT_TYPE_LATEST``; every engine metric carries ``engine="0"`` and
  ``model_name``; counters are exposed with ``_total`` (and ``_created``);
  ``vllm:kv_cache_usage_perc`` is a 0..1 fraction; ``vllm:time_to_first_token_seconds`` uses vLLM's
  buckets and Prometheus' ``value <= le`` bucket rule.
* Dev-mode routes only when ``dev_mode=True`` (``VLLM_SERVER_DEV_MODE=1``): ``POST /sleep?level=&mode=``,
  ``POST /wake_up?tags=``, ``GET /is_sleeping``. Otherwise Starlette's routing 404 ``{"detail":"Not Found"}``.
* Invalid query parameters -> ``400`` ErrorResponse ``{"error": {"message", "type", "param", "code"}}``.
* Model load: the socket is bound but not listening, so clients get *connection refused*, not 503
  (``start(loading=True)`` / :meth:`FakeVllmServer.begin_loading` / :meth:`FakeVllmServer.finish_loading`).

Knobs for fault tests: ``running``, ``waiting``, ``kv_usage``, ``prompt_tokens``, ``generation_tokens``,
:meth:`observe_ttft`, ``dead``, ``garbage_line`` (appended verbatim to /metrics), ``nan_metrics`` (family
names whose samples render as ``NaN``), ``missing_metrics`` (family names left out).

Threads: one ``serve_forever`` thread per listening period plus one daemon thread per request
(``ThreadingHTTPServer``); :meth:`stop` joins the serve thread and closes the socket.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from tests.fakes.base import (
    FakeHandler,
    FakeHttpServer,
    FakeServer,
    Listener,
    http_factory,
    refused,
)

__all__ = ["TTFT_BUCKETS", "VLLM_VERSION", "FakeVllmServer", "error_response", "refused"]

VLLM_VERSION = "0.33.0"

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)
"""``wheel:vllm/v1/metrics/loggers.py``: ``vllm:time_to_first_token_seconds`` buckets (+Inf implied)."""

REQUEST_TIME_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)
"""``wheel:vllm/v1/metrics/loggers.py``: ``request_latency_buckets`` of the request-phase histograms
(``vllm:request_queue_time_seconds``, ``_prefill_``, ``_decode_``...; +Inf implied)."""
PHASES = {"queue": ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
          "prefill": ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
          "decode": ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.")}

SLEEP_MODES = ("abort", "wait", "keep")
WAKE_TAGS = ("weights", "kv_cache")
LABELS = ["engine", "model_name"]


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _Server(FakeHttpServer):
    fake: FakeVllmServer


class FakeVllmServer(FakeServer):
    """One fake vLLM instance on 127.0.0.1. Use :meth:`start` / :meth:`stop` (or a ``with`` block)."""

    def __init__(self, *, model_name: str = "meta-llama/Llama-3.1-8B-Instruct", dev_mode: bool = False) -> None:
        super().__init__()
        self.model_name = model_name
        self.dev_mode = dev_mode
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.dead = False
        self.garbage_line: str | None = None
        self.nan_metrics: set[str] = set()
        self.missing_metrics: set[str] = set()
        self.sleep_level: int | None = None
        self.asleep_tags: set[str] = set()
        self.requests: list[tuple[str, str]]
        """(method, path-with-query) of every request served, for assertions."""
        self._ttft: list[float] = []
        self._phases: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self._created = time.time()
        self._listener = Listener(http_factory(_Server, _Handler, self), "fake-vllm")

    # -- lifecycle (start / stop / begin_loading / finish_loading: tests.fakes.base.FakeServer) --------
    def listeners(self) -> tuple[Listener, ...]:
        return (self._listener,)

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._listener.port}"

    # -- knobs ----------------------------------------------------------------------------------
    def observe_ttft(self, *seconds: float) -> None:
        with self.lock:
            self._ttft.extend(seconds)

    def observe_phase(self, phase: str, *seconds: float) -> None:
        """Record finished requests' time in ``phase`` ("queue", "prefill" or "decode")."""
        with self.lock:
            self._phases[phase].extend(seconds)

    # -- rendering ------------------------------------------------------------------------------
    def render_metrics(self) -> bytes:
        with self.lock:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Collector(self._families()))
            text = generate_latest(registry)
            if self.garbage_line is not None:
                text += self.garbage_line.encode() + b"\n"
            return text

    def _value(self, name: str, value: float) -> float:
        return float("nan") if name in self.nan_metrics else float(value)

    def _families(self) -> list[Metric]:
        lv = ["0", self.model_name]
        out: list[Metric] = []

        def gauge(name: str, doc: str, value: float) -> None:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(lv, self._value(name, value))
            out.append(g)

        def counter(name: str, doc: str, value: float) -> None:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(lv, self._value(name, value), created=self._created)
            out.append(c)

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", self.running)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason", "Number of requests waiting to be processed, by reason.",
            labels=[*LABELS, "reason"],
        )
        by_reason.add_metric([*lv, "capacity"], float(self.waiting))
        by_reason.add_metric([*lv, "deferred"], 0.0)
        out.append(by_reason)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv_usage)
        sleep_state = GaugeMetricFamily("vllm:engine_sleep_state", "Engine sleep state", labels=[*LABELS, "sleep_state"])
        for state, on in (("awake", self.sleep_level is None), ("weights_offloaded", self.sleep_level == 1),
                          ("discard_all", self.sleep_level == 2)):
            sleep_state.add_metric([*lv, state], 1.0 if on else 0.0)
        out.append(sleep_state)
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 0)
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        counter("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*LABELS, "finished_reason"])
        for reason in ("stop", "length", "abort", "error", "repetition"):
            success.add_metric([*lv, reason], 0.0, created=self._created)
        out.append(success)
        out.append(self._histogram(lv, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                   TTFT_BUCKETS, self._ttft))
        for phase, (name, doc) in PHASES.items():
            out.append(self._histogram(lv, name, doc, REQUEST_TIME_BUCKETS, self._phases[phase]))
        return [f for f in out if f.name not in self.missing_metrics]

    def _histogram(self, lv: list[str], name: str, doc: str, bounds: tuple[float, ...], values: list[float]) -> Metric:
        h = HistogramMetricFamily(name, doc, labels=LABELS)
        buckets = []
        for bound in (*bounds, float("inf")):
            count = sum(1 for v in values if v <= bound)  # Prometheus: a bucket counts value <= le
            buckets.append((_le(bound), self._value(name, count)))
        h.add_metric(lv, buckets, sum_value=self._value(name, sum(values)))
        return h

    def models_body(self) -> dict[str, Any]:
        card = {
            "id": self.model_name, "object": "model", "created": int(self._created), "owned_by": "vllm",
            "root": self.model_name, "parent": None, "max_model_len": 8192,
            "permission": [{
                "id": "modelperm-fake", "object": "model_permission", "created": int(self._created),
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        }
        return {"object": "list", "data": [card]}


class _Collector:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def error_response(message: str, *, param: str | None = None, code: int = 400) -> dict[str, Any]:
    """vLLM's ErrorResponse (``serve/engine/protocol.py``)."""
    return {"error": {"message": message, "type": "BadRequestError", "param": param, "code": code}}


_ROUTES: dict[str, tuple[tuple[str, ...], bool]] = {
    # path: (methods, dev-mode only)
    "/health": (("GET",), False),
    "/ping": (("GET", "POST"), False),
    "/version": (("GET",), False),
    "/load": (("GET",), False),
    "/metrics": (("GET",), False),
    "/v1/models": (("GET",), False),
    "/sleep": (("POST",), True),
    "/wake_up": (("POST",), True),
    "/is_sleeping": (("GET",), True),
}


class _Handler(FakeHandler):
    server: _Server
    server_version = "uvicorn"
    sys_version = ""

    # -- plumbing -------------------------------------------------------------------------------
    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, separators=(",", ":")).encode(), "application/json")

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        self._body()
        fake.record(method, self.path)
        route = _ROUTES.get(url.path)
        if route is None or (route[1] and not fake.dev_mode):
            self._json(404, {"detail": "Not Found"})
            return
        if method not in route[0]:
            self._json(405, {"detail": "Method Not Allowed"})
            return
        query = parse_qs(url.query, keep_blank_values=True)
        getattr(self, "_r_" + url.path.strip("/").replace("/", "_"))(query)

    # -- routes ---------------------------------------------------------------------------------
    def _r_health(self, query: dict[str, list[str]]) -> None:
        self._send(503 if self.server.fake.dead else 200)

    _r_ping = _r_health

    def _r_version(self, query: dict[str, list[str]]) -> None:
        self._json(200, {"version": VLLM_VERSION})

    def _r_load(self, query: dict[str, list[str]]) -> None:
        self._json(200, {"server_load": 0})

    def _r_v1_models(self, query: dict[str, list[str]]) -> None:
        self._json(200, self.server.fake.models_body())

    def _r_metrics(self, query: dict[str, list[str]]) -> None:
        self._send(200, self.server.fake.render_metrics(), CONTENT_TYPE_LATEST)

    def _r_sleep(self, query: dict[str, list[str]]) -> None:
        fake = self.server.fake
        raw_level = query.get("level", ["1"])[-1]
        mode = query.get("mode", ["abort"])[-1]
        try:
            level = int(raw_level)
        except ValueError:
            self._json(400, error_response(
                f"1 validation error: query.level: Input should be a valid integer, unable to parse string "
                f"as an integer (input {raw_level!r})", param="level"))
            return
        if not 0 <= level <= 2:
            self._json(400, error_response(
                f"1 validation error: query.level: Input should be between 0 and 2 (input {level})", param="level"))
            return
        if mode not in SLEEP_MODES:
            self._json(400, error_response(
                f"1 validation error: query.mode: Input should be 'abort', 'wait' or 'keep' (input {mode!r})",
                param="mode"))
            return
        with fake.lock:
            fake.sleep_level = level
            fake.asleep_tags = set(WAKE_TAGS)
        self._json(200, {"status": "sleeping", "level": level})

    def _r_wake_up(self, query: dict[str, list[str]]) -> None:
        fake = self.server.fake
        tags = query.get("tags")
        with fake.lock:
            if tags:
                fake.asleep_tags -= set(tags)
            else:
                fake.asleep_tags.clear()
            if not fake.asleep_tags:
                fake.sleep_level = None
            status = "sleeping" if fake.sleep_level is not None else "awake"
        self._json(200, {"status": status, "tags": tags if tags else None})

    def _r_is_sleeping(self, query: dict[str, list[str]]) -> None:
        self._json(200, {"is_sleeping": self.server.fake.sleep_level is not None})

