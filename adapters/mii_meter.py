"""A request meter for one DeepSpeed-MII 0.3.3 pod: a sidecar in front of MII's REST gateway that
measures the load MII itself cannot export (``shared/design/CONTRACTS.md`` section 3: MII has no
metrics endpoint).

``controlplane mii-meter --listen :8080 --upstream http://127.0.0.1:8000`` listens on ``--listen``
and forwards, unchanged, to the gateway at ``--upstream``:

* ``POST /mii/<deployment_name>`` (any method on ``/mii/...``, so Flask's own 405 passes through): the
  request body and its ``Content-Type`` go up as they came; the reply's status, body and
  ``Content-Type`` come back as the gateway sent them (its 4xx/5xx HTML pages included);
* ``GET /healthz`` (MII's static ``ok``).

Everything else is the meter's own: ``GET /metrics`` (Prometheus text of the meter's **own** registry,
never the process-global one), and 404 for any other path (``/terminate`` is not forwarded: a client
must not be able to shut the gateway down through the Service).

Bounds: a request body larger than ``max_request_bytes`` -> 413 without reading it (and without a
``Content-Length`` -> 411); the whole exchange with the gateway has one deadline of ``timeout_s``
(connect, send, each read) -> 504 when it passes; the gateway refusing or dropping the connection ->
502; a reply larger than ``max_response_bytes`` -> 502 (nothing of it is sent). A client that stalls
while sending its request is dropped after ``client_timeout_s``. With ``max_concurrent`` set, at most
that many requests are at the gateway at once and the others wait for a slot (at most
``max_waiting`` of them: 503 beyond); without it nothing waits at the meter and ``waiting`` is 0
(requests then queue inside MII, where the meter cannot see them, but they are counted as running).

What it counts (generate requests, ``/mii/...`` only), exported on ``GET /metrics``:

* ``controlplane_mii_requests_running`` (gauge): requests sent to the gateway and not yet answered;
* ``controlplane_mii_requests_waiting`` (gauge): requests waiting for a slot (0 without ``max_concurrent``);
* ``controlplane_mii_prompt_tokens_total`` / ``controlplane_mii_generation_tokens_total`` (counters):
  the sums of ``prompt_length`` / ``generated_length`` over every row of every 200 reply that is
  MII's JSON list of ``{generated_text, prompt_length, generated_length, finish_reason}``;
* ``controlplane_mii_request_duration_seconds`` (histogram): from the request received at the meter
  (body read) to the gateway's whole reply read, waiting for a slot included. MII's gateway answers
  non-streaming, so this is the time to the **whole** reply (prefill + every decode step), not a
  time to first token;
* ``controlplane_mii_requests_total{outcome}`` (counter): ``ok`` (200, well-formed), ``rejected``
  (gateway 4xx), ``failed`` (gateway 5xx or other status), ``malformed`` (200 whose body is not the
  list above: passed through unchanged, no tokens counted), ``unreachable`` (502), ``timeout`` (504),
  ``too_large`` (413 / 411 / oversized reply), ``busy`` (503, no slot).
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from controlplane.domain.errors import ValidationError

__all__ = ["DURATION_BUCKETS_S", "METRICS", "MeterConfig", "MiiMeter", "Upstream", "parse_listen", "reply_tokens"]

log = structlog.get_logger("adapters.mii_meter")

PREFIX = "controlplane_mii_"
METRICS = {
    "running": PREFIX + "requests_running",
    "waiting": PREFIX + "requests_waiting",
    "prompt_tokens": PREFIX + "prompt_tokens",
    "generation_tokens": PREFIX + "generation_tokens",
    "duration": PREFIX + "request_duration_seconds",
    "requests": PREFIX + "requests",
}
"""Family names as :func:`prometheus_client.parser.text_string_to_metric_families` reports them
(counters without ``_total``)."""
DURATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, math.inf)
OUTCOMES = ("ok", "rejected", "failed", "malformed", "unreachable", "timeout", "too_large", "busy")
READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Upstream:
    """The MII REST gateway: ``http://HOST:PORT`` (no path)."""

    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Upstream:
        parts = urllib.parse.urlsplit(url)
        try:
            port = 80 if parts.port is None else parts.port
        except ValueError:
            port = -1
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query \
                or not 0 < port < 65536:
            raise ValidationError("upstream", f"{url!r} is not http://HOST:PORT (the MII REST gateway, no path)")
        return cls(parts.hostname, port)


def parse_listen(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (every interface) -> (host, port); :class:`ValidationError` naming
    ``listen`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValidationError("listen", f"{address!r} is not HOST:PORT or :PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True, slots=True)
class MeterConfig:
    upstream: Upstream
    host: str = "0.0.0.0"
    port: int = 0
    timeout_s: float = 300.0
    """One deadline for the whole exchange with the gateway (a long generate takes minutes)."""
    client_timeout_s: float = 30.0
    max_request_bytes: int = 1024 * 1024
    max_response_bytes: int = 16 * 1024 * 1024
    max_concurrent: int | None = None
    max_waiting: int = 1024

    def __post_init__(self) -> None:
        for name in ("timeout_s", "client_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValidationError(name, f"must be a positive number of seconds, got {value!r}")
        for name in ("max_request_bytes", "max_response_bytes", "max_waiting"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise ValidationError(name, f"must be a positive integer, got {getattr(self, name)!r}")
        if self.max_concurrent is not None and (type(self.max_concurrent) is not int or self.max_concurrent < 1):
            raise ValidationError("max_concurrent", f"must be a positive integer, got {self.max_concurrent!r}")


def reply_tokens(body: bytes) -> tuple[int, int] | None:
    """(prompt tokens, generated tokens) of MII's generate reply, None when ``body`` is not the JSON
    list of ``{generated_text: str, prompt_length: int >= 0, generated_length: int >= 0,
    finish_reason: str}`` (CONTRACTS.md section 3)."""
    try:
        rows = json.loads(body)
    except ValueError:
        return None
    if not isinstance(rows, list):
        return None
    prompt = generated = 0
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("generated_text"), str) \
                or not isinstance(row.get("finish_reason"), str):
            return None
        plen, glen = row.get("prompt_length"), row.get("generated_length")
        if type(plen) is not int or type(glen) is not int or plen < 0 or glen < 0:
            return None
        prompt += plen
        generated += glen
    return prompt, generated


class _Meters:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.running = Gauge(METRICS["running"], "MII generate requests at the gateway, not yet answered", registry=r)
        self.waiting = Gauge(METRICS["waiting"], "MII generate requests waiting at the meter for a slot", registry=r)
        self.prompt = Counter(METRICS["prompt_tokens"], "Sum of prompt_length over MII replies", registry=r)
        self.generation = Counter(METRICS["generation_tokens"], "Sum of generated_length over MII replies", registry=r)
        self.duration = Histogram(METRICS["duration"], "Request received to whole MII reply read (seconds)",
                                  buckets=DURATION_BUCKETS_S, registry=r)
        self.requests = Counter(METRICS["requests"], "MII generate requests by outcome", ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.requests.labels(outcome=outcome)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    meter: MiiMeter

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-reply (or any handler error): one event, no traceback on stderr."""
        import sys

        log.warning("mii_meter.client_error", client=str(client_address), error=repr(sys.exc_info()[1]))


class MiiMeter:
    """The meter's HTTP server. :meth:`start` binds and serves in a thread; :meth:`stop` closes it."""

    def __init__(self, config: MeterConfig) -> None:
        self.config = config
        self.meters = _Meters()
        self._slots = threading.BoundedSemaphore(config.max_concurrent) if config.max_concurrent else None
        self._waiting = 0
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MiiMeter:
        try:
            server = _Server((self.config.host, self.config.port), _Handler)
        except OSError as exc:
            raise ValidationError("listen", f"cannot listen on {self.config.host}:{self.config.port}: {exc}") from exc
        server.meter = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="mii-meter", daemon=True)
        self._thread.start()
        log.info("mii_meter.listening", host=self.config.host, port=self.port,
                 upstream=f"{self.config.upstream.host}:{self.config.upstream.port}",
                 max_concurrent=self.config.max_concurrent)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> MiiMeter:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def exposition(self) -> bytes:
        return generate_latest(self.meters.registry)

    # -- slots ------------------------------------------------------------------------------------
    def acquire(self, deadline: float) -> str | None:
        """None when a slot is held (or there is no bound), else the outcome to answer with."""
        if self._slots is None:
            return None
        if self._slots.acquire(blocking=False):
            return None
        with self._lock:
            if self._waiting >= self.config.max_waiting:
                return "busy"
            self._waiting += 1
        self.meters.waiting.inc()
        try:
            got = self._slots.acquire(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            self.meters.waiting.dec()
            with self._lock:
                self._waiting -= 1
        return None if got else "timeout"

    def release(self) -> None:
        if self._slots is not None:
            self._slots.release()

    # -- the gateway ------------------------------------------------------------------------------
    def forward(self, method: str, path: str, body: bytes | None, content_type: str | None,
                deadline: float) -> tuple[int, bytes, str]:
        """(status, body, content type) of the gateway's reply; raises TimeoutError past ``deadline``,
        OSError / HTTPException when it cannot answer, :class:`_TooLarge` for an oversized reply."""
        up = self.config.upstream
        conn = http.client.HTTPConnection(up.host, up.port, timeout=_left(deadline))
        try:
            headers = {"Content-Type": content_type} if content_type else {}
            conn.request(method, path, body=body, headers=headers)
            sock = conn.sock
            _bound(sock, deadline)
            resp = conn.getresponse()
            chunks: list[bytes] = []
            size = 0
            while True:
                _bound(sock, deadline)
                chunk = resp.read1(READ_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > self.config.max_response_bytes:
                    raise _TooLarge(size)
                chunks.append(chunk)
            return resp.status, b"".join(chunks), resp.getheader("Content-Type", "")
        finally:
            conn.close()


class _TooLarge(Exception):
    pass


def _plain_path(path: str) -> bool:
    """No ``.`` / ``..`` segment, literal or percent-encoded: ``/mii/../terminate`` must not reach the gateway."""
    return not any(seg in (".", "..") for seg in urllib.parse.unquote(path).split("/"))


def _bound(sock: Any, deadline: float) -> None:
    """The next socket operation may take at most what is left of ``deadline``."""
    left = _left(deadline)
    if sock is not None:
        try:
            sock.settimeout(left)
        except OSError:
            pass


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "controlplane-mii-meter"

    def setup(self) -> None:
        self.timeout = self.server.meter.config.client_timeout_s
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        return  # one structlog event per failure instead of stderr lines

    def _send(self, status: int, body: bytes, content_type: str, *, close: bool = False) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _plain(self, status: int, text: str, *, close: bool = False) -> None:
        self._send(status, text.encode() + b"\n", "text/plain; charset=utf-8", close=close)

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        meter = self.server.meter
        path = urllib.parse.urlsplit(self.path).path
        if path == "/metrics" and self.command == "GET":
            self._send(200, meter.exposition(), CONTENT_TYPE_LATEST)
            return
        if path == "/healthz" and self.command == "GET":
            self._proxy(metered=False)
            return
        if path.startswith("/mii/") and _plain_path(path):
            self._proxy(metered=True)
            return
        self._drain_body()
        self._plain(404, f"not found: {path} (the meter forwards /mii/<deployment> and /healthz)")

    def _drain_body(self) -> None:
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= self.server.meter.config.max_request_bytes:
            self.rfile.read(int(length))
        elif length:
            self.close_connection = True

    def _read_body(self) -> bytes | None | str:
        """The request body (None for a request without one), or the outcome to refuse it with."""
        limit = self.server.meter.config.max_request_bytes
        if self.headers.get("Transfer-Encoding"):
            return "length_required"
        length = self.headers.get("Content-Length")
        if length is None:
            return "length_required" if self.command in ("POST", "PUT") else None
        if not length.isdigit():
            return "length_required"
        if int(length) > limit:
            return "too_large"
        return self.rfile.read(int(length))

    def _proxy(self, *, metered: bool) -> None:
        meter, m = self.server.meter, self.server.meter.meters
        started = time.monotonic()
        body = self._read_body()
        if isinstance(body, str):
            if metered:
                m.requests.labels(outcome="too_large").inc()
            limit = meter.config.max_request_bytes
            if body == "too_large":
                self._plain(413, f"request body over {limit} bytes", close=True)
            else:
                self._plain(411, "a request body needs a Content-Length", close=True)
            log.warning("mii_meter.refused", path=self.path, reason=body)
            return
        deadline = time.monotonic() + meter.config.timeout_s
        if metered:
            refused = meter.acquire(deadline)
            if refused is not None:
                m.requests.labels(outcome=refused).inc()
                log.warning("mii_meter.no_slot", path=self.path, outcome=refused)
                if refused == "busy":
                    self._plain(503, "too many requests waiting at the meter")
                else:
                    self._plain(504, "timed out waiting for a slot at the MII gateway")
                return
            m.running.inc()
        try:
            outcome, status, reply, ctype = self._exchange(body, deadline)
        finally:
            if metered:
                m.running.dec()
                meter.release()
        if metered:
            if outcome == "ok":
                tokens = reply_tokens(reply)
                if tokens is None:
                    outcome = "malformed"
                    log.warning("mii_meter.malformed_reply", path=self.path, body=reply[:200])
                else:
                    m.prompt.inc(tokens[0])
                    m.generation.inc(tokens[1])
            m.requests.labels(outcome=outcome).inc()
            if outcome in ("ok", "malformed", "rejected", "failed"):
                m.duration.observe(time.monotonic() - started)
        self._send(status, reply, ctype)

    def _exchange(self, body: bytes | None, deadline: float) -> tuple[str, int, bytes, str]:
        """(outcome, status, body, content type) to answer the client with."""
        meter = self.server.meter
        try:
            status, reply, ctype = meter.forward(self.command, self.path, body, self.headers.get("Content-Type"),
                                                 deadline)
        except _TooLarge:
            log.warning("mii_meter.reply_too_large", path=self.path, limit=meter.config.max_response_bytes)
            return ("too_large", 502, b"MII gateway reply over "
                    + str(meter.config.max_response_bytes).encode() + b" bytes\n", "text/plain; charset=utf-8")
        except TimeoutError as exc:
            log.warning("mii_meter.upstream_timeout", path=self.path, reason=str(exc))
            return "timeout", 504, b"MII gateway timed out\n", "text/plain; charset=utf-8"
        except (OSError, http.client.HTTPException) as exc:
            log.warning("mii_meter.upstream_unreachable", path=self.path, reason=repr(exc))
            return "unreachable", 502, f"MII gateway unreachable: {exc!r}\n".encode(), "text/plain; charset=utf-8"
        if status == 200:
            return "ok", status, reply, ctype
        return ("rejected" if 400 <= status < 500 else "failed"), status, reply, ctype


def run_cli(listen: str, upstream: str, *, timeout_s: float, max_request_bytes: int,
            max_concurrent: int | None) -> int:
    """``controlplane mii-meter``: serve until SIGTERM / SIGINT. Bad arguments raise
    :class:`ValidationError` (the CLI prints one line and exits 2)."""
    import signal

    host, port = parse_listen(listen)
    config = MeterConfig(upstream=Upstream.parse(upstream), host=host, port=port, timeout_s=timeout_s,
                         max_request_bytes=max_request_bytes, max_concurrent=max_concurrent)
    meter = MiiMeter(config).start()
    stopped = threading.Event()

    def stop(*_: object) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"mii-meter listening on {host}:{meter.port}, upstream {upstream}", flush=True)
    stopped.wait()
    meter.stop()
    return 0
