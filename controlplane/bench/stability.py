"""``controlplane bench stability``: does leadership stay put on a busy machine with no fault?

Starts a fresh 3-member group on 127.0.0.1 (``controlplane/bench/stability_node.py`` processes, the
production timing defaults unless ``--set field=value``), optionally beside ``--cpu N`` CPU burners
and a ``--disk`` writer (``controlplane/bench/load.py``: bounded in size and time, started and
stopped here), lets it run ``--seconds`` and reports, as JSON:

* ``leader_changes``: leader elections after the first (a new term with a leader, from every
  member's record merged), ``holder_changes``: lease epochs after the first, ``final_term``;
* ``first_leader_s`` / ``first_holder_s``: from the moment every member's RaftNode had started (and
  ``..._from_spawn_s``: from the first process spawn, interpreter start-up included);
* ``startup``: every member's start-up marks from the first spawn and the first holder from the
  spawn, from the first and the last Raft start (:func:`startup_summary`; ``--fresh-starts N`` runs
  N short trials of it, ``controlplane/bench/fresh_start.py``);
* ``mode``: what a member runs (the RaftNode + LeaseGuard stand-in, or the whole coordinator), and
  ``bytecode``: whether the members read byte-compiled modules (:func:`prepare_bytecode`);
* per member: tick gaps (p50/p99/max and counts over 50..2000 ms), GC pauses, fsync count/mean/max,
  every election it started with the time since it last heard the leader and the tick gap around it;
* ``loadavg`` (``/proc/loadavg``) at start, every ``SAMPLE_LOAD_S`` and at the end, and ``uptime``.

The run is only measured: nothing fails it. Tests (``tests/raft/test_stability.py``) assert bounds.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from controlplane.bench.load import background_load
from controlplane.bench.stability_node import MODES

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "stability-bench-password-0123"
START_TIMEOUT_S = 60.0
REPORT_TIMEOUT_S = 30.0
SAMPLE_LOAD_S = 30.0
MAX_SECONDS = 3600.0


PACKAGES = ("controlplane", "raft", "adapters")
BYTECODE = ("compiled", "source")


def prepare_bytecode(bytecode: str) -> dict[str, Any]:
    """``compiled``: byte-compile the project's packages (only stale files), as a production install
    does (``deploy/Dockerfile``: ``pip install`` compiles at install time), so every member reads
    ``.pyc`` files. An editable install under ``PYTHONDONTWRITEBYTECODE=1`` (this repository's
    development setting) otherwise recompiles the project's ~100 modules in every process start:
    about 0.3 s of CPU per member on a quiet machine, several seconds beside 8 burners.
    ``source``: remove those ``__pycache__`` folders (git-ignored, nothing else is in them) to measure
    that slower start on purpose. Returns what was done and how long it took."""
    import compileall

    t0 = time.monotonic()
    dirs = [REPO / p for p in PACKAGES]
    if bytecode == "compiled":
        ok = all(compileall.compile_dir(d, quiet=1, workers=1) for d in dirs)
    else:
        for d in dirs:
            for cache in d.rglob("__pycache__"):
                shutil.rmtree(cache, ignore_errors=True)
        ok = True
    return {"bytecode": bytecode, "ok": bool(ok), "seconds": round(time.monotonic() - t0, 3)}


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return _loadavg()


class _Member:
    def __init__(self, cfg: dict[str, Any], workdir: Path) -> None:
        self.node_id = cfg["node_id"]
        self.path = workdir / f"{self.node_id}.yaml"
        self.path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        self.log = workdir / f"{self.node_id}.log"
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.proc: subprocess.Popen[str] | None = None
        self.spawned_s = 0.0

    def spawn(self, mode: str = "node") -> None:
        self.spawned_s = time.monotonic()
        with open(self.log, "a", encoding="utf-8") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controlplane.bench.stability_node", str(self.path), mode], cwd=REPO,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.answers.put(json.loads(line))
            except json.JSONDecodeError:
                continue

    def next(self, timeout_s: float) -> dict[str, Any]:
        try:
            return self.answers.get(timeout=timeout_s)
        except queue.Empty:
            tail = self.log.read_text(encoding="utf-8")[-1500:] if self.log.exists() else ""
            raise RuntimeError(f"{self.node_id}: no answer in {timeout_s}s; log: {tail}") from None

    def send(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


def member_configs(base: Path, overrides: dict[str, Any]) -> list[dict[str, Any]]:
    from controlplane.cli.up import free_ports
    from controlplane.tls import make_raft_pki

    ports = free_ports(6)
    members = [{"node_id": f"coord-{i}", "zone": f"az-{i}", "raft_address": f"127.0.0.1:{ports[2 * i]}",
                "api_address": f"127.0.0.1:{ports[2 * i + 1]}"} for i in range(3)]
    pki = make_raft_pki(base / "pki", [str(m["node_id"]) for m in members])  # mutual TLS, as in production
    return [{**m, "peers": [p for p in members if p is not m], "data_dir": str(base / m["node_id"]),
             "password": PASSWORD, "raft_tls": pki.tls_fields(str(m["node_id"])), **overrides} for m in members]


def merge(reports: list[dict[str, Any]], group_start_s: float, spawn_s: float) -> dict[str, Any]:
    """Leader and holder changes over the merged records of every member."""
    leaders = sorted((x["term"], x["leader"], x["at_s"]) for r in reports for x in r["leaders_seen"])
    first_by_term: dict[int, tuple[str, float]] = {}
    for term, leader, at in leaders:
        if term not in first_by_term or at < first_by_term[term][1]:
            first_by_term[term] = (leader, at)
    epochs: dict[int, tuple[str, float]] = {}
    for r in reports:
        for x in r["leases_seen"]:
            if x["epoch"] not in epochs or x["at_s"] < epochs[x["epoch"]][1]:
                epochs[x["epoch"]] = (x["holder"], x["at_s"])
    auth = [r["first_authority_s"] for r in reports if r["first_authority_s"] is not None]
    first_leader = min((at for _, at in first_by_term.values()), default=None)
    first_holder = min(auth) if auth else None
    elections = sorted(({"node": r["node_id"], **e} for r in reports for e in r["elections_started"]),
                       key=lambda e: e["at_s"])
    for e in elections:
        e["at_s"] = round(e["at_s"] - group_start_s, 3)
    return {
        "leader_changes": max(0, len(first_by_term) - 1),
        "leaders": [{"term": t, "leader": ld, "at_s": round(at - group_start_s, 3)} for t, (ld, at) in sorted(first_by_term.items())],
        "holder_changes": max(0, len(epochs) - 1),
        "holders": [{"epoch": e, "holder": h, "at_s": round(at - group_start_s, 3)} for e, (h, at) in sorted(epochs.items())],
        "final_term": max((r["final_term"] for r in reports), default=0),
        "elections_started": len(elections),
        "elections": elections[:200],
        "first_leader_s": None if first_leader is None else round(first_leader - group_start_s, 3),
        "first_holder_s": None if first_holder is None else round(first_holder - group_start_s, 3),
        "first_holder_from_spawn_s": None if first_holder is None else round(first_holder - spawn_s, 3),
    }


def startup_summary(started: list[dict[str, Any]], reports: list[dict[str, Any]], spawned_s: list[float]) -> dict[str, Any]:
    """Where a fresh start's time goes, in seconds from the first member's spawn: per member its
    spawn, ``main`` (interpreter and imports done), configuration loaded, RaftNode started and
    everything started (``ready``); then the first lease holder from the first spawn, from the first
    and from the last RaftNode start, and ``holder_ready``: the first time a member both held the lease
    and had started everything it runs (for a coordinator: API and control loop)."""
    t0 = min(spawned_s)

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 3)

    members = [{"node": st["started"], "spawn_s": rel(sp), **{k: rel(v) for k, v in st.get("phases", {}).items()}}
               for st, sp in zip(started, spawned_s)]
    raft_starts = [st["t_s"] for st in started]
    auth = {r["node_id"]: r["first_authority_s"] for r in reports if r.get("first_authority_s") is not None}
    phases = {st["started"]: st.get("phases", {}) for st in started}
    first = min(auth.values(), default=None)
    ready = [max(t, phases[n].get("ready_s", t)) for n, t in auth.items()]
    return {
        "members": members,
        "first_holder_from_spawn_s": rel(first),
        "first_holder_from_first_raft_start_s": None if first is None else round(first - min(raft_starts), 3),
        "first_holder_from_last_raft_start_s": None if first is None else round(first - max(raft_starts), 3),
        "holder_ready_from_spawn_s": rel(min(ready, default=None)),
    }


def _member_view(r: dict[str, Any]) -> dict[str, Any]:
    d = r["durability"]
    return {
        "node_id": r["node_id"], "ticks": r["ticks"], "tick_gap_ms": r["tick_gap_ms"], "gc_pause_ms": r["gc_pause_ms"],
        "fsync": {"mode": d["mode"], "n": d["fsyncs"], "mean_ms": round(d["fsync_ms_total"] / d["fsyncs"], 2) if d["fsyncs"] else None,
                  "max_ms": round(d["fsync_ms_max"], 1)},
        "vote_requests_received": r["vote_requests_received"], "final_term": r["final_term"],
    }


def run_stability(seconds: float, *, cpu: int = 0, disk: bool = False, overrides: dict[str, Any] | None = None,
                  disk_mb: int = 256, log: Any = None, mode: str = "node", bytecode: str = "compiled") -> dict[str, Any]:
    """``mode``: what each member process runs (``stability_node.MODES``: ``node`` = RaftNode +
    LeaseGuard; ``coordinator`` = the whole coordinator as ``controlplane coordinator`` starts it).
    ``bytecode``: see :func:`prepare_bytecode` (done before the load starts)."""
    if not 1 <= seconds <= MAX_SECONDS:
        raise ValueError(f"seconds: must be between 1 and {MAX_SECONDS:.0f}, got {seconds}")
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if bytecode not in BYTECODE:
        raise ValueError(f"bytecode: must be one of {', '.join(BYTECODE)}, got {bytecode!r}")
    prepared = prepare_bytecode(bytecode)
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    root = Path(tempfile.mkdtemp(prefix="controlplane-stability-"))
    members = [_Member(c, root) for c in member_configs(root, dict(overrides or {}))]
    load_dir = root / "disk-load"
    load_dir.mkdir()
    samples = [_loadavg()]
    uptime_start = _uptime()
    try:
        # the load runs for the whole measurement plus start-up and reporting, then ends by itself
        with background_load(cpu, load_dir if disk else None, seconds + START_TIMEOUT_S + REPORT_TIMEOUT_S, disk_mb=disk_mb):
            if cpu or disk:
                time.sleep(2.0)  # let the load build up first: a fresh group starts on a busy machine
                samples.append(_loadavg())
            spawn = time.monotonic()
            for m in members:
                m.spawn(mode)
            started = [m.next(START_TIMEOUT_S) for m in members]
            if not all("started" in s for s in started):
                raise RuntimeError(f"members did not start: {started}")
            group_start = max(s["t_s"] for s in started)
            say(f"stability: group up {group_start - spawn:.2f}s after spawn; measuring {seconds:.0f}s "
                f"(cpu burners {cpu}, disk writer {'on' if disk else 'off'})")
            end = group_start + seconds
            while time.monotonic() < end:
                time.sleep(min(SAMPLE_LOAD_S, max(0.0, end - time.monotonic())))
                samples.append(_loadavg())
            reports = []
            for m in members:
                m.send("report")
                reports.append(m.next(REPORT_TIMEOUT_S)["report"])
            uptime_end = _uptime()
    finally:
        for m in members:
            m.close()
        shutil.rmtree(root, ignore_errors=True)
    out = merge(reports, group_start, spawn)
    return {
        "seconds": seconds, "mode": mode, "bytecode": prepared, "cpu_burners": cpu, "disk_writer": disk,
        "overrides": dict(overrides or {}),
        **out, "startup": startup_summary(started, reports, [m.spawned_s for m in members]),
        "members": [_member_view(r) for r in reports],
        "uptime": {"start": uptime_start, "end": uptime_end}, "loadavg": samples,
        "group_up_after_spawn_s": round(group_start - spawn, 3),
    }


def _parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: expected field=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def run_cli(seconds: float | None, cpu: int, disk: bool, sets: list[str], out: str | None, *,
            mode: str = "node", fresh_starts: int = 0, bytecode: str = "compiled") -> int:
    """One long run (``--seconds``, default 60), or with ``fresh_starts`` that many fresh starts of
    ``FRESH_SECONDS`` each (``controlplane/bench/fresh_start.py``)."""
    from controlplane.bench.fresh_start import FRESH_SECONDS, run_fresh_starts, write_result
    from controlplane.domain.errors import ControlPlaneError

    if not 0 <= cpu <= 32:
        raise ControlPlaneError(f"--cpu: must be between 0 and 32, got {cpu}")
    try:
        overrides = _parse_set(sets)
        if fresh_starts:
            result = run_fresh_starts(fresh_starts, cpu=cpu, disk=disk, mode=mode, overrides=overrides, bytecode=bytecode,
                                      seconds=FRESH_SECONDS if seconds is None else seconds)
        else:
            result = run_stability(60.0 if seconds is None else seconds, cpu=cpu, disk=disk, overrides=overrides, mode=mode,
                                   bytecode=bytecode)
    except (ValueError, RuntimeError) as exc:
        raise ControlPlaneError(f"bench stability: {exc}") from None
    write_result(result, out)
    return 0
