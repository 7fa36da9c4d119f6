"""A real ``controlplane up`` group (127.0.0.1 only) under the fencing attacks of issue 14:

* a poisoned ``Fence(epoch=2**63-1)`` with the adapter token is refused (no TLS client certificate:
  the handshake fails; a coordinator's certificate but no signature: PERMISSION_DENIED) and the
  adapter's epoch file is untouched;
* an adapter that really holds a higher epoch (signed with the fence key: a leaked key, or a newer
  holder) stops commands to its cluster only: the holder logs it, Status shows it to admins, and the
  other cluster keeps scaling; after the documented reset the cluster is commanded again;
* ``up`` keeps the adapters running while a coordinator restarted by hand runs, and stops once
  none does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from controlplane.api.admin import Credentials, fetch_status
from controlplane.api.channel import open_channel
from controlplane.api.v1 import adapter_pb2, adapter_pb2_grpc
from controlplane.fencing import FenceSigner
from tests.support.waiting import alive, listening, wait_until

EXE = [sys.executable, "-m", "controlplane.cli.main"]


def start_up(root: Path, nodes: int, *extra: str) -> tuple[subprocess.Popen, dict]:
    up = subprocess.Popen(EXE + ["up", "--nodes", str(nodes), "--json", "--dir", str(root), *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return up, json.loads(up.stdout.readline())


def stop_up(up: subprocess.Popen) -> None:
    if up.poll() is None:
        up.send_signal(signal.SIGTERM)
        up.wait(30)


def admin(listing: dict) -> Credentials:
    return Credentials(token=Path(listing["admin_token_file"]).read_text().strip(), ca_file=listing["ca_file"])


def holder_of(listing: dict) -> dict:
    creds = admin(listing)

    def find():
        nodes = fetch_status([n["api_address"] for n in listing["nodes"]], 2.0, creds)
        held = [n for n in nodes if n.get("reachable") and n["lease"]["remaining_ms"] > 0]
        return held[0] if len(held) == 1 else None

    return wait_until(find, 60.0, "one lease holder", 0.2)


def coordinator_stub(root: Path, address: str) -> tuple[grpc.Channel, adapter_pb2_grpc.ClusterAdapterStub]:
    """A channel as coordinator coord-a would open it (its certificate, the adapter token)."""
    token = (root / "adapter.token").read_text().strip()
    channel = open_channel(address, ca_file=root / "pki" / "ca.pem", cert_file=root / "pki" / "coordinator-coord-a.pem",
                           key_file=root / "pki" / "coordinator-coord-a-key.pem", token=token)
    return channel, adapter_pb2_grpc.ClusterAdapterStub(channel)


def instances_seen(stub: adapter_pb2_grpc.ClusterAdapterStub, cluster: str) -> set[str]:
    reply = stub.Recent(adapter_pb2.RecentRequest(cluster_id=cluster, max_age_ms=1_500), timeout=5)
    return {s.instance_id for b in reply.batches for s in b.samples}


def log_events(path: Path, event: str) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text(errors="replace").splitlines() if f'"{event}"' in x]


def test_poisoned_and_stale_adapters_stop_only_their_cluster(tmp_path: Path) -> None:
    up, listing = start_up(tmp_path, 2)
    a, b = listing["adapters"]  # gpu-a1, gpu-b1
    try:
        holder = holder_of(listing)
        token = (tmp_path / "adapter.token").read_text().strip()
        epoch_file = tmp_path / "adapters" / f"{b['id']}.epoch.json"
        wait_until(epoch_file.exists, 30.0, "the holder's first fence on gpu-b1", 0.1)
        before = epoch_file.read_bytes()
        huge = adapter_pb2.FenceRequest(cluster_id=b["id"], fence=adapter_pb2.FenceToken(epoch=2**63 - 1, seq=1,
                                                                                         holder=holder["node_id"]))
        # 1. The reproduced attack: the adapter token, in plaintext. Refused by the handshake.
        with open_channel(b["adapter_address"], token=token) as plain:
            with pytest.raises(grpc.RpcError) as err:
                adapter_pb2_grpc.ClusterAdapterStub(plain).Fence(huge, timeout=5)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        # 2. Even with a coordinator's certificate and the token: no signature, PERMISSION_DENIED.
        channel, stub = coordinator_stub(tmp_path, b["adapter_address"])
        with pytest.raises(grpc.RpcError) as err:
            stub.Fence(huge, timeout=5)
        assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED and "fence.signature" in err.value.details()
        current = json.loads(epoch_file.read_text())
        assert current["epoch"] < 2**63 - 1 and json.loads(before)["epoch"] <= current["epoch"]

        # 3. A validly signed higher epoch (the fence key leaked): gpu-b1 alone is fenced out.
        signer = FenceSigner.from_file(tmp_path / "fence" / "fence-key.pem")
        sig = signer.sign(2**62, "intruder")
        poisoned_ms = int(time.time() * 1000)
        stub.Fence(adapter_pb2.FenceRequest(cluster_id=b["id"], fence=adapter_pb2.FenceToken(
            epoch=2**62, seq=1, holder="intruder", signature=sig.signature, key_id=sig.key_id)), timeout=5)
        channel.close()
        holder_log = tmp_path / f"{holder['node_id']}.log"
        [stale] = wait_until(lambda: log_events(holder_log, "adapter_stale_epoch"), 30.0, "the holder's stale-epoch line")
        assert (stale["cluster"], stale["adapter_epoch"], stale["level"]) == (b["id"], 2**62, "error")
        assert stale["epoch"] == holder["lease"]["epoch"]
        status = wait_until(lambda: [n for n in fetch_status([holder["api_address"]], 2.0, admin(listing))
                                     if n.get("fenced_clusters")], 10.0, "fenced_clusters in the holder's status")
        assert [f["cluster_id"] for f in status[0]["fenced_clusters"]] == [b["id"]]

        # 4. The other cluster keeps scaling: the demo burst (20 s after start) adds instances on gpu-a1.
        a_channel, a_stub = coordinator_stub(tmp_path, a["adapter_address"])
        b_channel, b_stub = coordinator_stub(tmp_path, b["adapter_address"])
        wait_until(lambda: len(instances_seen(a_stub, a["id"])) >= 2, 90.0, "gpu-a1 to scale out during the burst", 0.5)
        # Nothing new was created on the fenced cluster (instance ids carry the deciding tick's wall ms).
        assert all(int(i.split("-")[-2]) < poisoned_ms for i in instances_seen(b_stub, b["id"]))

        # 5. Recovery (docs/lease.md): stop the adapter, reset its epoch file, start it again.
        os.kill(b["pid"], signal.SIGTERM)
        wait_until(lambda: not alive(b["pid"]) or not listening(b["adapter_address"]), 20.0, "gpu-b1 to stop", 0.1)
        epoch_file.unlink()
        with open(tmp_path / f"{b['id']}.restarted.log", "ab") as err_log:
            restarted = subprocess.Popen(EXE + ["adapter", "--config", b["config"]], stdout=subprocess.DEVNULL, stderr=err_log)
        try:
            wait_until(lambda: log_events(holder_log, "adapter_epoch_accepted"), 60.0, "the holder to command gpu-b1 again")
            assert json.loads(epoch_file.read_text())["epoch"] == holder["lease"]["epoch"]
        finally:
            restarted.send_signal(signal.SIGTERM)
            restarted.wait(20)
        a_channel.close()
        b_channel.close()
        for log in tmp_path.glob("*.log"):
            assert "Traceback" not in log.read_text(errors="replace"), log
    finally:
        stop_up(up)


def test_up_keeps_the_adapters_while_a_restarted_coordinator_runs(tmp_path: Path) -> None:
    """The bug: ``up`` watched only its own children, so once the coordinators it started were gone
    it stopped the adapters under coordinators restarted by hand."""
    up, listing = start_up(tmp_path, 1, "--no-restart")  # restarted by hand here, not by up
    [node], [adapter] = listing["nodes"], listing["adapters"]
    replacement = None
    try:
        wait_until(lambda: listening(node["api_address"]), 30.0, "the coordinator's API")
        os.kill(node["pid"], signal.SIGKILL)
        wait_until(lambda: not listening(node["api_address"]), 10.0, "the coordinator to be gone")
        with open(tmp_path / "coord-a.restarted.log", "ab") as err_log:
            replacement = subprocess.Popen(EXE + ["coordinator", "--config", node["config"]], stdout=subprocess.DEVNULL,
                                           stderr=err_log)
        wait_until(lambda: listening(node["api_address"]), 30.0, "the restarted coordinator's API")
        from controlplane.cli.up import GONE_GRACE_S

        deadline = time.monotonic() + 2 * GONE_GRACE_S + 1
        while time.monotonic() < deadline:  # well past the grace: up must still be running
            assert up.poll() is None, up.stderr.read()
            assert alive(adapter["pid"])
            time.sleep(0.2)
        replacement.send_signal(signal.SIGTERM)
        replacement.wait(20)
        replacement = None
        assert up.wait(GONE_GRACE_S + 20) == 1
        assert "every coordinator has exited" in up.stderr.read()
        wait_until(lambda: not alive(adapter["pid"]), 15.0, "the adapter to be stopped")
    finally:
        if replacement is not None:
            replacement.kill()
            replacement.wait(10)
        stop_up(up)
