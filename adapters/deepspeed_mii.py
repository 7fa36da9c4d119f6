"""Driver for one DeepSpeed-MII 0.3.3 deployment (``shared/design/CONTRACTS.md`` section 3).

``MiiDriver(rest_url, grpc_address, timeout_s)``:

* ``rest_url`` is the REST gateway URL exactly as ``docs/source/rest.rst`` writes it,
  ``http://{HOST}:{RESTFUL_API_PORT}/mii/{DEPLOYMENT_NAME}`` (default port 51080; the gateway exists only
  with ``enable_restful_api=True``);
* ``grpc_address`` is ``HOST:PORT`` of MII's gRPC **load balancer** (``port_number``, default 50050).

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

Metrics (:meth:`MiiDriver.sample`). MII exports nothing, so:

* ``ttft_p99_ms`` is a **proxy**: the wall-clock milliseconds of the one probe generate above, from
  sending the HTTP request to reading the whole response (non-streaming, one generated token, a
  one-word prompt). It **includes** HTTP + Flask + the gRPC load-balancer hop + queueing in the replica's
  scheduler + prefill of a tiny prompt + one decode step + detokenisation. It is **not** a p99 (it is one
  observation), **not** the TTFT of real traffic (real prompts prefill longer; streaming clients see the
  first token earlier than a whole response), and it **adds** one request of load per sample. What it
  does track is queueing delay: under load a new request waits, and so does the probe.
* ``running``, ``waiting``, ``kv_usage``, token rates and GPU memory are **unknown** and reported as 0;
  :meth:`MiiDriver.statistics` says so (``metrics_endpoint: False``, ``missing`` lists the fields,
  ``ttft_source: "probe_latency"``). A scaler must not read those zeros as "idle": scale MII on the
  probe latency (and replica counts), not on queue depth.

Every failure is one structlog event (``mii.unreachable``, ``mii.rejected``, ``mii.unexpected``,
``mii.not_ready``); a successful sample logs ``mii.probe`` at debug level.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import structlog

from adapters.engine_http import (
    EngineRejected,
    UnexpectedResponse,
    count_unreachable,
    http_request,
    unreachable_reason,
)
from controlplane.domain.errors import Unavailable, ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.observations import InstanceSample

__all__ = ["MISSING_FIELDS", "EngineRejected", "MiiDriver", "ProbeResult", "UnexpectedResponse", "parse_address"]

log = structlog.get_logger("adapters.deepspeed_mii")

ENGINE = "DeepSpeed-MII"

MAX_RESPONSE_BYTES = 1024 * 1024
PROBE_PROMPT = "ping"
PROBE_BODY: dict[str, Any] = {"prompts": [PROBE_PROMPT], "max_new_tokens": 1}
"""The exact probe request body (kwargs of ``client.generate``)."""
FINISH_REASONS = ("stop", "length", "none")
MISSING_FIELDS = ("running", "waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s",
                  "gpu_mem_used_bytes", "gpu_mem_total_bytes")
"""InstanceSample fields MII cannot supply (no metrics endpoint); reported as 0."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One successful probe: load balancer accepted, generate answered 200 with a valid body."""

    latency_ms: float
    generated_text: str
    prompt_length: int
    generated_length: int
    finish_reason: str


@dataclass(slots=True)
class DriverStatistics:
    probes: int = 0
    unreachable: int = 0
    rejected: int = 0
    unexpected: int = 0
    last_error: str = ""
    last_probe_ms: float | None = None


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); :class:`ValidationError` naming ``grpc_address`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValidationError("grpc_address", f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class MiiDriver:
    """One MII deployment (REST gateway + gRPC load balancer). Thread-safe."""

    def __init__(self, rest_url: str, grpc_address: str, timeout_s: float) -> None:
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
        self._lock = threading.Lock()
        self._stats = DriverStatistics()

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
        """One probe; its latency is the TTFT proxy. Everything MII cannot export is 0 (see module doc)."""
        result = self.probe()
        return InstanceSample(
            instance_id=instance_id, deployment=deployment, at_ms=now_ms,
            running=0, waiting=0, kv_usage=0.0, prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0,
            ttft_p99_ms=result.latency_ms,
        )

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            s = self._stats
            return {"probes": s.probes, "unreachable": s.unreachable, "rejected": s.rejected,
                    "unexpected": s.unexpected, "last_error": s.last_error, "last_probe_ms": s.last_probe_ms,
                    "metrics_endpoint": False, "missing": list(MISSING_FIELDS), "ttft_source": "probe_latency"}

    # -- EngineDriver (adapters/engines.py) -----------------------------------------------------
    def is_ready(self) -> bool:
        return self.ready()

    def in_flight(self) -> int | None:
        """None: MII exports no request counts (its load is metered where the requests pass)."""
        return None

    def warm_down(self) -> None:
        raise ValidationError("action", "engine deepspeed-mii has no sleep mode (its only warm path is a restart "
                                        "from the node's model cache); drain the instance instead")

    def warm_up(self) -> None:
        raise ValidationError("action", "engine deepspeed-mii has no sleep mode, so nothing to wake")


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
