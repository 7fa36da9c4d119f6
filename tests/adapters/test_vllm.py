"""VllmDriver against the protocol-faithful fake vLLM 0.33.0 server (CONTRACTS.md section 1)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from adapters.vllm import (
    EngineRejected,
    MetricsMalformed,
    VllmDriver,
    WarmPathUnavailable,
    histogram_quantile_upper_ms,
)
from controlplane.domain.errors import (
    PermanentError,
    TemporaryError,
    Unavailable,
    ValidationError,
)
from controlplane.domain.ids import DeploymentId, InstanceId
from tests.fakes.base import http_call
from tests.fakes.vllm_server import TTFT_BUCKETS, FakeVllmServer, refused

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
IID = InstanceId("i-1")
DEP = DeploymentId("chat")


@pytest.fixture
def fake() -> Iterator[FakeVllmServer]:
    server = FakeVllmServer(model_name=MODEL).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dev_fake() -> Iterator[FakeVllmServer]:
    server = FakeVllmServer(model_name=MODEL, dev_mode=True).start()
    try:
        yield server
    finally:
        server.stop()


def driver_for(server: FakeVllmServer, model_name: str | None = MODEL) -> VllmDriver:
    return VllmDriver(server.base_url, timeout_s=2.0, model_name=model_name)


def raw(server: FakeVllmServer, method: str, path: str) -> tuple[int, bytes, str]:
    return http_call(server.base_url + path, method)


# -- the fake itself follows the contract ---------------------------------------------------------

def test_fake_routes_match_contract(fake: FakeVllmServer) -> None:
    assert raw(fake, "GET", "/health")[:2] == (200, b"")
    assert raw(fake, "GET", "/ping")[:2] == (200, b"")
    assert raw(fake, "POST", "/ping")[:2] == (200, b"")
    assert json.loads(raw(fake, "GET", "/version")[1]) == {"version": "0.33.0"}
    assert json.loads(raw(fake, "GET", "/load")[1]) == {"server_load": 0}
    models = json.loads(raw(fake, "GET", "/v1/models")[1])
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    assert models["data"][0]["owned_by"] == "vllm" and models["data"][0]["parent"] is None
    for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping"), ("GET", "/nope")):
        status, body, ctype = raw(fake, method, path)
        assert (status, json.loads(body)) == (404, {"detail": "Not Found"})
        assert ctype == "application/json"
    fake.dead = True
    assert raw(fake, "GET", "/health")[:2] == (503, b"")
    assert raw(fake, "POST", "/ping")[:2] == (503, b"")


def test_fake_metrics_exposition(fake: FakeVllmServer) -> None:
    fake.running, fake.waiting, fake.kv_usage = 3, 2, 0.5
    fake.prompt_tokens = 7
    status, body, ctype = raw(fake, "GET", "/metrics")
    assert status == 200 and ctype == CONTENT_TYPE_LATEST == "text/plain; version=1.0.0; charset=utf-8"
    text = body.decode()
    labels = f'{{engine="0",model_name="{MODEL}"}}'
    assert f"vllm:num_requests_running{labels} 3.0" in text
    assert f"vllm:num_requests_waiting{labels} 2.0" in text
    assert f"vllm:kv_cache_usage_perc{labels} 0.5" in text
    assert f"vllm:prompt_tokens_total{labels} 7.0" in text
    assert f"vllm:prompt_tokens_created{labels}" in text
    assert "gpu_cache_usage_perc" not in text
    les = [s.labels["le"] for f in text_string_to_metric_families(text)
           if f.name == "vllm:time_to_first_token_seconds" for s in f.samples if s.name.endswith("_bucket")]
    assert les == [repr(b) for b in TTFT_BUCKETS] + ["+Inf"]


def test_fake_bucket_boundary_is_inclusive(fake: FakeVllmServer) -> None:
    fake.observe_ttft(0.1)  # exactly on a bound: counts in le="0.1", not in le="0.08"
    text = raw(fake, "GET", "/metrics")[1].decode()
    assert f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.08",model_name="{MODEL}"}} 0.0' in text
    assert f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="{MODEL}"}} 1.0' in text


# -- health and startup ---------------------------------------------------------------------------

def test_health_happy_path_and_version(fake: FakeVllmServer) -> None:
    d = driver_for(fake)
    assert d.health() is True
    assert d.version() == "0.33.0"


def test_health_false_when_engine_dead(fake: FakeVllmServer) -> None:
    fake.dead = True
    assert driver_for(fake).health() is False


def test_connection_refused_while_loading() -> None:
    server = FakeVllmServer(model_name=MODEL).start(loading=True)
    try:
        d = driver_for(server)
        assert refused(server.port)
        with capture_logs() as logs, pytest.raises(Unavailable) as info:
            d.health()
        assert isinstance(info.value.__cause__, OSError | urllib.error.URLError)
        assert any(e["event"] == "vllm.unreachable" for e in logs)
        with pytest.raises(Unavailable):
            d.sample(IID, DEP, 0)
        server.finish_loading()
        assert d.health() is True
        server.begin_loading()  # model reload: same port, refused again
        with pytest.raises(Unavailable):
            d.health()
        server.finish_loading()
        assert d.health() is True
        assert d.statistics()["unreachable"] == 3
    finally:
        server.stop()


def test_unreachable_after_stop() -> None:
    server = FakeVllmServer().start()
    d = driver_for(server, model_name=None)
    server.stop()
    with pytest.raises(Unavailable):
        d.health()


def test_invalid_timeout_rejected() -> None:
    with pytest.raises(ValidationError):
        VllmDriver("http://127.0.0.1:1", timeout_s=0)


# -- metrics --------------------------------------------------------------------------------------

def test_sample_exact_values(fake: FakeVllmServer) -> None:
    fake.running, fake.waiting, fake.kv_usage = 5, 9, 0.375
    fake.prompt_tokens, fake.generation_tokens = 1000, 400
    s = driver_for(fake).sample(IID, DEP, 10_000)
    assert (s.instance_id, s.deployment, s.at_ms) == (IID, DEP, 10_000)
    assert (s.running, s.waiting, s.kv_usage) == (5, 9, 0.375)
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (0.0, 0.0)  # first scrape
    assert s.ttft_p99_ms is None  # no previous scrape to diff against
    assert s.healthy is True


def test_model_name_none_accepts_single_model(fake: FakeVllmServer) -> None:
    fake.running = 2
    assert driver_for(fake, model_name=None).sample(IID, DEP, 0).running == 2


def test_other_model_name_is_missing(fake: FakeVllmServer) -> None:
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake, model_name="other").sample(IID, DEP, 0)
    assert info.value.field == "vllm:num_requests_running" and info.value.problem == "missing"


def test_token_rates_from_counter_deltas(fake: FakeVllmServer) -> None:
    d = driver_for(fake)
    fake.prompt_tokens, fake.generation_tokens = 1000, 100
    d.sample(IID, DEP, 10_000)
    fake.prompt_tokens, fake.generation_tokens = 3000, 600
    s = d.sample(IID, DEP, 12_000)
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (1000.0, 250.0)
    s = d.sample(IID, DEP, 14_000)  # nothing new
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (0.0, 0.0)
    fake.prompt_tokens, fake.generation_tokens = 500, 50  # server restarted: counters reset
    s = d.sample(IID, DEP, 15_000)
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (500.0, 50.0)
    s = d.sample(IID, DEP, 15_000)  # no elapsed time: no rate
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (0.0, 0.0)


def test_ttft_p99_from_histogram_deltas(fake: FakeVllmServer) -> None:
    d = driver_for(fake)
    fake.observe_ttft(*[5.0] * 50)  # before the baseline: must not count
    d.sample(IID, DEP, 0)
    assert d.sample(IID, DEP, 1000).ttft_p99_ms is None  # no new observations
    # 99 fast requests and 1 slow one: rank ceil(0.99*100) = 99 lands in le=0.1 (0.1 is inclusive)
    fake.observe_ttft(*[0.1] * 99, 3.0)
    assert d.sample(IID, DEP, 2000).ttft_p99_ms == 100.0
    # 98 fast + 2 slow: rank 99 is a slow one, in le=5.0 (3.0 <= 5.0)
    fake.observe_ttft(*[0.02] * 98, 3.0, 3.0)
    assert d.sample(IID, DEP, 3000).ttft_p99_ms == 5000.0
    # just above a bound goes to the next bucket
    fake.observe_ttft(0.1000001)
    assert d.sample(IID, DEP, 4000).ttft_p99_ms == 250.0
    # beyond the last finite bucket: report the largest finite bound
    fake.observe_ttft(9999.0)
    assert d.sample(IID, DEP, 5000).ttft_p99_ms == 2_560_000.0


def test_queue_time_apart_from_prefill_and_decode(fake: FakeVllmServer) -> None:
    d = driver_for(fake)
    fake.observe_phase("queue", 9.0)  # before the baseline: must not count
    first = d.sample(IID, DEP, 0)
    assert first.queue_p95_ms is None
    # The first scrape has no baseline: its token rates are unknown, not an idle 0.
    assert first.unknown == ("generation_tokens_per_s", "prompt_tokens_per_s")
    # 95 requests queued <= 0.3 s and 5 queued 3 s; prefill long, decode short: TTFT is queueing here.
    fake.observe_phase("queue", *[0.2] * 95, *[3.0] * 5)
    fake.observe_phase("prefill", *[1.2] * 100)
    fake.observe_phase("decode", *[0.4] * 100)
    s = d.sample(IID, DEP, 1000)
    assert s.unknown == ()
    assert s.queue_p95_ms == 300.0  # rank 95 of 100 is in le=0.3
    assert d.statistics()["prefill_p95_ms"] == 1500.0 and d.statistics()["decode_p95_ms"] == 500.0
    fake.observe_phase("queue", *[0.2] * 94, *[3.0] * 6)
    assert d.sample(IID, DEP, 2000).queue_p95_ms == 5000.0  # rank 95 is now a 3 s one (le=5.0)
    assert d.sample(IID, DEP, 3000).queue_p95_ms is None  # nothing left the queue since


def test_kv_under_its_name_before_vllm_0_10() -> None:
    """A server of an older release names the KV fraction ``vllm:gpu_cache_usage_perc``."""
    page = "\n".join([
        "# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{model_name="m"} 2.0',
        "# TYPE vllm:num_requests_waiting gauge", 'vllm:num_requests_waiting{model_name="m"} 1.0',
        "# TYPE vllm:gpu_cache_usage_perc gauge", 'vllm:gpu_cache_usage_perc{model_name="m"} 0.4',
        "# TYPE vllm:prompt_tokens_total counter", 'vllm:prompt_tokens_total{model_name="m"} 10.0',
        "# TYPE vllm:generation_tokens_total counter", 'vllm:generation_tokens_total{model_name="m"} 5.0', ""]).encode()
    scrape, gauges = VllmDriver("http://127.0.0.1:1", 1.0)._parse(page)
    assert (gauges["vllm:kv_cache_usage_perc"], gauges["vllm:num_requests_running"]) == (0.4, 2.0)
    assert scrape.ttft_buckets is None and scrape.queue_buckets is None


def test_queue_histogram_missing_or_nan_gives_none(fake: FakeVllmServer) -> None:
    d = driver_for(fake)
    fake.missing_metrics.add("vllm:request_queue_time_seconds")
    d.sample(IID, DEP, 0)
    fake.observe_phase("queue", 1.0)
    assert d.sample(IID, DEP, 1000).queue_p95_ms is None
    fake.missing_metrics.clear()
    fake.nan_metrics.add("vllm:request_queue_time_seconds")
    assert d.sample(IID, DEP, 2000).queue_p95_ms is None


def test_histogram_quantile_reference() -> None:
    inf = math.inf
    assert histogram_quantile_upper_ms(0.99, [(0.1, 0), (inf, 0)]) is None
    assert histogram_quantile_upper_ms(0.99, [(0.1, 1), (0.5, 1), (inf, 1)]) == 100.0
    assert histogram_quantile_upper_ms(0.99, [(0.1, 99), (0.5, 100), (inf, 100)]) == 100.0
    assert histogram_quantile_upper_ms(0.99, [(0.1, 98), (0.5, 100), (inf, 100)]) == 500.0
    assert histogram_quantile_upper_ms(0.99, [(0.1, 989), (0.5, 1000), (inf, 1000)]) == 500.0
    assert histogram_quantile_upper_ms(0.99, [(0.1, 990), (0.5, 1000), (inf, 1000)]) == 100.0


def test_garbage_line_is_typed_error_and_keeps_baseline(fake: FakeVllmServer) -> None:
    d = driver_for(fake)
    fake.prompt_tokens = 100
    d.sample(IID, DEP, 0)
    fake.garbage_line = "this is not prometheus {{{"
    fake.prompt_tokens = 300
    with capture_logs() as logs, pytest.raises(MetricsMalformed) as info:
        d.sample(IID, DEP, 1000)
    assert info.value.field == "exposition" and isinstance(info.value, TemporaryError)
    assert info.value.__cause__ is not None
    assert [e["event"] for e in logs] == ["vllm.metrics_malformed"]
    fake.garbage_line = None
    s = d.sample(IID, DEP, 2000)  # rate over the whole interval since the last good scrape
    assert s.prompt_tokens_per_s == 100.0
    assert d.statistics()["malformed"] == 1


@pytest.mark.parametrize("metric", [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens", "vllm:generation_tokens",
])
def test_nan_in_required_metric_is_typed_error(fake: FakeVllmServer, metric: str) -> None:
    fake.nan_metrics = {metric}
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake).sample(IID, DEP, 0)
    assert info.value.field == metric and "non-finite" in info.value.problem


@pytest.mark.parametrize("metric", [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens", "vllm:generation_tokens",
])
def test_missing_required_metric_is_typed_error(fake: FakeVllmServer, metric: str) -> None:
    fake.missing_metrics = {metric}
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake).sample(IID, DEP, 0)
    assert (info.value.field, info.value.problem) == (metric, "missing")


def test_kv_usage_out_of_range_is_typed_error(fake: FakeVllmServer) -> None:
    fake.kv_usage = 37.5  # a percentage (aibrix mock style) is not the contract
    with pytest.raises(MetricsMalformed) as info:
        driver_for(fake).sample(IID, DEP, 0)
    assert info.value.field == "vllm:kv_cache_usage_perc"


@pytest.mark.parametrize("knob", ["nan_metrics", "missing_metrics"])
def test_ttft_histogram_nan_or_missing_gives_none(fake: FakeVllmServer, knob: str) -> None:
    d = driver_for(fake)
    d.sample(IID, DEP, 0)
    setattr(fake, knob, {"vllm:time_to_first_token_seconds"})
    fake.observe_ttft(0.5)
    s = d.sample(IID, DEP, 1000)
    assert s.ttft_p99_ms is None and s.running == 0


# -- warm path (dev mode) -------------------------------------------------------------------------

def test_sleep_wake_in_dev_mode_exact_bodies(dev_fake: FakeVllmServer) -> None:
    assert json.loads(raw(dev_fake, "GET", "/is_sleeping")[1]) == {"is_sleeping": False}
    assert json.loads(raw(dev_fake, "POST", "/sleep?level=2&mode=wait")[1]) == {"status": "sleeping", "level": 2}
    assert json.loads(raw(dev_fake, "POST", "/wake_up?tags=weights")[1]) == {"status": "sleeping", "tags": ["weights"]}
    assert json.loads(raw(dev_fake, "POST", "/wake_up?tags=kv_cache")[1]) == {"status": "awake", "tags": ["kv_cache"]}
    assert json.loads(raw(dev_fake, "POST", "/sleep")[1]) == {"status": "sleeping", "level": 1}
    assert json.loads(raw(dev_fake, "POST", "/wake_up")[1]) == {"status": "awake", "tags": None}

    d = driver_for(dev_fake)
    assert d.is_sleeping() is False
    assert d.sleep() == 1
    assert ("POST", "/sleep?level=1&mode=abort") in dev_fake.requests
    assert d.is_sleeping() is True
    assert d.wake_up(["weights"]) is False
    assert d.wake_up() is True
    assert d.is_sleeping() is False
    assert d.sleep(level=0, mode="keep") == 0


def test_no_dev_mode_raises_warm_path_unavailable(fake: FakeVllmServer) -> None:
    d = driver_for(fake)
    for call in (d.sleep, d.wake_up, d.is_sleeping):
        with capture_logs() as logs, pytest.raises(WarmPathUnavailable) as info:
            call()
        assert isinstance(info.value, PermanentError)
        assert logs[0]["event"] == "vllm.warm_path_unavailable" and logs[0]["fallback"] == "cold_start"


@pytest.mark.parametrize("query,param", [("level=3", "level"), ("level=x", "level"), ("mode=later", "mode")])
def test_invalid_sleep_params_give_400_error_response(dev_fake: FakeVllmServer, query: str, param: str) -> None:
    status, body, _ = raw(dev_fake, "POST", "/sleep?" + query)
    err = json.loads(body)["error"]
    assert status == 400 and set(err) == {"message", "type", "param", "code"} and err["code"] == 400


def test_invalid_sleep_level_is_validation_error(dev_fake: FakeVllmServer) -> None:
    d = driver_for(dev_fake)
    with pytest.raises(EngineRejected) as info:
        d.sleep(level=3)
    assert isinstance(info.value, ValidationError)
    assert (info.value.status, info.value.field, info.value.error_type) == (400, "level", "BadRequestError")
    with pytest.raises(EngineRejected) as info:
        d.sleep(mode="later")
    assert info.value.field == "mode"
    assert d.is_sleeping() is False
