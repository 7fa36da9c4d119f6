"""``controlplane bench raft``: commit latency, throughput and failover of replicated decisions on three
real coordinator processes, and the same numbers for bare pysyncobj (the floor), in one run.

What runs (everything on 127.0.0.1, every process stopped in ``finally``):

* **coordinator**: three ``python -m controlplane.bench.raft member CONFIG`` processes. Each is the real
  composition root, :class:`controlplane.coordinator.Coordinator` (RaftNode + LeaseGuard +
  RaftReplicator + ControlLoop + gRPC Admin API), built from a configuration written by
  :func:`controlplane.cli.up.plan_group` (every timing at its default, ``fsync: entry``), plus a
  JSON-lines control channel on stdin/stdout that lets this process submit decisions through the
  holder's ``RaftReplicator`` (fenced by its lease, exactly like the control loop).
* **bare**: three ``python -m controlplane.bench.raft bare CONFIG`` processes: pysyncobj as shipped
  (``SyncObj`` with a ``@replicated`` counter, auto-tick, no fsync) with the same Raft timeouts and
  connection settings taken from the same default configuration, a password, journal files and
  ``appendEntriesUseBatch=False``.

Measurements (per system, sequentially, so the two never compete for the CPUs):

1. *Commit latency*: ``--commits`` sequential commits on the holder (after a warm-up), each one
   encoded decision batch (:data:`BATCH_DEPLOYMENTS` ``SetDesired`` commands, the shape of one control
   loop tick) or, bare, one counter increment; timed in the member around the blocking commit.
2. *Throughput*: a burst of ``--commits`` commits from :data:`BURST_CONCURRENCY` threads on the
   holder (at most that many in flight); commits per second of wall time.
3. *Failover*, ``--trials`` times: after a random delay (uniform over one lease renewal period, so the
   kill falls anywhere in the renewal cycle), SIGKILL the lease holder (bare: the Raft leader). Both
   survivors were already asked, over the control channel, to report as soon as they (a) hold a valid
   lease with a newer epoch than the killed holder's and (b) committed one fenced decision batch
   under it (bare: became leader in a newer term and committed one increment). Failover = the time
   this process receives that report minus the time it sent SIGKILL, both on this process's
   ``time.monotonic()``. The new holder's Admin ``Status`` (gRPC) is then read to confirm
   ``lease_remaining_ms > 0``, the new epoch and ``commit_index`` covering the commit. The killed
   member is restarted from its data directory and the next trial starts once it has applied every
   entry committed before it came back and the holder has been stable for a moment.

Why the control channel rather than polling the Admin API for the failover end: it observes the
same two facts (valid lease, committed entry) without a 100 Hz gRPC poll competing with the
members for two CPUs, and it measures what matters, a decision committed under the new lease,
instead of waiting for an unrelated renewal to advance ``commit_index``. The member polls its own
guard every :data:`AWAIT_POLL_S`. Members also report their own ``CLOCK_MONOTONIC`` timestamps
(Linux: one clock for all processes) for the breakdown: Raft leader elected, acquire allowed,
acquire sent, lease held, decision committed.

Output: a rich progress bar on stderr; ``--json``: the result on stdout; always
``--out``/bench-raft.md (tables), bench-raft.json and bench-raft.png (failover distributions).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

# --- parameters -------------------------------------------------------------------------------------

DEFAULT_TRIALS = 20
DEFAULT_COMMITS = 300
DEFAULT_OUT = "out"
BATCH_DEPLOYMENTS = 16
"""SetDesired commands per decision batch (one control-loop tick deciding 16 deployments)."""
BURST_CONCURRENCY = 8
"""Threads submitting during the throughput burst (= most commits in flight)."""
WARMUP_COMMITS = 20
COMMIT_CHUNK = 50
"""Sequential commits per control-channel request (the progress bar advances per chunk)."""
AWAIT_POLL_S = 0.002
FAILOVER_TIMEOUT_S = 15.0
START_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 30.0
STABLE_FOR_S = 0.25
"""A holder counts as settled when it is unchanged over two looks at least this far apart."""
CALL_TIMEOUT_S = 120.0
MEMBER_MAX_LIFETIME_S = 1800.0
"""A member exits by itself after this long, and when its stdin closes (the bench process died)."""
KILL_PHASE_SEED = 20260901
TARGET_FAILOVER_MS = 2000
TENANT = "bench"
MODEL = "llama3-8b-h100"
FILES = ("bench-raft.md", "bench-raft.json", "bench-raft.png")
SYSTEMS = ("coordinator", "bare")


class BenchError(Exception):
    """The benchmark could not run (a member did not start, the group did not settle...)."""


def mono_ms() -> float:
    """``CLOCK_MONOTONIC`` in milliseconds (the clock ``RaftNode.clock_ms`` truncates)."""
    return time.monotonic() * 1000.0


# =====================================================================================================
# Member side: the child processes
# =====================================================================================================


def deployment_ids() -> list[str]:
    return [f"bench-{i:02d}" for i in range(BATCH_DEPLOYMENTS)]


def setup_commands() -> list[Any]:
    """One tenant and the deployments the decision batches target (min_replicas 0, no warm pool, so
    the coordinator's own control loop, which sees no load, agrees with every decision and stays
    quiet instead of committing batches of its own during the measurement)."""
    from controlplane.domain import commands as c
    from controlplane.domain.tenants import Deployment, Engine, Tenant

    cmds: list[Any] = [c.PutTenant(Tenant(TENANT, priority=1))]
    cmds += [
        c.PutDeployment(Deployment(d, TENANT, Engine.VLLM, MODEL, "h100", 1, min_replicas=0, max_replicas=64,
                                   warm_pool=0))
        for d in deployment_ids()
    ]
    return cmds


def decision_batch(seq: int, now_ms: int) -> list[Any]:
    """What one control-loop tick commits for 16 deployments: a SetDesired each."""
    from controlplane.domain import commands as c

    return [c.SetDesired(d, 0, 0, f"bench decision {seq}: no_data", now_ms)
            for d in deployment_ids()]


def decision_batch_bytes() -> int:
    from controlplane.domain.commands import Batch
    from raft import codec

    return len(codec.encode(Batch(tuple(decision_batch(0, 0)))))


class _Member:
    """Operations common to both kinds of member; subclasses commit one entry and say who leads."""

    node_id = ""

    def __init__(self) -> None:
        self._cancel = threading.Event()
        self._seq = 0
        self._seq_lock = threading.Lock()

    # hooks ------------------------------------------------------------------------------------------
    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def commit_one(self) -> None:
        raise NotImplementedError

    def is_raft_leader(self) -> bool:
        raise NotImplementedError

    def holds_newer(self, old: int) -> int | None:
        """The token (lease epoch / Raft term) if this node may command with one newer than ``old``."""
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}

    def after_await(self, token: int) -> dict[str, Any]:
        return {}

    # operations -------------------------------------------------------------------------------------
    def next_seq(self) -> int:
        with self._seq_lock:
            self._seq += 1
            return self._seq

    def seq(self, n: int) -> dict[str, Any]:
        lat: list[float] = []
        errors: list[str] = []
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                self.commit_one()
            except Exception as exc:  # noqa: BLE001 (reported to the bench, which decides)
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            lat.append((time.perf_counter() - t0) * 1000.0)
        return {"ok": not errors, "latencies_ms": lat, "error_count": len(errors), "errors": errors[:3]}

    def burst(self, n: int, concurrency: int) -> dict[str, Any]:
        lock = threading.Lock()
        taken = [0]
        lat: list[float] = []
        errors: list[str] = []
        go = threading.Event()

        def worker() -> None:
            go.wait()
            while True:
                with lock:
                    if taken[0] >= n:
                        return
                    taken[0] += 1
                t0 = time.perf_counter()
                try:
                    self.commit_one()
                except Exception as exc:  # noqa: BLE001
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                dt = (time.perf_counter() - t0) * 1000.0
                with lock:
                    lat.append(dt)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, concurrency))]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        go.set()
        for t in threads:
            t.join(CALL_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        return {"ok": not errors, "elapsed_s": elapsed, "committed": len(lat), "latencies_ms": lat,
                "error_count": len(errors), "errors": errors[:3]}

    def await_command(self, old: int, timeout_s: float) -> dict[str, Any]:
        """Wait until this node may command with a token newer than ``old``, then commit one entry.
        Reports its own CLOCK_MONOTONIC timestamps (ms)."""
        self._cancel.clear()
        deadline = mono_ms() + timeout_s * 1000.0
        t_leader: float | None = None
        errors: list[str] = []
        while True:
            now = mono_ms()
            if self._cancel.is_set():
                return {"ok": False, "cancelled": True, "node_id": self.node_id, "errors": errors[:3]}
            if now >= deadline:
                return {"ok": False, "error": f"no newer authority within {timeout_s}s", "node_id": self.node_id,
                        "errors": errors[:3]}
            if t_leader is None and self.is_raft_leader():
                t_leader = now
            token = self.holds_newer(old)
            if token is not None:
                t_auth = mono_ms()
                try:
                    self.commit_one()
                except Exception as exc:  # noqa: BLE001 (lost it again: keep waiting)
                    errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(AWAIT_POLL_S)
                    continue
                t_done = mono_ms()
                return {"ok": True, "node_id": self.node_id, "token": token,
                        "t_leader_ms": t_leader if t_leader is not None else t_auth, "t_authority_ms": t_auth,
                        "t_committed_ms": t_done, "retries": len(errors), **self.after_await(token)}
            time.sleep(AWAIT_POLL_S)

    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "status":
            return {"ok": True, **self.status()}
        if op == "stats":
            return {"ok": True, **self.stats()}
        if op == "seq":
            return self.seq(int(args["n"]))
        if op == "burst":
            return self.burst(int(args["n"]), int(args["concurrency"]))
        if op == "await":
            return self.await_command(int(args["old"]), float(args["timeout_s"]))
        if op == "setup":
            return self.setup()
        return {"ok": False, "error": f"unknown op {op!r}"}

    def setup(self) -> dict[str, Any]:
        return {"ok": True}

    def cancel(self) -> None:
        self._cancel.set()


class CoordinatorMember(_Member):
    """A real :class:`~controlplane.coordinator.Coordinator`; commits go through its RaftReplicator."""

    def __init__(self, config_path: str) -> None:
        super().__init__()
        from controlplane.config import load_config
        from controlplane.coordinator import Coordinator, Topology

        self.cfg = load_config(config_path)
        self.node_id = self.cfg.node_id
        # No clusters / adapters: the benchmark measures the replicated decisions, not adapter RPCs.
        self.coord = Coordinator(self.cfg, Topology())

    def start(self) -> None:
        self.coord.start()

    def stop(self) -> None:
        self.coord.stop()

    def _commit(self, commands: Sequence[Any]) -> None:
        now = self.coord.node.clock_ms()
        result = self.coord.replicator.commit(commands, now)
        if not result.ok:
            why = result.error or next((r.error for r in result.results if not r.ok), "rejected")
            raise RuntimeError(f"batch rejected: {why}")

    def commit_one(self) -> None:
        self._commit(decision_batch(self.next_seq(), self.coord.node.clock_ms()))

    def setup(self) -> dict[str, Any]:
        self._commit(setup_commands())
        return {"ok": True}

    def is_raft_leader(self) -> bool:
        return self.coord.node.is_leader()

    def holds_newer(self, old: int) -> int | None:
        epoch = self.coord.guard.authority(self.coord.node.clock_ms())
        return epoch if epoch is not None and epoch > old else None

    def after_await(self, token: int) -> dict[str, Any]:
        g = self.coord.guard.statistics()
        same = g.epoch == token
        return {
            "commit_index": self.coord.node.status().commit_index,
            "acquire_sent_ms": g.last_acquire_sent_ms if same else None,
            "acquire_allowed_ms": g.last_acquire_allowed_ms if same else None,
            "acquire_t_obs_ms": g.last_acquire_t_obs_ms if same else None,
        }

    def status(self) -> dict[str, Any]:
        s = asdict(self.coord.status())
        s["peers"] = [list(p.values()) for p in s["peers"]]
        return s

    def stats(self) -> dict[str, Any]:
        d = self.coord.node.durability()
        return {
            "durability": {"fsync": d.mode, "fsyncs": d.fsyncs,
                           "fsync_ms_mean": round(d.fsync_ms_total / max(1, d.fsyncs), 3),
                           "fsync_ms_max": round(d.fsync_ms_max, 3)},
            "control_loop": asdict(self.coord.loop.statistics()),
            "lease": {k: v for k, v in asdict(self.coord.guard.statistics()).items()
                      if k in ("acquisitions", "renewals", "renew_failures", "losses", "releases",
                               "max_renew_latency_ms")},
        }


def bare_settings(cfg: Any) -> dict[str, Any]:
    """The SyncObjConf of the bare floor, from the coordinator's (default) configuration: the same
    Raft timeouts and connection settings as ``raft/node.py``; everything else pysyncobj's default."""
    return {
        "raftMinTimeout": cfg.raft_min_timeout_ms / 1000.0,
        "raftMaxTimeout": cfg.raft_max_timeout_ms / 1000.0,
        "appendEntriesPeriod": cfg.append_entries_period_ms / 1000.0,
        "leaderFallbackTimeout": cfg.leader_fallback_timeout_ms / 1000.0,
        "connectionTimeout": 1e9,
        "connectionRetryTime": cfg.connection_retry_ms / 1000.0,
        "appendEntriesUseBatch": False,
        "bindAddress": cfg.raft_address,
        "journalFile": str(cfg.data_dir / "bare.journal"),
        "fullDumpFile": str(cfg.data_dir / "bare.dump"),
    }


class BareMember(_Member):
    """pysyncobj as shipped: a SyncObj with one replicated counter (auto-tick, no fsync)."""

    def __init__(self, config_path: str) -> None:
        super().__init__()
        from pysyncobj import SyncObj, SyncObjConf, replicated

        from controlplane.config import load_config

        class Counter(SyncObj):
            def __init__(self, self_addr: str, others: list[str], conf: SyncObjConf) -> None:
                super().__init__(self_addr, others, conf)
                self.value = 0  # after super().__init__: part of the snapshot

            @replicated
            def inc(self, n: int) -> int:
                self.value += n
                return self.value

        self.cfg = load_config(config_path)
        self.node_id = self.cfg.node_id
        assert self.cfg.password is not None
        self._conf = SyncObjConf(password=self.cfg.password.get_secret_value(), **bare_settings(self.cfg))
        self._factory = lambda: Counter(self.cfg.raft_address, [p.raft_address for p in self.cfg.peers], self._conf)
        self.obj: Any = None

    def start(self) -> None:
        self.obj = self._factory()

    def stop(self) -> None:
        if self.obj is not None:
            self.obj.destroy()

    def commit_one(self) -> None:
        self.obj.inc(1, sync=True, timeout=self.cfg.commit_timeout_ms / 1000.0)

    def is_raft_leader(self) -> bool:
        return bool(self.obj._isLeader())  # pysyncobj has no public "am I leader" (getStatus is heavy)

    def holds_newer(self, old: int) -> int | None:
        if not self.obj._isLeader():
            return None
        term = int(self.obj.raftCurrentTerm)
        return term if term > old else None

    def after_await(self, token: int) -> dict[str, Any]:
        return {"commit_index": int(self.obj.raftCommitIndex)}

    def status(self) -> dict[str, Any]:
        for _ in range(5):
            try:
                st = self.obj.getStatus()  # iterates pysyncobj dicts from another thread: may race
                break
            except RuntimeError:
                time.sleep(0.005)
        else:
            return {"node_id": self.node_id, "error": "getStatus kept racing"}
        connected = sum(1 for k, v in st.items() if k.startswith("partner_node_status_server_") and v == 2)
        return {"node_id": self.node_id, "leader": st["state"] == 2, "term": st["raft_term"],
                "commit_index": st["commit_idx"], "applied_index": st["last_applied"],
                "leader_address": None if st["leader"] is None else str(st["leader"]), "connected": connected}


def member_main(kind: str, config_path: str) -> int:
    """Entry point of one member process: ``python -m controlplane.bench.raft member|bare CONFIG``."""
    import logging

    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # anything else written to stdout (structlog's default logger) goes to the log
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    watchdog = threading.Timer(MEMBER_MAX_LIFETIME_S, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    member: _Member = CoordinatorMember(config_path) if kind == "member" else BareMember(config_path)
    out_lock = threading.Lock()

    def reply(obj: dict[str, Any]) -> None:
        line = json.dumps(obj)
        with out_lock:
            proto.write(line + "\n")
            proto.flush()

    def run(req: dict[str, Any]) -> None:
        try:
            res = member.handle(str(req.get("op")), req)
        except Exception as exc:  # noqa: BLE001 (the bench reports it)
            res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        reply({**res, "id": req["id"]})

    member.start()
    try:
        reply({"started": member.node_id, "pid": os.getpid()})
        for line in sys.stdin:  # EOF: the bench process is gone
            try:
                req = json.loads(line)
            except json.JSONDecodeError:
                continue
            if req.get("op") == "quit":
                break
            if req.get("op") == "cancel":
                member.cancel()
                reply({"ok": True, "id": req["id"]})
                continue
            threading.Thread(target=run, args=(req,), daemon=True).start()
    finally:
        member.cancel()
        member.stop()
    return 0


# =====================================================================================================
# Bench side: processes, groups, trials
# =====================================================================================================


class _Slot:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: dict[str, Any] = {}
        self.t_recv = 0.0
        """time.monotonic() when the reader thread received the answer."""

    def fill(self, value: dict[str, Any], t: float) -> None:
        self.value, self.t_recv = value, t
        self.event.set()


class _Proc:
    """One member process and its JSON-lines control channel."""

    def __init__(self, kind: str, node_id: str, config: Path, log: Path, api_address: str) -> None:
        self.kind, self.node_id, self.config, self.log, self.api_address = kind, node_id, config, log, api_address
        self.proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, _Slot] = {}
        self._next = 0
        self._started = _Slot()
        self._reader: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        self._started = _Slot()
        with self._lock:
            self._pending = {}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])])}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603 (our own module, fixed arguments)
                [sys.executable, "-m", "controlplane.bench.raft", self.kind, str(self.config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, env=env,
            )
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()

    def wait_started(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if not self._started.event.wait(timeout_s) or not self._started.value.get("started"):
            raise BenchError(f"{self.node_id} did not start within {timeout_s:.0f}s: {self.log_tail()}")

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            t = time.monotonic()
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "id" not in obj:
                self._started.fill(obj, t)
                continue
            with self._lock:
                slot = self._pending.pop(obj["id"], None)
            if slot is not None:
                slot.fill(obj, t)
        t = time.monotonic()
        with self._lock:
            left, self._pending = self._pending, {}
        for slot in left.values():
            slot.fill({"ok": False, "error": "process exited"}, t)
        self._started.fill({"ok": False, "error": "process exited"}, t)

    def request(self, op: str, **args: Any) -> _Slot:
        slot = _Slot()
        if not self.alive or self.proc is None or self.proc.stdin is None:
            slot.fill({"ok": False, "error": f"{self.node_id} is not running"}, time.monotonic())
            return slot
        with self._lock:
            self._next += 1
            rid = self._next
            self._pending[rid] = slot
        try:
            self.proc.stdin.write(json.dumps({"op": op, "id": rid, **args}) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            with self._lock:
                self._pending.pop(rid, None)
            slot.fill({"ok": False, "error": f"{self.node_id}: {exc}"}, time.monotonic())
        return slot

    def call(self, op: str, timeout_s: float = CALL_TIMEOUT_S, **args: Any) -> dict[str, Any]:
        slot = self.request(op, **args)
        if not slot.event.wait(timeout_s):
            raise BenchError(f"{self.node_id}: no answer to {op!r} within {timeout_s:.0f}s: {self.log_tail()}")
        return slot.value

    def kill(self) -> float:
        """SIGKILL; returns time.monotonic() taken right before the signal was sent."""
        assert self.proc is not None
        t = time.monotonic()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        return t

    def ask_quit(self) -> None:
        if self.alive and self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit", "id": 0}) + "\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
            except OSError:
                pass

    def reap(self, deadline: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def log_tail(self, n: int = 1500) -> str:
        try:
            return "log tail: " + self.log.read_text(encoding="utf-8", errors="replace")[-n:]
        except OSError:
            return "(no log)"


class _Group:
    """Three members of one kind, configured by ``plan_group`` (defaults, fsync entry)."""

    def __init__(self, system: str, root: Path) -> None:
        from controlplane.cli.up import plan_group
        from controlplane.config import load_config

        self.system = system
        root.mkdir(parents=True, exist_ok=True)
        from controlplane.api.admin import Credentials
        from controlplane.tokens import new_token

        nodes, _ = plan_group(3, root)
        token = new_token()[0]  # Admin.Status needs a token: the coordinators register this one
        (root / "admin.token").write_text(token + "\n", encoding="utf-8")
        self.creds = Credentials(token=token)
        self.procs: list[_Proc] = []
        for n in nodes:
            data = yaml.safe_load(n.config.read_text(encoding="utf-8"))
            data.pop("clusters", None)  # no adapters in this benchmark
            if system == "coordinator":
                data["admin_token_file"] = str(root / "admin.token")
            n.config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            kind = "member" if system == "coordinator" else "bare"
            self.procs.append(_Proc(kind, n.node_id, n.config, root / f"{n.node_id}.log", n.api_address))
        self.cfg = load_config(nodes[0].config)

    def start(self) -> None:
        for p in self.procs:
            p.spawn()
        for p in self.procs:
            p.wait_started()

    def close(self) -> None:
        for p in self.procs:
            p.ask_quit()
        deadline = time.monotonic() + 10.0
        for p in self.procs:
            p.reap(deadline)

    # --- one normalized look at every member --------------------------------------------------------
    def look(self) -> list[dict[str, Any] | None]:
        """Per member: holder (valid lease / Raft leader), epoch (lease epoch / term), commit and
        applied index, peers_ok (both peers connected); None when down or unreachable."""
        if self.system == "coordinator":
            from controlplane.api.admin import fetch_status

            out: list[dict[str, Any] | None] = []
            for p in self.procs:
                if not p.alive:
                    out.append(None)
                    continue
                st = fetch_status([p.api_address], 1.0, self.creds)[0]
                if not st["reachable"]:
                    out.append(None)
                    continue
                lease = st["lease"]
                out.append({
                    "holder": lease["remaining_ms"] > 0 and lease["holder"] == st["node_id"],
                    "epoch": lease["epoch"], "remaining_ms": lease["remaining_ms"],
                    "commit": st["commit_index"], "applied": st["applied_index"],
                    "peers_ok": len(st["peers"]) == 2 and all(x["reachable"] for x in st["peers"]),
                })
            return out
        looks: list[dict[str, Any] | None] = []
        for p in self.procs:
            if not p.alive:
                looks.append(None)
                continue
            st = p.call("status", timeout_s=5.0)
            if not st.get("ok") or "leader" not in st:
                looks.append(None)
                continue
            looks.append({"holder": st["leader"], "epoch": st["term"], "commit": st["commit_index"],
                          "applied": st["applied_index"], "peers_ok": st["connected"] == 2})
        return looks

    def settle(self, restarted: _Proc | None = None, target: int = 0,
               timeout_s: float = SETTLE_TIMEOUT_S) -> tuple[int, int, int]:
        """Wait until all three are up and connected, ``restarted`` applied at least ``target``, and
        exactly one holder with an unchanged epoch over two looks >= STABLE_FOR_S apart. Returns
        (holder index, its epoch / term, its commit index)."""
        deadline = time.monotonic() + timeout_s
        seen: tuple[int, int] | None = None
        seen_at = 0.0
        looks: list[dict[str, Any] | None] = []
        while time.monotonic() < deadline:
            looks = self.look()
            ok = all(x is not None and x["peers_ok"] for x in looks)
            holders = [i for i, x in enumerate(looks) if x is not None and x["holder"]]
            if restarted is not None and ok:
                r = looks[self.procs.index(restarted)]
                ok = r is not None and r["applied"] >= target
            if ok and len(holders) == 1:
                h = holders[0]
                key = (h, int(looks[h]["epoch"]))  # type: ignore[index]
                now = time.monotonic()
                if seen == key and now - seen_at >= STABLE_FOR_S:
                    return h, key[1], int(looks[h]["commit"])  # type: ignore[index]
                if seen != key:
                    seen, seen_at = key, now
            else:
                seen = None
            time.sleep(0.05)
        raise BenchError(f"{self.system}: the group did not settle within {timeout_s:.0f}s: {looks}")

    # --- measurements -------------------------------------------------------------------------------
    def commits(self, n: int, advance: Callable[[int], None]) -> dict[str, Any]:
        h, _, _ = self.settle()
        holder = self.procs[h]
        if self.system == "coordinator":
            res = holder.call("setup")
            if not res.get("ok"):
                raise BenchError(f"setup commit failed on {holder.node_id}: {res}")
        warm = holder.call("seq", n=WARMUP_COMMITS)
        lat: list[float] = []
        errors = warm.get("error_count", 0)
        left = n
        while left > 0:
            k = min(COMMIT_CHUNK, left)
            res = holder.call("seq", n=k)
            lat += res.get("latencies_ms", [])
            errors += int(res.get("error_count", 0))
            if not res.get("ok"):
                if not lat and errors > n:
                    raise BenchError(f"{self.system}: commits keep failing on {holder.node_id}: {res}")
                holder = self.procs[self.settle()[0]]
            left -= k
            advance(k)
        burst = holder.call("burst", n=n, concurrency=BURST_CONCURRENCY)
        advance(n)
        stats = holder.call("stats")
        committed = int(burst.get("committed", 0))
        elapsed = float(burst.get("elapsed_s", 0.0)) or float("nan")
        return {
            "holder": holder.node_id,
            "latency_ms": summary(lat),
            "errors": errors,
            "throughput": {
                "commits": n, "committed": committed, "concurrency": BURST_CONCURRENCY,
                "elapsed_s": round(elapsed, 3), "commits_per_s": round(committed / elapsed, 1),
                "latency_ms": summary(burst.get("latencies_ms", [])), "errors": int(burst.get("error_count", 0)),
            },
            **{k: v for k, v in stats.items() if k not in ("ok", "id")},
        }

    def failover_trial(self, i: int, rng: random.Random, phase_max_s: float) -> dict[str, Any]:
        for _ in range(5):
            h, old, _ = self.settle()
            phase = rng.uniform(0.0, phase_max_s)
            time.sleep(phase)
            again = self.look()[h]
            if again is not None and again["holder"] and again["epoch"] == old:
                break
        else:
            raise BenchError(f"{self.system}: the holder kept changing before trial {i}")
        victim = self.procs[h]
        survivors = [p for p in self.procs if p is not victim]
        slots = [p.request("await", old=old, timeout_s=FAILOVER_TIMEOUT_S) for p in survivors]
        t_kill = victim.kill()
        record: dict[str, Any] = {"trial": i, "killed": victim.node_id, "old_epoch": old,
                                  "kill_phase_ms": round(phase * 1000.0, 1)}
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S + 5.0
        winner: tuple[_Proc, _Slot] | None = None
        while winner is None and time.monotonic() < deadline:
            done = [(p, s) for p, s in zip(survivors, slots) if s.event.is_set() and s.value.get("ok")]
            if done:
                winner = min(done, key=lambda ps: ps[1].t_recv)
            elif all(s.event.is_set() for s in slots):
                break
            else:
                time.sleep(0.002)
        for p, s in zip(survivors, slots):
            if winner is None or p is not winner[0]:
                p.request("cancel")
                s.event.wait(5.0)
        if winner is None:
            record.update(ok=False, error=[s.value for s in slots])
        else:
            p, s = winner
            v = s.value
            k = t_kill * 1000.0
            rel = (lambda t: None if t is None or t < k else round(t - k, 1))  # member clock, same CLOCK_MONOTONIC
            record.update(
                ok=True, failover_ms=round((s.t_recv - t_kill) * 1000.0, 1), new_holder=p.node_id,
                new_epoch=v["token"], retries=v.get("retries", 0),
                elected_ms=rel(v.get("t_leader_ms")), authority_ms=rel(v.get("t_authority_ms")),
                committed_ms=rel(v.get("t_committed_ms")),
                first_commit_ms=round(v["t_committed_ms"] - v["t_authority_ms"], 1),
            )
            if self.system == "coordinator":
                t_obs = v.get("acquire_t_obs_ms")
                record.update(acquire_allowed_ms=rel(v.get("acquire_allowed_ms")),
                              acquire_sent_ms=rel(v.get("acquire_sent_ms")),
                              # how old the lease version the new holder last saw was at the kill
                              # (negative: an entry of the old holder was applied after the kill)
                              last_renewal_age_ms=None if t_obs is None else round(k - t_obs, 1))
            record["confirmed"] = self._confirm(p, v)
            if v["t_authority_ms"] < k:
                record.update(ok=False, error="the new authority predates the kill (holder moved before it)")
        t_restart = time.monotonic()
        victim.spawn()
        victim.wait_started()
        target = max((x["commit"] for x in self.look() if x is not None), default=0)
        self.settle(restarted=victim, target=target)
        record["restart_and_catch_up_s"] = round(time.monotonic() - t_restart, 2)
        return record

    def _confirm(self, p: _Proc, v: dict[str, Any]) -> dict[str, Any]:
        """Read the new holder's status after the fact (Admin gRPC for coordinators)."""
        if self.system == "coordinator":
            from controlplane.api.admin import fetch_status

            st = fetch_status([p.api_address], 2.0, self.creds)[0]
            if not st["reachable"]:
                return {"ok": False, "error": st.get("error")}
            lease = st["lease"]
            ok = lease["remaining_ms"] > 0 and lease["epoch"] == v["token"] and st["commit_index"] >= v["commit_index"]
            return {"ok": ok, "via": "grpc Admin.Status", "lease_remaining_ms": lease["remaining_ms"],
                    "lease_epoch": lease["epoch"], "commit_index": st["commit_index"]}
        st = p.call("status", timeout_s=5.0)
        ok = bool(st.get("leader")) and st.get("term") == v["token"] and st.get("commit_index", 0) >= v["commit_index"]
        return {"ok": ok, "via": "control channel getStatus", "term": st.get("term"),
                "commit_index": st.get("commit_index")}


# --- statistics ------------------------------------------------------------------------------------


def nearest_rank(sorted_values: Sequence[float], p: float) -> float:
    """The p-th percentile by nearest rank (a measured value; with 20 trials p99 is the maximum)."""
    n = len(sorted_values)
    return sorted_values[max(1, math.ceil(p / 100.0 * n)) - 1]


def summary(values: Sequence[float]) -> dict[str, Any]:
    v = sorted(float(x) for x in values)
    if not v:
        return {"n": 0}
    r = (lambda x: round(x, 2))
    return {"n": len(v), "min": r(v[0]), "p50": r(nearest_rank(v, 50)), "p90": r(nearest_rank(v, 90)),
            "p99": r(nearest_rank(v, 99)), "max": r(v[-1]), "mean": r(statistics.fmean(v))}


def _ratio(a: Any, b: Any) -> float | None:
    try:
        return round(float(a) / float(b), 2) if float(b) > 0 else None
    except (TypeError, ValueError):
        return None


# --- the run -----------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    import pysyncobj.version

    return {
        "platform": platform.platform(), "cpu_model": model, "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": mem_gib, "python": platform.python_version(), "pysyncobj": pysyncobj.version.VERSION,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()], "data_dir_root": tempfile.gettempdir(),
    }


@contextmanager
def _progress(show: bool) -> Iterator[Callable[[str, int], None]]:
    """``advance(task_name, n)``; tasks are created on first use. Draws on stderr."""
    if not show:
        yield lambda name, n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    totals: dict[str, int] = {}
    started: set[str] = set()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), transient=False) as bar:
        ids: dict[str, Any] = {}

        def advance(name: str, n: int) -> None:
            if name not in ids:
                ids[name] = bar.add_task(name, total=totals.get(name))
            if name not in started:
                started.add(name)
                bar.start_task(ids[name])
            bar.advance(ids[name], n)

        def define(name: str, total: int) -> None:
            totals[name] = total
            ids[name] = bar.add_task(name, total=total, start=False)

        advance.define = define  # type: ignore[attr-defined]
        yield advance


def run_bench(trials: int, commits: int, out_dir: Path, *, show_progress: bool = True,
              command: str = "") -> dict[str, Any]:
    """Run everything, write ``out_dir``/bench-raft.{md,json,png}; return the result."""
    from controlplane.config import CoordinatorConfig

    started = time.monotonic()
    result: dict[str, Any] = {
        "benchmark": "raft", "command": command or f"controlplane bench raft --trials {trials} --commits {commits}",
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "params": {"trials": trials, "commits": commits, "batch_commands": BATCH_DEPLOYMENTS,
                   "batch_bytes": decision_batch_bytes(), "burst_concurrency": BURST_CONCURRENCY,
                   "warmup_commits": WARMUP_COMMITS, "kill_phase": "uniform(0, lease_renew_ms) after settling",
                   "kill_phase_seed": KILL_PHASE_SEED, "percentiles": "nearest rank",
                   "failover_end": "survivor's report received: valid lease with a newer epoch + one fenced "
                                   "decision batch committed (bare: leader in a newer term + one increment committed)",
                   "await_poll_ms": AWAIT_POLL_S * 1000.0},
    }
    rng = random.Random(KILL_PHASE_SEED)
    with tempfile.TemporaryDirectory(prefix="bench-raft-") as tmp, _progress(show_progress) as advance:
        define = getattr(advance, "define", None)
        if define is not None:
            for system in SYSTEMS:
                define(f"{system}: commits", 2 * commits)
                define(f"{system}: failover trials", trials)
        for system in SYSTEMS:
            group = _Group(system, Path(tmp) / system)
            cfg: CoordinatorConfig = group.cfg
            phase_max_s = cfg.lease_renew_ms / 1000.0
            try:
                group.start()
                part = group.commits(commits, lambda n, s=system: advance(f"{s}: commits", n))
                records = []
                for i in range(trials):
                    records.append(group.failover_trial(i, rng, phase_max_s))
                    advance(f"{system}: failover trials", 1)
            finally:
                group.close()
            ok = [r for r in records if r.get("ok")]
            part["failover_ms"] = {**summary([r["failover_ms"] for r in ok]), "failed": len(records) - len(ok),
                                   "values": [r.get("failover_ms") for r in records]}
            part["failover_breakdown_p50_ms"] = {
                key: summary([r[key] for r in ok if r.get(key) is not None]).get("p50")
                for key in ("last_renewal_age_ms", "elected_ms", "acquire_allowed_ms", "acquire_sent_ms", "authority_ms", "committed_ms",
                            "first_commit_ms") if any(key in r for r in ok)
            }
            part["trials"] = records
            result[system] = part
    result["config"] = {
        "coordinator": {k: v for k, v in cfg.model_dump(mode="json").items()
                        if k not in ("password", "password_file", "data_dir", "peers", "node_id", "zone",
                                     "raft_address", "api_address", "clusters", "raft_tls")},
        "bare": {k: v for k, v in bare_settings(cfg).items() if k not in ("bindAddress", "journalFile", "fullDumpFile")}
        | {"password": "set", "journalFile": "data_dir/bare.journal", "fullDumpFile": "data_dir/bare.dump",
           "autoTick": True, "fsync": "none (pysyncobj never fsyncs)", "commandsWaitLeader": True},
    }
    fields = CoordinatorConfig.model_fields
    result["config"]["coordinator_not_default"] = {
        name: value for name, value in result["config"]["coordinator"].items()
        if name in fields and not fields[name].is_required()
        and json.loads(json.dumps(fields[name].get_default(call_default_factory=True), default=str)) != value
    }  # e.g. CONTROLPLANE_FSYNC=none in the environment; empty for a default run
    from raft.lease import contender_may_acquire_at_ms

    wait_ms = contender_may_acquire_at_ms(0, cfg.lease_duration_ms, cfg.drift_rho, cfg.lease_margin_ms)
    co, ba = result["coordinator"], result["bare"]
    result["ratios"] = {
        "description": "coordinator / bare, measured in this run",
        "commit_p50": _ratio(co["latency_ms"].get("p50"), ba["latency_ms"].get("p50")),
        "commit_p99": _ratio(co["latency_ms"].get("p99"), ba["latency_ms"].get("p99")),
        "throughput": _ratio(co["throughput"]["commits_per_s"], ba["throughput"]["commits_per_s"]),
        **{f"failover_{p}": _ratio(co["failover_ms"].get(p), ba["failover_ms"].get(p))
           for p in ("p50", "p90", "p99", "max")},
    }
    p99 = co["failover_ms"].get("p99")
    result["verdict"] = {
        "target_failover_p99_ms": TARGET_FAILOVER_MS,
        "coordinator_failover_p99_ms": p99,
        "coordinator_failover_p99_under_target": p99 is not None and p99 < TARGET_FAILOVER_MS,
        "contender_lease_wait_ms": wait_ms,
        "expected_lease_failover_ms": [wait_ms - cfg.lease_renew_ms, wait_ms],
        "note": "a contender may acquire ceil(D*(1+rho))+margin after it last saw the lease change; the kill "
                "falls 0..lease_renew_ms after the last renewal, then one acquire commit and one decision commit",
    }
    result["duration_s"] = round(time.monotonic() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: str(out_dir / name) for name in FILES}
    result["files"] = {"markdown": paths["bench-raft.md"], "json": paths["bench-raft.json"],
                       "plot": paths["bench-raft.png"]}
    write_plot(result, Path(paths["bench-raft.png"]))
    Path(paths["bench-raft.md"]).write_text(render_markdown(result), encoding="utf-8")
    Path(paths["bench-raft.json"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


# --- reports -----------------------------------------------------------------------------------------


def _f(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        s = f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"
    else:
        s = f"{v:,}" if isinstance(v, int) else str(v)
    return s + unit


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    co, ba, ra = result["coordinator"], result["bare"], result["ratios"]
    rows = [
        ("commit latency p50 (ms)", _f(co["latency_ms"].get("p50")), _f(ba["latency_ms"].get("p50")), _f(ra["commit_p50"], "x")),
        ("commit latency p99 (ms)", _f(co["latency_ms"].get("p99")), _f(ba["latency_ms"].get("p99")), _f(ra["commit_p99"], "x")),
        ("commit latency max (ms)", _f(co["latency_ms"].get("max")), _f(ba["latency_ms"].get("max")), ""),
        (f"throughput, {BURST_CONCURRENCY} in flight (commits/s)", _f(co["throughput"]["commits_per_s"]),
         _f(ba["throughput"]["commits_per_s"]), _f(ra["throughput"], "x")),
    ]
    for p in ("p50", "p90", "p99", "max"):
        rows.append((f"failover {p} (ms)", _f(co["failover_ms"].get(p)), _f(ba["failover_ms"].get(p)),
                     _f(ra[f"failover_{p}"], "x")))
    rows.append(("failover min (ms)", _f(co["failover_ms"].get("min")), _f(ba["failover_ms"].get("min")), ""))
    rows.append(("failed trials", _f(co["failover_ms"]["failed"]), _f(ba["failover_ms"]["failed"]), ""))
    return rows


def render_markdown(result: dict[str, Any]) -> str:
    m, p, co, ba = result["machine"], result["params"], result["coordinator"], result["bare"]
    lines = [
        "# Raft benchmark: coordinator vs bare pysyncobj", "",
        f"`{result['command']}` — {result['started_at']}, {result['duration_s']} s", "",
        f"Machine: {m['cpu_model']}, {m['cpus_usable']} CPUs usable, {m['memory_gib']} GiB, {m['platform']}, "
        f"Python {m['python']}, pysyncobj {m['pysyncobj']}, load average at start {m['loadavg_at_start']}.", "",
        f"Coordinator: 3 `Coordinator` processes, default configuration (fsync `{result['config']['coordinator']['fsync']}`), "
        f"decision batch = {p['batch_commands']} SetDesired ({p['batch_bytes']} bytes encoded), fenced, through "
        f"RaftReplicator on the lease holder. Bare: SyncObj + @replicated counter, same Raft timeouts and "
        "connection settings, password, journal files, appendEntriesUseBatch False, no fsync.", "",
        f"{p['commits']} sequential commits after {p['warmup_commits']} warm-up; throughput = {p['commits']} commits "
        f"from {p['burst_concurrency']} threads; failover over {p['trials']} trials (SIGKILL of the holder/leader "
        f"-> {p['failover_end']}). Percentiles by nearest rank.", "",
    ]
    if result["config"]["coordinator_not_default"]:
        lines += [f"**Not the default configuration**: {result['config']['coordinator_not_default']} "
                  "(CONTROLPLANE_* environment overrides).", ""]
    lines += ["| metric | coordinator | bare pysyncobj | coordinator / bare |", "|---|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in summary_rows(result)]
    lines += ["", "Failover breakdown, medians (ms after the kill; member-side CLOCK_MONOTONIC):", "",
              "| phase | coordinator | bare |", "|---|---:|---:|"]
    names = {"last_renewal_age_ms": "age of the last lease change the new holder saw, at the kill",
             "elected_ms": "new Raft leader seen", "acquire_allowed_ms": "lease acquire allowed",
             "acquire_sent_ms": "lease acquire sent", "authority_ms": "valid lease (bare: leader) seen",
             "committed_ms": "first decision committed", "first_commit_ms": "first commit itself (duration)"}
    for key, label in names.items():
        a = co["failover_breakdown_p50_ms"].get(key)
        b = ba["failover_breakdown_p50_ms"].get(key)
        lines.append(f"| {label} | {_f(a)} | {_f(b)} |")
    v = result["verdict"]
    lines += ["", f"Contender lease wait ceil(D*(1+rho))+margin = {v['contender_lease_wait_ms']} ms; "
              f"coordinator failover p99 {_f(v['coordinator_failover_p99_ms'])} ms is "
              f"{'under' if v['coordinator_failover_p99_under_target'] else 'NOT under'} {v['target_failover_p99_ms']} ms.",
              "", "Per trial (ms):", "", "| trial | coordinator | bare |", "|---:|---:|---:|"]
    cv, bv = co["failover_ms"]["values"], ba["failover_ms"]["values"]
    for i in range(max(len(cv), len(bv))):
        lines.append(f"| {i + 1} | {_f(cv[i] if i < len(cv) else None)} | {_f(bv[i] if i < len(bv) else None)} |")
    lines += ["", f"Plot: `{Path(result['files']['plot']).name}`.", ""]
    return "\n".join(lines)


def write_plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    data = {s: sorted(x for x in result[s]["failover_ms"]["values"] if x is not None) for s in SYSTEMS}
    colors = {"coordinator": "tab:blue", "bare": "tab:orange"}
    labels = {"coordinator": "coordinator (lease + fenced commit)", "bare": "bare pysyncobj (leader + commit)"}
    jitter = random.Random(0)
    for k, s in enumerate(SYSTEMS):
        vals = data[s]
        if vals:
            ax1.boxplot([vals], positions=[k], widths=0.5, showfliers=False)
            ax1.scatter([k + jitter.uniform(-0.15, 0.15) for _ in vals], vals, s=14, color=colors[s], alpha=0.8, zorder=3)
            ys = [(i + 1) / len(vals) for i in range(len(vals))]
            ax2.step(vals, ys, where="post", color=colors[s], label=labels[s])
    ax1.set_xticks(range(len(SYSTEMS)), [s for s in SYSTEMS])
    for ax in (ax1, ax2):
        target = result["verdict"]["target_failover_p99_ms"]
        wait = result["verdict"]["contender_lease_wait_ms"]
        (ax.axhline if ax is ax1 else ax.axvline)(target, color="red", ls="--", lw=1, label=f"{target} ms target")
        (ax.axhline if ax is ax1 else ax.axvline)(wait, color="gray", ls=":", lw=1, label=f"lease wait {wait} ms")
    ax1.set_ylabel("failover (ms, SIGKILL -> committed under new authority)")
    ax1.set_title(f"failover per trial (n={result['params']['trials']})")
    ax2.set_xlabel("failover (ms)")
    ax2.set_ylabel("fraction of trials")
    ax2.set_title("empirical CDF")
    handles, names = ax2.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Raft: coordinator vs bare pysyncobj ({result['params']['trials']} failover trials, "
                        f"{result['params']['commits']} commits)")
    for col in ("metric", "coordinator", "bare pysyncobj", "coordinator / bare"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for row in summary_rows(result):
        table.add_row(*row)
    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(table)
    console.print(f"written: {result['files']['markdown']}, {result['files']['json']}, {result['files']['plot']}")


def run_cli(trials: int, commits: int, out: str, as_json: bool, command: str = "") -> int:
    """``controlplane bench raft``: 0 when every trial produced a measurement, 1 otherwise."""
    from controlplane.domain.errors import ControlPlaneError

    if not 1 <= trials <= 1000:
        raise ControlPlaneError(f"--trials: must be between 1 and 1000, got {trials}")
    if not 1 <= commits <= 100_000:
        raise ControlPlaneError(f"--commits: must be between 1 and 100000, got {commits}")
    command = command or (f"controlplane bench raft --trials {trials} --commits {commits} --out {out}"
                          + (" --json" if as_json else ""))
    try:
        result = run_bench(trials, commits, Path(out), show_progress=True, command=command)
    except BenchError as exc:
        print(f"controlplane: error: bench raft: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    failed = result["coordinator"]["failover_ms"]["failed"] + result["bare"]["failover_ms"]["failed"]
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("member", "bare"):
        sys.exit(member_main(sys.argv[1], sys.argv[2]))
    print("usage: python -m controlplane.bench.raft member|bare CONFIG (started by `controlplane bench raft`)",
          file=sys.stderr)
    sys.exit(2)
