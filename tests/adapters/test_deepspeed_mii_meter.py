"""MiiDriver with its request meter: against the real meter in front of the fake MII gateway, and
against hand-written meter pages (malformed metrics, counter resets)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import pytest

from adapters.deepspeed_mii import (
    METER_MISSING_FIELDS,
    MetricsMalformed,
    MiiDriver,
    parse_meter,
)
from adapters.mii_meter import MeterConfig, MiiMeter, Upstream
from controlplane.domain.engines import LOAD_FIELDS
from controlplane.domain.errors import Unavailable, ValidationError
from controlplane.domain.ids import DeploymentId, InstanceId
from tests.fakes.base import FakeHandler, FakeHttpServer, http_call
from tests.fakes.mii_server import FakeMiiServer
from tests.support.waiting import wait_until

IID = InstanceId("i-1")
DEP = DeploymentId("chat")
ALL_UNKNOWN = tuple(sorted(LOAD_FIELDS))


@pytest.fixture
def fake() -> Iterator[FakeMiiServer]:
    server = FakeMiiServer().start()
    try:
        yield server
    finally:
        if server.hold is not None:
            server.hold.set()
        server.stop()


@pytest.fixture
def meter(fake: FakeMiiServer) -> Iterator[MiiMeter]:
    m = MiiMeter(MeterConfig(upstream=Upstream("127.0.0.1", fake.rest_port), host="127.0.0.1", timeout_s=5.0)).start()
    try:
        yield m
    finally:
        m.stop()


def through(meter: MiiMeter, body: bytes) -> int:
    return http_call(meter.url + "/mii/mii-llama", "POST", body, "application/json")[0]


# -- a meter page written by hand ---------------------------------------------------------------------
class _PageHandler(FakeHandler):
    server: FakeHttpServer

    def _dispatch(self, method: str) -> None:
        self._send(200, self.server.fake["page"], "text/plain; version=0.0.4")


@pytest.fixture
def page() -> Iterator[tuple[dict[str, bytes], str]]:
    state = {"page": b""}
    server = FakeHttpServer(("127.0.0.1", 0), _PageHandler)
    server.fake = state
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def meter_page(running: object = 0, waiting: object = 0, prompt: object = 0, generation: object = 0,
               inf: bool = True, drop: str = "") -> bytes:
    lines = [
        "# TYPE controlplane_mii_requests_running gauge", f"controlplane_mii_requests_running {running}",
        "# TYPE controlplane_mii_requests_waiting gauge", f"controlplane_mii_requests_waiting {waiting}",
        "# TYPE controlplane_mii_prompt_tokens_total counter", f"controlplane_mii_prompt_tokens_total {prompt}",
        "# TYPE controlplane_mii_generation_tokens_total counter", f"controlplane_mii_generation_tokens_total {generation}",
        "# TYPE controlplane_mii_request_duration_seconds histogram",
        'controlplane_mii_request_duration_seconds_bucket{le="0.5"} 1',
        'controlplane_mii_request_duration_seconds_bucket{le="1.0"} 2',
    ]
    if inf:
        lines.append('controlplane_mii_request_duration_seconds_bucket{le="+Inf"} 2')
    lines += ["controlplane_mii_request_duration_seconds_count 2", "controlplane_mii_request_duration_seconds_sum 1.2"]
    return ("\n".join(line for line in lines if not (drop and line.startswith(drop))) + "\n").encode()


def driver(fake: FakeMiiServer, meter_url: str | None) -> MiiDriver:
    return MiiDriver(fake.rest_url, fake.grpc_address, 2.0, meter_url=meter_url)


# -- with the real meter ---------------------------------------------------------------------------------
def test_the_meter_supplies_running_and_token_rates(fake: FakeMiiServer, meter: MiiMeter) -> None:
    d = driver(fake, meter.url)
    first = d.sample(IID, DEP, 10_000)
    assert first.unknown == ("generation_tokens_per_s", "kv_usage", "prompt_tokens_per_s")  # no baseline yet
    assert first.knows("running") and first.knows("waiting") and (first.running, first.waiting) == (0, 0)
    fake.reply_text = "a b c d"
    assert through(meter, b'{"prompts":["one two three","four"],"max_new_tokens":3}') == 200  # 4 prompt, 6 generated
    s = d.sample(IID, DEP, 12_000)
    assert s.unknown == ("kv_usage",)
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (2.0, 3.0)  # over the 2 s between samples
    assert s.ttft_p99_ms is not None and s.healthy  # still the probe proxy
    idle = d.sample(IID, DEP, 14_000)
    assert (idle.prompt_tokens_per_s, idle.generation_tokens_per_s, idle.unknown) == (0.0, 0.0, ("kv_usage",))
    stats = d.statistics()
    assert stats["metrics_endpoint"] is True and stats["meter_url"] == meter.url
    assert stats["missing"] == list(METER_MISSING_FIELDS) and stats["ttft_source"] == "probe_latency"
    assert stats["meter_scrapes"] == 3 and stats["meter_failures"] == 0
    # the probe goes to the gateway, not through the meter: the meter counted only client traffic
    assert parse_meter(http_call(meter.url + "/metrics")[1], 0).prompt_tokens == 4


def test_requests_in_flight_are_running_and_in_flight(fake: FakeMiiServer, meter: MiiMeter) -> None:
    d = driver(fake, meter.url)
    fake.hold = threading.Event()
    threads = [threading.Thread(target=through, args=(meter, b'{"prompts":["q"]}'), daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: fake.held == 3, 5.0, "3 generates held in the fake")
    assert d.in_flight() == 3
    fake.hold.set()  # the probe below is held too while the event is clear
    for t in threads:
        t.join(5.0)
    assert d.in_flight() == 0
    assert d.sample(IID, DEP, 1_000).running == 0


def test_a_meter_that_does_not_answer_leaves_the_load_unknown(fake: FakeMiiServer, meter: MiiMeter) -> None:
    url = meter.url
    meter.stop()
    d = driver(fake, url)
    s = d.sample(IID, DEP, 1_000)
    assert s.healthy and s.unknown == ALL_UNKNOWN and s.ttft_p99_ms is not None
    assert (s.running, s.waiting, s.prompt_tokens_per_s) == (0, 0, 0.0)
    with pytest.raises(Unavailable):
        d.scrape_meter(2_000)
    assert d.in_flight() is None
    assert d.statistics()["meter_failures"] == 2


def test_a_meter_url_that_is_not_a_meter_leaves_the_load_unknown(fake: FakeMiiServer) -> None:
    from adapters.deepspeed_mii import UnexpectedResponse

    d = driver(fake, f"http://127.0.0.1:{fake.rest_port}")  # the gateway itself: /metrics is Flask's 404
    with pytest.raises(UnexpectedResponse) as caught:
        d.scrape_meter(0)
    assert caught.value.status == 404
    s = d.sample(IID, DEP, 1_000)
    assert s.healthy and s.unknown == ALL_UNKNOWN


def test_a_bad_meter_url_names_the_field(fake: FakeMiiServer) -> None:
    for bad in ("127.0.0.1:8080", "http://h:1/metrics", "ftp://h:1"):
        with pytest.raises(ValidationError, match="meter_url"):
            driver(fake, bad)
    with pytest.raises(ValidationError, match="meter_url"):
        driver(fake, None).scrape_meter(0)


# -- hand-written pages ---------------------------------------------------------------------------------
def test_rates_and_counts_from_a_page(fake: FakeMiiServer, page: tuple[dict[str, bytes], str]) -> None:
    state, url = page
    d = driver(fake, url)
    state["page"] = meter_page(running=5, waiting=2, prompt=100, generation=40)
    s = d.sample(IID, DEP, 0)
    assert (s.running, s.waiting) == (5, 2)
    state["page"] = meter_page(running=4, waiting=0, prompt=300, generation=140)
    s = d.sample(IID, DEP, 4_000)
    assert (s.running, s.waiting, s.prompt_tokens_per_s, s.generation_tokens_per_s) == (4, 0, 50.0, 25.0)
    state["page"] = meter_page(prompt=30, generation=10)  # the meter restarted: counts from zero
    s = d.sample(IID, DEP, 5_000)
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s, s.unknown) == (30.0, 10.0, ("kv_usage",))
    assert d.in_flight() == 0


@pytest.mark.parametrize(("text", "field"), [
    (meter_page(running="NaN"), "controlplane_mii_requests_running"),
    (meter_page(waiting=-1), "controlplane_mii_requests_waiting"),
    (meter_page(running=2**31), "controlplane_mii_requests_running"),
    (meter_page(prompt="+Inf"), "controlplane_mii_prompt_tokens_total"),
    (meter_page(generation=-3), "controlplane_mii_generation_tokens_total"),
    (meter_page(drop="controlplane_mii_requests_waiting"), "controlplane_mii_requests_waiting"),
    (meter_page(drop="controlplane_mii_prompt_tokens_total"), "controlplane_mii_prompt_tokens_total"),
    (meter_page(inf=False), "controlplane_mii_request_duration_seconds"),
    (meter_page(drop="controlplane_mii_request_duration_seconds_bucket"), "controlplane_mii_request_duration_seconds"),
    (b"controlplane_mii_requests_running {{{\n", "exposition"),
    (b"", "controlplane_mii_requests_running"),
])
def test_malformed_meter_metrics_are_typed_and_never_fake_zeros(
        fake: FakeMiiServer, page: tuple[dict[str, bytes], str], text: bytes, field: str) -> None:
    state, url = page
    d = driver(fake, url)
    state["page"] = meter_page(prompt=100)
    d.sample(IID, DEP, 0)  # a good baseline
    state["page"] = text
    with pytest.raises(MetricsMalformed) as caught:
        d.scrape_meter(1_000)
    assert caught.value.field == field
    s = d.sample(IID, DEP, 2_000)
    assert s.healthy and s.unknown == ALL_UNKNOWN and s.ttft_p99_ms is not None  # unknown, not idle
    assert d.in_flight() is None
    assert d.statistics()["meter_failures"] == 2
    state["page"] = meter_page(prompt=500)  # the next good scrape rates over the whole interval
    s = d.sample(IID, DEP, 4_000)
    assert (s.prompt_tokens_per_s, s.unknown) == (100.0, ("kv_usage",))
    assert math.isfinite(s.generation_tokens_per_s)


# -- Kubernetes wiring -------------------------------------------------------------------------------------
def test_a_workload_meter_port_reaches_the_driver() -> None:
    import pydantic

    from adapters.kubernetes import PodInfo, WorkloadConfig, default_driver_factory

    base = {"deployment": "team-a/code", "namespace": "serving", "kind": "Deployment", "name": "code-mii",
            "engine": "deepspeed-mii", "port": 8000, "model": "code"}
    pod = PodInfo(name="code-mii-0", resource_version="1", ip="10.0.0.7", phase="Running", ready=True,
                  waiting_reason=None, instance_id="i-1", deleting=False, created="", ordinal=None)
    build = default_driver_factory(2.0)
    metered = build(WorkloadConfig(**base, meter_port=8080), pod)
    assert (metered.meter_url, metered.rest_url) == ("http://10.0.0.7:8080", "http://10.0.0.7:8000/mii/code")
    assert build(WorkloadConfig(**base), pod).meter_url is None
    with pytest.raises(pydantic.ValidationError, match="meter_port"):
        WorkloadConfig(**{**base, "engine": "vllm", "model": None}, meter_port=8080)
    with pytest.raises(pydantic.ValidationError, match="meter_port"):
        WorkloadConfig(**base, meter_port=0)
