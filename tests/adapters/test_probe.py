"""``controlplane probe`` as a subprocess against the vLLM, Triton and DeepSpeed-MII fakes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.mii_server import FakeMiiServer
from tests.fakes.triton_server import FakeTritonServer
from tests.fakes.vllm_server import FakeVllmServer

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def run_probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli.main", "probe", *args], check=False,
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def free_refused_port() -> int:
    """A port nothing listens on (bound then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def vllm() -> Iterator[FakeVllmServer]:
    server = FakeVllmServer(model_name=MODEL).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def triton() -> Iterator[FakeTritonServer]:
    server = FakeTritonServer(models={"llm": "READY"}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mii() -> Iterator[FakeMiiServer]:
    server = FakeMiiServer().start()
    try:
        yield server
    finally:
        server.stop()


def test_vllm_json(vllm: FakeVllmServer) -> None:
    vllm.running, vllm.waiting, vllm.kv_usage = 3, 5, 0.25
    vllm.prompt_tokens, vllm.generation_tokens = 100, 40
    proc = run_probe("--engine", "vllm", "--url", vllm.base_url, "--model", MODEL, "--json")
    assert (proc.returncode, proc.stderr) == (0, "")
    twice = "needs two scrapes"
    gpu = "not exported by this engine (the gpu-agent reads NVML)"
    assert json.loads(proc.stdout) == {
        "engine": "vllm", "url": vllm.base_url, "source": "live", "scrapes": 1, "interval_ms": None,
        "healthy": True, "ready": True,
        "waiting": 5, "running": 3, "kv_usage": 0.25, "ttft_p99_ms": None, "queue_p95_ms": None,
        "prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 0.0,
        "gpu_mem_used_bytes": 0, "gpu_mem_total_bytes": 0,
        "unknown": ["generation_tokens_per_s", "gpu_mem_total_bytes", "gpu_mem_used_bytes", "prompt_tokens_per_s",
                    "queue_p95_ms", "ttft_p99_ms"],
        "why": {"generation_tokens_per_s": twice, "gpu_mem_total_bytes": gpu, "gpu_mem_used_bytes": gpu,
                "prompt_tokens_per_s": twice, "queue_p95_ms": twice, "ttft_p99_ms": twice},
        "driver": {"scrapes": 1, "malformed": 0, "unreachable": 0, "last_error": "", "queue_p95_ms": None,
                   "prefill_p95_ms": None, "decode_p95_ms": None},
    }
    assert [r for r in vllm.requests] == [("GET", "/health"), ("GET", "/metrics")]


def test_vllm_dead_engine_exits_1(vllm: FakeVllmServer) -> None:
    vllm.dead = True
    proc = run_probe("--engine", "vllm", "--url", vllm.base_url, "--json")
    assert proc.returncode == 1
    obs = json.loads(proc.stdout)
    assert (obs["healthy"], obs["ready"]) == (False, False)


def test_vllm_loading_is_one_line_exit_2() -> None:
    server = FakeVllmServer(model_name=MODEL).start(loading=True)
    try:
        proc = run_probe("--engine", "vllm", "--url", server.base_url, "--json")
    finally:
        server.stop()
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == f"controlplane: error: vllm at {server.base_url}: unreachable: connection refused\n"


def test_triton_json(triton: FakeTritonServer) -> None:
    triton.pending = 4
    triton.success, triton.inference_count = 10, 10
    triton.queue_us, triton.request_us = 1000, 5000
    proc = run_probe("--engine", "triton", "--url", triton.base_url, "--metrics-url", triton.metrics_url,
                     "--model", "llm", "--json")
    assert (proc.returncode, proc.stderr) == (0, "")
    obs = json.loads(proc.stdout)
    driver = obs.pop("driver")
    not_exported = "not exported by this engine or its configuration"
    assert obs == {
        "engine": "triton", "url": triton.base_url, "source": "live", "scrapes": 1, "interval_ms": None,
        "healthy": True, "ready": True,
        "waiting": 4, "running": 0, "kv_usage": 0.0, "ttft_p99_ms": None, "queue_p95_ms": None,
        "prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 0.0,
        "gpu_mem_used_bytes": 10 * GIB, "gpu_mem_total_bytes": 80 * GIB,
        "unknown": ["generation_tokens_per_s", "kv_usage", "prompt_tokens_per_s", "queue_p95_ms", "running",
                    "ttft_p99_ms"],
        "why": {"generation_tokens_per_s": not_exported, "kv_usage": not_exported, "prompt_tokens_per_s": not_exported,
                "queue_p95_ms": "needs two scrapes", "running": "needs two scrapes", "ttft_p99_ms": "needs two scrapes"},
    }
    assert (driver["running_source"], driver["kv_source"], driver["gpu_metrics"]) == ("no_baseline", "absent", True)


def test_triton_model_loading_not_ready(triton: FakeTritonServer) -> None:
    triton.models["llm"] = "LOADING"
    proc = run_probe("--engine", "triton", "--url", triton.base_url, "--metrics-url", triton.metrics_url,
                     "--model", "llm", "--json")
    assert proc.returncode == 1
    obs = json.loads(proc.stdout)
    assert (obs["healthy"], obs["ready"]) == (True, False)


def test_triton_requires_metrics_url(triton: FakeTritonServer) -> None:
    proc = run_probe("--engine", "triton", "--url", triton.base_url, "--model", "llm")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"controlplane: error: triton at {triton.base_url}: --metrics-url: required for "
                           "triton (the metrics port, default 8002)\n")


def test_triton_refused_is_one_line_exit_2() -> None:
    port = free_refused_port()
    url = f"http://127.0.0.1:{port}"
    proc = run_probe("--engine", "triton", "--url", url, "--metrics-url", url, "--model", "llm", "--json")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"controlplane: error: triton at {url}: unreachable: connection refused\n"


def test_mii_json(mii: FakeMiiServer) -> None:
    proc = run_probe("--engine", "deepspeed-mii", "--url", mii.rest_url, "--grpc-address", mii.grpc_address,
                     "--json")
    assert (proc.returncode, proc.stderr) == (0, "")
    obs = json.loads(proc.stdout)
    ttft = obs.pop("ttft_p99_ms")
    assert isinstance(ttft, float) and 0 < ttft < 5000
    assert obs["driver"].pop("last_probe_ms") == ttft
    missing = ["running", "waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s",
               "gpu_mem_used_bytes", "gpu_mem_total_bytes"]
    no_meter = "DeepSpeed-MII exports no metrics: pass --meter-url (its mii-meter sidecar)"
    gpu = "not exported by this engine (the gpu-agent reads NVML)"
    assert obs == {
        "engine": "deepspeed-mii", "url": mii.rest_url, "source": "live", "scrapes": 1, "interval_ms": None,
        "healthy": True, "ready": True,
        "waiting": 0, "running": 0, "kv_usage": 0.0, "queue_p95_ms": None,
        "prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 0.0,
        "gpu_mem_used_bytes": 0, "gpu_mem_total_bytes": 0,
        "unknown": ["generation_tokens_per_s", "gpu_mem_total_bytes", "gpu_mem_used_bytes", "kv_usage",
                    "prompt_tokens_per_s", "queue_p95_ms", "running", "waiting"],
        "why": {"generation_tokens_per_s": no_meter, "gpu_mem_total_bytes": gpu, "gpu_mem_used_bytes": gpu,
                "kv_usage": no_meter, "prompt_tokens_per_s": no_meter,
                "queue_p95_ms": "not exported by this engine", "running": no_meter, "waiting": no_meter},
        "driver": {"probes": 1, "unreachable": 0, "rejected": 0, "unexpected": 0, "last_error": "",
                   "metrics_endpoint": False, "missing": missing, "ttft_source": "probe_latency",
                   "meter_url": None, "meter_scrapes": 0, "meter_failures": 0, "meter_request_p99_ms": None},
    }
    assert mii.requests == [("POST", "/mii/mii-llama", "application/json",
                             b'{"prompts":["ping"],"max_new_tokens":1}')]


def test_mii_with_its_meter_reads_the_load_there(mii: FakeMiiServer) -> None:
    from adapters.mii_meter import MeterConfig, MiiMeter, Upstream

    meter = MiiMeter(MeterConfig(upstream=Upstream("127.0.0.1", mii.rest_port), host="127.0.0.1")).start()
    try:
        proc = run_probe("--engine", "deepspeed-mii", "--url", mii.rest_url, "--grpc-address", mii.grpc_address,
                         "--meter-url", meter.url, "--json")
    finally:
        meter.stop()
    assert (proc.returncode, proc.stderr) == (0, "")
    obs = json.loads(proc.stdout)
    assert (obs["running"], obs["waiting"]) == (0, 0)
    assert obs["unknown"] == ["generation_tokens_per_s", "gpu_mem_total_bytes", "gpu_mem_used_bytes", "kv_usage",
                              "prompt_tokens_per_s", "queue_p95_ms"]
    assert obs["why"]["prompt_tokens_per_s"] == "needs two scrapes"  # one scrape: no token rates yet
    assert obs["driver"]["metrics_endpoint"] is True and obs["driver"]["meter_scrapes"] == 1


def test_mii_backend_500_is_unhealthy_exit_1(mii: FakeMiiServer) -> None:
    mii.error_status = 500
    proc = run_probe("--engine", "deepspeed-mii", "--url", mii.rest_url, "--grpc-address", mii.grpc_address,
                     "--json")
    assert proc.returncode == 1
    obs = json.loads(proc.stdout)
    assert (obs["healthy"], obs["ready"], obs["ttft_p99_ms"], obs["waiting"]) == (False, False, None, None)
    assert obs["driver"]["unexpected"] == 1


def test_mii_loading_is_one_line_exit_2() -> None:
    server = FakeMiiServer().start(loading=True)
    try:
        proc = run_probe("--engine", "deepspeed-mii", "--url", server.rest_url, "--grpc-address",
                         server.grpc_address, "--json")
    finally:
        server.stop()
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"controlplane: error: deepspeed-mii at {server.rest_url}: unreachable: connection refused\n"


def test_mii_timeout_is_one_line_exit_2(mii: FakeMiiServer) -> None:
    mii.slow_s = 1.5
    proc = run_probe("--engine", "deepspeed-mii", "--url", mii.rest_url, "--grpc-address", mii.grpc_address,
                     "--timeout", "0.3")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"controlplane: error: deepspeed-mii at {mii.rest_url}: unreachable: timed out after 0.3s\n"


def test_mii_wrong_deployment_is_one_line_exit_2(mii: FakeMiiServer) -> None:
    url = f"http://127.0.0.1:{mii.rest_port}/mii/nope"
    proc = run_probe("--engine", "deepspeed-mii", "--url", url, "--grpc-address", mii.grpc_address)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"controlplane: error: deepspeed-mii at {url}: /mii/nope: HTTP 404: 404 Not Found\n"


def test_text_output(vllm: FakeVllmServer) -> None:
    proc = run_probe("--engine", "vllm", "--url", vllm.base_url)
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[:5] == [f"{'engine':24} vllm", f"{'url':24} {vllm.base_url}",
                                            f"{'source':24} live", f"{'healthy':24} True", f"{'ready':24} True"]
    assert f"{'unknown ttft_p99_ms':24} needs two scrapes" in proc.stdout.splitlines()
    assert not any(line != line.rstrip() for line in proc.stdout.splitlines())
