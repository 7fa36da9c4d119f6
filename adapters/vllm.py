"""Driver for one vLLM 0.33.0 OpenAI-compatible server (``shared/design/CONTRACTS.md`` section 1).

``VllmDriver(base_url, timeout_s, model_name=None)`` talks plain HTTP through ``urllib`` with a bounded
timeout on every request and translates every library error at the boundary:

* connection refused / reset / timeout / DNS -> :class:`~controlplane.domain.errors.Unavailable`
  (vLLM refuses connections while the model loads: uvicorn only starts after engine init);
* ``/health`` 200 -> ``True``, 503 (``EngineDeadError``) or any other 5xx -> ``False``;
* dev-mode routes (``/sleep``, ``/wake_up``, ``/is_sleeping``) answering Starlette's route 404 ->
  :class:`WarmPathUnavailable` (the server was started without ``VLLM_SERVER_DEV_MODE=1``; callers
  degrade to cold starts); 400 ErrorResponse -> :class:`EngineRejected` (a ``ValidationError``).

Metrics (:meth:`VllmDriver.sample`), parsed with ``prometheus_client.parser``:

* ``running``/``waiting``/``kv_usage`` are the gauges ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (a 0..1 fraction), summed over
  ``engine`` labels (kv: mean over engines) for the selected ``model_name``.
* Token rates are counter deltas (``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``)
  divided by the elapsed ``now_ms`` between two successful scrapes; the first scrape has no baseline,
  so it reports 0 *and names both rates in* ``InstanceSample.unknown`` (a 0 there is not "idle"). A
  counter that went down (server restart) counts from zero, as Prometheus' ``rate()`` does.
* Queue time apart from compute: ``queue_p95_ms`` is the p95 of ``vllm:request_queue_time_seconds``
  (time from arrival to first scheduling) over the interval, by the same delta-of-buckets rule as
  TTFT below; ``statistics()`` also keeps the p95 of ``vllm:request_prefill_time_seconds`` and
  ``vllm:request_decode_time_seconds``, so a TTFT over the SLO can be told apart: queueing
  (replicas short) or prefill (long prompts). These histograms' first bucket is 0.3 s
  (``buckets.py``), so the p95 is coarse below it: any p95 up to 300 ms reads as 300 ms.
* ``ttft_p99_ms`` comes from the *difference* of the ``vllm:time_to_first_token_seconds`` cumulative
  bucket counts between this scrape and the previous successful one. p99 is the **upper bound** (``le``)
  of the first bucket whose cumulative delta reaches ``ceil(0.99 * n)`` observations (Prometheus
  buckets count ``value <= le``, so an observation exactly on a boundary belongs to that bucket). If
  that bucket is ``+Inf`` the largest finite bound (2560 s) is reported. ``None`` on the first scrape,
  when no request got its first token since the previous scrape, or when the histogram is absent/NaN.

Malformed metrics policy (never an unhandled exception): a scrape that cannot be parsed (garbage
line), or where ``running``, ``waiting``, ``kv_cache_usage_perc``, ``prompt_tokens`` or
``generation_tokens`` is missing, NaN/infinite or out of range, raises :class:`MetricsMalformed`
(a ``TemporaryError``) naming the field; nothing is reported as a silent 0 because a fake zero load
would drive a scale-in. The failed scrape does not replace the previous baseline, so the next good
scrape computes rates and TTFT over the whole interval. Only the optional TTFT falls back to ``None``.
Every failure is also logged as one structlog event (``vllm.metrics_malformed``,
``vllm.warm_path_unavailable``, ``vllm.unreachable``).
"""

from __future__ import annotations

import dataclasses
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
from controlplane.domain.engines import CAPABILITIES, Engine
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.observations import InstanceSample
from controlplane.domain.start_tiers import VLLM_SLEEP_LEVEL

__all__ = [
    "EngineRejected", "MetricsMalformed", "UnexpectedResponse", "VllmDriver", "WarmPathUnavailable",
    "histogram_quantile_upper_ms", "parse_exposition",
]

log = structlog.get_logger("adapters.vllm")

ENGINE = "vLLM"
DEV_MODE_OFF = " is not routed (VLLM_SERVER_DEV_MODE is off)"

MAX_RESPONSE_BYTES = 8 * 1024 * 1024
"""Bound on a response body read (a /metrics page is tens of KiB)."""

TTFT_QUANTILE = 0.99

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_BEFORE_0_10 = "vllm:gpu_cache_usage_perc"
"""The same 0..1 fraction under its name before vLLM PR #18354 (removed in 0.12): read when the
current name is absent, so a server of an older release is observed, not refused."""
PROMPT_TOKENS = "vllm:prompt_tokens"  # counter family; sample name has _total
GENERATION_TOKENS = "vllm:generation_tokens"
TTFT = "vllm:time_to_first_token_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
PHASE_QUANTILE = 0.95
"""Quantile of the request-phase histograms (queue, prefill, decode) reported per interval."""
RATE_FIELDS = ("generation_tokens_per_s", "prompt_tokens_per_s")
"""Sample fields that are counter deltas: unknown on the first scrape (no baseline yet)."""


@dataclass(frozen=True, slots=True)
class _Scrape:
    at_ms: int
    prompt_tokens: float
    generation_tokens: float
    ttft_buckets: tuple[tuple[float, float], ...] | None
    """(upper bound, cumulative count) sorted by bound, +Inf last; None when absent or NaN."""
    queue_buckets: tuple[tuple[float, float], ...] | None = None
    prefill_buckets: tuple[tuple[float, float], ...] | None = None
    decode_buckets: tuple[tuple[float, float], ...] | None = None


@dataclass(slots=True)
class DriverStatistics:
    scrapes: int = 0
    malformed: int = 0
    unreachable: int = 0
    last_error: str = ""
    queue_p95_ms: float | None = None
    prefill_p95_ms: float | None = None
    decode_p95_ms: float | None = None


class VllmDriver:
    """One vLLM server. Thread-safe; keeps the previous successful scrape for deltas."""

    def __init__(self, base_url: str, timeout_s: float, model_name: str | None = None, *,
                 sleep_level: int = VLLM_SLEEP_LEVEL) -> None:
        if timeout_s <= 0:
            raise ValidationError("timeout_s", "must be > 0")
        if sleep_level not in CAPABILITIES[Engine.VLLM].sleep_levels:
            raise ValidationError("sleep_level", f"vLLM sleeps at levels {CAPABILITIES[Engine.VLLM].sleep_levels}, "
                                                 f"got {sleep_level}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.model_name = model_name
        self.sleep_level = sleep_level
        self._lock = threading.Lock()
        self._previous: _Scrape | None = None
        self._stats = DriverStatistics()

    # -- HTTP boundary --------------------------------------------------------------------------
    def _request(self, method: str, route: str, query: list[tuple[str, str]] | None = None) -> tuple[int, bytes, str]:
        """(status, body, content type) for any HTTP answer; Unavailable when there is no answer."""
        url = self.base_url + route
        if query:
            url += "?" + urllib.parse.urlencode(query)

        def unreachable(reason: object) -> None:
            count_unreachable(self._lock, self._stats, route, reason)
            log.warning("vllm.unreachable", base_url=self.base_url, route=route, reason=str(reason))

        return http_request(ENGINE, method, url, timeout_s=self.timeout_s, max_bytes=MAX_RESPONSE_BYTES,
                            data=b"" if method == "POST" else None, on_unreachable=unreachable)

    def _json_body(self, route: str, body: bytes) -> dict[str, Any]:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise UnexpectedResponse(f"vLLM {route}: body is not JSON: {body[:200]!r}") from exc
        if not isinstance(obj, dict):
            raise UnexpectedResponse(f"vLLM {route}: expected a JSON object, got {body[:200]!r}")
        return obj

    def _dev_call(self, method: str, route: str, query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        status, body, _ = self._request(method, route, query)
        if status == 200:
            return self._json_body(route, body)
        if status in (404, 405):
            log.warning("vllm.warm_path_unavailable", base_url=self.base_url, route=route, status=status,
                        fallback="cold_start")
            raise WarmPathUnavailable(self.base_url, route, DEV_MODE_OFF)
        if status == 400:
            raise self._rejected(route, status, body)
        raise UnexpectedResponse(f"vLLM {route}: HTTP {status}: {body[:200]!r}")

    def _rejected(self, route: str, status: int, body: bytes) -> EngineRejected:
        try:
            err = json.loads(body)["error"]
            message, error_type, param = str(err["message"]), str(err.get("type", "")), err.get("param")
        except (ValueError, KeyError, TypeError):
            message, error_type, param = body[:200].decode(errors="replace"), "", None
        return EngineRejected(str(param or route), message, status=status, error_type=error_type)

    # -- endpoints ------------------------------------------------------------------------------
    def health(self) -> bool:
        """``True`` on 200, ``False`` on 503 (engine dead) or another 5xx; Unavailable while loading."""
        status, _, _ = self._request("GET", "/health")
        if status == 200:
            return True
        if status >= 500:
            return False
        raise UnexpectedResponse(f"vLLM /health: HTTP {status}")

    def version(self) -> str:
        status, body, _ = self._request("GET", "/version")
        if status != 200:
            raise UnexpectedResponse(f"vLLM /version: HTTP {status}")
        return str(self._json_body("/version", body).get("version", ""))

    def sleep(self, level: int = 1, mode: str = "abort") -> int:
        """``POST /sleep``; returns the level the engine reports. Dev mode only."""
        obj = self._dev_call("POST", "/sleep", [("level", str(level)), ("mode", mode)])
        if obj.get("status") != "sleeping" or not isinstance(obj.get("level"), int):
            raise UnexpectedResponse(f"vLLM /sleep: unexpected body {obj!r}")
        return int(obj["level"])

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """``POST /wake_up``; ``True`` when fully awake, ``False`` when still partially sleeping."""
        obj = self._dev_call("POST", "/wake_up", [("tags", t) for t in tags or ()])
        if obj.get("status") not in ("awake", "sleeping"):
            raise UnexpectedResponse(f"vLLM /wake_up: unexpected body {obj!r}")
        return obj["status"] == "awake"

    def is_sleeping(self) -> bool:
        obj = self._dev_call("GET", "/is_sleeping")
        if not isinstance(obj.get("is_sleeping"), bool):
            raise UnexpectedResponse(f"vLLM /is_sleeping: unexpected body {obj!r}")
        return bool(obj["is_sleeping"])

    # -- EngineDriver (adapters/engines.py) -----------------------------------------------------
    def is_ready(self) -> bool:
        return self.health()

    def warm_down(self) -> None:
        """``POST /sleep?level=<sleep_level>&mode=wait``: in-flight requests finish first."""
        self.sleep(level=self.sleep_level, mode="wait")

    def warm_up(self) -> None:
        self.wake_up()

    def in_flight(self) -> int:
        """``vllm:num_requests_running + vllm:num_requests_waiting`` of one ``/metrics`` scrape: every
        request the engine holds. Leaves the :meth:`sample` baseline (rates, TTFT deltas) alone."""
        status, body, _ = self._request("GET", "/metrics")
        if status != 200:
            raise UnexpectedResponse(f"vLLM /metrics: HTTP {status}")
        _, gauges = self._parse(body)
        return int(gauges[RUNNING]) + int(gauges[WAITING])

    # -- metrics --------------------------------------------------------------------------------
    def sample(self, instance_id: InstanceId, deployment: DeploymentId, now_ms: int) -> InstanceSample:
        status, body, _ = self._request("GET", "/metrics")
        if status != 200:
            raise UnexpectedResponse(f"vLLM /metrics: HTTP {status}")
        try:
            current, gauges = self._parse(body)
        except MetricsMalformed as exc:
            with self._lock:
                self._stats.malformed += 1
                self._stats.last_error = str(exc)
            log.warning("vllm.metrics_malformed", base_url=self.base_url, field=exc.field, problem=exc.problem)
            raise
        current = dataclasses.replace(current, at_ms=now_ms)
        with self._lock:
            previous, self._previous = self._previous, current
            queue, prefill, decode = (_phase_ms(previous, current, name) for name in
                                      ("queue_buckets", "prefill_buckets", "decode_buckets"))
            s = self._stats
            s.scrapes += 1
            s.queue_p95_ms, s.prefill_p95_ms, s.decode_p95_ms = queue, prefill, decode
        prompt_rate, gen_rate = _rates(previous, current)
        return InstanceSample(
            instance_id=instance_id, deployment=deployment, at_ms=now_ms,
            running=int(gauges[RUNNING]), waiting=int(gauges[WAITING]), kv_usage=gauges[KV_USAGE],
            prompt_tokens_per_s=prompt_rate, generation_tokens_per_s=gen_rate,
            ttft_p99_ms=_ttft_p99_ms(previous, current), queue_p95_ms=queue,
            # The token rates are counter deltas: with no earlier scrape they are not 0, but unknown.
            unknown=RATE_FIELDS if previous is None or current.at_ms <= previous.at_ms else (),
        )

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            s = self._stats
            return {"scrapes": s.scrapes, "malformed": s.malformed, "unreachable": s.unreachable,
                    "last_error": s.last_error, "queue_p95_ms": s.queue_p95_ms, "prefill_p95_ms": s.prefill_p95_ms,
                    "decode_p95_ms": s.decode_p95_ms}

    def _parse(self, body: bytes) -> tuple[_Scrape, dict[str, float]]:
        families = parse_exposition(body)
        values: dict[str, list[tuple[dict[str, str], float]]] = {}
        for name, sample_name in ((RUNNING, RUNNING), (WAITING, WAITING), (KV_USAGE, KV_USAGE),
                                  (PROMPT_TOKENS, PROMPT_TOKENS + "_total"),
                                  (GENERATION_TOKENS, GENERATION_TOKENS + "_total")):
            values[name] = self._select(families.get(name, []), sample_name)
        if not values[KV_USAGE]:
            values[KV_USAGE] = self._select(families.get(KV_USAGE_BEFORE_0_10, []), KV_USAGE_BEFORE_0_10)
        gauges: dict[str, float] = {}
        for name in (RUNNING, WAITING, PROMPT_TOKENS, GENERATION_TOKENS):
            gauges[name] = _finite_sum(name, values[name])
        kv = _finite_sum(KV_USAGE, values[KV_USAGE]) / len(values[KV_USAGE])
        if not 0.0 <= kv <= 1.0:
            raise MetricsMalformed(KV_USAGE, f"{kv} is not a 0..1 fraction", engine=ENGINE)
        gauges[KV_USAGE] = kv
        for name in (RUNNING, WAITING):
            check_count(name, gauges[name], engine=ENGINE)
        ttft, queue, prefill, decode = (
            cumulative_buckets(self._select(families.get(name, []), name + "_bucket", keep_le=True))
            for name in (TTFT, QUEUE_TIME, PREFILL_TIME, DECODE_TIME))
        return _Scrape(0, gauges[PROMPT_TOKENS], gauges[GENERATION_TOKENS], ttft, queue, prefill, decode), gauges

    def _select(self, samples: list[Any], sample_name: str, *, keep_le: bool = False) -> list[tuple[dict[str, str], float]]:
        """Samples named ``sample_name`` for our model (every model when ``model_name`` is None)."""
        out = []
        for s in samples:
            if s.name != sample_name:
                continue
            if self.model_name is not None and s.labels.get("model_name") != self.model_name:
                continue
            out.append((s.labels, float(s.value)))
        models = {labels.get("model_name") for labels, _ in out}
        if self.model_name is None and len(models) > 1:
            raise MetricsMalformed(sample_name, f"several models {sorted(map(str, models))}: pass model_name", engine=ENGINE)
        return out


def parse_exposition(body: bytes) -> dict[str, list[Any]]:
    """Family name -> samples. Any parse failure becomes :class:`MetricsMalformed`."""
    return engine_http.parse_exposition(body, engine=ENGINE)


def _finite_sum(name: str, samples: list[tuple[dict[str, str], float]]) -> float:
    if not samples:
        raise MetricsMalformed(name, "missing", engine=ENGINE)
    total = 0.0
    for labels, value in samples:
        if not math.isfinite(value):
            raise MetricsMalformed(name, f"non-finite value {value} for engine {labels.get('engine')!r}", engine=ENGINE)
        total += value
    return total


def _rates(previous: _Scrape | None, current: _Scrape) -> tuple[float, float]:
    if previous is None or current.at_ms <= previous.at_ms:
        return 0.0, 0.0
    seconds = (current.at_ms - previous.at_ms) / 1000.0
    return (counter_delta(previous.prompt_tokens, current.prompt_tokens) / seconds,
            counter_delta(previous.generation_tokens, current.generation_tokens) / seconds)


def _ttft_p99_ms(previous: _Scrape | None, current: _Scrape) -> float | None:
    if previous is None:
        return None
    seconds = histogram_delta_quantile(TTFT_QUANTILE, previous.ttft_buckets, current.ttft_buckets)
    return None if seconds is None else seconds * 1000.0


def _phase_ms(previous: _Scrape | None, current: _Scrape, which: str) -> float | None:
    """p95 (ms, a bucket's upper bound) of one request-phase histogram over the interval; None on the
    first scrape, without the histogram or with no request finishing that phase since."""
    if previous is None:
        return None
    seconds = histogram_delta_quantile(PHASE_QUANTILE, getattr(previous, which), getattr(current, which))
    return None if seconds is None else seconds * 1000.0


def histogram_quantile_upper_ms(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """Upper bound (ms) of the first bucket whose cumulative count reaches ``ceil(q * n)``.

    ``cumulative`` is (le seconds, cumulative count) sorted by le with +Inf last; None when n == 0. A
    quantile in the +Inf bucket reports the largest finite bound.
    """
    seconds = engine_http.histogram_quantile_upper(q, cumulative)
    return None if seconds is None else seconds * 1000.0
