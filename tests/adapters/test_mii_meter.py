"""The MII request meter (adapters/mii_meter.py) end to end on 127.0.0.1: a real client, the meter,
the fake MII 0.3.3 gateway (tests/fakes/mii_server.py). Bounded deadlines, no sleeps."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.mii_meter import MeterConfig, MiiMeter, Upstream, parse_listen, reply_tokens
from controlplane.cli.main import main
from controlplane.domain.errors import ValidationError
from tests.fakes.base import http_call
from tests.fakes.mii_server import FakeMiiServer, flask_error_page
from tests.support.waiting import wait_until

GEN = "/mii/mii-llama"


@pytest.fixture
def fake() -> Iterator[FakeMiiServer]:
    server = FakeMiiServer().start()
    try:
        yield server
    finally:
        if server.hold is not None:
            server.hold.set()
        server.stop()


def meter_for(server: FakeMiiServer, **config: object) -> MiiMeter:
    upstream = Upstream("127.0.0.1", server.rest_port)
    return MiiMeter(MeterConfig(upstream=upstream, host="127.0.0.1", **config)).start()  # type: ignore[arg-type]


@pytest.fixture
def meter(fake: FakeMiiServer) -> Iterator[MiiMeter]:
    m = meter_for(fake, timeout_s=5.0)
    try:
        yield m
    finally:
        m.stop()


def metrics(meter: MiiMeter) -> dict[str, float]:
    """Sample name (with labels) -> value, read through the HTTP endpoint like a scraper does."""
    status, body, ctype = http_call(meter.url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, bytes, str]:
    return http_call(url + GEN, "POST", body, content_type)


def in_background(fn, n: int) -> list[threading.Thread]:  # type: ignore[no-untyped-def]
    threads = [threading.Thread(target=fn, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def raw_request(port: int, head: bytes) -> bytes:
    """Send ``head`` (request line + headers, no body) and read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(head)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# -- forwarding ------------------------------------------------------------------------------------
def test_generate_and_errors_pass_through_unchanged(fake: FakeMiiServer, meter: MiiMeter) -> None:
    direct = f"http://127.0.0.1:{fake.rest_port}"
    body = b'{"prompts":["a b","c"],"max_length":3}'
    assert post(meter.url, body) == post(direct, body)
    assert fake.requests[-1] == ("POST", GEN, "application/json", body)
    assert fake.requests[-2] == ("POST", GEN, "application/json", body)  # the meter's copy, byte for byte
    for request in ((b'{"prompts":["x"]}', "text/plain"), (b"{", "application/json"),
                    (b'{"prompts":["x"],"bogus":1}', "application/json")):
        assert post(meter.url, *request) == post(direct, *request)
    assert post(meter.url, b'{"prompts":["x"]}', "text/plain") == (415, flask_error_page(415), "text/html; charset=utf-8")
    assert http_call(meter.url + "/mii/other", "POST", b"{}", "application/json")[0] == 404  # the gateway's 404
    assert http_call(meter.url + GEN) == (405, flask_error_page(405), "text/html; charset=utf-8")
    assert http_call(meter.url + "/healthz") == (200, b"ok", "text/html; charset=utf-8")
    m = metrics(meter)
    assert m["controlplane_mii_requests_total{outcome=ok}"] == 1
    assert m["controlplane_mii_requests_total{outcome=rejected}"] == 5  # 415 twice, 400, 404, 405
    assert m["controlplane_mii_requests_total{outcome=failed}"] == 1  # Flask 500
    assert m["controlplane_mii_request_duration_seconds_count"] == 7


def test_terminate_and_unknown_paths_are_not_forwarded(fake: FakeMiiServer, meter: MiiMeter) -> None:
    seen = len(fake.requests)
    status, body, _ = http_call(meter.url + "/terminate")
    assert status == 404 and b"/terminate" in body
    assert http_call(meter.url + "/v1/completions", "POST", b"{}", "application/json")[0] == 404
    for sneaky in ("/mii/../terminate", "/mii/%2e%2e/terminate", "/mii/./x"):
        assert raw_request(meter.port, f"GET {sneaky} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                           .encode()).startswith(b"HTTP/1.1 404 ")
    assert len(fake.requests) == seen


def test_token_counters_sum_prompt_and_generated_lengths(fake: FakeMiiServer, meter: MiiMeter) -> None:
    fake.reply_text = "one two three"
    post(meter.url, b'{"prompts":["a b c","d"],"max_new_tokens":2}')  # 3+1 prompt, 2+2 generated
    post(meter.url, b'{"prompts":["x y"]}')  # 2 prompt, 3 generated
    m = metrics(meter)
    assert m["controlplane_mii_prompt_tokens_total"] == 6
    assert m["controlplane_mii_generation_tokens_total"] == 7
    assert m["controlplane_mii_requests_total{outcome=ok}"] == 2
    assert m["controlplane_mii_request_duration_seconds_count"] == 2
    assert m["controlplane_mii_request_duration_seconds_bucket{le=+Inf}"] == 2


def test_requests_held_in_the_engine_count_as_running(fake: FakeMiiServer, meter: MiiMeter) -> None:
    fake.hold = threading.Event()
    answers: list[int] = []
    threads = in_background(lambda: answers.append(post(meter.url, b'{"prompts":["q"]}')[0]), 3)
    wait_until(lambda: fake.held == 3, 5.0, "3 generates held in the fake")
    m = metrics(meter)
    assert (m["controlplane_mii_requests_running"], m["controlplane_mii_requests_waiting"]) == (3, 0)
    fake.hold.set()
    for t in threads:
        t.join(5.0)
    assert answers == [200, 200, 200]
    m = metrics(meter)
    assert (m["controlplane_mii_requests_running"], m["controlplane_mii_prompt_tokens_total"]) == (0, 3)


def test_a_concurrency_bound_makes_the_rest_wait_at_the_meter(fake: FakeMiiServer) -> None:
    fake.hold = threading.Event()
    meter = meter_for(fake, max_concurrent=1, timeout_s=5.0)
    try:
        answers: list[int] = []
        threads = in_background(lambda: answers.append(post(meter.url, b'{"prompts":["q"]}')[0]), 3)
        wait_until(lambda: metrics(meter)["controlplane_mii_requests_waiting"] == 2, 5.0, "2 waiting")
        wait_until(lambda: fake.held == 1, 5.0, "the one with the slot held in the fake")
        assert metrics(meter)["controlplane_mii_requests_waiting"] == 2
        assert metrics(meter)["controlplane_mii_requests_running"] == 1
        fake.hold.set()
        for t in threads:
            t.join(5.0)
        assert answers == [200, 200, 200]
        m = metrics(meter)
        assert (m["controlplane_mii_requests_running"], m["controlplane_mii_requests_waiting"]) == (0, 0)
    finally:
        meter.stop()


def test_a_client_that_goes_away_mid_request_leaves_the_counts_right(fake: FakeMiiServer, meter: MiiMeter,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    fake.hold = threading.Event()
    body = b'{"prompts":["q"]}'
    sock = socket.create_connection(("127.0.0.1", meter.port), timeout=3)
    sock.sendall(b"POST /mii/mii-llama HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    wait_until(lambda: fake.held == 1, 5.0, "the generate held in the fake")
    sock.close()
    fake.hold.set()
    wait_until(lambda: metrics(meter)["controlplane_mii_requests_running"] == 0, 5.0, "running back to 0")
    assert post(meter.url, body)[0] == 200  # still serving
    assert "Traceback" not in capfd.readouterr().err


# -- bounds and failures ----------------------------------------------------------------------------
def test_an_oversized_or_unsized_body_is_refused_without_reaching_mii(fake: FakeMiiServer) -> None:
    meter = meter_for(fake, max_request_bytes=100)
    try:
        seen = len(fake.requests)
        answer = raw_request(meter.port, b"POST /mii/mii-llama HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                         b"Content-Length: 101\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 413 ")
        answer = raw_request(meter.port, b"POST /mii/mii-llama HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                         b"Connection: close\r\n\r\n0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 411 ")
        assert post(meter.url, b'{"prompts":["' + b"a" * 70 + b'"]}')[0] == 200  # under the bound: forwarded
        assert len(fake.requests) == seen + 1
        assert metrics(meter)["controlplane_mii_requests_total{outcome=too_large}"] == 2
    finally:
        meter.stop()


def test_an_unreachable_gateway_is_a_502(fake: FakeMiiServer) -> None:
    fake.begin_loading()  # the gateway port refuses connections (replicas loading)
    meter = meter_for(fake)
    try:
        status, body, _ = post(meter.url, b'{"prompts":["q"]}')
        assert status == 502 and b"unreachable" in body
        assert http_call(meter.url + "/healthz")[0] == 502
        m = metrics(meter)
        assert m["controlplane_mii_requests_total{outcome=unreachable}"] == 1
        assert (m["controlplane_mii_requests_running"], m["controlplane_mii_prompt_tokens_total"]) == (0, 0)
    finally:
        meter.stop()


def test_a_gateway_past_the_deadline_is_a_504(fake: FakeMiiServer) -> None:
    fake.hold = threading.Event()  # never set during the request: the "model" does not answer
    meter = meter_for(fake, timeout_s=0.3)
    try:
        status, body, _ = post(meter.url, b'{"prompts":["q"]}')
        assert status == 504 and b"timed out" in body
        m = metrics(meter)
        assert m["controlplane_mii_requests_total{outcome=timeout}"] == 1
        assert m["controlplane_mii_requests_running"] == 0
    finally:
        fake.hold.set()
        meter.stop()


def test_an_oversized_reply_is_a_502(fake: FakeMiiServer) -> None:
    fake.body_override = b"[" + b" " * 5000 + b"]"
    meter = meter_for(fake, max_response_bytes=1000)
    try:
        assert post(meter.url, b'{"prompts":["q"]}')[0] == 502
        assert metrics(meter)["controlplane_mii_requests_total{outcome=too_large}"] == 1
    finally:
        meter.stop()


@pytest.mark.parametrize("body", [
    b"not json",
    b'{"generated_text": "x"}',
    b'[{"generated_text": "x", "prompt_length": -1, "generated_length": 1, "finish_reason": "stop"}]',
    b'[{"generated_text": "x", "prompt_length": 1.5, "generated_length": 1, "finish_reason": "stop"}]',
    b'[{"generated_text": "x", "prompt_length": true, "generated_length": 1, "finish_reason": "stop"}]',
    b'[{"generated_text": "x", "prompt_length": 3, "generated_length": 1, "finish_reason": "stop"}, 7]',
])
def test_a_malformed_reply_passes_through_and_counts_no_tokens(fake: FakeMiiServer, meter: MiiMeter,
                                                               body: bytes) -> None:
    fake.body_override = body
    assert post(meter.url, b'{"prompts":["q"]}') == (200, body, "application/json")
    m = metrics(meter)
    assert m["controlplane_mii_requests_total{outcome=malformed}"] == 1
    assert m["controlplane_mii_requests_total{outcome=ok}"] == 0
    assert (m["controlplane_mii_prompt_tokens_total"], m["controlplane_mii_generation_tokens_total"]) == (0, 0)


def test_reply_tokens_reads_the_contract_rows() -> None:
    rows = [{"generated_text": "a", "prompt_length": 4, "generated_length": 2, "finish_reason": "length"},
            {"generated_text": "", "prompt_length": 1, "generated_length": 0, "finish_reason": "none"}]
    assert reply_tokens(json.dumps(rows).encode()) == (5, 2)
    assert reply_tokens(b"[]") == (0, 0)
    assert reply_tokens(b"[{}]") is None


def test_the_meter_has_its_own_registry(fake: FakeMiiServer, meter: MiiMeter) -> None:
    other = meter_for(fake)  # a second meter in one process: no duplicate-timeseries error
    try:
        post(meter.url, b'{"prompts":["q"]}')
        assert metrics(other)["controlplane_mii_prompt_tokens_total"] == 0
        assert b"controlplane_mii" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)
    finally:
        other.stop()


# -- configuration and CLI ------------------------------------------------------------------------------
def test_bad_configuration_names_the_field() -> None:
    assert parse_listen(":8080") == ("0.0.0.0", 8080)
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    for bad in ("8080", "host:", "host:99999", "host:x"):
        with pytest.raises(ValidationError, match="listen"):
            parse_listen(bad)
    for bad in ("https://h:1", "http://h:1/mii/x", "h:1", "http://:1", "http://h:0", "http://h:x"):
        with pytest.raises(ValidationError, match="upstream"):
            Upstream.parse(bad)
    up = Upstream.parse("http://127.0.0.1:51080")
    assert up == Upstream("127.0.0.1", 51080)
    for field, value in (("timeout_s", 0), ("timeout_s", float("nan")), ("max_request_bytes", 0),
                         ("max_concurrent", 0), ("max_response_bytes", 1.5)):
        with pytest.raises(ValidationError, match=field):
            MeterConfig(upstream=up, **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("argv", "field"), [
    (["--listen", "nope", "--upstream", "http://127.0.0.1:51080"], "listen"),
    (["--listen", ":0", "--upstream", "http://127.0.0.1:51080/mii/x"], "upstream"),
    (["--listen", ":0", "--upstream", "http://127.0.0.1:51080", "--max-concurrent", "0"], "max_concurrent"),
    (["--listen", ":0", "--upstream", "http://127.0.0.1:51080", "--timeout", "-1"], "timeout_s"),
])
def test_the_cli_refuses_bad_arguments_with_one_line(argv: list[str], field: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mii-meter", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("controlplane: error:") and field in err[0]
