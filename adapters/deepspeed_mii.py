"""Driver for one DeepSpeed-MII 0.3.3 deployment (``shared/design/CONTRACTS.md`` section 3).

``MiiDriver(rest_url, grpc_address, timeout_s, meter_url=None)``:

* ``rest_url`` is the REST gateway URL exactly as ``docs/source/rest.rst`` writes it,
  ``http://{HOST}:{RESTFUL_API_PORT}/mii/{DEPLOYMENT_NAME}`` (default port 51080; the gateway exists only
  with ``enable_restful_api=True``);
* ``grpc_address`` is ``HOST:PORT`` of MII's gRPC **load balancer** (``port_number``, default 50050);
* ``meter_url`` is ``http://HOST:PORT`` of the pod's request meter (:mod:`adapters.mii_meter`, the
  ``controlplane mii-meter`` sidecar that client traffic passes through), or None where there is none.

Why no health endpoint is used for readiness: MII has no ``grpc.health.v1`` service and no metrics
endpoint, and the health routes that exist (gateway ``GET /healthz`` -> ``ok``, the FastAPI servers'
``GET /health``) are static: they answer while the replicas are dead. Readiness here is therefore

1. the gRPC load-balancer port accepts a TCP connection (what MII itself polls in
   ``_wait_until_server_is_live``; it proves a listener, not a working replica), **and**
2. a tiny generate through the gateway succeeds: ``POST {rest_url}`` with ``Content-Type:
   application/json`` and body ``{"prompts": ["ping"], "max_new_tokens": 1}`` (the kwargs of
   ``client.generate``) answers 200 with a JSON list of exactly one
   ``{"generated_text": str, "prompt_length": int, "generated_length": int, "finish_reason":
   "stop"|"length"|"none"}``.

Errors are translated at the boundary:

* connection refused / reset / timeout / DNS on either port -> :class:`~controlplane.domain.errors.Unavailable`
  (MII's ports refuse connections while replicas load);
* 4xx from the gateway (Flask: 400 bad JSON, 404 unknown deployment, 405, 415 wrong content type) ->
  :class:`EngineRejected` (a ``ValidationError``: the request or the URL is wrong, retrying will not help);
* 5xx (Flask's 500 when ``client.generate`` raised: backend/replicas failing behind the gateway) ->
  ``ready()`` returns ``False``; :meth:`MiiDriver.sample` raises :class:`UnexpectedResponse`;
* any other status, or a 200 body that is not the list above -> :class:`UnexpectedResponse`.

Metrics (:meth:`MiiDriver.sample`). MII itself exports nothing, so:

* ``ttft_p99_ms`` is always a **proxy**: the wall-clock milliseconds of the one probe generate above, from
  sending the HTTP request to reading the whole response (non-streaming, one generated token, a
  one-word prompt). It **includes** HTTP + Flask + the gRPC load-balancer hop + queueing in the replica's
  scheduler + prefill of a tiny prompt + one decode step + detokenisation. It is **not** a p99 (it is one
  observation), **not** the TTFT of real traffic (real prompts prefill longer; streaming clients see the
  first token earlier than a whole response), and it **adds** one request of load per sample. What it
  does track is queueing delay: under load a new request waits, and so does the probe. The meter's
  latency histogram is **not** used for it: MII's REST gateway answers non-streaming, so the meter sees
  the time to the *whole* reply (prefill + every decode step), which grows with the reply length, not
  with the wait for a first token; as a TTFT it would ask for replicas whenever replies are long. Its
  p99 is in :meth:`MiiDriver.statistics` (``meter_request_p99_ms``) for operators.
* **With a meter** (``meter_url``), one ``GET {meter_url}/metrics`` per sample, parsed with
  ``prometheus_client.parser``: ``running`` = ``controlplane_mii_requests_running`` (requests the
  gateway holds: MII's running batch *and* its internal queue, which the meter cannot tell apart),
  ``waiting`` = ``controlplane_mii_requests_waiting`` (requests waiting at the meter for a slot; 0
  unless the meter bounds concurrency), token rates = deltas of ``controlplane_mii_prompt_tokens_total``
  / ``controlplane_mii_generation_tokens_total`` over the ``now_ms`` between two successful scrapes (a
  counter that went down, a meter restart, counts from zero). ``unknown`` is ``("kv_usage",)``, plus
  the two token rates on the first scrape (no baseline yet: a 0 rate there would be a fake idle).
  Malformed meter metrics (unparseable text, a family missing, NaN/infinite, negative, a count out of
  the int32 range, the latency histogram without ``+Inf``) raise :class:`MetricsMalformed` naming the
  metric from :meth:`MiiDriver.scrape_meter`; :meth:`MiiDriver.sample` turns that (and a meter that
  does not answer) into the sample *without* a meter below, so the engine, whose probe succeeded,
  stays healthy while its load is reported unknown, never as fake zeros. A failed scrape keeps the
  previous baseline.
* **Without a meter**, ``running``, ``waiting``, ``kv_usage`` and the token rates are 0 and listed in
  ``InstanceSample.unknown`` (every :data:`~controlplane.domain.engines.LOAD_FIELDS` name): the core
  never scales down on them (the zeros once took a loaded MII deployment from 6 replicas to 1).
* GPU memory is never known (0). :meth:`MiiDriver.statistics` says which case holds
  (``metrics_endpoint``, ``missing``, ``ttft_source: "probe_latency"``, ``meter_url``).

Every failure is one structlog event (``mii.unreachable``, ``mii.rejected``, ``mii.unexpected``,
``mii.not_ready``, ``mii.meter_failed``); a successful sample logs ``mii.probe`` at debug level.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import structlog

from adapters import engine_http
from adapters.engine_http import (
    Buckets,
    EngineRejected,
    MetricsMalformed,
    UnexpectedResponse,
    check_count,
    count_unreachable,
    counter_delta,
    cumulative_buckets,
    histogram_delta_quantile,
    http_request,
    unreachable_reason,
)
from adapters.mii_meter import METRICS as METER_METRICS
from controlplane.domain.engines import LOAD_FIELDS
from controlplane.domain.errors import Unavailable, ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.observations import InstanceSample

__all__ = ["METER_MISSING_FIELDS", "MISSING_FIELDS", "EngineRejected", "MeterReading", "MetricsMalformed", "MiiDriver",
           "ProbeResult", "UnexpectedResponse", "parse_address"]

log = structlog.get_logger("adapters.deepspeed_mii")

ENGINE = "DeepSpeed-MII"
METER = "DeepSpeed-MII meter"

MAX_RESPONSE_BYTES = 1024 * 1024
PROBE_PROMPT = "ping"
PROBE_BODY: dict[str, Any] = {"prompts": [PROBE_PROMPT], "max_new_tokens": 1}
"""The exact probe request body (kwargs of ``client.generate``)."""
FINISH_REASONS = ("stop", "length", "none")
MISSING_FIELDS = ("running", "waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s",
                  "gpu_mem_used_bytes", "gpu_mem_total_bytes")
"""InstanceSample fields MII cannot supply without its meter (no metrics endpoint); reported as 0."""
METER_MISSING_FIELDS = ("kv_usage", "gpu_mem_used_bytes", "gpu_mem_total_bytes")
"""InstanceSample fields the meter cannot supply either (it sees requests, not the KV cache or GPUs)."""
UNKNOWN_WITHOUT_METER = tuple(sorted(LOAD_FIELDS))
UNKNOWN_WITH_METER = ("kv_usage",)
UNKNOWN_FIRST_SCRAPE = tuple(sorted(("kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s")))
METER_P99 = 0.99


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One successful probe: load balancer accepted, generate answered 200 with a valid body."""

    latency_ms: float
    generated_text: str
    prompt_length: int
    generated_length: int
    finish_reason: str


@dataclass(frozen=True, slots=True)
class MeterReading:
    """One scrape of the meter (``at_ms`` = the ``now_ms`` it was taken at)."""

    at_ms: int
    running: int
    waiting: int
    prompt_tokens: float
    generation_tokens: float
    duration: Buckets


@dataclass(slots=True)
class DriverStatistics:
    probes: int = 0
    unreachable: int = 0
    rejected: int = 0
    unexpected: int = 0
    last_error: str = ""
    last_probe_ms: float | None = None
    meter_scrapes: int = 0
    meter_failures: int = 0
    meter_request_p99_ms: float | None = None


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); :class:`ValidationError` naming ``grpc_address`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValidationError("grpc_address", f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class MiiDriver:
    """One MII deployment (REST gateway + gRPC load balancer). Thread-safe."""

    def __init__(self, rest_url: str, grpc_address: str, timeout_s: float, meter_url: str | None = None) -> None:
        if timeout_s <= 0:
            raise ValidationError("timeout_s", "must be > 0")
        parts = urllib.parse.urlsplit(rest_url.rstrip("/"))
        segments = parts.path.split("/")
        if parts.scheme not in ("http", "https") or not parts.netloc or len(segments) != 3 \
                or segments[1] != "mii" or not segments[2]:
            raise ValidationError("rest_url", f"{rest_url!r} is not http://HOST:PORT/mii/DEPLOYMENT_NAME")
        self.rest_url = rest_url.rstrip("/")
        self.gateway_url = f"{parts.scheme}://{parts.netloc}"
        self.deployment_name = urllib.parse.unquote(segments[2])
        self.grpc_address = grpc_address
        self._grpc = parse_address(grpc_address)
        self.timeout_s = timeout_s
        self.meter_url = _meter_url(meter_url) if meter_url is not None else None
        self._lock = threading.Lock()
        self._stats = DriverStatistics()
        self._previous: MeterReading | None = None

    # -- boundary -------------------------------------------------------------------------------
    def _note_unreachable(self, where: str, reason: object) -> None:
        count_unreachable(self._lock, self._stats, where, reason)
        log.warning("mii.unreachable", where=where, reason=str(reason))

    def _unreachable(self, where: str, exc: BaseException) -> Unavailable:
        reason = unreachable_reason(exc)
        self._note_unreachable(where, reason)
        return Unavailable(f"{ENGINE} {where} unreachable: {reason}")

    def _request(self, method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
        """(status, body) for any HTTP answer; Unavailable when there is no answer."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        status, payload, _ = http_request(ENGINE, method, url, timeout_s=self.timeout_s, max_bytes=MAX_RESPONSE_BYTES,
                                          data=body, headers=headers,
                                          on_unreachable=lambda reason: self._note_unreachable(url, reason))
        return status, payload

    def _fail(self, counter: str, event: str, exc: UnexpectedResponse | EngineRejected) -> None:
        with self._lock:
            setattr(self._stats, counter, getattr(self._stats, counter) + 1)
            self._stats.last_error = str(exc)
        log.warning(event, rest_url=self.rest_url, status=exc.status, problem=str(exc))

    # -- checks ---------------------------------------------------------------------------------
    def lb_accepts(self) -> None:
        """The gRPC load balancer port accepts a TCP connection (a port check only: no RPC is made,
        MII has no health service). Unavailable when refused or timed out."""
        try:
            with socket.create_connection(self._grpc, timeout=self.timeout_s):
                return
        except OSError as exc:
            raise self._unreachable(f"gRPC load balancer {self.grpc_address}", exc) from exc

    def gateway_alive(self) -> bool:
        """``GET /healthz`` -> ``ok``. Static in MII: proves the Flask process, nothing behind it."""
        status, body = self._request("GET", self.gateway_url + "/healthz")
        if status == 200 and body.strip() == b"ok":
            return True
        raise UnexpectedResponse(f"DeepSpeed-MII /healthz: HTTP {status}: {body[:200]!r}", status=status)

    def probe(self) -> ProbeResult:
        """Load-balancer port check, then the tiny generate; raises on any failure (see module doc)."""
        self.lb_accepts()
        payload = json.dumps(PROBE_BODY, separators=(",", ":")).encode()
        started = time.perf_counter()
        status, body = self._request("POST", self.rest_url, payload)
        latency_ms = (time.perf_counter() - started) * 1000.0
        route = urllib.parse.urlsplit(self.rest_url).path
        if 400 <= status < 500:
            rejected = EngineRejected(route, f"HTTP {status}: {_text(body)}", status=status)
            self._fail("rejected", "mii.rejected", rejected)
            raise rejected
        if status != 200:
            unexpected = UnexpectedResponse(f"DeepSpeed-MII {route}: HTTP {status}: {_text(body)}", status=status)
            self._fail("unexpected", "mii.unexpected", unexpected)
            raise unexpected
        try:
            result = _parse_reply(body, latency_ms)
        except UnexpectedResponse as exc:
            self._fail("unexpected", "mii.unexpected", exc)
            raise
        with self._lock:
            self._stats.probes += 1
            self._stats.last_probe_ms = latency_ms
        log.debug("mii.probe", rest_url=self.rest_url, latency_ms=latency_ms,
                  generated_length=result.generated_length, finish_reason=result.finish_reason)
        return result

    def ready(self) -> bool:
        """True when the probe succeeds; False when the gateway answers 5xx (backend failing).
        Unavailable (refused/timeout), EngineRejected (4xx), UnexpectedResponse (bad body) propagate."""
        try:
            self.probe()
        except UnexpectedResponse as exc:
            if exc.status is not None and exc.status >= 500:
                log.warning("mii.not_ready", rest_url=self.rest_url, status=exc.status)
                return False
            raise
        return True

    def sample(self, instance_id: InstanceId, deployment: DeploymentId, now_ms: int) -> InstanceSample:
        """One probe (its latency is the TTFT proxy), then the meter's load where there is a meter;
        every load field MII cannot supply is 0 and named in ``unknown`` (see the module doc)."""
        result = self.probe()
        return self.meter_sample(instance_id, deployment, now_ms, ttft_p99_ms=result.latency_ms)

    def meter_sample(self, instance_id: InstanceId, deployment: DeploymentId, now_ms: int,
                     ttft_p99_ms: float | None = None) -> InstanceSample:
        """The load part of :meth:`sample`: one meter scrape (none without a meter), no gateway probe.
        ``controlplane probe --metrics-file`` reads captured meter pages through it."""
        unknown: tuple[str, ...] = UNKNOWN_WITHOUT_METER
        running = waiting = 0
        prompt_rate = gen_rate = 0.0
        if self.meter_url is not None:
            try:
                with self._lock:
                    previous = self._previous
                reading = self.scrape_meter(now_ms)
            except (MetricsMalformed, Unavailable, UnexpectedResponse):
                pass  # counted and logged by scrape_meter: the load is unknown this sample
            else:
                running, waiting = reading.running, reading.waiting
                if previous is not None and reading.at_ms > previous.at_ms:
                    seconds = (reading.at_ms - previous.at_ms) / 1000.0
                    prompt_rate = counter_delta(previous.prompt_tokens, reading.prompt_tokens) / seconds
                    gen_rate = counter_delta(previous.generation_tokens, reading.generation_tokens) / seconds
                    unknown = UNKNOWN_WITH_METER
                    p99 = histogram_delta_quantile(METER_P99, previous.duration, reading.duration)
                    with self._lock:
                        self._stats.meter_request_p99_ms = None if p99 is None else p99 * 1000.0
                else:
                    unknown = UNKNOWN_FIRST_SCRAPE
        return InstanceSample(
            instance_id=instance_id, deployment=deployment, at_ms=now_ms,
            running=running, waiting=waiting, kv_usage=0.0, prompt_tokens_per_s=prompt_rate,
            generation_tokens_per_s=gen_rate, ttft_p99_ms=ttft_p99_ms, unknown=unknown,
        )

    def scrape_meter(self, now_ms: int) -> MeterReading:
        """One ``GET {meter_url}/metrics``; the new baseline for token rates. :class:`MetricsMalformed`
        naming the metric, :class:`Unavailable` (no answer) or :class:`UnexpectedResponse` (not 200)
        otherwise, each counted and logged once (``mii.meter_failed``); the baseline is kept then."""
        try:
            reading = self._read_meter(now_ms)
        except (MetricsMalformed, Unavailable, UnexpectedResponse) as exc:
            with self._lock:
                self._stats.meter_failures += 1
                self._stats.last_error = str(exc)
            log.warning("mii.meter_failed", meter_url=self.meter_url, problem=str(exc),
                        field=getattr(exc, "field", None))
            raise
        with self._lock:
            if self._previous is None or now_ms >= self._previous.at_ms:
                self._previous = reading
            self._stats.meter_scrapes += 1
        return reading

    def _read_meter(self, now_ms: int) -> MeterReading:
        if self.meter_url is None:
            raise ValidationError("meter_url", "this driver has no meter")
        url = self.meter_url + "/metrics"
        status, body, _ = http_request(METER, "GET", url, timeout_s=self.timeout_s, max_bytes=MAX_RESPONSE_BYTES)
        if status != 200:
            raise UnexpectedResponse(f"{METER} {url}: HTTP {status}", status=status)
        return parse_meter(body, now_ms)

    def in_flight(self) -> int | None:
        """Requests the pod holds now: the meter's running + waiting, from one scrape. None without a
        meter, or when the meter cannot be read (MII itself cannot tell)."""
        if self.meter_url is None:
            return None
        try:
            reading = self._read_meter(0)
        except (MetricsMalformed, Unavailable, UnexpectedResponse) as exc:
            log.warning("mii.meter_failed", meter_url=self.meter_url, problem=str(exc), during="in_flight")
            return None
        return reading.running + reading.waiting

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            s = self._stats
            metered = self.meter_url is not None
            return {"probes": s.probes, "unreachable": s.unreachable, "rejected": s.rejected,
                    "unexpected": s.unexpected, "last_error": s.last_error, "last_probe_ms": s.last_probe_ms,
                    "metrics_endpoint": metered, "meter_url": self.meter_url,
                    "missing": list(METER_MISSING_FIELDS if metered else MISSING_FIELDS),
                    "ttft_source": "probe_latency", "meter_scrapes": s.meter_scrapes,
                    "meter_failures": s.meter_failures, "meter_request_p99_ms": s.meter_request_p99_ms}

    # -- EngineDriver (adapters/engines.py); in_flight is above, with the meter -----------------
    def is_ready(self) -> bool:
        return self.ready()

    def warm_down(self) -> None:
        raise ValidationError("action", "engine deepspeed-mii has no sleep mode (its only warm path is a restart "
                                        "from the node's model cache); drain the instance instead")

    def warm_up(self) -> None:
        raise ValidationError("action", "engine deepspeed-mii has no sleep mode, so nothing to wake")


def _meter_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
        raise ValidationError("meter_url", f"{url!r} is not http://HOST:PORT (the mii-meter sidecar)")
    return url.rstrip("/")


def parse_meter(body: bytes, at_ms: int) -> MeterReading:
    """The meter's ``/metrics`` page as a :class:`MeterReading`; :class:`MetricsMalformed` naming the
    metric when a family is missing, a value is NaN/infinite/negative or a count is out of range, or
    the latency histogram has no ``+Inf`` bucket."""
    families = engine_http.parse_exposition(body, engine=METER)
    by_name: dict[str, list[Any]] = {}
    for samples in families.values():  # by sample name: the TYPE line may name a counter with or without _total
        for sample in samples:
            by_name.setdefault(sample.name, []).append(sample)

    def value(sample_name: str) -> float:
        values = [float(s.value) for s in by_name.get(sample_name, [])]
        if not values:
            raise MetricsMalformed(sample_name, "missing", engine=METER)
        total = math.fsum(values)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise MetricsMalformed(sample_name, f"{values} is not finite and >= 0", engine=METER)
        return total

    running = check_count(METER_METRICS["running"], value(METER_METRICS["running"]), engine=METER)
    waiting = check_count(METER_METRICS["waiting"], value(METER_METRICS["waiting"]), engine=METER)
    prompt = value(METER_METRICS["prompt_tokens"] + "_total")
    generation = value(METER_METRICS["generation_tokens"] + "_total")
    duration_name = METER_METRICS["duration"]
    bucket_samples = [(s.labels, float(s.value)) for s in by_name.get(duration_name + "_bucket", [])]
    buckets = cumulative_buckets(bucket_samples)
    if buckets is None or any(count < 0 for _, count in buckets):
        raise MetricsMalformed(duration_name, "missing, NaN, negative or without a +Inf bucket", engine=METER)
    return MeterReading(at_ms, running, waiting, prompt, generation, buckets)


def _text(body: bytes) -> str:
    """One line for an error body: the ``<title>`` of Flask's HTML error page, else the collapsed text."""
    text = body[:2000].decode(errors="replace")
    title = re.search(r"<title>(.*?)</title>", text, re.DOTALL)
    return " ".join((title.group(1) if title else text).split())[:200]


def _parse_reply(body: bytes, latency_ms: float) -> ProbeResult:
    try:
        rows = json.loads(body)
    except ValueError as exc:
        raise UnexpectedResponse(f"DeepSpeed-MII generate: body is not JSON: {body[:200]!r}", status=200) from exc
    if not isinstance(rows, list) or len(rows) != 1 or not isinstance(rows[0], dict):
        raise UnexpectedResponse(f"DeepSpeed-MII generate: expected a list of one reply, got {body[:200]!r}",
                                 status=200)
    row = rows[0]
    text, plen, glen, reason = (row.get("generated_text"), row.get("prompt_length"),
                                row.get("generated_length"), row.get("finish_reason"))
    if not isinstance(text, str) or type(plen) is not int or type(glen) is not int \
            or plen < 0 or glen < 0 or reason not in FINISH_REASONS:
        raise UnexpectedResponse(f"DeepSpeed-MII generate: unexpected reply {row!r}", status=200)
    return ProbeResult(latency_ms, text, plen, glen, reason)
