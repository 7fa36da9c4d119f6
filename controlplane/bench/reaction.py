"""``controlplane bench reaction``: how fast a step burst becomes a fenced command at the adapter, on
real processes on 127.0.0.1.

What runs (every process stopped in ``finally``; a child also exits when its stdin closes):

* **coordinators**: three ``python -m controlplane.bench.reaction coordinator CONFIG EVENTS`` processes,
  each the real composition root :class:`controlplane.coordinator.Coordinator` built from the
  configuration :func:`controlplane.cli.up.plan_group` writes (TLS API, admin and adapter tokens from
  :func:`~controlplane.cli.up.make_local_security`, every timing at its default unless ``--tick-ms``),
  managing one cluster. The only addition: thin wrappers that write timestamps (wall clock, ms) of
  the observation batches received, and of each acting tick's fence, plan, commits and sends, to
  ``EVENTS`` (one JSON line each, written after the tick) for the breakdown.
* **adapter**: one ``python -m controlplane.bench.reaction adapter CONFIG`` process: the adapter's own
  gRPC service (:func:`adapters.service.serve_adapter`, bearer token) over the simulated backend
  (:class:`adapters.simulated.SimulatedBackend`, configured as ``controlplane adapter --config`` would
  be), with benchmark-only additions kept in this module, never in the production paths: a
  JSON-lines control channel on stdin/stdout that steps a deployment's offered load, and a record of
  the backend's ``observe`` results, of every fence and of every command accepted, each stamped
  with the adapter's own clock. Its :class:`~adapters.service.ObservationHub` keeps the configured
  interval, but the bench shifts its phase by a random fraction of an interval before each burst
  (otherwise the adapter's 250 ms observation cadence and the leader's 250 ms tick keep one fixed
  phase for the whole run, and every burst would measure the same tick wait).

The workload: ``--deployments`` deployments (default :data:`DEPLOYMENTS`) of ``llama3-8b-h100`` at a
steady :data:`CALM_RPS` requests/s each, ``min_replicas`` 1. Bursts go to them in turn, so each
has ``deployments`` bursts' time to scale back before its next one. A burst: the bench asks the
adapter to step the deployment's load to :data:`BURST_RPS` right after its next observation (a step
at a batch boundary); the burst ends (load back to calm) once the adapter has accepted the scale-out
command, or after :data:`BURST_TIMEOUT_S`.

The measurement, per burst, entirely on the adapter's clock (one clock at both ends: no
cross-process clock error):

* start: the timestamp (``at_ms``) of the first observation batch after the step whose level for
  the deployment (running + waiting requests of its instances plus its gateway queue) exceeds the
  highest level of the batches of the :data:`PRE_BURST_MS` before the step;
* end: the moment the adapter accepted (after the fencing check) the first ``create`` (or ``wake``)
  command for that deployment.

Breakdown (median per segment): ``deliver`` (batch published -> received by the lease holder),
``tick wait`` (-> the start of the holder's tick that acted), ``fence+gather+facts`` (-> plan
starts), ``decide`` (``reconcile.plan``), ``commit`` (-> the plan's Raft commit returned), ``send``
(-> accepted by the adapter). These join the adapter's records with the coordinator's by batch
sequence and request id and use the host's wall clock in both processes (the same clock on one
machine); the observation interval itself is before the start and not counted (a step waits up to
one interval for the next batch).

The benchmark deployments use shorter policy windows than the defaults (:data:`POLICY`) so that
they scale back within a few seconds and a run stays short, and ``target_concurrency`` 4 so that a
burst of modest size is a clear step: the path from a batch to a command (panic on the first tick
that sees a level of ``panic_threshold`` x capacity) does not depend on the windows.

Output: a rich progress bar on stderr; ``--json``: the result on stdout; always ``--out``/
bench-reaction.md, bench-reaction.json and bench-reaction.png (distribution and breakdown).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

DEFAULT_BURSTS = 50
DEFAULT_OUT = "out"
DEPLOYMENTS = 8
CALM_RPS = 1.0
BURST_RPS = 80.0
TARGET_P99_MS = 100.0
PRE_BURST_MS = 2_000
"""The pre-burst level: the highest level among the batches of this long before the step."""
BURST_TIMEOUT_S = 5.0
GAP_S = 0.8
"""Calm time after a burst ends before the next one is prepared."""
SETTLE_TIMEOUT_S = 60.0
START_TIMEOUT_S = 60.0
RECOVER_TIMEOUT_S = 40.0
CHILD_MAX_LIFETIME_S = 1800.0
COLD_START_MS = 2_000
WARM_START_MS = 500
GPUS = 256
TENANT = "bench"
MODEL = "llama3-8b-h100"
SEED = 20260901
POLICY = {
    "target_concurrency": 4.0, "stable_window_ms": 6_000, "ewma_half_life_ms": 1_000, "panic_window_ms": 2_000,
    "panic_hold_ms": 2_000, "scale_down_stabilization_ms": 3_000, "scale_down_cooldown_ms": 500, "max_step_down": 8,
}
MAX_REPLICAS = 8
FILES = ("bench-reaction.md", "bench-reaction.json", "bench-reaction.png")
SEGMENTS = ("deliver", "tick_wait", "fence_gather_facts", "decide", "commit", "send")
SEGMENT_LABELS = {
    "deliver": "deliver (batch published -> received by the holder)",
    "tick_wait": "tick wait (-> the acting tick starts)",
    "fence_gather_facts": "fence + gather + filter + facts (-> plan starts)",
    "decide": "decide (reconcile.plan)",
    "commit": "commit (-> the plan's Raft commit returned)",
    "send": "send (-> accepted by the adapter)",
}


class BenchError(Exception):
    """The benchmark could not run (a process did not start, the group did not settle...)."""


def now_ms() -> float:
    """The host's wall clock in ms (float): the adapter's clock (``wall_ms``) at sub-ms resolution."""
    return time.time() * 1000.0


def deployment_ids(n: int) -> list[str]:
    return [f"burst-{i:02d}" for i in range(n)]


# =====================================================================================================
# The adapter process
# =====================================================================================================


def _bench_backend_class() -> type:
    from adapters.simulated import LoadStep, SimulatedBackend

    class BenchBackend(SimulatedBackend):
        """The simulated backend plus records and a load switch (benchmark only)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.levels: deque[tuple[int, float, dict[str, int]]] = deque(maxlen=4000)
            """(at_ms, wall ms when observed, level per deployment) per observation."""
            self.accepted: deque[dict[str, Any]] = deque(maxlen=20000)
            self.fences: deque[tuple[float, int, str]] = deque(maxlen=20000)
            self.pending: dict[str, float] = {}
            """deployment -> rps to switch to right after the next observation."""
            self.steps: dict[str, list[tuple[int, float]]] = {}
            """deployment -> (at_ms of the observation it followed, rps) per switch."""

        def set_rate(self, dep: str, rps: float) -> None:
            from controlplane.domain.ids import DeploymentId

            d = DeploymentId(dep)
            with self._lock:
                self._advance(self._clock_ms())
                self._cfg[d] = self._cfg[d].model_copy(update={"load": [LoadStep(at_s=0, rps=rps)]})
                self._origin_ms[d] = float(self._now_ms)
                self._next_arrival[d] = self._draw_arrival(d, float(self._now_ms))

        def observe(self, now: int) -> Any:
            obs = super().observe(now)
            t = now_ms()
            level: dict[str, int] = {}
            for s in obs.samples:
                level[s.deployment] = level.get(s.deployment, 0) + s.running + s.waiting
            for dep, n in obs.gateway_waiting:
                level[dep] = level.get(dep, 0) + n
            with self._lock:
                self.levels.append((obs.at_ms, t, level))
                pending, self.pending = self.pending, {}
            for dep, rps in pending.items():
                self.set_rate(dep, rps)
                self.steps.setdefault(dep, []).append((obs.at_ms, rps))
            return obs

        def _accept(self, kind: str, request_id: str, dep: str, action: str, fence: Any) -> None:
            self.accepted.append({"t": now_ms(), "kind": kind, "request_id": request_id, "deployment": dep,
                                  "action": action, "epoch": fence.epoch, "holder": fence.holder})

        def apply(self, command: Any, now: int) -> None:
            self._accept("apply", command.request_id, command.instance.deployment_id, command.action, command.fence)
            super().apply(command, now)

        def scale(self, command: Any, now: int) -> None:
            self._accept("scale", command.request_id, command.deployment_id, "scale", command.fence)
            super().scale(command, now)

        def fence(self, token: Any) -> None:
            self.fences.append((now_ms(), token.epoch, token.holder))

        def phases(self) -> dict[str, dict[str, int]]:
            with self._lock:
                self._advance(self._clock_ms())
                out: dict[str, dict[str, int]] = {}
                for dep, insts in self.fleet.by_deployment.items():
                    counts: dict[str, int] = {}
                    for sim in insts.values():
                        counts[sim.phase] = counts.get(sim.phase, 0) + 1
                    out[dep] = counts
                return out

    return BenchBackend


def _bench_hub_class() -> type:
    from adapters.service import ObservationHub

    class BenchHub(ObservationHub):
        """The hub with a one-off phase shift (benchmark only); same interval otherwise."""

        instance: BenchHub | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.shift_s = 0.0
            self.seqs: deque[tuple[int, int]] = deque(maxlen=4000)
            """(seq, at_ms) of each batch published."""
            BenchHub.instance = self

        def _run(self) -> None:
            period_s = self.interval_ms / 1000
            next_at = time.monotonic()
            while not self._stopped.is_set():
                self.pump()
                shift, self.shift_s = self.shift_s, 0.0
                next_at += period_s + shift
                self._stopped.wait(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at, time.monotonic() - period_s)

        def pump(self) -> Any:
            batch = super().pump()
            self.seqs.append((batch.seq, batch.at_ms))
            return batch

    return BenchHub


def burst_result(backend: Any, hub: Any, dep: str, step_at: int) -> dict[str, Any]:
    """The measurement of the burst of ``dep`` that stepped after the observation at ``step_at``."""
    levels = list(backend.levels)
    before = [lv.get(dep, 0) for at, _, lv in levels if step_at - PRE_BURST_MS <= at <= step_at]
    pre = max(before) if before else 0
    first = next(((at, t, lv.get(dep, 0)) for at, t, lv in levels if at > step_at and lv.get(dep, 0) > pre), None)
    out: dict[str, Any] = {"deployment": dep, "step_at_ms": step_at, "pre_level": pre, "done": False}
    if first is None:
        return out
    at, t_obs, level = first
    out.update(obs_at_ms=at, obs_wall_ms=t_obs, level=level,
               seq=next((s for s, a in hub.seqs if a == at), None))
    cmd = next((a for a in list(backend.accepted)
                if a["deployment"] == dep and a["action"] in ("create", "wake", "scale") and a["t"] >= step_at), None)
    if cmd is None:
        return out
    fence = max((f for f in list(backend.fences) if f[0] <= cmd["t"] and f[1] == cmd["epoch"]), default=None)
    out.update(done=True, accepted_ms=cmd["t"], request_id=cmd["request_id"], action=cmd["action"],
               epoch=cmd["epoch"], holder=cmd["holder"], latency_ms=round(cmd["t"] - at, 3),
               before_observation=cmd["t"] < at,
               last_fence_ms=None if fence is None else fence[0],
               creates_within_100ms=sum(1 for a in list(backend.accepted) if a["deployment"] == dep
                           and a["action"] in ("create", "wake") and 0 <= a["t"] - cmd["t"] < 100))
    return out


def adapter_main(config_path: str) -> int:
    """``python -m controlplane.bench.reaction adapter CONFIG``: the adapter with its control channel."""
    from adapters import service
    from adapters.config import load_adapter_config

    proto = _protocol_stdout()
    cfg = load_adapter_config(config_path)
    assert cfg.simulated is not None
    backend = _bench_backend_class()(cfg.cluster_id, cfg.simulated)
    hub_class = _bench_hub_class()
    service.ObservationHub = hub_class  # this process only: serve_adapter composes the benchmark's hub
    server = service.serve_adapter(cfg.cluster_id, cfg.listen, cfg.state_dir, backend,
                                   observe_interval_ms=cfg.observe_interval_ms, ring_s=cfg.ring_s,
                                   auth_token=cfg.auth_token(), tls=cfg.tls_pair())
    hub = hub_class.instance
    rng = random.Random(SEED)

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "phases":
            return {"ok": True, "phases": backend.phases(), "fences": len(backend.fences)}
        if op == "burst":
            dep = str(req["deployment"])
            hub.shift_s = rng.uniform(0.0, hub.interval_ms / 1000)  # a new phase against the ticks
            with backend._lock:
                n = len(backend.steps.get(dep, []))
            deadline = time.monotonic() + 3.0 + hub.interval_ms / 250
            time.sleep(hub.interval_ms / 1000 * 2 + 0.3)  # the shift happened, and calm batches at the new phase
            with backend._lock:
                backend.pending[dep] = float(req["rps"])
            while time.monotonic() < deadline:
                with backend._lock:
                    steps = backend.steps.get(dep, [])
                    if len(steps) > n:
                        return {"ok": True, "step_at_ms": steps[-1][0]}
                time.sleep(0.005)
            return {"ok": False, "error": "the load step was not applied"}
        if op == "rate":
            backend.set_rate(str(req["deployment"]), float(req["rps"]))
            return {"ok": True}
        if op == "result":
            return {"ok": True, **burst_result(backend, hub, str(req["deployment"]), int(req["step_at_ms"]))}
        if op == "stats":
            return {"ok": True, "applied": server.servicer.applied, "stale_rejected": server.servicer.stale_rejected,
                    "observe_errors": hub.observe_errors, "statistics": backend.statistics()}
        return {"ok": False, "error": f"unknown op {op!r}"}

    try:
        _serve_channel(proto, handle, {"started": cfg.cluster_id, "pid": os.getpid(), "port": server.port})
    finally:
        server.stop(0.5)
    return 0


# =====================================================================================================
# The coordinator process
# =====================================================================================================


class _TickRecorder:
    """Timestamps of the holder's acting ticks, written as JSON lines (after each tick)."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (open for the process lifetime)
        self._lock = threading.Lock()
        self.current: dict[str, Any] | None = None

    def write(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec)
        with self._lock:
            self._f.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._f.close()


def instrument(coord: Any, rec: _TickRecorder) -> None:
    """Wrap the coordinator's tick, plan, commit, fence, send and batch receipt with timestamps."""
    from controlplane.core import reconcile

    loop, replicator, adapter, observations = coord.loop, coord.replicator, coord.adapter, coord.observations
    orig_tick, orig_commit, orig_send = loop.tick, replicator.commit, adapter.send
    orig_fence, orig_receive, orig_plan = adapter.fence, observations._receive, reconcile.plan

    def receive(cid: str, batch: Any) -> None:
        t = now_ms()
        orig_receive(cid, batch)
        rec.write({"k": "recv", "seq": batch.seq, "at_ms": batch.at_ms, "t": t})

    def tick(now: int) -> Any:
        cur: dict[str, Any] = {"k": "tick", "t0": now_ms(), "fences": [], "plan": None, "commits": [], "sends": []}
        rec.current = cur
        try:
            return orig_tick(now)
        finally:
            rec.current = None
            cur["t1"] = now_ms()
            if cur["sends"]:
                rec.write(cur)

    def fence(cluster_id: str, f: Any, now: int) -> None:
        t = now_ms()
        try:
            orig_fence(cluster_id, f, now)
        finally:
            if rec.current is not None:
                rec.current["fences"].append([t, now_ms()])

    def plan(*args: Any, **kwargs: Any) -> Any:
        t = now_ms()
        try:
            return orig_plan(*args, **kwargs)
        finally:
            if rec.current is not None:
                rec.current["plan"] = [t, now_ms()]

    def commit(commands: Any, now: int) -> Any:
        t = now_ms()
        try:
            return orig_commit(commands, now)
        finally:
            if rec.current is not None:
                rec.current["commits"].append([t, now_ms(), len(commands)])

    def send(cluster_id: str, command: Any, f: Any, now: int) -> None:
        t = now_ms()
        try:
            orig_send(cluster_id, command, f, now)
        finally:
            if rec.current is not None:
                rec.current["sends"].append([t, now_ms(), command.request_id, command.action,
                                             command.instance.deployment])

    loop.tick, replicator.commit, adapter.send, adapter.fence = tick, commit, send, fence
    observations._receive = receive
    reconcile.plan = plan  # this process only: the loop calls reconcile.plan through the module


def coordinator_main(config_path: str, events_path: str) -> int:
    """``python -m controlplane.bench.reaction coordinator CONFIG EVENTS``."""
    from controlplane.config import load_config
    from controlplane.coordinator import Coordinator, topology_of

    proto = _protocol_stdout()
    cfg = load_config(config_path)
    coord = Coordinator(cfg, topology_of(cfg))
    rec = _TickRecorder(events_path)
    instrument(coord, rec)
    coord.start()

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        if req.get("op") == "status":
            st = coord.status()
            return {"ok": True, "node_id": st.node_id, "lease_holder": st.lease_holder, "lease_epoch": st.lease_epoch,
                    "holding": st.lease_remaining_ms > 0, "deployments": sorted(coord.replicator.state.deployments),
                    "loop": coord.loop.statistics().__repr__()}
        return {"ok": False, "error": f"unknown op {req.get('op')!r}"}

    try:
        _serve_channel(proto, handle, {"started": cfg.node_id, "pid": os.getpid()})
    finally:
        coord.stop()
        rec.close()
    return 0


# --- the children's control channel ------------------------------------------------------------------


def _protocol_stdout() -> Any:
    """The control channel's output (the real stdout); everything else printed goes to stderr."""
    import logging

    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    watchdog = threading.Timer(CHILD_MAX_LIFETIME_S, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    return proto


def _serve_channel(proto: Any, handle: Callable[[dict[str, Any]], dict[str, Any]], hello: dict[str, Any]) -> None:
    """Answer JSON-line requests from stdin (one at a time) until ``quit`` or EOF."""
    proto.write(json.dumps(hello) + "\n")
    proto.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except json.JSONDecodeError:
            continue
        if req.get("op") == "quit":
            break
        try:
            res = handle(req)
        except Exception as exc:  # noqa: BLE001 (reported to the bench)
            res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps({**res, "id": req.get("id")}) + "\n")
        proto.flush()


# =====================================================================================================
# The bench process
# =====================================================================================================


class _Child:
    """A child process and its control channel."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self._log = open(log, "ab")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     text=True, bufsize=1)
        self._lines: deque[str] = deque()
        self._cond = threading.Condition()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._lines.append("")
            self._cond.notify_all()

    def _line(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._lines:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"{self.name}: no answer within {timeout_s:.0f} s")
                self._cond.wait(left)
            line = self._lines.popleft()
        if not line:
            raise BenchError(f"{self.name}: exited (status {self.proc.poll()}); see its log")
        return json.loads(line)

    def hello(self, timeout_s: float) -> dict[str, Any]:
        return self._line(timeout_s)

    def call(self, op: str, timeout_s: float = 30.0, **args: Any) -> dict[str, Any]:
        self._next += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, "id": self._next, **args}) + "\n")
        self.proc.stdin.flush()
        while True:
            res = self._line(timeout_s)
            if res.get("id") == self._next:
                return res

    def stop(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(8.0)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5.0)
        self._log.close()


def write_configs(root: Path, n_deps: int, tick_ms: int | None) -> tuple[list[Any], Path, dict[str, Any]]:
    """Coordinator configurations (one cluster, the benchmark tenant and deployments) and the
    adapter's; returns (nodes, adapter config, the deployment spec used)."""
    from controlplane.cli.up import make_local_security, plan_group, write_private

    security = make_local_security(root)
    nodes, adapters = plan_group(3, root, gpus_per_cluster=GPUS, security=security)
    cluster = adapters[0]
    deployment = {"tenant": TENANT, "engine": "vllm", "model": MODEL, "pool": "h100", "min_replicas": 1,
                  "max_replicas": MAX_REPLICAS, "warm_pool": 0, "policy": dict(POLICY)}
    for node in nodes:
        cfg = yaml.safe_load(node.config.read_text(encoding="utf-8"))
        cfg["clusters"] = [cluster]
        cfg["tenants"] = [{"id": TENANT, "priority": 100, "quota": {"h100": GPUS}}]
        cfg["deployments"] = [{"id": d, **deployment} for d in deployment_ids(n_deps)]
        if tick_ms is not None:
            cfg["tick_ms"] = tick_ms
        write_private(node.config, yaml.safe_dump(cfg, sort_keys=False))
    adapter_cfg = {
        "cluster_id": cluster["id"], "listen": cluster["adapter_address"], "state_dir": str(root / "adapter"),
        "nvml": False, **security.adapter_fields(), "backend": "simulated",
        "simulated": {"seed": SEED, "deployments": [
            {"deployment": d, "model": MODEL, "cold_start_ms": COLD_START_MS, "warm_start_ms": WARM_START_MS,
             "load": [{"at_s": 0, "rps": CALM_RPS}]} for d in deployment_ids(n_deps)]},
    }
    path = root / "adapter.yaml"
    path.write_text(yaml.safe_dump(adapter_cfg, sort_keys=False), encoding="utf-8")
    return nodes, path, deployment


def _calm(phases: dict[str, int]) -> bool:
    """One instance serving, nothing else alive (the deployment is back at its minimum)."""
    alive = {k: v for k, v in phases.items() if k not in ("gone", "lost")}
    return alive == {"serving": 1}


def run_bench(bursts: int, out_dir: Path, *, n_deps: int = DEPLOYMENTS, tick_ms: int | None = None,
              show_progress: bool = True, command: str = "") -> dict[str, Any]:
    from controlplane.bench.raft import _progress, machine, summary
    from controlplane.config import CoordinatorConfig, load_config

    started = time.monotonic()
    deps = deployment_ids(n_deps)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    records: list[dict[str, Any]] = []
    children: list[_Child] = []
    with tempfile.TemporaryDirectory(prefix="bench-reaction-") as tmp, _progress(show_progress) as advance:
        root = Path(tmp)
        define = getattr(advance, "define", None)
        if define is not None:
            define("bursts", bursts)
        nodes, adapter_path, deployment = write_configs(root, n_deps, tick_ms)
        exe = [sys.executable, "-m", "controlplane.bench.reaction"]
        try:
            adapter = _Child("adapter", exe + ["adapter", str(adapter_path)], root / "adapter.log", env)
            children.append(adapter)
            adapter.hello(START_TIMEOUT_S)
            coords = []
            for node in nodes:
                ch = _Child(node.node_id, exe + ["coordinator", str(node.config), str(root / f"{node.node_id}.events")],
                            root / f"{node.node_id}.log", env)
                children.append(ch)
                coords.append(ch)
            for ch in coords:
                ch.hello(START_TIMEOUT_S)
            _wait(lambda: all(_calm(adapter.call("phases")["phases"].get(d, {})) for d in deps), SETTLE_TIMEOUT_S,
                  "every deployment serving one instance")
            last_burst: dict[str, float] = {}
            for k in range(bursts):
                dep = deps[k % n_deps]
                _wait(lambda d=dep: _calm(adapter.call("phases")["phases"].get(d, {})), RECOVER_TIMEOUT_S,
                      f"{dep} back at one instance")
                step = adapter.call("burst", deployment=dep, rps=BURST_RPS)
                if not step.get("ok"):
                    raise BenchError(f"adapter: {step.get('error')}")
                deadline = time.monotonic() + BURST_TIMEOUT_S
                while True:
                    res = adapter.call("result", deployment=dep, step_at_ms=step["step_at_ms"])
                    if res.get("done") or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                adapter.call("rate", deployment=dep, rps=CALM_RPS)
                res.pop("ok", None)
                res.pop("id", None)
                res["burst"] = k + 1
                records.append(res)
                last_burst[dep] = time.monotonic()
                advance("bursts", 1)
                time.sleep(GAP_S)
            stats = adapter.call("stats")
        finally:
            for ch in reversed(children):
                ch.stop()
        events = [_read_events(root / f"{node.node_id}.events") for node in nodes]
        cfg = load_config(nodes[0].config)
    _join(records, events)
    ok = [r for r in records if r.get("done")]
    lat = [r["latency_ms"] for r in ok]
    result: dict[str, Any] = {
        "benchmark": "reaction",
        "command": command or f"controlplane bench reaction --bursts {bursts}",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
        "params": {
            "bursts": bursts, "deployments": n_deps, "calm_rps": CALM_RPS, "burst_rps": BURST_RPS,
            "pre_burst_ms": PRE_BURST_MS, "burst_timeout_s": BURST_TIMEOUT_S, "cold_start_ms": COLD_START_MS,
            "model": MODEL, "policy": deployment["policy"], "min_replicas": 1, "max_replicas": MAX_REPLICAS,
            "tick_ms": cfg.tick_ms, "tick_ms_default": CoordinatorConfig.model_fields["tick_ms"].default,
            "observe_interval_ms": 250, "coordinators": 3, "fsync": cfg.fsync,
            "start": "at_ms of the first observation batch after the step whose level (running + waiting + gateway "
                     "queue) exceeds the highest level of the batches in the 2 s before the step (adapter clock)",
            "end": "the adapter accepted (fencing check passed) the first create/wake for the deployment (adapter clock)",
            "percentiles": "nearest rank",
        },
        "latency_ms": {**summary(lat), "failed": len(records) - len(ok), "values": [r.get("latency_ms") for r in records]},
        "breakdown_ms": {seg: summary([r["breakdown_ms"][seg] for r in ok if r.get("breakdown_ms")]) for seg in SEGMENTS},
        "bursts": records,
        "adapter": {k: v for k, v in stats.items() if k in ("applied", "stale_rejected", "observe_errors")},
    }
    p99 = result["latency_ms"].get("p99")
    result["verdict"] = {
        "target_p99_ms": TARGET_P99_MS, "p99_ms": p99,
        "met": p99 is not None and p99 < TARGET_P99_MS and not result["latency_ms"]["failed"],
        "ratio_to_target": None if p99 is None else round(p99 / TARGET_P99_MS, 2),
        "tick_ms": cfg.tick_ms,
        "note": ("the lease holder ticks as soon as a batch shows new pressure (a queue that grew, a jump in load, "
                 "lifecycle reports), at most every 20 ms, besides its periodic tick"),
    }
    result["duration_s"] = round(time.monotonic() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / name for name in FILES}
    result["files"] = {"markdown": str(paths[FILES[0]]), "json": str(paths[FILES[1]]), "plot": str(paths[FILES[2]])}
    write_plot(result, paths[FILES[2]])
    paths[FILES[0]].write_text(render_markdown(result), encoding="utf-8")
    paths[FILES[1]].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def _read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    except OSError:
        pass
    return out


def _join(records: list[dict[str, Any]], events: list[list[dict[str, Any]]]) -> None:
    """Add each finished burst's breakdown from the coordinator that sent its command."""
    for r in records:
        if not r.get("done"):
            continue
        for evs in events:
            tick = next((e for e in evs if e["k"] == "tick" and any(s[2] == r["request_id"] for s in e["sends"])), None)
            if tick is None:
                continue
            recv = next((e["t"] for e in evs if e["k"] == "recv" and e["seq"] == r.get("seq")), None)
            send = next(s for s in tick["sends"] if s[2] == r["request_id"])
            plan = tick["plan"]
            commit = next((c for c in reversed(tick["commits"]) if c[1] <= send[0]), None)
            if recv is None or plan is None or commit is None:
                break
            t_obs = r["obs_at_ms"]
            marks = [t_obs, recv, tick["t0"], plan[0], plan[1], commit[1], r["accepted_ms"]]
            r["breakdown_ms"] = {seg: round(b - a, 3) for seg, a, b in zip(SEGMENTS, marks, marks[1:])}
            r["commit_ms"] = round(commit[1] - commit[0], 3)
            r["commit_commands"] = commit[2]
            r["tick_ms_total"] = round(tick["t1"] - tick["t0"], 3)
            break


# --- reports -----------------------------------------------------------------------------------------


def _f(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return f"{v:,}"


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    lat = result["latency_ms"]
    rows.append(("reaction (first batch showing the burst -> command accepted)", _f(lat.get("p50")), _f(lat.get("p99")),
                 _f(lat.get("max"))))
    for seg in SEGMENTS:
        s = result["breakdown_ms"][seg]
        rows.append((f"  {SEGMENT_LABELS[seg]}", _f(s.get("p50")), _f(s.get("p99")), _f(s.get("max"))))
    return rows


def render_markdown(result: dict[str, Any]) -> str:
    m, p, v = result["machine"], result["params"], result["verdict"]
    lat = result["latency_ms"]
    lines = [
        "# Reaction latency: step burst -> fenced command at the adapter", "",
        f"`{result['command']}` — {result['started_at']}, {result['duration_s']} s", "",
        (f"Machine: {m['cpu_model']}, {m['cpus_usable']} CPUs usable, {m['platform']}, Python {m['python']}, "
        f"load average at start {m['loadavg_at_start']}."), "",
        (f"3 coordinator processes (tick {p['tick_ms']} ms, default {p['tick_ms_default']} ms; fsync `{p['fsync']}`) and "
        f"one simulated adapter (observation every {p['observe_interval_ms']} ms) on 127.0.0.1. {p['deployments']} "
        f"deployments at {p['calm_rps']:g} request/s, bursts to {p['burst_rps']:g} requests/s in turn; policy "
        f"{p['policy']} (shorter windows than the defaults so that a run is short)."), "",
        f"Start: {p['start']}. End: {p['end']}. {lat['n']} of {p['bursts']} bursts measured; percentiles by nearest rank.", "",
        "| ms | p50 | p99 | max |", "|---|---:|---:|---:|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in summary_rows(result)]
    lines += ["", (f"Target p99 < {v['target_p99_ms']:g} ms: **{'met' if v['met'] else 'missed'}** "
              f"(p99 {_f(v['p99_ms'])} ms, {_f(v['ratio_to_target'])}x the target). {v['note']}."), "",
              f"Plot: `{Path(result['files']['plot']).name}`.", ""]
    return "\n".join(lines)


def write_plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    vals = sorted(x for x in result["latency_ms"]["values"] if x is not None)
    if vals:
        ax1.step(vals, [(i + 1) / len(vals) for i in range(len(vals))], where="post", color="tab:blue",
                 label=f"reaction (n={len(vals)})")
    ax1.axvline(result["verdict"]["target_p99_ms"], color="red", ls="--", lw=1, label="100 ms target (p99)")
    ax1.axvline(result["params"]["tick_ms"], color="gray", ls=":", lw=1, label=f"tick {result['params']['tick_ms']} ms")
    ax1.set_xlabel("ms (adapter clock): first batch showing the burst -> command accepted")
    ax1.set_ylabel("fraction of bursts")
    ax1.set_title("reaction latency, empirical CDF")
    ax1.legend(fontsize=8)
    bursts = [r for r in result["bursts"] if r.get("breakdown_ms")]
    bottom = [0.0] * len(bursts)
    for seg, color in zip(SEGMENTS, ("tab:gray", "tab:orange", "tab:olive", "tab:green", "tab:blue", "tab:purple")):
        heights = [max(0.0, r["breakdown_ms"][seg]) for r in bursts]
        ax2.bar(range(len(bursts)), heights, bottom=bottom, color=color, label=seg, width=0.9)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax2.set_xlabel("burst")
    ax2.set_ylabel("ms")
    ax2.set_title("breakdown per burst")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    p = result["params"]
    table = Table(title=f"Reaction latency ({result['latency_ms']['n']} bursts, tick {p['tick_ms']} ms)")
    for col in ("ms", "p50", "p99", "max"):
        table.add_column(col, justify="left" if col == "ms" else "right")
    for row in summary_rows(result):
        table.add_row(*row)
    console = Console(width=None if sys.stdout.isatty() else 140)
    console.print(table)
    v = result["verdict"]
    console.print(f"target p99 < {v['target_p99_ms']:g} ms: {'met' if v['met'] else 'MISSED'} ({_f(v['ratio_to_target'])}x)")
    console.print(f"written: {result['files']['markdown']}, {result['files']['json']}, {result['files']['plot']}")


def run_cli(bursts: int, out: str, as_json: bool, *, deployments: int = DEPLOYMENTS, tick_ms: int | None = None,
            command: str = "") -> int:
    """``controlplane bench reaction``: 0 when every burst was measured, 1 otherwise."""
    from controlplane.domain.errors import ControlPlaneError

    if not 1 <= bursts <= 10_000:
        raise ControlPlaneError(f"--bursts: must be between 1 and 10000, got {bursts}")
    if not 1 <= deployments <= 64:
        raise ControlPlaneError(f"--deployments: must be between 1 and 64, got {deployments}")
    if tick_ms is not None and not 10 <= tick_ms <= 10_000:
        raise ControlPlaneError(f"--tick-ms: must be between 10 and 10000, got {tick_ms}")
    command = command or (f"controlplane bench reaction --bursts {bursts}"
                          + (f" --deployments {deployments}" if deployments != DEPLOYMENTS else "")
                          + (f" --tick-ms {tick_ms}" if tick_ms is not None else "") + f" --out {out}"
                          + (" --json" if as_json else ""))
    try:
        result = run_bench(bursts, Path(out), n_deps=deployments, tick_ms=tick_ms, command=command)
    except BenchError as exc:
        print(f"controlplane: error: bench reaction: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0 if result["latency_ms"]["failed"] == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "adapter":
        sys.exit(adapter_main(sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[1] == "coordinator":
        sys.exit(coordinator_main(sys.argv[2], sys.argv[3]))
    print("usage: python -m controlplane.bench.reaction adapter CONFIG | coordinator CONFIG EVENTS "
          "(started by `controlplane bench reaction`)", file=sys.stderr)
    sys.exit(2)
