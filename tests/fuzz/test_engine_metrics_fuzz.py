"""Engine payloads, fuzzed: the vLLM and Triton drivers' ``/metrics`` scrapes and DeepSpeed-MII's
generate reply.

Pages come from the protocol-faithful fakes (tests/fakes) with any gauge and counter value (negative,
huge, NaN, infinite), metrics missing or NaN, a garbage line, and then byte-level mutations (a line
dropped, duplicated or cut, a number replaced, random bytes spliced in, invalid UTF-8). Each page is
scraped twice through the real driver (its HTTP layer stubbed to return the page; the HTTP boundary
has its own tests in tests/adapters). Whatever the page:

* the driver returns a sample whose every field is in range (counts fit the adapter protocol's
  int32, the KV fraction in 0..1, rates and TTFT finite and not negative) and that the adapter's wire
  encoding (``adapters.wire.sample_message``) accepts, or it raises one of the control plane's typed
  errors (``MetricsMalformed`` and ``UnexpectedResponse`` are ``TemporaryError``);
* a rejected scrape changes nothing: the driver's baseline for the next deltas is the one before.

Bounded and derandomized for CI; ``CP_SLOW=1`` explores more with fresh seeds.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import wire
from adapters.deepspeed_mii import ProbeResult, _parse_reply
from adapters.engine_http import MAX_COUNT, UnexpectedResponse
from adapters.triton import TritonDriver
from adapters.vllm import VllmDriver
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.observations import InstanceSample
from tests.conftest import long_mode
from tests.fakes.triton_server import FakeTritonServer
from tests.fakes.vllm_server import FakeVllmServer

_SLOW = long_mode()
FUZZ = settings(max_examples=400 if _SLOW else 60, deadline=None, derandomize=not _SLOW, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NASTY = st.one_of(
    st.sampled_from([-1, 2**31 - 1, 2**31, 2**53, 1e30, -1e30, 0.5, 1.5, float("nan"), float("inf"), float("-inf")]),
    st.floats(allow_nan=True, allow_infinity=True),
)
SANE = st.integers(0, 5_000)
GARBAGE = st.sampled_from(["", "garbage", "vllm:num_requests_running{", "x{a=\"1\"} not-a-number", "# TYPE x foo",
                           "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1e400", "\x00", "x 1 2 3 4",
                           'a{b="\\q"} 1', "# EOF", "x{le=\"a\"} 1"])


@st.composite
def mutated(draw: st.DrawFn, page: bytes) -> bytes:
    lines = page.split(b"\n")
    for _ in range(draw(st.integers(0, 3))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "cut", "number", "splice", "utf8", "label"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(0, max(0, len(lines[i]) - 1)))]
        elif op == "number":
            head, _, _ = lines[i].rpartition(b" ")
            if head:
                lines[i] = head + b" " + draw(st.sampled_from([b"NaN", b"+Inf", b"-1", b"1e308", b"0x10", b"", b"1_000",
                                                               b"99999999999999999999", b"-0"]))
        elif op == "splice":
            lines[i] = lines[i] + draw(st.binary(max_size=12))
        elif op == "utf8":
            lines[i] = lines[i] + b"\xff\xfe"
        else:
            lines[i] = lines[i].replace(b'model_name="', b'model_name="other-', 1).replace(b'model="', b'model="x', 1)
    if draw(st.booleans()):
        lines.append(draw(GARBAGE).encode("utf-8", "surrogatepass"))
    return b"\n".join(lines)


class _Stubbed:
    """Mixin: the page to return instead of an HTTP request."""

    page = b""

    def _request(self, method: str, route: str, *args: Any, **kwargs: Any) -> Any:
        return (200, self.page, "text/plain; version=0.0.4") if isinstance(self, VllmDriver) else (200, self.page)


class StubVllm(_Stubbed, VllmDriver):
    pass


class StubTriton(_Stubbed, TritonDriver):
    pass


def check_sample(s: InstanceSample) -> None:
    assert isinstance(s.running, int) and 0 <= s.running <= MAX_COUNT, s
    assert isinstance(s.waiting, int) and 0 <= s.waiting <= MAX_COUNT, s
    assert 0.0 <= s.kv_usage <= 1.0, s
    for v in (s.prompt_tokens_per_s, s.generation_tokens_per_s):
        assert math.isfinite(v) and v >= 0.0, s
    assert s.ttft_p99_ms is None or (math.isfinite(s.ttft_p99_ms) and s.ttft_p99_ms >= 0.0), s
    assert 0 <= s.gpu_mem_used_bytes <= s.gpu_mem_total_bytes or s.gpu_mem_total_bytes == 0, s
    wire.sample_message(s)  # fits the adapter protocol


def scrape(driver: Any, page: bytes, now_ms: int) -> None:
    before = driver._previous
    driver.page = page
    try:
        s = driver.sample("i-1", "dep", now_ms)
    except ControlPlaneError as exc:
        assert str(exc).strip(), "an error without a message"
        assert driver._previous is before, "a rejected scrape replaced the baseline"
        return
    check_sample(s)


MODES = ("sane", "sane", "one-hostile-value", "nan-or-missing", "mutated")
"""Per page: all values plausible, or exactly one kind of hostility (so most pages reach the arithmetic
and each hostile input is tried against an otherwise valid page)."""


def _knobs(draw: st.DrawFn, fake: Any, names: list[str], mode: str) -> None:
    for n in names:
        setattr(fake, n, draw(SANE))
    if mode == "one-hostile-value":
        setattr(fake, draw(st.sampled_from(names)), draw(NASTY))


@st.composite
def vllm_pages(draw: st.DrawFn) -> bytes:
    mode = draw(st.sampled_from(MODES))
    f = FakeVllmServer(model_name="m")
    f._created = 1_796_160_765.346  # the counters' `_created` samples: a fixed time, so that the same draws
    # make the same page (with the wall clock, a line's length, and so the mutation's bounds, drift between runs)
    _knobs(draw, f, ["running", "waiting", "prompt_tokens", "generation_tokens", "kv_usage"], mode)
    f.kv_usage = draw(st.floats(0, 1)) if mode != "one-hostile-value" or draw(st.booleans()) else draw(NASTY)
    if mode == "nan-or-missing":
        names = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds"]
        setattr(f, draw(st.sampled_from(["nan_metrics", "missing_metrics"])), {draw(st.sampled_from(names))})
    ttft = draw(st.lists(st.floats(0, 3000, allow_nan=False), max_size=3))
    if ttft:
        f.observe_ttft(*ttft)
    page = f.render_metrics()
    return draw(mutated(page)) if mode == "mutated" else page


@st.composite
def triton_pages(draw: st.DrawFn) -> bytes:
    mode = draw(st.sampled_from(MODES))
    f = FakeTritonServer(models={"llm": "READY"})
    f.trt_llm = draw(st.booleans())
    f.histogram_latencies = draw(st.booleans())
    _knobs(draw, f, ["pending", "success", "inference_count", "queue_us", "request_us", "trt_waiting", "trt_scheduled"],
           mode)
    f.kv_fraction = draw(st.floats(0, 1))
    f.gpu_total, f.gpu_used = draw(st.sampled_from([(80 * 2**30, 10 * 2**30), (None, None)]))
    if mode == "one-hostile-value" and draw(st.booleans()):
        setattr(f, draw(st.sampled_from(["kv_fraction", "gpu_total", "gpu_used"])), draw(NASTY))
    if mode == "nan-or-missing":
        names = ["nv_inference_pending_request_count", "nv_inference_count", "nv_inference_queue_duration_us",
                 "nv_inference_request_success", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"]
        setattr(f, draw(st.sampled_from(["nan_metrics", "missing_metrics"])), {draw(st.sampled_from(names))})
    try:
        page = f.render_metrics()
    except (ValueError, TypeError, OverflowError):  # the fake cannot print that value: a hand-made line instead
        page = b"nv_inference_pending_request_count{model=\"llm\",version=\"1\"} " + repr(f.pending).encode()
    return draw(mutated(page)) if mode == "mutated" else page


@FUZZ
@given(first=vllm_pages(), second=vllm_pages())
def test_vllm_scrapes_give_a_valid_sample_or_a_typed_error(first: bytes, second: bytes) -> None:
    d = StubVllm("http://127.0.0.1:1", 1.0, model_name="m")
    scrape(d, first, 1_000)
    scrape(d, second, 2_000)


@FUZZ
@given(first=triton_pages(), second=triton_pages())
def test_triton_scrapes_give_a_valid_sample_or_a_typed_error(first: bytes, second: bytes) -> None:
    d = StubTriton("http://127.0.0.1:1", "http://127.0.0.1:2", "llm", timeout_s=1.0)
    scrape(d, first, 1_000)
    scrape(d, second, 2_000)


JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=12)
REPLY = st.fixed_dictionaries({}, optional={
    "generated_text": st.one_of(st.text(max_size=8), JSON), "prompt_length": st.one_of(st.integers(-2, 10), JSON),
    "generated_length": st.one_of(st.integers(-2, 10), JSON), "finish_reason": st.sampled_from(["length", "stop", "none", "", "x"])})


@FUZZ
@given(body=st.one_of(st.binary(max_size=64), JSON.map(lambda v: json.dumps(v).encode()),
                      st.lists(REPLY, max_size=2).map(lambda v: json.dumps(v).encode())))
def test_mii_replies_parse_or_raise_unexpected_response(body: bytes) -> None:
    try:
        r = _parse_reply(body, 12.5)
    except UnexpectedResponse as exc:
        assert exc.status == 200 and str(exc)
        return
    assert isinstance(r, ProbeResult) and r.prompt_length >= 0 and r.generated_length >= 0
