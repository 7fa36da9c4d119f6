"""TritonDriver against the protocol-faithful fake Triton server (CONTRACTS.md section 2)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from adapters.triton import (
    EngineExiting,
    EngineRejected,
    MetricsMalformed,
    ModelIndexEntry,
    ModelLoadFailed,
    ModelUnknown,
    TritonDriver,
    WarmPathUnavailable,
)
from controlplane.domain.errors import (
    NotFound,
    PermanentError,
    TemporaryError,
    Unavailable,
    ValidationError,
)
from controlplane.domain.ids import DeploymentId, InstanceId
from tests.fakes.base import http_call
from tests.fakes.triton_server import NOT_EXPLICIT, FakeTritonServer
from tests.fakes.vllm_server import refused

MODEL = "llm"
IID = InstanceId("i-1")
DEP = DeploymentId("chat")
GIB = 2**30


@pytest.fixture
def fake() -> Iterator[FakeTritonServer]:
    server = FakeTritonServer(models={MODEL: "READY", "embed": "READY"}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def explicit() -> Iterator[FakeTritonServer]:
    server = FakeTritonServer(models={MODEL: "READY", "embed": "READY"}, model_control_mode="explicit").start()
    try:
        yield server
    finally:
        server.stop()


def driver_for(server: FakeTritonServer, model: str = MODEL) -> TritonDriver:
    return TritonDriver(server.base_url, server.metrics_url, model, timeout_s=2.0)


def raw(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, str]:
    return http_call(url + path, method, body)


def err(msg: str) -> bytes:
    return json.dumps({"error": msg}, separators=(",", ":")).encode()


# -- the fake itself follows the contract ---------------------------------------------------------

def test_fake_health_and_model_ready_statuses(fake: FakeTritonServer) -> None:
    u = fake.base_url
    assert raw(u, "GET", "/v2/health/live")[:2] == (200, b"")
    assert raw(u, "GET", "/v2/health/ready")[:2] == (200, b"")
    assert raw(u, "POST", "/v2/health/live")[:2] == (405, err("Method Not Allowed"))
    assert raw(u, "GET", "/v2/nope")[:2] == (404, err("Not Found"))
    assert raw(u, "GET", f"/v2/models/{MODEL}/ready")[:2] == (200, b"")
    assert raw(u, "GET", f"/v2/models/{MODEL}/versions/1/ready")[:2] == (200, b"")
    assert raw(u, "GET", "/v2/models/zzz/ready")[:2] == (400, err("Request for unknown model: 'zzz' is not found"))
    fake.models[MODEL] = "LOADING"
    assert raw(u, "GET", f"/v2/models/{MODEL}/ready")[:2] == (400, err("Model version not ready"))
    assert raw(u, "GET", "/v2/health/ready")[:2] == (400, b"")
    fake.models[MODEL] = "UNAVAILABLE"
    assert raw(u, "GET", f"/v2/models/{MODEL}/ready")[:2] == (
        404, err(f"Request for unknown model: '{MODEL}' has no available versions"))
    fake.exiting = True
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, body, ctype = raw(u, "GET", path)
        assert (status, body, ctype) == (503, b'{"error":"Server exiting"}', "application/json")


def test_fake_repository_routes(fake: FakeTritonServer) -> None:
    u = fake.base_url
    status, body, ctype = raw(u, "POST", "/v2/repository/index")
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body) == [{"name": "embed", "version": "1", "state": "READY"},
                                {"name": MODEL, "version": "1", "state": "READY"}]
    assert raw(u, "POST", f"/v2/repository/models/{MODEL}/load", b"{}")[:2] == (503, err(NOT_EXPLICIT))
    assert raw(u, "POST", f"/v2/repository/models/{MODEL}/unload")[:2] == (503, err(NOT_EXPLICIT))
    assert raw(u, "POST", "/v2/repository/r1/index")[:2] == (
        501, err("'repository_name' specification is not supported"))
    assert raw(u, "GET", "/v2/repository/index")[0] == 405


def test_fake_metrics_exposition(fake: FakeTritonServer) -> None:
    fake.pending, fake.success, fake.queue_us = 4, 10, 2500
    status, body, ctype = raw(fake.metrics_url, "GET", "/metrics")
    text = body.decode()
    assert (status, ctype) == (200, "text/plain; version=0.0.4")
    assert f'nv_inference_pending_request_count{{gpu_uuid="GPU-0000",model="{MODEL}",version="1"}} 4\n' in text
    assert f'nv_inference_request_success{{gpu_uuid="GPU-0000",model="{MODEL}",version="1"}} 10\n' in text
    assert f'nv_inference_queue_duration_us{{gpu_uuid="GPU-0000",model="{MODEL}",version="1"}} 2500\n' in text
    assert 'nv_inference_request_success{gpu_uuid="GPU-0000",model="embed",version="1"} 0\n' in text
    assert f'nv_gpu_memory_total_bytes{{gpu_uuid="GPU-0000"}} {80 * GIB}\n' in text
    assert "# TYPE nv_inference_count counter\n" in text and "nv_inference_count_total" not in text
    assert "nv_trt_llm" not in text and "first_response" not in text


# -- health, readiness, startup, exiting ----------------------------------------------------------

def test_live_ready_model_ready_happy_path(fake: FakeTritonServer) -> None:
    d = driver_for(fake)
    assert d.live() is True and d.ready() is True
    assert d.model_ready() is True and d.model_ready("1") is True
    assert d.model_ready("2") is False  # 404 version not found


def test_not_ready_statuses(fake: FakeTritonServer) -> None:
    d = driver_for(fake)
    fake.models[MODEL] = "LOADING"  # 400 "Model version not ready"; strict readiness: server not ready
    assert (d.ready(), d.model_ready(), d.live()) == (False, False, True)
    fake.models[MODEL] = "UNAVAILABLE"  # 404 no available versions
    assert d.model_ready() is False


def test_unknown_model_is_not_found(fake: FakeTritonServer) -> None:
    with pytest.raises(ModelUnknown) as info:
        driver_for(fake, "zzz").model_ready()
    assert isinstance(info.value, NotFound)
    assert info.value.message == "Request for unknown model: 'zzz' is not found"


@pytest.mark.parametrize("call", ["live", "ready", "model_ready", "repository_index", "load_model"])
def test_exiting_is_typed(fake: FakeTritonServer, call: str) -> None:
    fake.exiting = True
    d = driver_for(fake)
    with capture_logs() as logs, pytest.raises(EngineExiting) as info:
        getattr(d, call)()
    assert isinstance(info.value, PermanentError)
    assert [e["event"] for e in logs] == ["triton.exiting"]
    assert d.statistics()["exiting"] == 1


def test_connection_refused_while_loading_and_after_stop() -> None:
    server = FakeTritonServer().start(loading=True)
    try:
        d = driver_for(server)
        assert refused(server.port)
        with capture_logs() as logs, pytest.raises(Unavailable) as info:
            d.live()
        assert isinstance(info.value.__cause__, OSError | urllib.error.URLError)
        assert [e["event"] for e in logs] == ["triton.unreachable"]
        with pytest.raises(Unavailable):
            d.sample(IID, DEP, 0)
        server.finish_loading()
        assert d.ready() is True
    finally:
        server.stop()
    with pytest.raises(Unavailable):
        d.model_ready()
    assert d.statistics()["unreachable"] == 3


def test_invalid_arguments_rejected() -> None:
    with pytest.raises(ValidationError):
        TritonDriver("http://127.0.0.1:1", "http://127.0.0.1:2", MODEL, timeout_s=0)
    with pytest.raises(ValidationError):
        TritonDriver("http://127.0.0.1:1", "http://127.0.0.1:2", "a/b", timeout_s=1)


# -- repository and warm path ---------------------------------------------------------------------

def test_repository_index(explicit: FakeTritonServer) -> None:
    d = driver_for(explicit)
    assert d.repository_index() == [ModelIndexEntry("embed", "READY", "1"), ModelIndexEntry(MODEL, "READY", "1")]
    d.unload_model()
    assert d.repository_index() == [ModelIndexEntry("embed", "READY", "1"),
                                    ModelIndexEntry(MODEL, "UNAVAILABLE", "", "unloaded")]
    assert d.repository_index(ready_only=True) == [ModelIndexEntry("embed", "READY", "1")]
    assert explicit.requests[-1] == ("POST", "/v2/repository/index", b'{"ready":true}')
    assert explicit.requests[-2] == ("POST", "/v2/repository/index", b"")


def test_explicit_load_unload_exact_bodies(explicit: FakeTritonServer) -> None:
    d = driver_for(explicit)
    with capture_logs() as logs:
        d.unload_model()
    assert explicit.requests[-1] == ("POST", f"/v2/repository/models/{MODEL}/unload",
                                     b'{"parameters":{"unload_dependents":false}}')
    assert logs[0]["event"] == "triton.model_control"
    assert d.model_ready() is False
    assert d.ready() is True  # strict readiness ignores models unloaded on purpose
    d.load_model()
    assert explicit.requests[-1] == ("POST", f"/v2/repository/models/{MODEL}/load", b"{}")
    assert d.model_ready() is True
    d.load_model(config={"max_batch_size": 8})
    assert json.loads(explicit.requests[-1][2]) == {"parameters": {"config": '{"max_batch_size": 8}'}}
    d.unload_model(unload_dependents=True)
    assert explicit.requests[-1][2] == b'{"parameters":{"unload_dependents":true}}'
    status, body, ctype = raw(explicit.base_url, "POST", f"/v2/repository/models/{MODEL}/load", b"{}")
    assert (status, body, ctype) == (200, b"", "application/json")


def test_load_failure_is_typed(explicit: FakeTritonServer) -> None:
    with pytest.raises(ModelLoadFailed) as info:
        driver_for(explicit, "missing").load_model()
    assert (info.value.status, info.value.message) == (
        500, "failed to load 'missing', failed to poll from model repository")
    explicit.load_failures[MODEL] = "CUDA out of memory"
    with pytest.raises(ModelLoadFailed) as info:
        driver_for(explicit).load_model()
    assert info.value.message == f"failed to load '{MODEL}', CUDA out of memory"


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_non_explicit_mode_is_warm_path_unavailable(mode: str) -> None:
    server = FakeTritonServer(model_control_mode=mode).start()
    try:
        d = driver_for(server)
        for call in (d.load_model, d.unload_model):
            with capture_logs() as logs, pytest.raises(WarmPathUnavailable) as info:
                call()
            assert isinstance(info.value, PermanentError) and info.value.message == NOT_EXPLICIT
            assert logs[0]["event"] == "triton.warm_path_unavailable" and logs[0]["fallback"] == "cold_start"
        assert d.model_ready() is True
    finally:
        server.stop()


def test_engine_rejected_class_is_validation_error() -> None:
    assert issubclass(EngineRejected, ValidationError)


# -- metrics --------------------------------------------------------------------------------------

def test_sample_first_scrape_exact(fake: FakeTritonServer) -> None:
    fake.pending, fake.success, fake.inference_count, fake.queue_us, fake.request_us = 7, 100, 120, 5000, 9000
    fake.gpu_used = 30 * GIB
    d = driver_for(fake)
    s = d.sample(IID, DEP, 10_000)
    assert (s.instance_id, s.deployment, s.at_ms) == (IID, DEP, 10_000)
    assert (s.waiting, s.running, s.kv_usage) == (7, 0, 0.0)
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s, s.ttft_p99_ms) == (0.0, 0.0, None)
    assert (s.gpu_mem_used_bytes, s.gpu_mem_total_bytes, s.healthy) == (30 * GIB, 80 * GIB, True)
    st = d.statistics()
    assert (st["running_source"], st["kv_source"], st["gpu_metrics"], st["ttft_source"]) == (
        "no_baseline", "absent", True, "absent")
    assert st["mean_queue_ms"] is None and st["scrapes"] == 1


def test_running_and_queue_time_from_deltas(fake: FakeTritonServer) -> None:
    d = driver_for(fake)
    fake.success, fake.inference_count, fake.queue_us, fake.request_us = 10, 10, 1_000, 50_000
    d.sample(IID, DEP, 0)
    # 2 s: 40 successes, 80 ms queued in total (mean 2 ms), 6 s of execution -> 3 requests in flight
    fake.success, fake.inference_count = 50, 50
    fake.queue_us, fake.request_us = 81_000, 50_000 + 80_000 + 6_000_000
    with capture_logs() as logs:
        s = d.sample(IID, DEP, 2_000)
    assert s.running == 3
    st = d.statistics()
    assert (st["running_source"], st["mean_queue_ms"], st["inferences_per_s"]) == ("littles_law", 2.0, 20.0)
    # compute apart from queueing: (6.08 s of execution - 0.08 s of queue) over 40 executions = 150 ms
    assert st["mean_compute_ms"] == pytest.approx(150.0)
    assert logs == [{"event": "triton.sample", "log_level": "debug", "base_url": fake.metrics_url, "model": MODEL,
                     "waiting": 0, "running": 3, "mean_queue_ms": 2.0, "queue_p95_ms": 2.0}]
    s = d.sample(IID, DEP, 3_000)  # nothing new
    assert s.running == 0 and d.statistics()["mean_queue_ms"] is None
    fake.success, fake.inference_count, fake.queue_us, fake.request_us = 2, 2, 4_000, 1_004_000  # restart
    s = d.sample(IID, DEP, 4_000)
    assert s.running == 1 and d.statistics()["mean_queue_ms"] == 2.0


def test_queue_p95_from_the_summary_else_the_interval_mean(fake: FakeTritonServer) -> None:
    d = driver_for(fake)
    fake.success, fake.inference_count, fake.queue_us, fake.request_us = 10, 10, 1_000, 50_000
    first = d.sample(IID, DEP, 0)
    # No baseline: Little's law cannot count running yet, and plain Triton has no KV or token metrics.
    assert first.unknown == ("generation_tokens_per_s", "kv_usage", "prompt_tokens_per_s", "running")
    assert first.queue_p95_ms is None and d.statistics()["queue_source"] == "none"
    fake.success, fake.queue_us, fake.request_us = 50, 1_000 + 40 * 150_000, 50_000 + 40 * 400_000
    s = d.sample(IID, DEP, 1_000)
    # Without summaries: the interval's mean queue time, a lower bound of its p95.
    assert s.queue_p95_ms == 150.0 and d.statistics()["queue_source"] == "interval_mean"
    assert s.unknown == ("generation_tokens_per_s", "kv_usage", "prompt_tokens_per_s")
    fake.summary_latencies = True
    assert d.sample(IID, DEP, 1_500).queue_p95_ms is None  # an empty summary window (NaN) is no value
    fake.observe_queue(*[1_000.0] * 90, *[400_000.0] * 10)
    s = d.sample(IID, DEP, 2_000)
    assert s.queue_p95_ms == 400.0 and d.statistics()["queue_source"] == "summary"
    fake.nan_metrics.add("nv_inference_queue_summary_us")
    assert d.sample(IID, DEP, 3_000).queue_p95_ms is None


def test_token_rates_from_the_vllm_backend(fake: FakeTritonServer) -> None:
    fake.vllm_backend, fake.prompt_tokens, fake.generation_tokens = True, 1_000, 500
    d = driver_for(fake)
    assert "prompt_tokens_per_s" in d.sample(IID, DEP, 0).unknown  # first scrape: no baseline
    fake.prompt_tokens, fake.generation_tokens = 3_000, 1_500
    s = d.sample(IID, DEP, 2_000)
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (1_000.0, 500.0)
    assert s.unknown == ("kv_usage",) and d.statistics()["token_source"] == "vllm_backend"


def test_trt_llm_metrics(fake: FakeTritonServer) -> None:
    fake.trt_llm = True
    fake.pending, fake.trt_waiting, fake.trt_scheduled, fake.kv_fraction = 2, 5, 11, 0.625
    d = driver_for(fake)
    s = d.sample(IID, DEP, 0)
    assert (s.waiting, s.running, s.kv_usage) == (7, 11, 0.625)
    assert s.unknown == ("generation_tokens_per_s", "prompt_tokens_per_s")  # TRT-LLM: running and KV known
    assert (d.statistics()["running_source"], d.statistics()["kv_source"]) == ("trt_llm", "trt_llm")


def test_trt_llm_kv_out_of_range(fake: FakeTritonServer) -> None:
    fake.trt_llm, fake.kv_fraction = True, 62.5
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake).sample(IID, DEP, 0)
    assert info.value.field == 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'


def test_first_response_histogram_p99(fake: FakeTritonServer) -> None:
    fake.histogram_latencies = True
    d = driver_for(fake)
    fake.observe_first_response(*[3000.0] * 10)  # before baseline
    assert d.sample(IID, DEP, 0).ttft_p99_ms is None
    assert d.sample(IID, DEP, 1000).ttft_p99_ms is None  # no new first responses
    fake.observe_first_response(*[100.0] * 99, 4000.0)  # 100 is inclusive in le=100
    assert d.sample(IID, DEP, 2000).ttft_p99_ms == 100.0
    fake.observe_first_response(9999.0)  # +Inf bucket -> largest finite bound
    assert d.sample(IID, DEP, 3000).ttft_p99_ms == 5000.0
    assert d.statistics()["ttft_source"] == "first_response_histogram"
    fake.nan_metrics = {"nv_inference_first_response_histogram_ms"}
    assert d.sample(IID, DEP, 4000).ttft_p99_ms is None


def test_no_gpu_metrics_gives_zero_with_flag(fake: FakeTritonServer) -> None:
    fake.gpu_used = fake.gpu_total = None
    d = driver_for(fake)
    s = d.sample(IID, DEP, 0)
    assert (s.gpu_mem_used_bytes, s.gpu_mem_total_bytes) == (0, 0) and d.statistics()["gpu_metrics"] is False


def test_gpu_used_over_total_is_malformed(fake: FakeTritonServer) -> None:
    fake.gpu_used = 81 * GIB
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake).sample(IID, DEP, 0)
    assert info.value.field == "nv_gpu_memory_used_bytes"


def test_garbage_line_is_typed_error_and_keeps_baseline(fake: FakeTritonServer) -> None:
    d = driver_for(fake)
    d.sample(IID, DEP, 0)
    fake.garbage_line = "this is not prometheus {{{"
    fake.success, fake.queue_us, fake.request_us = 10, 30_000, 2_030_000
    with capture_logs() as logs, pytest.raises(MetricsMalformed) as info:
        d.sample(IID, DEP, 1000)
    assert info.value.field == "exposition" and isinstance(info.value, TemporaryError)
    assert info.value.__cause__ is not None
    assert [e["event"] for e in logs] == ["triton.metrics_malformed"]
    fake.garbage_line = None
    s = d.sample(IID, DEP, 2000)  # over the whole interval since the last good scrape: 2 s busy / 2 s
    assert s.running == 1 and d.statistics()["mean_queue_ms"] == 3.0
    assert d.statistics()["malformed"] == 1


REQUIRED = ["nv_inference_pending_request_count", "nv_inference_request_success", "nv_inference_count",
            "nv_inference_queue_duration_us", "nv_inference_request_duration_us"]


@pytest.mark.parametrize("metric", REQUIRED + ["nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"])
def test_nan_metric_is_typed_error(fake: FakeTritonServer, metric: str) -> None:
    fake.nan_metrics = {metric}
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake).sample(IID, DEP, 0)
    assert info.value.field == metric and "non-finite" in info.value.problem


LATENCY_COUNTERS = ["nv_inference_queue_duration_us", "nv_inference_request_duration_us"]


@pytest.mark.parametrize("metric", LATENCY_COUNTERS)
def test_latency_counters_off_leave_running_unknown(fake: FakeTritonServer, metric: str) -> None:
    """``--metrics-config counter_latencies=false``: no Little's law, so running is unknown, not 0."""
    fake.missing_metrics = {metric}
    d = driver_for(fake)
    fake.pending, fake.success, fake.inference_count = 3, 10, 10
    d.sample(IID, DEP, 0)
    fake.success, fake.inference_count = 30, 30
    s = d.sample(IID, DEP, 1_000)
    assert (s.waiting, s.running, s.queue_p95_ms) == (3, 0, None) and "running" in s.unknown
    st = d.statistics()
    assert (st["running_source"], st["inferences_per_s"], st["queue_source"]) == ("no_latency_counters", 20.0, "none")


@pytest.mark.parametrize("metric", [m for m in REQUIRED if m not in LATENCY_COUNTERS]
                         + ["nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"])
def test_missing_metric_is_typed_error(fake: FakeTritonServer, metric: str) -> None:
    fake.missing_metrics = {metric}
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake).sample(IID, DEP, 0)
    assert (info.value.field, info.value.problem) == (metric, "missing")


def test_other_model_is_missing(fake: FakeTritonServer) -> None:
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake, "other").sample(IID, DEP, 0)
    assert (info.value.field, info.value.problem) == ("nv_inference_pending_request_count", "missing")


def test_metrics_port_unreachable(fake: FakeTritonServer) -> None:
    d = TritonDriver(fake.base_url, "http://127.0.0.1:1", MODEL, timeout_s=2.0)
    with pytest.raises(Unavailable):
        d.sample(IID, DEP, 0)
    assert d.live() is True
