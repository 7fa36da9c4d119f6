"""``controlplane probe``: read one inference engine through the driver its adapter uses, and report
what the control plane would observe.

Two ways to read:

* **live** (``--url``): the engine's health routes, then ``--scrapes N`` metrics reads ``--interval-s``
  apart (default one). Rates, TTFT and queue-time p99s and Triton's ``running`` (Little's law) are
  deltas between two reads, so one read names them in ``unknown``;
* **captured** (``--metrics-file FILE``, repeatable): pages saved from the engine's ``/metrics``
  (``curl -s http://HOST:8000/metrics > page.txt``; for DeepSpeed-MII, its ``mii-meter`` sidecar's
  page), read in order ``--interval-s`` apart through the same driver, served to it from 127.0.0.1.
  No health route is read (``healthy`` and ``ready`` are ``null``). Two pages taken a known time apart
  give everything a live pair of reads gives.

Engines and their health:

* ``vllm`` (``--url`` = the server): ``healthy`` = ``GET /health`` 200 (False on 503, engine dead);
  ``ready`` = ``healthy`` (vLLM serves HTTP only after engine init).
* ``triton`` (``--url`` = HTTP port, ``--metrics-url`` = metrics port, ``--model`` required):
  ``healthy`` = ``/v2/health/live``; ``ready`` = ``/v2/health/ready`` and ``/v2/models/{model}/ready``.
* ``deepspeed-mii`` (``--url`` = the REST gateway ``http://HOST:PORT/mii/DEPLOYMENT``,
  ``--grpc-address`` = the gRPC load balancer, default ``HOST:50050``, ``--meter-url`` = the pod's
  ``mii-meter`` sidecar): a probe = LB port accepts + a tiny generate; ``healthy`` = ``ready`` = it
  succeeded (a 5xx from the gateway reports both ``false``); ``ttft_p99_ms`` is the probe's latency (a
  proxy, see the driver). Without a meter every load field is unknown.

``unknown`` lists every field the observation cannot supply (the sample's own
``InstanceSample.unknown`` plus TTFT, queue time and GPU memory when absent), and ``why`` says why.

Errors become one :class:`ProbeFailed` line: ``<engine> at <url>: unreachable: connection refused``
(the engine is loading or down), ``... unreachable: timed out after Ns``, or ``<engine> at <url>: <what
the driver said>`` for an answer the contract does not allow; an unreadable ``--metrics-file`` names
the file.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import structlog

from adapters.engines import REGISTRY, DriverAddress, build_driver
from controlplane.domain.engines import Engine
from controlplane.domain.errors import ControlPlaneError, Unavailable, ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.observations import InstanceSample

ENGINES = tuple(e.value for e in REGISTRY)
PROBE_INSTANCE = InstanceId("probe")
PROBE_DEPLOYMENT = DeploymentId("probe")
MAX_SCRAPES = 10
MAX_PAGE_BYTES = 8 * 1024 * 1024
"""The drivers' own bound on a ``/metrics`` body."""
DELTA_FIELDS = ("prompt_tokens_per_s", "generation_tokens_per_s", "running")


class ProbeFailed(ControlPlaneError):
    """The engine could not be read; the message is the one line the CLI prints."""


class EngineUnreachable(ProbeFailed, Unavailable):
    """No answer: connection refused (loading/down), timeout, DNS."""


def _reason(exc: BaseException, timeout_s: float) -> str:
    """A short cause for an Unavailable raised by a driver, from its ``__cause__`` chain."""
    seen: BaseException | None = exc
    while seen is not None:
        inner = getattr(seen, "reason", None)
        if isinstance(inner, BaseException):
            seen = inner
            continue
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, (TimeoutError, socket.timeout)):
            return f"timed out after {timeout_s:g}s"
        if isinstance(seen, ConnectionResetError):
            return "connection reset"
        if isinstance(seen, socket.gaierror):
            return f"cannot resolve host ({seen.strerror})"
        if seen.__cause__ is None:
            break
        seen = seen.__cause__
    return str(exc)


@dataclass(frozen=True)
class Read:
    """What to read: the engine's addresses, how many reads and how far apart."""

    engine: Engine
    url: str | None
    metrics_url: str | None = None
    model: str | None = None
    grpc_address: str | None = None
    meter_url: str | None = None
    timeout_s: float = 5.0
    scrapes: int = 1
    interval_ms: int = 1_000
    pages: tuple[bytes, ...] = ()
    """Captured ``/metrics`` pages; empty: read the live engine."""


def read_pages(paths: Sequence[str]) -> tuple[bytes, ...]:
    """The ``--metrics-file`` pages, or a :class:`ValidationError` naming the file."""
    if len(paths) > MAX_SCRAPES:
        raise ValidationError("--metrics-file", f"at most {MAX_SCRAPES} pages, got {len(paths)}")
    out = []
    for p in paths:
        try:
            with open(p, "rb") as f:
                body = f.read(MAX_PAGE_BYTES + 1)
        except OSError as exc:
            raise ValidationError("--metrics-file", f"{p}: {exc.strerror or exc}") from None
        if len(body) > MAX_PAGE_BYTES:
            raise ValidationError("--metrics-file", f"{p}: larger than {MAX_PAGE_BYTES} bytes")
        out.append(body)
    return tuple(out)


def probe(engine: str, url: str | None, *, metrics_url: str | None = None, model: str | None = None,
          grpc_address: str | None = None, timeout_s: float = 5.0, now_ms: int = 0,
          meter_url: str | None = None, scrapes: int = 1, interval_s: float = 1.0,
          pages: Sequence[bytes] = (), sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Read ``engine`` (live at ``url``, or from captured ``pages``); the observation as a JSON-able
    dict, or :class:`ProbeFailed` / :class:`ValidationError` (a bad argument, named)."""
    if engine not in ENGINES:
        raise ValidationError("--engine", f"must be one of {', '.join(ENGINES)}, got {engine!r}")
    if not timeout_s > 0:
        raise ValidationError("--timeout", f"must be > 0, got {timeout_s}")
    if not 1 <= scrapes <= MAX_SCRAPES:
        raise ValidationError("--scrapes", f"must be between 1 and {MAX_SCRAPES}, got {scrapes}")
    if not 0 < interval_s <= 600:
        raise ValidationError("--interval-s", f"must be > 0 and at most 600, got {interval_s}")
    if not pages and not url:
        raise ValidationError("--url", "required unless --metrics-file gives captured pages")
    read = Read(Engine(engine), url, metrics_url, model, grpc_address, meter_url, timeout_s,
                len(pages) if pages else scrapes, int(interval_s * 1000), tuple(pages))
    where = url or "captured pages"
    try:
        return _READERS[read.engine](read, now_ms, sleep)
    except Unavailable as exc:
        raise EngineUnreachable(f"{engine} at {where}: unreachable: {_reason(exc, timeout_s)}") from exc
    except ControlPlaneError as exc:
        raise ProbeFailed(f"{engine} at {where}: {' '.join(str(exc).split())}") from exc


# -- captured pages ------------------------------------------------------------------------------
class _Pages:
    """Serves captured pages, one per ``GET .../metrics``, in order (the last one again after),
    on 127.0.0.1, so that the driver reads them exactly as it reads an engine."""

    def __init__(self, pages: tuple[bytes, ...]) -> None:
        self._pages = pages
        self._next = 0
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                if not self.path.split("?", 1)[0].endswith("/metrics"):
                    self.send_error(404)
                    return
                body = owner.take()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="probe-pages", daemon=True)

    def take(self) -> bytes:
        with self._lock:
            page = self._pages[min(self._next, len(self._pages) - 1)]
            self._next += 1
            return page

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> _Pages:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _samples(read: Read, take: Callable[[int], InstanceSample], now_ms: int,
             sleep: Callable[[float], None]) -> InstanceSample:
    """``read.scrapes`` samples ``read.interval_ms`` apart (a real wait only when live); the last."""
    sample = take(now_ms)
    for k in range(1, read.scrapes):
        if not read.pages:
            sleep(read.interval_ms / 1000)
        sample = take(now_ms + k * read.interval_ms)
    return sample


# -- engines -------------------------------------------------------------------------------------
def _vllm(read: Read, now_ms: int, sleep: Callable[[float], None]) -> dict[str, Any]:
    from adapters.vllm import VllmDriver

    if read.pages:
        with _Pages(read.pages) as pages:
            driver = build_driver(Engine.VLLM, DriverAddress(pages.url, read.timeout_s, model=read.model))
            assert isinstance(driver, VllmDriver)
            sample = _samples(read, lambda t: driver.sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, t), now_ms, sleep)
        return _observation(read, None, None, sample, driver.statistics())
    assert read.url is not None
    driver = build_driver(Engine.VLLM, DriverAddress(read.url, read.timeout_s, model=read.model))
    assert isinstance(driver, VllmDriver)
    healthy = driver.health()
    sample = _samples(read, lambda t: driver.sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, t), now_ms, sleep)
    return _observation(read, healthy, healthy, sample, driver.statistics())


def _triton(read: Read, now_ms: int, sleep: Callable[[float], None]) -> dict[str, Any]:
    from adapters.triton import TritonDriver

    if not read.model:
        raise ValidationError("--model", "required for triton (the repository model name)")
    if read.pages:
        with _Pages(read.pages) as pages:
            driver = build_driver(Engine.TRITON, DriverAddress(pages.url, read.timeout_s, model=read.model,
                                                               metrics_url=pages.url))
            assert isinstance(driver, TritonDriver)
            sample = _samples(read, lambda t: driver.sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, t), now_ms, sleep)
        return _observation(read, None, None, sample, driver.statistics())
    if not read.metrics_url:
        raise ValidationError("--metrics-url", "required for triton (the metrics port, default 8002)")
    assert read.url is not None
    driver = build_driver(Engine.TRITON, DriverAddress(read.url, read.timeout_s, model=read.model,
                                                       metrics_url=read.metrics_url))
    assert isinstance(driver, TritonDriver)
    healthy = driver.live()
    ready = driver.ready() and driver.model_ready()
    sample = _samples(read, lambda t: driver.sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, t), now_ms, sleep)
    return _observation(read, healthy, ready, sample, driver.statistics())


def _mii(read: Read, now_ms: int, sleep: Callable[[float], None]) -> dict[str, Any]:
    from adapters.deepspeed_mii import MiiDriver, UnexpectedResponse

    if read.pages:  # the meter's pages: its load, without the gateway probe (no TTFT proxy)
        with _Pages(read.pages) as pages:
            driver = build_driver(Engine.DEEPSPEED_MII, DriverAddress(
                "http://127.0.0.1:9/mii/captured", read.timeout_s, grpc_address="127.0.0.1:9", meter_url=pages.url))
            assert isinstance(driver, MiiDriver)
            sample = _samples(read, lambda t: driver.meter_sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, t), now_ms, sleep)
        return _observation(read, None, None, sample, driver.statistics())
    assert read.url is not None
    # ``--url`` is the whole REST URL (``.../mii/DEPLOYMENT``); no gRPC address: its host, port 50050
    driver = build_driver(Engine.DEEPSPEED_MII, DriverAddress(read.url, read.timeout_s, grpc_address=read.grpc_address,
                                                              meter_url=read.meter_url))
    assert isinstance(driver, MiiDriver)
    try:
        sample = _samples(read, lambda t: driver.sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, t), now_ms, sleep)
    except UnexpectedResponse as exc:
        if exc.status is None or exc.status < 500:
            raise
        # the gateway lives but generate fails behind it: not healthy, not ready
        return _observation(read, False, False, None, driver.statistics())
    return _observation(read, True, True, sample, driver.statistics())


_READERS: dict[Engine, Callable[[Read, int, Callable[[float], None]], dict[str, Any]]] = {
    Engine.VLLM: _vllm, Engine.TRITON: _triton, Engine.DEEPSPEED_MII: _mii}
"""What a probe reads per engine (health routes, the driver's samples); the drivers themselves come
from :data:`adapters.engines.REGISTRY`."""


def _why_unknown(read: Read, sample: InstanceSample | None) -> dict[str, str]:
    """Field -> why the observation cannot supply it."""
    once = read.scrapes == 1
    if sample is None:
        return {"sample": "the engine answered, but could not serve a request"}
    why: dict[str, str] = {}
    caps = read.engine.capabilities
    for name in sample.unknown:
        if once and name in DELTA_FIELDS and (name in caps.reports or read.meter_url or read.pages):
            why[name] = "needs two scrapes"
        elif read.engine is Engine.DEEPSPEED_MII and not (read.meter_url or read.pages):
            why[name] = "DeepSpeed-MII exports no metrics: pass --meter-url (its mii-meter sidecar)"
        else:
            why[name] = "not exported by this engine or its configuration"
    if sample.ttft_p99_ms is None:
        why["ttft_p99_ms"] = "needs two scrapes" if once else "no request got its first token between the scrapes"
    if sample.queue_p95_ms is None:
        why["queue_p95_ms"] = ("not exported by this engine" if not caps.queue_time
                               else "needs two scrapes" if once else "no request left the queue between the scrapes")
    if sample.gpu_mem_total_bytes <= 0:
        why["gpu_mem_used_bytes"] = why["gpu_mem_total_bytes"] = "not exported by this engine (the gpu-agent reads NVML)"
    return dict(sorted(why.items()))


def _observation(read: Read, healthy: bool | None, ready: bool | None, sample: InstanceSample | None,
                 statistics: dict[str, Any]) -> dict[str, Any]:
    def field(name: str) -> Any:
        return getattr(sample, name) if sample is not None else None

    why = _why_unknown(read, sample)
    return {
        "engine": read.engine.value, "url": read.url, "source": "captured" if read.pages else "live",
        "scrapes": read.scrapes, "interval_ms": read.interval_ms if read.scrapes > 1 else None,
        "healthy": healthy, "ready": ready,
        "waiting": field("waiting"), "running": field("running"), "kv_usage": field("kv_usage"),
        "ttft_p99_ms": field("ttft_p99_ms"), "queue_p95_ms": field("queue_p95_ms"),
        "prompt_tokens_per_s": field("prompt_tokens_per_s"),
        "generation_tokens_per_s": field("generation_tokens_per_s"),
        "gpu_mem_used_bytes": field("gpu_mem_used_bytes"), "gpu_mem_total_bytes": field("gpu_mem_total_bytes"),
        "unknown": list(why), "why": why, "driver": statistics,
    }


def run_cli(args: Any) -> int:
    """The ``probe`` subcommand: print the observation (JSON with ``--json``). Exit 0 when healthy and
    ready (or read from captured pages), 1 when not."""
    # Drivers log failures as structlog events; the CLI's contract is one error line on stderr.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    pages = read_pages(args.metrics_file or ())
    obs = probe(args.engine, args.url, metrics_url=args.metrics_url, model=args.model,
                grpc_address=args.grpc_address, timeout_s=args.timeout, meter_url=args.meter_url,
                scrapes=args.scrapes, interval_s=args.interval_s, pages=pages)
    if args.json:
        print(json.dumps(obs, indent=2, sort_keys=True))
    else:
        for key in ("engine", "url", "source", "healthy", "ready", "waiting", "running", "kv_usage", "ttft_p99_ms",
                    "queue_p95_ms", "prompt_tokens_per_s", "generation_tokens_per_s", "gpu_mem_used_bytes",
                    "gpu_mem_total_bytes"):
            value = obs[key]
            print(f"{key:24} {'-' if value is None else value}")
        for name, why in obs["why"].items():
            print(f"{'unknown ' + name:24} {why}")
    return 0 if obs["source"] == "captured" or (obs["healthy"] and obs["ready"]) else 1


__all__ = ["ENGINES", "EngineUnreachable", "ProbeFailed", "probe", "read_pages", "run_cli"]
