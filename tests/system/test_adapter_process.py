"""The adapter as a process (`controlplane adapter --config`): its fencing epoch survives a restart,
duplicates are applied once, and bad configurations fail with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapters.client import RemoteAdapter
from adapters.gpu import GpuMonitor
from controlplane.cli.up import free_ports, stop_children
from controlplane.domain.errors import StaleEpoch
from controlplane.domain.instances import InitMethod, Instance, InstanceState
from controlplane.ports import AdapterCommand, Fence

REPO = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "controlplane.cli.main"]
INST = Instance("chat-1", "chat", "acme", "gpu-a1", "az-a", "h100", 1, InstanceState.PENDING, InitMethod.COLD, 0, 0)


def start_adapter(config: Path | None, log: Path, args: list[str] | None = None) -> subprocess.Popen:
    argv = ["--config", str(config)] if config is not None else list(args or [])
    proc = subprocess.Popen(EXE + ["adapter", *argv], env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    return proc


def wait_serving(address: str, proc: subprocess.Popen, timeout_s: float = 20.0, ca_file: Path | None = None,
                 client: tuple[Path, Path] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    creds = None if ca_file is None else grpc.ssl_channel_credentials(
        ca_file.read_bytes(), private_key=client[1].read_bytes() if client else None,
        certificate_chain=client[0].read_bytes() if client else None)
    with (grpc.secure_channel(address, creds) if creds is not None else grpc.insecure_channel(address)) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"adapter exited with {proc.returncode}"
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.05)
    raise AssertionError(f"adapter on {address} not serving within {timeout_s}s")


def stop(proc: subprocess.Popen) -> None:
    stop_children([proc], grace_s=10.0)


def test_the_highest_epoch_survives_an_adapter_restart_and_duplicates_apply_once(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    config = tmp_path / "adapter.yaml"
    config.write_text(yaml.safe_dump({
        "cluster_id": "gpu-a1", "listen": address, "state_dir": "state", "backend": "recording",
        "recording": {"path": "record.jsonl"},
    }))
    record = tmp_path / "record.jsonl"
    client = RemoteAdapter({"gpu-a1": address}, deadline_s=5.0)
    proc = start_adapter(config, tmp_path / "adapter.log")
    try:
        wait_serving(address, proc)
        client.send("gpu-a1", AdapterCommand("e5-r1", "create", INST), Fence(5, 1, "coord-b"), 0)
        client.send("gpu-a1", AdapterCommand("e5-r1", "create", INST), Fence(5, 1, "coord-b"), 0)  # a duplicate
        with pytest.raises(StaleEpoch) as first:
            client.send("gpu-a1", AdapterCommand("e4-r9", "drain", INST), Fence(4, 9, "coord-a"), 0)
        assert (first.value.got, first.value.highest) == (4, 5)
        stop(proc)
        assert proc.returncode == 0

        proc = start_adapter(config, tmp_path / "adapter.log")
        wait_serving(address, proc)
        with pytest.raises(StaleEpoch) as again:
            client.send("gpu-a1", AdapterCommand("e4-r10", "drain", INST), Fence(4, 10, "coord-a"), 0)
        assert (again.value.got, again.value.highest) == (4, 5)
        with pytest.raises(StaleEpoch):
            client.fence("gpu-a1", Fence(4, 11, "coord-a"), 0)
    finally:
        stop(proc)
        client.close()
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    accepted = [(x["action"], x["epoch"], x.get("request_id")) for x in lines if x["accepted"]]
    assert accepted == [("create", 5, "e5-r1")]  # the duplicate changed nothing
    assert [(x["action"], x["epoch"]) for x in lines if not x["accepted"]] == [("drain", 4), ("drain", 4), ("fence", 4)]
    assert json.loads((tmp_path / "state" / "gpu-a1.epoch.json").read_text()) == {"epoch": 5, "holder": "coord-b"}
    # NVML: without a driver, each start says so once, clearly; with one, it lists the GPUs.
    log = (tmp_path / "adapter.log").read_text()
    if GpuMonitor().start():
        assert log.count('"gpu_inventory"') == 2
    else:
        assert log.count('"no NVML: ') == 2 and '"fallback": "engine metrics"' in log


@pytest.mark.parametrize(("config", "expected"), [
    ({"cluster_id": "c1", "listen": "127.0.0.1:7001", "state_dir": "s", "backend": "simulated"},
     "simulated: required when backend is 'simulated'"),
    ({"cluster_id": "c1", "listen": "127.0.0.1:7001", "state_dir": "s", "backend": "simulated",
      "simulated": {"deployments": [{"deployment": "chat", "load": [{"at_s": 5, "rps": 1}, {"at_s": 2, "rps": 3}]}]}},
     "simulated.deployments[0].load: steps must be in strictly increasing at_s order"),
    ({"cluster_id": "c1", "listen": "nowhere", "state_dir": "s", "backend": "recording", "recording": {"path": "r"}},
     "listen: 'nowhere' is not 'host:port'"),
    ({"cluster_id": "c1", "listen": "0.0.0.0:7001", "state_dir": "s", "backend": "recording", "recording": {"path": "r"}},
     ("auth_token_file: required because listen 0.0.0.0:7001 is not a loopback address "
      "(anyone who reaches it could command the cluster)")),
    ({"cluster_id": "c1", "listen": "127.0.0.1:7001", "state_dir": "s", "backend": "recording", "recording": {"path": "r"},
      "auth_token_file": "missing.token"},
     "auth_token_file: cannot read '{dir}/missing.token': No such file or directory"),
    ({"cluster_id": "c1", "listen": "0.0.0.0:7001", "state_dir": "s", "backend": "recording", "recording": {"path": "r"},
      "auth_token_file": "missing.token"},
     ("tls: required because listen 0.0.0.0:7001 is not a loopback address (adapter channels are mutual TLS: "
      "cert_file, key_file, client_ca_file)")),
])
def test_a_bad_adapter_configuration_is_one_line_naming_the_field(tmp_path: Path, config: dict, expected: str) -> None:
    path = tmp_path / "adapter.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run(EXE + ["adapter", "--config", str(path)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == f"controlplane: error: {path}: {expected.format(dir=tmp_path)}"


def test_two_adapter_processes_racing_on_one_kubernetes_cluster_cannot_apply_a_stale_scale(tmp_path: Path) -> None:
    """Two `controlplane adapter` processes with the Kubernetes backend share one (fake) API server,
    as two adapters for one cluster would after a botched rollout. Each passes its own local epoch
    guard; only the fence annotation, written with a resourceVersion precondition, decides. In every
    round the newer epoch's scale is the final state, and the older epoch is refused (StaleEpoch from
    the cluster's annotation, with the stale-epoch metadata) whenever it comes second."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.fakes.kube_apiserver import FakeKubeApiServer

    fake = FakeKubeApiServer(seed=5).start()
    fake.add_workload("Deployment", "serving", "chat-vllm")
    fake.auto_reconcile = False  # no pods: this test is about the replicas write
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake.host}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "adapter"}}],
        "users": [{"name": "adapter", "user": {"token": "test"}}],
    }))
    ports = free_ports(2)
    procs, clients = [], []
    try:
        for name, port in zip("ab", ports):
            config = tmp_path / f"adapter-{name}.yaml"
            config.write_text(yaml.safe_dump({
                "cluster_id": "gpu-a1", "listen": f"127.0.0.1:{port}", "state_dir": f"state-{name}", "nvml": False,
                "backend": "kubernetes",
                "kubernetes": {"kubeconfig": str(kubeconfig), "conflict_backoff_ms": 1, "conflict_backoff_cap_ms": 8,
                               "workloads": [{"deployment": "chat", "namespace": "serving", "kind": "Deployment",
                                              "name": "chat-vllm", "engine": "vllm", "port": 8000}]},
            }))
            procs.append(start_adapter(config, tmp_path / f"adapter-{name}.log"))
            clients.append(RemoteAdapter({"gpu-a1": f"127.0.0.1:{port}"}, deadline_s=10.0))
        for proc, port in zip(procs, ports):
            wait_serving(f"127.0.0.1:{port}", proc)
        old_client, new_client = clients
        with ThreadPoolExecutor(2) as pool:
            for r in range(6):
                old, new = 2 * r + 4, 2 * r + 5

                def attempt(client: RemoteAdapter, epoch: int, replicas: int) -> BaseException | None:
                    try:
                        client.scale("gpu-a1", f"s{epoch}", "chat", replicas, [], Fence(epoch, 1, f"coord-{epoch}"))
                        return None
                    except BaseException as exc:  # noqa: BLE001 - the outcome is the assertion
                        return exc

                older = pool.submit(attempt, old_client, old, 10 + r)
                newer = pool.submit(attempt, new_client, new, 50 + r)
                assert newer.result(30) is None
                assert older.result(30) is None or isinstance(older.result(), StaleEpoch), older.result()
                workload = fake.get("deployments", "serving", "chat-vllm")
                assert workload["metadata"]["annotations"]["controlplane.io/fence-epoch"] == str(new)
                assert workload["spec"]["replicas"] == 50 + r
                with pytest.raises(StaleEpoch) as late:  # the older adapter's own guard knows only `old`
                    old_client.scale("gpu-a1", f"late{old}", "chat", 1, [], Fence(old, 2, f"coord-{old}"))
                assert (late.value.got, late.value.highest) == (old, new)
                assert fake.get("deployments", "serving", "chat-vllm")["spec"]["replicas"] == 50 + r
    finally:
        for proc in procs:
            stop(proc)
        for client in clients:
            client.close()
        fake.stop()


TOKEN = "adapter-token-0123456789abcdef"


def test_an_adapter_on_all_interfaces_needs_mutual_tls_the_token_and_signed_epochs(tmp_path: Path) -> None:
    from adapters.client import AdapterTls
    from controlplane.domain.errors import Unavailable
    from controlplane.fencing import FenceSigner, make_fence_key
    from controlplane.tls import issue_coordinator_cert, make_dev_pki

    pki = make_dev_pki(tmp_path / "pki")
    fence = make_fence_key(tmp_path / "fence")
    coord = issue_coordinator_cert(pki, "coord-a")
    port = free_ports(1)[0]
    (tmp_path / "adapter.token").write_text(TOKEN + "\n")
    (tmp_path / "adapter.token").chmod(0o600)
    config = tmp_path / "adapter.yaml"
    config.write_text(yaml.safe_dump({
        "cluster_id": "gpu-a1", "listen": f"0.0.0.0:{port}", "state_dir": "state", "nvml": False, "backend": "recording",
        "recording": {"path": "record.jsonl"}, "auth_token_file": "adapter.token",
        "tls": {"cert_file": "pki/server.pem", "key_file": "pki/server-key.pem", "client_ca_file": "pki/ca.pem"},
        "fence_public_key_files": ["fence/fence.pub.pem"],
    }))
    address = f"127.0.0.1:{port}"
    tls = AdapterTls(pki.ca_cert, *coord)
    good = RemoteAdapter({"gpu-a1": address}, deadline_s=5.0, token=TOKEN, tls=tls)
    anonymous = RemoteAdapter({"gpu-a1": address}, deadline_s=5.0, tls=tls)
    plaintext = RemoteAdapter({"gpu-a1": address}, deadline_s=2.0, token=TOKEN)
    signer = FenceSigner.from_file(fence.private_key)
    sig = signer.sign(3, "coord-a")
    proc = start_adapter(config, tmp_path / "adapter.log")
    try:
        wait_serving(address, proc, ca_file=pki.ca_cert, client=coord)
        good.fence("gpu-a1", Fence(3, 1, "coord-a", sig.signature, sig.key_id), 0)
        with pytest.raises(Unavailable, match="PERMISSION_DENIED: fence.signature: missing"):
            good.fence("gpu-a1", Fence(2**63 - 1, 2, "coord-a"), 0)  # the poisoned fence: refused
        with pytest.raises(Unavailable, match="UNAUTHENTICATED"):
            anonymous.fence("gpu-a1", Fence(4, 1, "coord-b"), 0)
        with pytest.raises(Unavailable):
            plaintext.fence("gpu-a1", Fence(4, 1, "coord-b"), 0)
    finally:
        stop(proc)
        for c in (good, anonymous, plaintext):
            c.close()
    assert proc.returncode == 0
    record = json.loads((tmp_path / "state" / "gpu-a1.epoch.json").read_text())
    assert (record["epoch"], record["holder"], record["key_id"]) == (3, "coord-a", signer.key_id)
    log = (tmp_path / "adapter.log").read_text()
    assert TOKEN not in log and "unauthenticated (loopback only)" not in log and "(loopback only)" not in log
    assert '"call_unauthenticated"' in log and '"authenticated": true' in log and '"mutual_tls": true' in log
    assert '"fence_refused"' in log


def test_the_legacy_flags_take_a_token_file_and_loopback_without_one_warns_once(tmp_path: Path) -> None:
    from controlplane.domain.errors import Unavailable

    token_file = tmp_path / "adapter.token"
    token_file.write_text(TOKEN)
    ports = free_ports(2)

    def flags(name: str, port: int) -> list[str]:
        return ["--cluster", "gpu-a1", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / f"state-{name}"),
                "--record", str(tmp_path / f"{name}.jsonl")]

    secured = start_adapter(None, tmp_path / "secured.log", flags("secured", ports[0]) + ["--auth-token-file", str(token_file)])
    open_ = start_adapter(None, tmp_path / "open.log", flags("open", ports[1]))
    clients = [RemoteAdapter({"gpu-a1": f"127.0.0.1:{p}"}, deadline_s=5.0, token=t)
               for p, t in ((ports[0], TOKEN), (ports[0], None), (ports[1], None))]
    try:
        wait_serving(f"127.0.0.1:{ports[0]}", secured)
        wait_serving(f"127.0.0.1:{ports[1]}", open_)
        clients[0].fence("gpu-a1", Fence(2, 1, "coord-a"), 0)
        with pytest.raises(Unavailable, match="UNAUTHENTICATED"):
            clients[1].fence("gpu-a1", Fence(3, 1, "coord-a"), 0)
        clients[2].fence("gpu-a1", Fence(1, 1, "coord-a"), 0)
    finally:
        stop(secured)
        stop(open_)
        for c in clients:
            c.close()
    assert "unauthenticated (loopback only)" not in (tmp_path / "secured.log").read_text()
    assert (tmp_path / "open.log").read_text().count("adapter is unauthenticated (loopback only)") == 1
