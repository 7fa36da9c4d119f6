"""MiiDriver against the fake DeepSpeed-MII 0.3.3 REST gateway + LB port (CONTRACTS.md section 3)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from adapters.deepspeed_mii import (
    MISSING_FIELDS,
    EngineRejected,
    MiiDriver,
    ProbeResult,
    UnexpectedResponse,
)
from controlplane.domain.engines import LOAD_FIELDS
from controlplane.domain.errors import (
    PermanentError,
    TemporaryError,
    Unavailable,
    ValidationError,
)
from controlplane.domain.ids import DeploymentId, InstanceId
from tests.fakes.base import http_call
from tests.fakes.mii_server import FakeMiiServer, flask_error_page
from tests.fakes.vllm_server import refused

IID = InstanceId("i-1")
DEP = DeploymentId("chat")
PROBE_REQUEST = ("POST", "/mii/mii-llama", "application/json", b'{"prompts":["ping"],"max_new_tokens":1}')


@pytest.fixture
def fake() -> Iterator[FakeMiiServer]:
    server = FakeMiiServer().start()
    try:
        yield server
    finally:
        server.stop()


def driver_for(server: FakeMiiServer, timeout_s: float = 2.0) -> MiiDriver:
    return MiiDriver(server.rest_url, server.grpc_address, timeout_s)


def raw(server: FakeMiiServer, method: str, path: str, body: bytes | None = None,
        content_type: str | None = None) -> tuple[int, bytes, str]:
    return http_call(f"http://127.0.0.1:{server.rest_port}{path}", method, body, content_type)


# -- the fake itself -------------------------------------------------------------------------------
def test_fake_gateway_routes_match_contract(fake: FakeMiiServer) -> None:
    assert raw(fake, "GET", "/healthz") == (200, b"ok", "text/html; charset=utf-8")
    status, body, ctype = raw(fake, "POST", "/mii/mii-llama", b'{"prompts":["a b","c"],"max_length":3}',
                              "application/json")
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body) == [
        {"generated_text": "pong", "prompt_length": 2, "generated_length": 1, "finish_reason": "stop"},
        {"generated_text": "pong", "prompt_length": 1, "generated_length": 1, "finish_reason": "stop"},
    ]
    assert raw(fake, "POST", "/mii/mii-llama", b'{"prompts":["x"]}', "text/plain") == (
        415, flask_error_page(415), "text/html; charset=utf-8")
    assert raw(fake, "POST", "/mii/mii-llama", b"{", "application/json")[0] == 400
    assert raw(fake, "POST", "/mii/mii-llama", b'{"prompts":["x"],"bogus":1}', "application/json")[0] == 500
    assert raw(fake, "GET", "/mii/mii-llama")[0] == 405
    assert raw(fake, "POST", "/mii/other", b"{}", "application/json")[0] == 404
    fake.reply_text = "one two three"
    _, body, _ = raw(fake, "POST", "/mii/mii-llama", b'{"prompts":["x"],"max_new_tokens":2}', "application/json")
    assert json.loads(body) == [{"generated_text": "one two", "prompt_length": 1, "generated_length": 2,
                                 "finish_reason": "length"}]


def test_fake_healthz_is_static_while_backend_is_down(fake: FakeMiiServer) -> None:
    fake.set_down(True)
    assert refused(fake.grpc_port)
    assert raw(fake, "GET", "/healthz") == (200, b"ok", "text/html; charset=utf-8")
    assert raw(fake, "POST", "/mii/mii-llama", b'{"prompts":["x"]}', "application/json")[0] == 500
    fake.set_down(False)
    assert not refused(fake.grpc_port)


# -- happy path ------------------------------------------------------------------------------------
def test_probe_sends_exact_request_and_parses_reply(fake: FakeMiiServer) -> None:
    d = driver_for(fake)
    result = d.probe()
    assert isinstance(result, ProbeResult)
    assert (result.generated_text, result.prompt_length, result.generated_length, result.finish_reason) == (
        "pong", 1, 1, "stop")
    assert 0 < result.latency_ms < 2000
    assert fake.requests == [PROBE_REQUEST]
    assert d.ready() is True
    assert d.gateway_alive() is True
    assert d.deployment_name == "mii-llama"


def test_sample_reports_probe_latency_and_unknowns_as_zero(fake: FakeMiiServer) -> None:
    d = driver_for(fake)
    s = d.sample(IID, DEP, 1234)
    assert (s.instance_id, s.deployment, s.at_ms) == (IID, DEP, 1234)
    assert (s.running, s.waiting, s.kv_usage, s.prompt_tokens_per_s, s.generation_tokens_per_s) == (0, 0, 0.0, 0.0, 0.0)
    assert s.unknown == tuple(sorted(LOAD_FIELDS)) and not any(s.knows(f) for f in LOAD_FIELDS)
    assert d.in_flight() is None  # MII cannot tell without its meter
    assert (s.gpu_mem_used_bytes, s.gpu_mem_total_bytes, s.healthy) == (0, 0, True)
    assert s.ttft_p99_ms is not None and 0 < s.ttft_p99_ms < 2000
    stats = d.statistics()
    assert stats == {"probes": 1, "unreachable": 0, "rejected": 0, "unexpected": 0, "last_error": "",
                     "last_probe_ms": s.ttft_p99_ms, "metrics_endpoint": False, "missing": list(MISSING_FIELDS),
                     "ttft_source": "probe_latency", "meter_url": None, "meter_scrapes": 0, "meter_failures": 0,
                     "meter_request_p99_ms": None}
    assert MISSING_FIELDS == ("running", "waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s",
                              "gpu_mem_used_bytes", "gpu_mem_total_bytes")


def test_probe_latency_tracks_slow_gateway(fake: FakeMiiServer) -> None:
    fake.slow_s = 0.3
    s = driver_for(fake).sample(IID, DEP, 0)
    assert s.ttft_p99_ms is not None and s.ttft_p99_ms >= 300


# -- refused / timeout -----------------------------------------------------------------------------
def test_loading_is_refused_then_ready() -> None:
    server = FakeMiiServer().start(loading=True)
    try:
        assert refused(server.rest_port) and refused(server.grpc_port)
        d = driver_for(server)
        with capture_logs() as logs, pytest.raises(Unavailable, match="gRPC load balancer .* unreachable"):
            d.ready()
        assert [e["event"] for e in logs] == ["mii.unreachable"]
        assert d.statistics()["unreachable"] == 1
        server.finish_loading()
        assert d.ready() is True
        server.begin_loading()
        with pytest.raises(Unavailable):
            d.probe()
    finally:
        server.stop()


def test_rest_gateway_refused_while_lb_up(fake: FakeMiiServer) -> None:
    port = fake.rest_port
    fake._rest.close()  # the gateway process died; the load balancer still listens
    d = MiiDriver(f"http://127.0.0.1:{port}/mii/mii-llama", fake.grpc_address, 2.0)
    with pytest.raises(Unavailable, match=f"http://127.0.0.1:{port}/mii/mii-llama unreachable"):
        d.probe()


def test_lb_down_while_gateway_up_is_unavailable(fake: FakeMiiServer) -> None:
    fake.set_down(True)
    d = driver_for(fake)
    assert d.gateway_alive() is True  # the static health endpoint lies
    with pytest.raises(Unavailable, match=f"gRPC load balancer {fake.grpc_address} unreachable"):
        d.probe()
    assert fake.requests == [("GET", "/healthz", "", b"")]  # no generate was attempted


def test_timeout_is_unavailable(fake: FakeMiiServer) -> None:
    fake.slow_s = 1.5
    d = driver_for(fake, timeout_s=0.3)
    started = time.monotonic()
    with capture_logs() as logs, pytest.raises(Unavailable, match="timed out"):
        d.probe()
    assert time.monotonic() - started < 1.4
    assert [e["event"] for e in logs] == ["mii.unreachable"]
    assert isinstance(Unavailable("x"), TemporaryError)


# -- error statuses --------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [400, 404, 415])
def test_4xx_is_engine_rejected(fake: FakeMiiServer, status: int) -> None:
    fake.error_status = status
    d = driver_for(fake)
    with capture_logs() as logs, pytest.raises(EngineRejected) as info:
        d.ready()
    assert info.value.status == status
    assert isinstance(info.value, PermanentError)
    assert [e["event"] for e in logs] == ["mii.rejected"]
    assert d.statistics()["rejected"] == 1


def test_unknown_deployment_is_engine_rejected(fake: FakeMiiServer) -> None:
    d = MiiDriver(f"http://127.0.0.1:{fake.rest_port}/mii/nope", fake.grpc_address, 2.0)
    with pytest.raises(EngineRejected, match="HTTP 404") as info:
        d.probe()
    assert info.value.status == 404


@pytest.mark.parametrize("status", [500, 503])
def test_5xx_is_not_ready_and_sample_raises(fake: FakeMiiServer, status: int) -> None:
    fake.error_status = status
    d = driver_for(fake)
    with capture_logs() as logs:
        assert d.ready() is False
    assert [e["event"] for e in logs] == ["mii.unexpected", "mii.not_ready"]
    with pytest.raises(UnexpectedResponse, match=f"HTTP {status}") as info:
        d.sample(IID, DEP, 0)
    assert info.value.status == status
    assert d.statistics()["unexpected"] == 2


@pytest.mark.parametrize("body", [
    b"not json", b"{}", b"[]", b'[{"generated_text": "x"}]',
    b'[{"generated_text": "x", "prompt_length": 1, "generated_length": 1, "finish_reason": "eos"}]',
    b'[{"generated_text": "x", "prompt_length": true, "generated_length": 1, "finish_reason": "stop"}]',
])
def test_malformed_reply_is_unexpected(fake: FakeMiiServer, body: bytes) -> None:
    fake.body_override = body
    d = driver_for(fake)
    with pytest.raises(UnexpectedResponse) as info:
        d.ready()
    assert info.value.status == 200
    assert d.statistics()["unexpected"] == 1


@pytest.mark.parametrize(("rest_url", "grpc", "timeout", "field"), [
    ("http://h:1/generate", "h:50050", 1.0, "rest_url"),
    ("http://h:1/mii/", "h:50050", 1.0, "rest_url"),
    ("ftp://h:1/mii/x", "h:50050", 1.0, "rest_url"),
    ("http://h:1/mii/x", "h", 1.0, "grpc_address"),
    ("http://h:1/mii/x", "h:0", 1.0, "grpc_address"),
    ("http://h:1/mii/x", "h:50050", 0.0, "timeout_s"),
])
def test_constructor_validates(rest_url: str, grpc: str, timeout: float, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        MiiDriver(rest_url, grpc, timeout)
    assert info.value.field == field


def test_error_bodies_become_one_line(fake: FakeMiiServer) -> None:
    fake.error_status = 500
    with pytest.raises(UnexpectedResponse) as info:
        driver_for(fake).probe()
    assert str(info.value) == "DeepSpeed-MII /mii/mii-llama: HTTP 500: 500 Internal Server Error"
