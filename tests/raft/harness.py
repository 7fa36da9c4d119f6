"""Run ONE coordinator (RaftNode + LeaseGuard + RaftReplicator) from a config file, driven by a tiny
line protocol on stdin/stdout. Used by the process-level tests; also handy by hand::

    python -m tests.raft.harness node-a.yaml

Each command is one line; each answer is one JSON line on stdout (logs go to stderr):

    status            {"ok": true, "node_id", "role", "term", "leader", "commit", "applied",
                       "holder", "lease_epoch", "version", "epoch" (authority now or null), "valid_ms"}
    commit FIRST N    commit writes FIRST..FIRST+N-1, one log entry each, fenced by the lease;
                      {"ack": i} after each acknowledged write, then {"ok": true, "done": N}
                      (or {"ok": false, "error", "at": i} at the first failure)
    stream FIRST      like commit, without end, in a background thread, until "stop"
    stop              end a stream: {"ok": true, "acked": n}
    dump              {"ok": true, "keys": [...], "digest", "applied", "commit"}
    add ADDR          add the member at Raft address ADDR (from the leader): {"ok": true} or an error
    remove ADDR       remove the member at Raft address ADDR (from the leader)
    bench N           N single-write commits: {"ok": true, "n", "p50_ms", "p99_ms", "max_ms", "fsyncs", ...}
    exhaust           open /dev/null until EMFILE and hold the descriptors: {"ok": true, "held": n}
    release           close them again: {"ok": true, "released": n}
    transport         the Raft transport's counters: {"ok": true, "counters": {...}, "accept_paused"}
    quit              stop everything and exit 0

A write ``i`` is ``PutBreaker(key="w%06d" % i)``: one small entry that always applies.

With ``CP_TEST_NOFILE=N`` the process lowers its soft RLIMIT_NOFILE to N first (the EMFILE test).
With ``CP_FAULTPROXY_PEER_PORTS`` set (``tests/support/faultproxy.py``: ``Partitioner.env_for``),
peers are dialled through the test's fault proxies.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import resource
import sys
import threading
import time
from typing import Any

from controlplane.config import load_config
from controlplane.domain.errors import ControlPlaneError
from controlplane.runtime.lease_guard import LeaseGuard
from raft import codec
from raft.lease import LeaseRecord
from raft.node import RaftNode
from raft.replicator import RaftReplicator
from tests.raft.cluster import breaker_write
from tests.support.faultproxy import ProxiedTCPNode, TCPNode, mapping_from_env

_out_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    line = json.dumps(obj, sort_keys=True)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Harness:
    def __init__(self, config_path: str) -> None:
        self.cfg = load_config(config_path)
        mapping = mapping_from_env()
        self_addr = self.cfg.raft_address

        def node_class(address: str) -> TCPNode:
            if mapping is None or address == self_addr:
                return TCPNode(address)
            return ProxiedTCPNode(address, mapping[address])

        self.node = RaftNode(self.cfg, node_class=node_class)
        self.guard = LeaseGuard(self.node)
        self.repl = RaftReplicator(self.node, fence=self.guard.fence)
        self._stream: threading.Thread | None = None
        self._stream_stop = threading.Event()
        self._streamed = 0
        self.held: list[int] = []

    def start(self) -> None:
        self.node.start()
        self.guard.start()

    def close(self) -> None:
        self._stream_stop.set()
        self.guard.stop()
        self.node.stop()

    # --- commands ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        st = self.node.status()
        rec, _ = self.node.lease_view()
        now = self.node.clock_ms()
        epoch = self.guard.authority(now)
        stats = self.guard.statistics()
        return {
            "ok": True, "node_id": st.node_id, "role": st.role, "term": st.term, "leader": st.leader_id,
            "commit": st.commit_index, "applied": st.applied_index, "holder": rec.holder,
            "lease_epoch": rec.epoch, "version": rec.version, "epoch": epoch,
            "valid_ms": max(0, stats.valid_until_ms - now) if epoch is not None else 0,
            "fatal": self.node.fatal_error(), "fatal_kind": self.node.fatal_kind(), "running": self.node.running,
        }

    def membership(self, op: str, address: str) -> dict[str, Any]:
        try:
            if op == "add":
                self.node.add_member(address)
            else:
                self.node.remove_member(address)
        except ControlPlaneError as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True}

    def write(self, i: int) -> None:
        result = self.repl.commit([breaker_write(i)], self.node.clock_ms())
        if not result.ok:
            raise RuntimeError(f"write {i} rejected: {result.error or [r.error for r in result.results]}")

    def commit(self, first: int, n: int) -> dict[str, Any]:
        for i in range(first, first + n):
            try:
                self.write(i)
            except (ControlPlaneError, RuntimeError) as exc:
                return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "at": i}
            emit({"ack": i})
        return {"ok": True, "done": n}

    def stream(self, first: int) -> dict[str, Any]:
        if self._stream is not None and self._stream.is_alive():
            return {"ok": False, "error": "a stream is already running"}
        self._stream_stop.clear()
        self._streamed = 0

        def run() -> None:
            i = first
            while not self._stream_stop.is_set():
                try:
                    self.write(i)
                except (ControlPlaneError, RuntimeError) as exc:
                    emit({"stream_error": f"{type(exc).__name__}: {exc}", "at": i})
                    time.sleep(0.05)
                    continue
                emit({"ack": i})
                self._streamed += 1
                i += 1

        self._stream = threading.Thread(target=run, name="stream", daemon=True)
        self._stream.start()
        return {"ok": True, "streaming_from": first}

    def stop_stream(self) -> dict[str, Any]:
        self._stream_stop.set()
        if self._stream is not None:
            self._stream.join(10)
        return {"ok": True, "acked": self._streamed}

    def dump(self) -> dict[str, Any]:
        state = self.node.state_copy()
        st = self.node.status()
        digest = hashlib.sha256(codec.encode_state(state, LeaseRecord())).hexdigest()
        return {
            "ok": True, "keys": sorted(state.breakers), "digest": digest,
            "applied": st.applied_index, "commit": st.commit_index,
        }

    def exhaust(self) -> dict[str, Any]:
        try:
            while True:
                self.held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
        return {"ok": True, "held": len(self.held)}

    def handle(self, line: str) -> dict[str, Any] | None:
        parts = line.split()
        if not parts:
            return None
        if parts[0] in ("add", "remove"):
            return self.membership(parts[0], parts[1])
        cmd, args = parts[0], [int(a) for a in parts[1:]]
        if cmd == "status":
            return self.status()
        if cmd == "commit":
            return self.commit(args[0], args[1])
        if cmd == "stream":
            return self.stream(args[0])
        if cmd == "stop":
            return self.stop_stream()
        if cmd == "dump":
            return self.dump()
        if cmd == "exhaust":
            return self.exhaust()
        if cmd == "release":
            n = len(self.held)
            for fd in self.held:
                os.close(fd)
            self.held = []
            return {"ok": True, "released": n}
        if cmd == "transport":
            stats = self.node.transport_stats()
            assert stats is not None
            return {"ok": True, "counters": stats.counters, "accept_paused": stats.accept_paused,
                    "open_links": stats.open_links, "pending_links": stats.pending_links}
        return {"ok": False, "error": f"unknown command {cmd!r}"}


def main(argv: list[str]) -> int:
    limit = os.environ.get("CP_TEST_NOFILE")
    if limit:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(limit), hard))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    h = Harness(argv[1])
    h.start()
    emit({"ok": True, "started": h.cfg.node_id})
    try:
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            try:
                answer = h.handle(line)
            except (ValueError, IndexError) as exc:
                answer = {"ok": False, "error": f"bad command {line.strip()!r}: {exc}"}
            if answer is not None:
                emit(answer)
    finally:
        h.close()
    emit({"ok": True, "bye": h.cfg.node_id})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
