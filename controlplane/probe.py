"""``controlplane probe``: read one inference engine once, through the driver its adapter uses, and
report what the control plane would observe.

Engines and what one read means:

* ``vllm`` (:class:`adapters.vllm.VllmDriver`, ``--url`` = the server): ``healthy`` = ``GET /health``
  200 (False on 503, engine dead); ``ready`` = ``healthy`` (vLLM serves HTTP only after engine init);
  then one ``/metrics`` scrape. ``ttft_p99_ms`` is ``null``: the driver computes it from the histogram
  *delta* between two scrapes and a probe scrapes once.
* ``triton`` (:class:`adapters.triton.TritonDriver`, ``--url`` = HTTP port, ``--metrics-url`` = metrics
  port, ``--model`` required): ``healthy`` = ``/v2/health/live``; ``ready`` = ``/v2/health/ready`` and
  ``/v2/models/{model}/ready``; one ``/metrics`` scrape (``running`` by Little's law and TTFT need two,
  so they are 0 / ``null``; TensorRT-LLM gauges, when present, are read directly).
* ``deepspeed-mii`` (:class:`adapters.deepspeed_mii.MiiDriver`, ``--url`` = the REST gateway
  ``http://HOST:PORT/mii/DEPLOYMENT``, ``--grpc-address`` = the gRPC load balancer, default
  ``HOST:50050``): one probe = LB port accepts + a tiny generate. ``healthy`` = ``ready`` = the probe
  succeeded (a 5xx from the gateway reports both ``false``); ``ttft_p99_ms`` is the probe's latency
  (a proxy, see the driver); running/waiting/KV are unknown (listed in ``unknown``). With
  ``--meter-url`` (the pod's ``mii-meter`` sidecar) running/waiting come from one meter scrape; token
  rates need two, so they stay in ``unknown``.

Errors become one :class:`ProbeFailed` line: ``<engine> at <url>: unreachable: connection refused``
(the engine is loading or down), ``... unreachable: timed out after Ns``, or ``<engine> at <url>: <what
the driver said>`` for an answer the contract does not allow.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

import structlog

from controlplane.domain.errors import ControlPlaneError, Unavailable, ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId

from adapters.engines import REGISTRY, DriverAddress, build_driver
from controlplane.domain.engines import Engine

ENGINES = tuple(e.value for e in REGISTRY)
PROBE_INSTANCE = InstanceId("probe")
PROBE_DEPLOYMENT = DeploymentId("probe")


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


def probe(engine: str, url: str, *, metrics_url: str | None = None, model: str | None = None,
          grpc_address: str | None = None, timeout_s: float = 5.0, now_ms: int = 0,
          meter_url: str | None = None) -> dict[str, Any]:
    """One read of ``engine`` at ``url``; the observation as a JSON-able dict, or :class:`ProbeFailed`."""
    if engine not in ENGINES:
        raise ValidationError("--engine", f"must be one of {', '.join(ENGINES)}, got {engine!r}")
    if timeout_s <= 0:
        raise ValidationError("--timeout", f"must be > 0, got {timeout_s}")
    try:
        return _READERS[Engine(engine)](url, metrics_url, model, grpc_address, timeout_s, now_ms, meter_url)
    except Unavailable as exc:
        raise EngineUnreachable(f"{engine} at {url}: unreachable: {_reason(exc, timeout_s)}") from exc
    except ControlPlaneError as exc:
        raise ProbeFailed(f"{engine} at {url}: {' '.join(str(exc).split())}") from exc


def _observation(engine: str, url: str, healthy: bool, ready: bool, sample: Any | None,
                 unknown: list[str], statistics: dict[str, Any]) -> dict[str, Any]:
    def field(name: str, default: Any = None) -> Any:
        return getattr(sample, name) if sample is not None else default

    return {
        "engine": engine, "url": url, "healthy": healthy, "ready": ready,
        "waiting": field("waiting"), "running": field("running"), "kv_usage": field("kv_usage"),
        "ttft_p99_ms": field("ttft_p99_ms"),
        "prompt_tokens_per_s": field("prompt_tokens_per_s"),
        "generation_tokens_per_s": field("generation_tokens_per_s"),
        "gpu_mem_used_bytes": field("gpu_mem_used_bytes"), "gpu_mem_total_bytes": field("gpu_mem_total_bytes"),
        "unknown": unknown, "driver": statistics,
    }


def _vllm(url: str, _metrics_url: str | None, model: str | None, _grpc: str | None, timeout_s: float,
          now_ms: int) -> dict[str, Any]:
    from adapters.vllm import VllmDriver

    driver = build_driver(Engine.VLLM, DriverAddress(url, timeout_s, model=model))
    assert isinstance(driver, VllmDriver)
    healthy = driver.health()
    sample = driver.sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, now_ms)
    unknown = ["ttft_p99_ms (needs two scrapes)", "prompt_tokens_per_s (needs two scrapes)",
               "generation_tokens_per_s (needs two scrapes)", "gpu_mem_used_bytes", "gpu_mem_total_bytes"]
    return _observation("vllm", url, healthy, healthy, sample, unknown, driver.statistics())


def _triton(url: str, metrics_url: str | None, model: str | None, _grpc: str | None, timeout_s: float,
            now_ms: int) -> dict[str, Any]:
    from adapters.triton import TritonDriver

    if not metrics_url:
        raise ValidationError("--metrics-url", "required for triton (the metrics port, default 8002)")
    if not model:
        raise ValidationError("--model", "required for triton (the repository model name)")
    driver = build_driver(Engine.TRITON, DriverAddress(url, timeout_s, model=model, metrics_url=metrics_url))
    assert isinstance(driver, TritonDriver)
    healthy = driver.live()
    ready = driver.ready() and driver.model_ready()
    sample = driver.sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, now_ms)
    stats = driver.statistics()
    unknown = ["prompt_tokens_per_s", "generation_tokens_per_s"]
    if stats["running_source"] == "no_baseline":
        unknown.append("running (needs two scrapes)")
    if stats["kv_source"] == "absent":
        unknown.append("kv_usage")
    if stats["ttft_source"] == "absent":
        unknown.append("ttft_p99_ms")
    else:
        unknown.append("ttft_p99_ms (needs two scrapes)")
    if not stats["gpu_metrics"]:
        unknown += ["gpu_mem_used_bytes", "gpu_mem_total_bytes"]
    return _observation("triton", url, healthy, ready, sample, unknown, stats)


def _mii(url: str, _metrics_url: str | None, _model: str | None, grpc_address: str | None, timeout_s: float,
         now_ms: int) -> dict[str, Any]:
    from adapters.deepspeed_mii import MiiDriver, UnexpectedResponse

    # ``--url`` is the whole REST URL (``.../mii/DEPLOYMENT``); no gRPC address: its host, port 50050
    driver = build_driver(Engine.DEEPSPEED_MII, DriverAddress(url, timeout_s, grpc_address=grpc_address))
    assert isinstance(driver, MiiDriver)
    try:
        sample = driver.sample(PROBE_INSTANCE, PROBE_DEPLOYMENT, now_ms)
    except UnexpectedResponse as exc:
        if exc.status is None or exc.status < 500:
            raise
        sample = None  # the gateway lives but generate fails behind it: not healthy, not ready
    stats = driver.statistics()
    ok = sample is not None
    unknown = list(stats["missing"])
    if meter_url is not None and sample is not None:
        unknown = sorted(set(sample.unknown) | set(stats["missing"]))
    return _observation("deepspeed-mii", url, ok, ok, sample, unknown, stats)


_READERS: dict[Engine, Callable[[str, str | None, str | None, str | None, float, int], dict[str, Any]]] = {
    Engine.VLLM: _vllm, Engine.TRITON: _triton, Engine.DEEPSPEED_MII: _mii}
"""What one probe read reports per engine (health routes and the fields one scrape cannot know);
the drivers themselves come from :data:`adapters.engines.REGISTRY`."""


def run_cli(args: Any) -> int:
    """The ``probe`` subcommand: print the observation (JSON with ``--json``); 0 healthy and ready, 1 not."""
    # Drivers log failures as structlog events; the CLI's contract is one error line on stderr.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    obs = probe(args.engine, args.url, metrics_url=args.metrics_url, model=args.model,
                grpc_address=args.grpc_address, timeout_s=args.timeout,
                meter_url=args.meter_url)
    if args.json:
        print(json.dumps(obs, indent=2, sort_keys=True))
    else:
        for key in ("engine", "url", "healthy", "ready", "waiting", "running", "kv_usage", "ttft_p99_ms",
                    "gpu_mem_used_bytes", "gpu_mem_total_bytes"):
            print(f"{key:20} {obs[key]}")
        if obs["unknown"]:
            print(f"{'unknown':20} {', '.join(obs['unknown'])}")
    return 0 if obs["healthy"] and obs["ready"] else 1

