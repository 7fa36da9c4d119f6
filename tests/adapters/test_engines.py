"""Contract tests of the engine registry (adapters/engines.py): every entry's driver, built from a
DriverAddress through the registry, satisfies the EngineDriver protocol against its protocol-faithful
fake (tests/fakes/). A new engine adds one Case here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from adapters.engine_http import WarmPathUnavailable
from adapters.engines import REGISTRY, DriverAddress, EngineDriver, build_driver, entry
from controlplane.domain.engines import CAPABILITIES, Engine
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.observations import InstanceSample
from tests.fakes.mii_server import FakeMiiServer
from tests.fakes.triton_server import FakeTritonServer
from tests.fakes.vllm_server import FakeVllmServer

pytestmark = pytest.mark.timeout(30)


@dataclass(frozen=True)
class Case:
    engine: Engine
    start: Callable[[], Any]
    address: Callable[[Any], DriverAddress]
    load: Callable[[Any, int, int], None]
    """Put ``queued`` requests in the engine's queue and ``executing`` in execution."""
    in_flight_known: bool


def _vllm_load(server: FakeVllmServer, queued: int, executing: int) -> None:
    server.waiting, server.running = queued, executing


def _triton_load(server: FakeTritonServer, queued: int, executing: int) -> None:
    server.trt_llm = True
    server.pending, server.trt_waiting = queued, 0
    server.trt_scheduled = executing


CASES = {
    Engine.VLLM: Case(Engine.VLLM, lambda: FakeVllmServer(model_name="m", dev_mode=True).start(),
                      lambda s: DriverAddress(s.base_url, 1.0), _vllm_load, True),
    Engine.TRITON: Case(Engine.TRITON,
                        lambda: FakeTritonServer(models={"llm": "READY"}, model_control_mode="explicit").start(),
                        lambda s: DriverAddress(s.base_url, 1.0, model="llm", metrics_url=s.metrics_url),
                        _triton_load, True),
    Engine.DEEPSPEED_MII: Case(Engine.DEEPSPEED_MII, lambda: FakeMiiServer(deployment_name="mii-llama").start(),
                               lambda s: DriverAddress(s.rest_url.rsplit("/mii/", 1)[0], 1.0, model="mii-llama",
                                                       grpc_address=s.grpc_address),
                               lambda s, q, e: None, False),
}


@pytest.fixture(params=list(REGISTRY), ids=lambda e: e.value)
def case(request: pytest.FixtureRequest) -> Iterator[tuple[Case, Any, EngineDriver]]:
    c = CASES[request.param]
    server = c.start()
    try:
        yield c, server, build_driver(c.engine, c.address(server))
    finally:
        server.stop()


def test_every_engine_has_a_registry_entry_a_fake_and_the_domain_capabilities() -> None:
    assert set(REGISTRY) == set(Engine) == set(CASES)
    for engine, e in REGISTRY.items():
        assert e.engine is engine
        assert e.capabilities is CAPABILITIES[engine]  # the planner's table, not a copy


def test_the_driver_satisfies_the_protocol(case: tuple[Case, Any, EngineDriver]) -> None:
    c, _server, driver = case
    assert isinstance(driver, EngineDriver)
    assert driver.is_ready() is True
    sample = driver.sample(InstanceId("i-1"), DeploymentId("chat"), 1_000)
    assert isinstance(sample, InstanceSample) and sample.instance_id == "i-1" and sample.at_ms == 1_000
    stats = driver.statistics()
    assert isinstance(stats, dict) and stats


def test_in_flight_counts_queued_and_executing_or_says_it_cannot_tell(case: tuple[Case, Any, EngineDriver]) -> None:
    c, server, driver = case
    c.load(server, 3, 4)
    if not c.in_flight_known:
        assert driver.in_flight() is None
        return
    assert driver.in_flight() == 7
    c.load(server, 0, 0)
    assert driver.in_flight() == 0


def test_warm_path_follows_the_capabilities(case: tuple[Case, Any, EngineDriver]) -> None:
    c, _server, driver = case
    if not CAPABILITIES[c.engine].warm_path:
        with pytest.raises(ValidationError, match="no sleep mode"):
            driver.warm_down()
        with pytest.raises(ValidationError, match="no sleep mode"):
            driver.warm_up()
        return
    driver.warm_down()
    assert driver.is_ready() is (c.engine is Engine.VLLM)  # a sleeping vLLM still answers /health
    driver.warm_up()
    assert driver.is_ready() is True


def test_vllm_in_flight_leaves_the_sample_baseline_alone() -> None:
    server = FakeVllmServer(model_name="m").start()
    try:
        driver = build_driver(Engine.VLLM, DriverAddress(server.base_url, 1.0))
        driver.sample(InstanceId("i"), DeploymentId("d"), 1_000)
        server.generation_tokens = 500
        assert driver.in_flight() == 0
        assert driver.sample(InstanceId("i"), DeploymentId("d"), 2_000).generation_tokens_per_s == 500.0
    finally:
        server.stop()


def test_triton_in_flight_adds_its_queue_the_backend_queue_and_active_requests() -> None:
    server = FakeTritonServer(models={"llm": "READY"}).start()
    try:
        driver = build_driver(Engine.TRITON, DriverAddress(server.base_url, 1.0, model="llm",
                                                           metrics_url=server.metrics_url))
        server.pending = 2
        assert driver.in_flight() is None  # no TensorRT-LLM gauges: nothing counts executing requests
        server.trt_llm = True
        server.trt_waiting, server.trt_scheduled, server.trt_paused = 1, 3, 2
        assert driver.in_flight() == 2 + 1 + 5
    finally:
        server.stop()


def test_vllm_without_dev_mode_refuses_the_warm_path() -> None:
    server = FakeVllmServer(model_name="m", dev_mode=False).start()
    try:
        with pytest.raises(WarmPathUnavailable):
            build_driver(Engine.VLLM, DriverAddress(server.base_url, 1.0)).warm_down()
    finally:
        server.stop()


def test_bad_engine_or_missing_address_field_is_a_typed_error() -> None:
    with pytest.raises(ValidationError, match="engine"):
        entry("tgi")
    with pytest.raises(ValidationError, match="metrics_url"):
        build_driver(Engine.TRITON, DriverAddress("http://127.0.0.1:1", 1.0, model="llm"))
    with pytest.raises(ValidationError, match="sleep_level"):
        build_driver(Engine.VLLM, DriverAddress("http://127.0.0.1:1", 1.0, sleep_level=3))
