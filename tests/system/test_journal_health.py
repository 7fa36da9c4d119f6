"""Real coordinator processes: a follower restarted on a journal with one flipped byte in a committed
entry stops taking part in Raft with one log line naming the file and the byte offset (no
traceback), ``controlplane health`` answers NOT_SERVING, its API answers UNAVAILABLE with the
reason, and the other two keep committing (lease renewals are Raft entries) within 2 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import yaml

from controlplane.api.admin import Credentials, fetch_status
from controlplane.api.v1 import api_pb2, api_pb2_grpc
from controlplane.cli.up import plan_group
from controlplane.tokens import new_token
from raft.journal import REC_HEADER_SIZE, scan
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "controlplane.cli.main"]
TOKEN = new_token()[0]
CREDS = Credentials(token=TOKEN)
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def start(config: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as err:
        return subprocess.Popen(EXE + ["coordinator", "--config", str(config)], env=ENV,
                                stdout=subprocess.DEVNULL, stderr=err)


def holder(endpoints: list[str]) -> dict | None:
    st = [s for s in fetch_status(endpoints, 1.0, CREDS) if s["reachable"]]
    return next((s for s in st if s["lease"]["remaining_ms"] > 0), None)


def health(endpoint: str) -> subprocess.CompletedProcess:
    return subprocess.run(EXE + ["health", "--endpoint", endpoint, "--timeout", "3"], env=ENV,
                          capture_output=True, text=True, timeout=30, check=False)


def test_a_corrupt_follower_is_not_serving_answers_unavailable_and_the_group_goes_on(tmp_path: Path) -> None:
    nodes, _ = plan_group(3, tmp_path)
    (tmp_path / "admin.token").write_text(TOKEN + "\n")
    for n in nodes:
        cfg = dict(yaml.safe_load(n.config.read_text()), admin_token_file=str(tmp_path / "admin.token"))
        n.config.write_text(yaml.safe_dump(cfg))
    logs = {n.node_id: tmp_path / f"{n.node_id}.log" for n in nodes}
    procs = {n.node_id: start(n.config, logs[n.node_id]) for n in nodes}
    endpoints = [n.api_address for n in nodes]
    try:
        h = wait_until(lambda: holder(endpoints), 30.0, "a lease holder", 0.1)
        wait_until(lambda: (x := holder(endpoints)) and x["commit_index"] > h["commit_index"] + 20, 30.0,
                   "some committed lease renewals", 0.1)
        victim = next(n for n in nodes if n.node_id != h["node_id"])
        assert health(victim.api_address).returncode == 0
        procs[victim.node_id].send_signal(signal.SIGTERM)
        procs[victim.node_id].wait(15)
        journal = tmp_path / victim.node_id / "raft.journal"
        data = journal.read_bytes()
        loaded = scan(journal, data, None)
        at = loaded.offsets[len(loaded.offsets) // 2] + REC_HEADER_SIZE  # first payload byte of a committed entry
        journal.write_bytes(data[:at] + bytes([data[at] ^ 0x06]) + data[at + 1 :])
        mark = logs[victim.node_id].stat().st_size
        procs[victim.node_id] = start(victim.config, logs[victim.node_id])

        res = wait_until(lambda: (r := health(victim.api_address)).returncode == 1 and "NOT_SERVING" in r.stderr and r,
                         30.0, "the restarted member to answer NOT_SERVING", 0.2)
        print(f"health: {res.stderr.strip()}")
        channel = grpc.insecure_channel(victim.api_address)
        try:
            api_pb2_grpc.TenantsStub(channel).ListTenants(api_pb2.ListRequest(), timeout=5,
                                                          metadata=(("authorization", f"Bearer {TOKEN}"),))
            raise AssertionError("a stopped member served a read")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            assert "stopped" in exc.details() and "raft.journal" in exc.details() and f"byte offset {at}" in exc.details()
            assert str(tmp_path) not in exc.details()  # the data dir's location is not told to callers
        finally:
            channel.close()
        assert procs[victim.node_id].poll() is None  # the process lives on, reporting

        text = logs[victim.node_id].read_text(errors="replace")[mark:]
        lines = [ln for ln in text.splitlines() if "stopped:" in ln]
        assert len(lines) == 1 and f"byte offset {at}" in lines[0] and "Traceback" not in text, text[-3000:]

        rest = [n.api_address for n in nodes if n is not victim]
        before = holder(rest)
        t0 = time.monotonic()
        wait_until(lambda: (x := holder(rest)) and x["commit_index"] > before["commit_index"] + 3, 2.0,
                   "the other two to keep committing", 0.05)
        print(f"stopped member: {lines[0].strip()}; survivors committed again after {time.monotonic() - t0:.2f}s")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
