"""The engine drivers behind one protocol, and the one registry that builds them.

Everything that talks to an inference engine (the Kubernetes backend, ``controlplane probe``) goes
through :data:`REGISTRY`: no other module compares engine names. Adding an engine is one driver
module implementing :class:`EngineDriver`, one :class:`EngineEntry` here, its row in
:data:`controlplane.domain.engines.CAPABILITIES` (the planner reads the same table), a protocol-faithful
fake in ``tests/fakes/`` and its contract tests (``tests/adapters/test_engines.py``).

=================  ==================  ==========================  ===================================
engine             ``is_ready``        ``in_flight``               ``warm_down`` / ``warm_up``
=================  ==================  ==========================  ===================================
vLLM               ``GET /health``     running + waiting gauges    ``POST /sleep?level=N`` / ``/wake_up``
                                       of one ``/metrics`` scrape
Triton             model ready         Triton queue + TensorRT-    explicit model unload / load
                                       LLM waiting + active; None
                                       without TensorRT-LLM gauges
DeepSpeed-MII      probe generate      the request meter's running ``ValidationError``: no sleep mode
                                       + waiting; None without one
=================  ==================  ==========================  ===================================
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from adapters.deepspeed_mii import MiiDriver
from adapters.triton import TritonDriver
from adapters.vllm import VllmDriver
from controlplane.domain.engines import CAPABILITIES, Engine, EngineCapabilities
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.observations import InstanceSample
from controlplane.domain.start_tiers import VLLM_SLEEP_LEVEL

__all__ = ["MII_DEFAULT_GRPC_PORT", "REGISTRY", "DriverAddress", "EngineDriver", "EngineEntry", "build_driver",
           "entry"]

MII_DEFAULT_GRPC_PORT = 50050
"""DeepSpeed-MII's gRPC load-balancer port when the address names none (MII's ``port_number`` default)."""


@runtime_checkable
class EngineDriver(Protocol):
    """What the adapter asks of one engine server. Every method has a bounded timeout and raises the
    control plane's typed errors only (``Unavailable`` when the engine does not answer)."""

    def is_ready(self) -> bool:
        """The engine serves requests now (vLLM ``/health``, Triton model ready, MII probe generate)."""
        ...

    def sample(self, instance_id: InstanceId, deployment: DeploymentId, now_ms: int) -> InstanceSample: ...

    def in_flight(self) -> int | None:
        """Requests the engine holds now (queued or executing); None: the engine cannot tell."""
        ...

    def warm_down(self) -> None:
        """The warm path down (vLLM sleep, Triton unload); ``WarmPathUnavailable`` when the server
        refuses it, ``ValidationError`` for an engine without one."""
        ...

    def warm_up(self) -> None:
        """The warm path up (vLLM wake, Triton load)."""
        ...

    def statistics(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class DriverAddress:
    """Where one engine server is and how long to wait for it: everything a driver factory needs."""

    base_url: str
    """``http://HOST:PORT``: the vLLM server, Triton's HTTP port, MII's REST gateway (root, or the
    whole ``.../mii/DEPLOYMENT`` URL when ``model`` is None)."""
    timeout_s: float
    model: str | None = None
    """vLLM: the ``model_name`` label to read (None: the only one); Triton: the repository model;
    DeepSpeed-MII: the deployment name."""
    metrics_url: str | None = None
    """Triton's metrics port (``http://HOST:8002``)."""
    grpc_address: str | None = None
    """DeepSpeed-MII's gRPC load balancer ``HOST:PORT`` (None: the base URL's host, port 50050)."""
    sleep_level: int = VLLM_SLEEP_LEVEL
    """vLLM's sleep level for ``warm_down`` (the product's ``start_tiers.VLLM_SLEEP_LEVEL``)."""
    meter_url: str | None = None
    """DeepSpeed-MII: ``http://HOST:PORT`` of the pod's request meter (:mod:`adapters.mii_meter`);
    None: MII's load is unknown."""


@dataclass(frozen=True, slots=True)
class EngineEntry:
    engine: Engine
    build: Callable[[DriverAddress], EngineDriver]
    requires: tuple[str, ...]
    """The :class:`DriverAddress` fields this engine cannot do without (checked by :func:`build_driver`)."""
    model_required: bool = False
    """An adapter workload of this engine must name its model (Triton's repository model, MII's
    deployment name): a pod address alone does not say it."""
    default_metrics_port: int | None = None
    """The engine's own metrics port when it is not the HTTP port (Triton 8002)."""

    @property
    def capabilities(self) -> EngineCapabilities:
        """The engine's row of the domain table (never a copy: the planner reads the same facts)."""
        return CAPABILITIES[self.engine]


def _vllm(a: DriverAddress) -> EngineDriver:
    return VllmDriver(a.base_url, a.timeout_s, model_name=a.model, sleep_level=a.sleep_level)


def _triton(a: DriverAddress) -> EngineDriver:
    assert a.model is not None and a.metrics_url is not None  # build_driver checked ``requires``
    return TritonDriver(a.base_url, a.metrics_url, a.model, a.timeout_s)


def _mii(a: DriverAddress) -> EngineDriver:
    base = a.base_url.rstrip("/")
    rest_url = base if a.model is None else f"{base}/mii/{urllib.parse.quote(a.model, safe='')}"
    grpc = a.grpc_address or f"{urllib.parse.urlsplit(base).hostname or ''}:{MII_DEFAULT_GRPC_PORT}"
    return MiiDriver(rest_url, grpc, a.timeout_s, meter_url=a.meter_url)


REGISTRY: Mapping[Engine, EngineEntry] = MappingProxyType({
    Engine.VLLM: EngineEntry(Engine.VLLM, _vllm, requires=()),
    Engine.TRITON: EngineEntry(Engine.TRITON, _triton, requires=("model", "metrics_url"), model_required=True,
                               default_metrics_port=8002),
    Engine.DEEPSPEED_MII: EngineEntry(Engine.DEEPSPEED_MII, _mii, requires=(), model_required=True),
})


def entry(engine: Engine | str) -> EngineEntry:
    """The registry entry of ``engine`` (an :class:`Engine` or its name); ValidationError naming
    ``engine`` for one the registry does not know."""
    try:
        return REGISTRY[Engine(engine)]
    except (ValueError, KeyError):
        known = ", ".join(e.value for e in REGISTRY)
        raise ValidationError("engine", f"must be one of {known}, got {engine!r}") from None


def build_driver(engine: Engine | str, address: DriverAddress) -> EngineDriver:
    """The driver of ``engine`` at ``address``; ValidationError naming a required field left unset."""
    e = entry(engine)
    for name in e.requires:
        if not getattr(address, name):
            raise ValidationError(name, f"required for engine {e.engine.value}")
    return e.build(address)
