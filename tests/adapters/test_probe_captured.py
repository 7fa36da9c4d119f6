"""``controlplane probe`` on captured ``/metrics`` pages (``--metrics-file``) and on several live scrapes:
what an operator gets from ``curl .../metrics > page.txt`` is what the adapter would observe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from adapters.mii_meter import _Meters
from controlplane.domain.errors import ValidationError
from controlplane.probe import ProbeFailed, probe, read_pages
from tests.fakes.triton_server import FakeTritonServer
from tests.fakes.vllm_server import FakeVllmServer

REPO = Path(__file__).resolve().parents[2]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def vllm_pages() -> tuple[bytes, bytes]:
    fake = FakeVllmServer(model_name=MODEL)
    fake.running, fake.waiting, fake.kv_usage = 7, 2, 0.5
    fake.prompt_tokens, fake.generation_tokens = 1_000, 400
    first = fake.render_metrics()
    fake.prompt_tokens, fake.generation_tokens = 21_000, 10_400  # 10 s later
    fake.observe_ttft(*[0.1] * 99, 3.0)
    fake.observe_phase("queue", *[0.2] * 100)
    return first, fake.render_metrics()


def test_two_captured_vllm_pages_give_rates_and_latencies() -> None:
    first, second = vllm_pages()
    obs = probe("vllm", None, pages=[first, second], interval_s=10.0)
    assert (obs["source"], obs["healthy"], obs["ready"], obs["scrapes"]) == ("captured", None, None, 2)
    assert (obs["running"], obs["waiting"], obs["kv_usage"]) == (7, 2, 0.5)
    assert (obs["prompt_tokens_per_s"], obs["generation_tokens_per_s"]) == (2_000.0, 1_000.0)
    assert (obs["ttft_p99_ms"], obs["queue_p95_ms"]) == (100.0, 300.0)
    assert obs["unknown"] == ["gpu_mem_total_bytes", "gpu_mem_used_bytes"]


def test_one_captured_page_names_what_needs_two() -> None:
    obs = probe("vllm", None, pages=[vllm_pages()[0]])
    assert obs["why"]["prompt_tokens_per_s"] == obs["why"]["ttft_p99_ms"] == "needs two scrapes"


def test_a_page_of_an_older_vllm_release_is_read() -> None:
    """Held-out style: hand-written in the exposition format of a vLLM before 0.10 (the KV fraction
    under ``gpu_cache_usage_perc``, no request-phase histograms, two data-parallel engines)."""
    page = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 5.0',
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
        'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0',
        "# TYPE vllm:gpu_cache_usage_perc gauge",
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.2',
        'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.6',
        "# TYPE vllm:prompt_tokens_total counter",
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0',
        'vllm:prompt_tokens_total{engine="1",model_name="m"} 100.0',
        "# TYPE vllm:generation_tokens_total counter",
        'vllm:generation_tokens_total{engine="0",model_name="m"} 50.0',
        'vllm:generation_tokens_total{engine="1",model_name="m"} 50.0', ""]).encode()
    obs = probe("vllm", None, pages=[page])
    assert (obs["running"], obs["waiting"], obs["kv_usage"]) == (8, 1, pytest.approx(0.4))


def test_captured_triton_pages() -> None:
    fake = FakeTritonServer(models={"llm": "READY"})
    fake.pending, fake.success, fake.inference_count, fake.queue_us, fake.request_us = 2, 10, 10, 1_000, 50_000
    first = fake.render_metrics()
    # 2 s later: 40 successes, 80 ms queued in all (mean 2 ms), 6 s of execution: 3 in flight
    fake.success, fake.inference_count = 50, 50
    fake.queue_us, fake.request_us = 81_000, 50_000 + 80_000 + 6_000_000
    obs = probe("triton", None, model="llm", pages=[first, fake.render_metrics()], interval_s=2.0)
    assert (obs["waiting"], obs["running"], obs["queue_p95_ms"]) == (2, 3, 2.0)
    assert "running" not in obs["unknown"] and "kv_usage" in obs["unknown"]
    with pytest.raises(ProbeFailed, match="--model: required for triton"):
        probe("triton", None, pages=[first])


def test_captured_mii_meter_pages() -> None:
    meters = _Meters()
    meters.running.set(4)
    first = generate_latest(meters.registry)
    meters.prompt.inc(5_000)
    meters.generation.inc(1_000)
    obs = probe("deepspeed-mii", None, pages=[first, generate_latest(meters.registry)], interval_s=5.0)
    assert (obs["running"], obs["waiting"]) == (4, 0)
    assert (obs["prompt_tokens_per_s"], obs["generation_tokens_per_s"]) == (1_000.0, 200.0)
    assert "kv_usage" in obs["unknown"] and "running" not in obs["unknown"]


def test_a_malformed_captured_page_is_one_named_error() -> None:
    with pytest.raises(ProbeFailed, match=r"vllm at captured pages: .*unparseable Prometheus text"):
        probe("vllm", None, pages=[b"vllm:num_requests_running{ 1\n"])
    with pytest.raises(ProbeFailed, match=r"vllm:num_requests_running: missing"):
        probe("vllm", None, pages=[b"# nothing here\n"])


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="--url"):
        probe("vllm", None)
    with pytest.raises(ValidationError, match="--scrapes"):
        probe("vllm", "http://127.0.0.1:9", scrapes=0)
    with pytest.raises(ValidationError, match="--interval-s"):
        probe("vllm", "http://127.0.0.1:9", interval_s=-1)
    with pytest.raises(ValidationError, match="no-such-page.txt"):
        read_pages([str(tmp_path / "no-such-page.txt")])


def test_live_scrapes_interval_apart() -> None:
    fake = FakeVllmServer(model_name=MODEL).start()
    waits: list[float] = []
    try:
        fake.prompt_tokens = 100

        def sleep(seconds: float) -> None:  # the probe's wait between reads: the engine moves on meanwhile
            waits.append(seconds)
            fake.prompt_tokens += 600

        obs = probe("vllm", fake.base_url, scrapes=3, interval_s=2.0, sleep=sleep)
    finally:
        fake.stop()
    assert waits == [2.0, 2.0] and obs["scrapes"] == 3 and obs["interval_ms"] == 2_000
    assert obs["prompt_tokens_per_s"] == 300.0 and "prompt_tokens_per_s" not in obs["unknown"]


def test_the_cli_reads_captured_files(tmp_path: Path) -> None:
    first, second = vllm_pages()
    (tmp_path / "a.txt").write_bytes(first)
    (tmp_path / "b.txt").write_bytes(second)
    proc = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "probe", "--engine", "vllm",
                           "--metrics-file", str(tmp_path / "a.txt"), "--metrics-file", str(tmp_path / "b.txt"),
                           "--interval-s", "10", "--json"], check=False, cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert json.loads(proc.stdout)["generation_tokens_per_s"] == 1_000.0
    proc = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "probe", "--engine", "vllm",
                           "--metrics-file", str(tmp_path / "missing.txt")], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("controlplane: error: --metrics-file: ") and "missing.txt" in proc.stderr
