"""``controlplane bench soak``: a long run of the real processes under a steady workload and periodic
faults, sampling what must stay bounded: memory, file descriptors, Raft journal and snapshot size.

What runs (all on 127.0.0.1, every child stopped in ``finally``, and killed by the kernel if this
process dies: ``PR_SET_PDEATHSIG``):

* three coordinators (``controlplane coordinator``) planned by :func:`controlplane.cli.up.plan_group`
  with the local security of ``controlplane up`` (TLS API, admin and adapter tokens, Raft password),
  every timing and the log compaction settings at their defaults;
* three simulated adapters (``controlplane adapter``), one per zone, each offering a steady repeating
  load to one deployment: :data:`CALM_RPS` requests/s with a burst to :data:`BURST_RPS` for
  :data:`BURST_S` every :data:`CYCLE_S` (so the group scales out and back all the time);
* an API writer in this process: every ``write_every_s`` an ``UpdateTenant`` (TLS, admin token) on a
  tenant of its own, so the Raft log grows steadily besides the control loop's own commits.

Faults, every ``fault_every_s``, alternating: *leader* (kill -9 of the Raft leader) and *follower*
(kill -9 of a follower); the killed coordinator is restarted from its data dir after
:data:`DOWN_S`. One coordinator, the *anchor* (``coord-a``), is never killed, so that one
coordinator's memory and descriptors are a series over the whole run: when the anchor is the
leader at a *leader* fault it is paused instead (SIGSTOP for :data:`PAUSE_S`, then SIGCONT), which
costs it the leadership just the same.

Samples, every ``sample_s``: per process (by name and pid) resident memory (``VmRSS``) and open file
descriptors (``/proc/PID/fd``); per coordinator data dir the journal file size on disk (pysyncobj
maps it and only ever grows the file: its high-water mark), the journal's logical size (the last
record offset in its header: what the log holds now), its ``.meta`` and the snapshot size; the
leader's commit index.

Verdict (``verdict`` in the JSON): over the processes that lived through the whole run (adapters,
the anchor), memory is bounded when the growth over the second half of the run, from a linear fit,
is at most :data:`MEM_GROWTH_MIB` or :data:`MEM_GROWTH_FRACTION` of the process's RSS, whichever
is larger; descriptors when the second half's maximum is at most the first half's plus
:data:`FD_SLACK`. A member's journal is bounded when its logical size in the second half stays at
most :data:`JOURNAL_FACTOR` x the largest any member reached in the first half (at least
:data:`JOURNAL_MIN_BYTES`; every member holds the same log), it never holds more entries than the
compaction trigger allows (``log_compaction_min_entries``, plus what arrives while a snapshot is
written), and compaction was seen (the logical size dropped, or the snapshot was rewritten); a run
shorter than the compaction period says ``inconclusive`` for the journal.

Output: ``--out`` (default ``out/soak``)/soak.json, report.md and soak.png; ``--json`` prints the
result on stdout; progress lines on stderr.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from controlplane.procfs import open_fds, rss_kib

CALM_RPS, BURST_RPS = 3.0, 30.0
BURST_S, CYCLE_S = 30, 90
DOWN_S = 5.0
"""How long a killed coordinator stays down before it is restarted."""
PAUSE_S = 3.0
"""How long the anchor is stopped when it is the leader at a leader fault."""
DEFAULT_FAULT_EVERY_S = 300.0
DEFAULT_WRITE_EVERY_S = 2.0
START_TIMEOUT_S = 90.0
MEM_GROWTH_MIB = 16.0
MEM_GROWTH_FRACTION = 0.10
FD_SLACK = 8
JOURNAL_FACTOR = 1.5
JOURNAL_MIN_BYTES = 1 << 20
ENTRIES_FACTOR, ENTRIES_SLACK = 1.2, 1_000
"""A log may exceed the entry trigger by what arrives while the snapshot is written."""
TENANT, WRITER_TENANT = "soak", "soak-writer"
MODEL = "llama3-8b-h100"
ANCHOR = "coord-a"
FILES = ("soak.json", "report.md", "soak.png")
SCHEMA = 1
CHILD_EXE = [sys.executable, "-m", "controlplane.cli.main"]
_PR_SET_PDEATHSIG = 1


class SoakError(Exception):
    """The soak could not run (a process did not start, no leader was elected...)."""


# --- sampling (pure reads of /proc and the data dirs) ---------------------------------------------


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _scan_journal(path: Path):  # noqa: ANN202 (raft.journal.Loaded | None)
    from raft.journal import JournalError, scan

    try:
        return scan(path, path.read_bytes(), None)  # a live file: a partial last record is tolerated
    except (OSError, JournalError):
        return None


def journal_logical_bytes(path: Path) -> int:
    """The journal's used bytes: the end of its last complete record (0 when unreadable)."""
    loaded = _scan_journal(path)
    return 0 if loaded is None else loaded.end


def journal_entries(path: Path, limit: int = 1_000_000) -> int:
    """Entries in the journal file (``raft/journal.py`` format; 0 when unreadable)."""
    loaded = _scan_journal(path)
    return 0 if loaded is None else min(limit, len(loaded.entries))


def data_dir_sample(data_dir: Path) -> dict[str, int]:
    from raft.node import JOURNAL_FILE, SNAPSHOT_FILE

    journal = data_dir / JOURNAL_FILE
    snapshot = data_dir / SNAPSHOT_FILE
    try:
        snap_mtime_ns = snapshot.stat().st_mtime_ns
    except OSError:
        snap_mtime_ns = 0
    return {
        "journal_bytes": _size(journal),
        "journal_logical_bytes": journal_logical_bytes(journal),
        "journal_entries": journal_entries(journal),
        "meta_bytes": _size(Path(str(journal) + ".meta")),
        "snapshot_bytes": _size(snapshot),
        "snapshot_mtime_ns": snap_mtime_ns,
    }


# --- verdict (pure) --------------------------------------------------------------------------------------


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(x, y)`` points (0 with fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def memory_verdict(series: list[tuple[float, float]], duration_s: float) -> dict[str, Any]:
    """``series``: (t_s, rss_kib) of one process over the run."""
    half = duration_s / 2
    first = [p for p in series if p[0] < half]
    second = [p for p in series if p[0] >= half]
    if len(second) < 2 or not first:
        return {"bounded": None, "reason": "too few samples"}
    s1, s2 = slope(first), slope(second)
    median = sorted(y for _, y in second)[len(second) // 2]
    growth_mib = s2 * (duration_s - half) / 1024.0
    allowed = max(MEM_GROWTH_MIB, MEM_GROWTH_FRACTION * median / 1024.0)
    return {
        "bounded": growth_mib <= allowed,
        "rss_start_mib": round(series[0][1] / 1024.0, 1), "rss_end_mib": round(series[-1][1] / 1024.0, 1),
        "rss_max_mib": round(max(y for _, y in series) / 1024.0, 1),
        "slope_first_half_mib_per_h": round(s1 * 3600 / 1024.0, 2),
        "slope_second_half_mib_per_h": round(s2 * 3600 / 1024.0, 2),
        "second_half_growth_mib": round(growth_mib, 2), "allowed_growth_mib": round(allowed, 2),
    }


def fd_verdict(series: list[tuple[float, float]], duration_s: float) -> dict[str, Any]:
    half = duration_s / 2
    first = [y for t, y in series if t < half]
    second = [y for t, y in series if t >= half]
    if not first or not second:
        return {"bounded": None, "reason": "too few samples"}
    return {"bounded": max(second) <= max(first) + FD_SLACK, "fds_first_half_max": int(max(first)),
            "fds_second_half_max": int(max(second)), "fds_end": int(series[-1][1])}


def journal_verdict(series: list[dict[str, Any]], duration_s: float, compaction_period_s: float,
                    group_first_half_max: int, compaction_entries: int) -> dict[str, Any]:
    """``series``: the data-dir samples of one node (``t_s`` + :func:`data_dir_sample`).

    Every member holds the same log, so the reference is the largest log any member held in the
    first half: a member killed and restarted more often than ``log_compaction_min_time`` never
    reaches its time trigger (the timer restarts with the process) and compacts on the entry
    trigger instead, so its log peaks higher than a member that compacts every period; that is the
    bound, not growth."""
    half = duration_s / 2
    first = [s["journal_logical_bytes"] for s in series if s["t_s"] < half]
    second = [s["journal_logical_bytes"] for s in series if s["t_s"] >= half]
    drops = sum(1 for a, b in zip(series, series[1:]) if b["journal_logical_bytes"] < a["journal_logical_bytes"])
    rewrites = len({s["snapshot_mtime_ns"] for s in series if s["snapshot_mtime_ns"]})
    entries = [s["journal_entries"] for s in series if "journal_entries" in s]
    out: dict[str, Any] = {
        "journal_logical_max_bytes": max((s["journal_logical_bytes"] for s in series), default=0),
        "journal_file_max_bytes": max((s["journal_bytes"] for s in series), default=0),
        "journal_max_entries": max(entries) if entries else None,
        "snapshot_max_bytes": max((s["snapshot_bytes"] for s in series), default=0),
        "snapshot_end_bytes": series[-1]["snapshot_bytes"] if series else 0,
        "compactions_seen": max(drops, rewrites - 1, 0),
    }
    if not first or not second:
        return {**out, "bounded": None, "reason": "too few samples"}
    limit = max(JOURNAL_FACTOR * group_first_half_max, JOURNAL_MIN_BYTES)
    out.update(first_half_max_bytes=max(first), second_half_max_bytes=max(second), limit_bytes=int(limit))
    if max(second) > limit:
        return {**out, "bounded": False, "reason": "the log grew past the limit"}
    if entries and max(entries) > ENTRIES_FACTOR * compaction_entries + ENTRIES_SLACK:
        return {**out, "bounded": False, "reason": f"more than {compaction_entries} entries (the compaction trigger)"}
    if out["compactions_seen"] == 0:
        if duration_s < compaction_period_s:
            return {**out, "bounded": None, "reason": f"run shorter than the compaction period ({compaction_period_s:.0f} s)"}
        return {**out, "bounded": False, "reason": "no compaction seen"}
    return {**out, "bounded": True}


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    duration = result["duration_s"]
    samples = result["samples"]
    long_lived = result["long_lived"]
    per_proc: dict[str, dict[str, Any]] = {}
    for name in long_lived:
        pid = result["processes"][name]["pids"][0]
        mem = [(s["t_s"], s["procs"][name]["rss_kib"]) for s in samples
               if name in s["procs"] and s["procs"][name]["pid"] == pid and s["procs"][name]["rss_kib"] is not None]
        fds = [(s["t_s"], s["procs"][name]["fds"]) for s in samples
               if name in s["procs"] and s["procs"][name]["pid"] == pid and s["procs"][name]["fds"] is not None]
        per_proc[name] = {"memory": memory_verdict(mem, duration), "fds": fd_verdict(fds, duration)}
    series = {node: [{"t_s": s["t_s"], **s["data"][node]} for s in samples if node in s["data"]] for node in result["nodes"]}
    group_first = max((d["journal_logical_bytes"] for ss in series.values() for d in ss if d["t_s"] < duration / 2),
                      default=0)
    journals = {node: journal_verdict(ss, duration, result["config"]["log_compaction_min_time_s"], group_first,
                                      result["config"]["log_compaction_min_entries"])
                for node, ss in series.items()}

    def all_of(values: list[bool | None]) -> bool | None:
        if any(v is False for v in values):
            return False
        return None if any(v is None for v in values) else True

    return {
        "memory_bounded": all_of([p["memory"]["bounded"] for p in per_proc.values()]),
        "fds_bounded": all_of([p["fds"]["bounded"] for p in per_proc.values()]),
        "journal_bounded": all_of([j["bounded"] for j in journals.values()]),
        "processes": per_proc, "journals": journals,
    }


# --- the processes ---------------------------------------------------------------------------------------


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # noqa: BLE001  (not Linux: children are still stopped in ``finally``)
        pass


@dataclass
class Child:
    name: str
    kind: str
    config: Path
    log: Path
    proc: subprocess.Popen | None = None
    pids: list[int] = field(default_factory=list)

    def start(self) -> None:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(CHILD_EXE + [self.kind, "--config", str(self.config)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                         preexec_fn=_pdeathsig)
        self.pids.append(self.proc.pid)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def load_schedule(duration_s: float) -> list[dict[str, float]]:
    steps: list[dict[str, float]] = [{"at_s": 0, "rps": CALM_RPS}]
    k = 0
    while k * CYCLE_S < duration_s + 120:
        steps.append({"at_s": 20 + k * CYCLE_S, "rps": BURST_RPS})
        steps.append({"at_s": 20 + BURST_S + k * CYCLE_S, "rps": CALM_RPS})
        k += 1
    return steps


def write_group(root: Path, duration_s: float) -> tuple[list[Any], list[dict], Any, list[Path]]:
    from controlplane.cli.up import make_local_security, plan_group, write_private

    security = make_local_security(root)
    nodes, adapters = plan_group(3, root, security=security)
    tenant = {"id": TENANT, "priority": 100, "quota": {"h100": 8 * len(adapters)}}
    deployment = {"id": "chat", "tenant": TENANT, "engine": "vllm", "model": MODEL, "pool": "h100",
                  "min_replicas": len(adapters), "max_replicas": 4 * len(adapters), "warm_pool": 0,
                  "policy": {"stable_window_ms": 6_000, "ewma_half_life_ms": 1_000, "panic_window_ms": 2_000,
                             "panic_hold_ms": 3_000, "scale_down_stabilization_ms": 4_000,
                             "scale_down_cooldown_ms": 1_000, "max_step_down": 4}}
    for node in nodes:
        cfg = yaml.safe_load(node.config.read_text(encoding="utf-8"))
        cfg["tenants"] = [tenant, {"id": WRITER_TENANT, "priority": 1, "quota": {"h100": 0}}]
        cfg["deployments"] = [deployment]
        write_private(node.config, yaml.safe_dump(cfg, sort_keys=False))
    configs = []
    for i, a in enumerate(adapters):
        path = root / f"{a['id']}.adapter.yaml"
        load = {"deployment": "chat", "model": MODEL, "cold_start_ms": 3_000, "warm_start_ms": 500,
                "load": load_schedule(duration_s)}
        cfg = {"cluster_id": a["id"], "listen": a["adapter_address"], "state_dir": str(root / "adapters"),
               "nvml": False, **security.adapter_fields(), "backend": "simulated",
               "simulated": {"seed": i + 1, "deployments": [load], "default": {**load, "deployment": "*"}}}
        path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        configs.append(path)
    return nodes, adapters, security, configs


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise SoakError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# --- the run -------------------------------------------------------------------------------------------------


@dataclass
class Run:
    root: Path
    coordinators: dict[str, Child]
    adapters: dict[str, Child]
    data_dirs: dict[str, Path]
    endpoints: list[str]
    creds: Any
    t0: float = 0.0
    down_s: float = DOWN_S
    pause_s: float = PAUSE_S
    faults: list[dict[str, Any]] = field(default_factory=list)
    writes: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0})

    def now(self) -> float:
        return time.monotonic() - self.t0

    def status(self) -> list[dict[str, Any]]:
        from controlplane.api.admin import fetch_status

        return fetch_status(self.endpoints, 2.0, self.creds)

    def leader(self) -> tuple[str | None, int]:
        for n in self.status():
            if n.get("reachable") and n.get("role") == "leader":
                return str(n["node_id"]), int(n.get("commit_index") or 0)
        return None, 0

    def sample(self) -> dict[str, Any]:
        procs = {}
        for name, ch in {**self.coordinators, **self.adapters}.items():
            pid = ch.pid
            procs[name] = {"pid": pid, "rss_kib": rss_kib(pid) if pid else None, "fds": open_fds(pid) if pid else None}
        leader, commit = self.leader()
        return {"t_s": round(self.now(), 2), "procs": procs, "leader": leader, "commit_index": commit,
                "data": {n: data_dir_sample(d) for n, d in self.data_dirs.items()}}


def _progress(msg: str) -> None:
    print(f"soak: {datetime.now(UTC).strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def fault(run: Run, k: int) -> dict[str, Any]:
    """Fault number ``k``: even = the leader, odd = a follower (never the anchor: it is paused instead)."""
    leader, _ = run.leader()
    kind = "leader" if k % 2 == 0 else "follower"
    rec: dict[str, Any] = {"t_s": round(run.now(), 2), "kind": kind, "leader_before": leader}
    if kind == "leader" and leader == ANCHOR:
        pid = run.coordinators[ANCHOR].pid
        if pid:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(run.pause_s)
            os.kill(pid, signal.SIGCONT)
        rec.update(action="sigstop", target=ANCHOR, down_s=run.pause_s)
        return rec
    if kind == "leader" and leader is not None:
        target = leader
    else:
        followers = sorted(n for n in run.coordinators if n not in (leader, ANCHOR))
        target = followers[k // 2 % len(followers)]
    ch = run.coordinators[target]
    ch.kill9()
    time.sleep(run.down_s)
    ch.start()
    rec.update(action="kill -9 + restart", target=target, down_s=run.down_s)
    return rec


def write_once(run: Run, client: Any, k: int) -> None:
    from controlplane.api.client import ApiError, Unreachable
    from controlplane.api.v1 import api_pb2

    tenant = api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name=WRITER_TENANT),
                            spec=api_pb2.TenantSpec(priority=1 + k % 5))
    try:
        client.call("Tenants", "UpdateTenant", api_pb2.UpdateTenantRequest(tenant=tenant), timeout_s=5.0)
        run.writes["ok"] += 1
    except (ApiError, Unreachable):
        run.writes["failed"] += 1


def run_soak(minutes: float, out_dir: Path, *, sample_s: float | None = None, fault_every_s: float | None = None,
             write_every_s: float = DEFAULT_WRITE_EVERY_S, root: Path | None = None, down_s: float = DOWN_S,
             pause_s: float = PAUSE_S) -> dict[str, Any]:
    from controlplane.api.admin import Credentials
    from controlplane.api.client import ApiClient
    from controlplane.config import CoordinatorConfig

    if minutes <= 0:
        raise SoakError(f"--minutes: must be > 0, got {minutes}")
    duration = minutes * 60.0
    sample_s = sample_s or (10.0 if duration >= 600 else max(1.0, duration / 30))
    fault_every_s = fault_every_s or (DEFAULT_FAULT_EVERY_S if duration >= 1200 else max(down_s * 2, duration / 2.5))
    base = root or Path(tempfile.mkdtemp(prefix="controlplane-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    nodes, adapters, security, adapter_cfgs = write_group(base, duration)
    run = Run(base, {n.node_id: Child(n.node_id, "coordinator", n.config, base / f"{n.node_id}.log") for n in nodes},
              {a["id"]: Child(a["id"], "adapter", c, base / f"{a['id']}.log") for a, c in zip(adapters, adapter_cfgs)},
              {n.node_id: base / n.node_id for n in nodes}, [n.api_address for n in nodes],
              Credentials(token=security.admin_token, ca_file=str(security.ca_file)), down_s=down_s, pause_s=pause_s)
    defaults = CoordinatorConfig.model_fields
    config = {"minutes": minutes, "sample_s": sample_s, "fault_every_s": fault_every_s, "write_every_s": write_every_s,
              "down_s": down_s, "pause_s": pause_s, "calm_rps": CALM_RPS, "burst_rps": BURST_RPS, "burst_s": BURST_S,
              "cycle_s": CYCLE_S, "log_compaction_min_entries": defaults["log_compaction_min_entries"].default,
              "log_compaction_min_time_s": defaults["log_compaction_min_time_ms"].default / 1000.0}
    samples: list[dict[str, Any]] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stopping = {"flag": False}

    def on_signal(*_a: object) -> None:
        stopping["flag"] = True

    for s in previous:
        signal.signal(s, on_signal)
    client = ApiClient(run.endpoints, token=security.admin_token, ca_file=str(security.ca_file))
    started = datetime.now(UTC)
    try:
        for ch in run.adapters.values():
            ch.start()
        for a in adapters:
            _wait(lambda a=a: _listening(a["adapter_address"]), START_TIMEOUT_S, f"adapter {a['id']} to listen")
        for ch in run.coordinators.values():
            ch.start()
        _wait(lambda: run.leader()[0] is not None, START_TIMEOUT_S, "a Raft leader")
        _progress(f"group up in {base}; {minutes:g} min, sample every {sample_s:g} s, fault every {fault_every_s:g} s")
        run.t0 = time.monotonic()
        next_sample, next_fault, next_write, k_fault, k_write = 0.0, fault_every_s, 0.0, 0, 0
        while run.now() < duration and not stopping["flag"]:
            t = run.now()
            if t >= next_sample:
                samples.append(run.sample())
                next_sample += sample_s
                if len(samples) % max(1, int(60 / sample_s)) == 0:
                    _progress(_line(samples[-1]))
            if t >= next_write:
                write_once(run, client, k_write)
                k_write += 1
                next_write += write_every_s
            if t >= next_fault:
                rec = fault(run, k_fault)
                run.faults.append(rec)
                _progress(f"fault {k_fault + 1}: {rec['action']} {rec['target']} (leader was {rec['leader_before']})")
                k_fault += 1
                next_fault += fault_every_s
            time.sleep(max(0.0, min(next_sample, next_write, next_fault, duration) - run.now()))
        samples.append(run.sample())
    finally:
        client.close()
        for ch in [*run.coordinators.values(), *run.adapters.values()]:
            ch.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    result: dict[str, Any] = {
        "schema": SCHEMA, "started": started.isoformat(), "duration_s": round(samples[-1]["t_s"], 2) if samples else 0.0,
        "interrupted": stopping["flag"], "dir": str(base), "config": config, "nodes": sorted(run.coordinators),
        "anchor": ANCHOR, "long_lived": [ANCHOR, *sorted(run.adapters)],
        "processes": {n: {"kind": ch.kind, "pids": ch.pids} for n, ch in {**run.coordinators, **run.adapters}.items()},
        "faults": run.faults, "writes": run.writes, "samples": samples,
    }
    result["verdict"] = verdict(result)
    write_outputs(result, out_dir)
    return result


def _line(s: dict[str, Any]) -> str:
    rss = sum((p["rss_kib"] or 0) for p in s["procs"].values()) / 1024.0
    journal = sum(d["journal_logical_bytes"] for d in s["data"].values()) / 1024.0
    return f"t={s['t_s']:.0f}s leader={s['leader']} commit={s['commit_index']} rss(all)={rss:.0f} MiB journal(all)={journal:.0f} KiB"


# --- report ----------------------------------------------------------------------------------------------------


def _word(v: bool | None) -> str:
    return {True: "bounded", False: "GROWING", None: "inconclusive"}[v]


def render_markdown(r: dict[str, Any]) -> str:
    v = r["verdict"]
    c = r["config"]
    lines = [
        "# Soak", "",
        f"{r['duration_s'] / 60:.1f} min (asked {c['minutes']:g}) of 3 coordinators + 3 simulated adapters on 127.0.0.1, "
        f"started {r['started']}; {len(r['samples'])} samples every {c['sample_s']:g} s; {len(r['faults'])} faults "
        f"(every {c['fault_every_s']:g} s, leader and follower in turn); {r['writes']['ok']} API writes "
        f"({r['writes']['failed']} failed) every {c['write_every_s']:g} s; load {c['calm_rps']:g} req/s per zone with "
        f"a {c['burst_rps']:g} req/s burst of {c['burst_s']} s every {c['cycle_s']} s. Log compaction: "
        f"{c['log_compaction_min_entries']} entries or {c['log_compaction_min_time_s']:.0f} s (defaults).", "",
        f"* memory: **{_word(v['memory_bounded'])}**", f"* file descriptors: **{_word(v['fds_bounded'])}**",
        f"* journal: **{_word(v['journal_bounded'])}**", "",
        "| process | RSS start / end / max MiB | slope 1st half / 2nd half MiB/h | 2nd-half growth (allowed) MiB | fds 1st / 2nd half max | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for name, p in v["processes"].items():
        m, f = p["memory"], p["fds"]
        if m.get("bounded") is None:
            lines.append(f"| {name} | - | - | - | - | {m.get('reason')} |")
            continue
        lines.append(f"| {name} | {m['rss_start_mib']} / {m['rss_end_mib']} / {m['rss_max_mib']} | "
                     f"{m['slope_first_half_mib_per_h']} / {m['slope_second_half_mib_per_h']} | "
                     f"{m['second_half_growth_mib']} ({m['allowed_growth_mib']}) | "
                     f"{f.get('fds_first_half_max', '-')} / {f.get('fds_second_half_max', '-')} | "
                     f"{_word(m['bounded'])} / {_word(f['bounded'])} |")
    lines += ["", "| node | journal logical max KiB (1st / 2nd half) | max entries | journal file max KiB | snapshot max / end KiB | compactions seen | verdict |",
              "|---|---|---|---|---|---|---|"]
    for node, j in v["journals"].items():
        halves = (f"{j.get('first_half_max_bytes', 0) / 1024:.0f} / {j.get('second_half_max_bytes', 0) / 1024:.0f}"
                  if "first_half_max_bytes" in j else "-")
        entries = "-" if j.get("journal_max_entries") is None else str(j["journal_max_entries"])
        lines.append(f"| {node} | {j['journal_logical_max_bytes'] / 1024:.0f} ({halves}) | {entries} | {j['journal_file_max_bytes'] / 1024:.0f} | "
                     f"{j['snapshot_max_bytes'] / 1024:.0f} / {j['snapshot_end_bytes'] / 1024:.0f} | {j['compactions_seen']} | "
                     f"{_word(j['bounded'])}{'' if j.get('reason') is None else ' (' + j['reason'] + ')'} |")
    lines += ["", "Faults:", ""]
    lines += [f"* {f['t_s']:.0f} s: {f['kind']}: {f['action']} {f['target']} (leader before: {f['leader_before']})"
              for f in r["faults"]] or ["* none"]
    lines += ["", "Plot: soak.png (RSS and descriptors per process, journal and snapshot per node; faults as lines).", ""]
    return "\n".join(lines)


def write_plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    samples = r["samples"]
    names = sorted({n for s in samples for n in s["procs"]})
    for name in names:
        pts = [(s["t_s"] / 60, s["procs"][name]) for s in samples if name in s["procs"]]
        axes[0].plot([t for t, p in pts], [(p["rss_kib"] or float("nan")) / 1024 for _, p in pts], label=name)
        axes[1].plot([t for t, p in pts], [p["fds"] if p["fds"] is not None else float("nan") for _, p in pts], label=name)
    for node in r["nodes"]:
        ts = [s["t_s"] / 60 for s in samples]
        axes[2].plot(ts, [s["data"][node]["journal_logical_bytes"] / 1024 for s in samples], label=f"{node} journal (used)")
        axes[2].plot(ts, [s["data"][node]["snapshot_bytes"] / 1024 for s in samples], "--", label=f"{node} snapshot")
    axes[0].set_ylabel("RSS MiB")
    axes[1].set_ylabel("open fds")
    axes[2].set_ylabel("KiB")
    axes[2].set_xlabel("minutes")
    for ax in axes:
        for f in r["faults"]:
            ax.axvline(f["t_s"] / 60, color="grey", alpha=0.3, linewidth=1)
        ax.legend(fontsize=7, ncol=3)
        ax.grid(alpha=0.3)
    axes[0].set_title("soak: memory, descriptors, journal and snapshot (grey lines: faults)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_outputs(r: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_text(json.dumps(r, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (out_dir / "report.md").write_text(render_markdown(r), encoding="utf-8")
    write_plot(r, out_dir / "soak.png")


def run_cli(minutes: float, out: str, as_json: bool, *, sample_s: float | None = None,
            fault_every_s: float | None = None) -> int:
    from controlplane.domain.errors import ControlPlaneError

    for flag, value in (("--sample-s", sample_s), ("--fault-every-s", fault_every_s)):
        if value is not None and value <= 0:
            raise ControlPlaneError(f"{flag}: must be > 0, got {value}")
    if minutes <= 0:
        raise ControlPlaneError(f"--minutes: must be > 0, got {minutes}")
    try:
        result = run_soak(minutes, Path(out), sample_s=sample_s, fault_every_s=fault_every_s)
    except SoakError as exc:
        raise ControlPlaneError(f"bench soak: {exc}") from None
    if as_json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(render_markdown(result))
        print(f"written: {', '.join(str(Path(out) / f) for f in FILES)}")
    v = result["verdict"]
    return 1 if False in (v["memory_bounded"], v["fds_bounded"], v["journal_bounded"]) else 0
