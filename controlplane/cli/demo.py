"""``controlplane demo``: the whole system on this machine, in a few minutes.

What runs (everything on 127.0.0.1, torn down on exit, Ctrl-C or SIGTERM):

* **three coordinator processes**, one per simulated zone (``controlplane coordinator --config``,
  planned and secured by :mod:`controlplane.cli.up`: TLS API, admin token, Raft password), so the
  lease holder can really be SIGKILLed and restarted;
* **three cluster adapters with the simulated backend**, one per zone, served *in this process*
  (:func:`adapters.service.serve_adapter` over :class:`adapters.simulated.SimulatedBackend`): the
  same gRPC service, fencing and observation stream as ``controlplane adapter``, but the demo reads
  every request's time to first token directly from the backends, which is what "SLO attainment so
  far" needs (an adapter process does not export per-request statistics). The adapters are not what
  the demo kills, so running them here costs nothing in realism;
* **three tenants, one engine each**, created through the API (:class:`controlplane.api.client.ApiClient`,
  admin token): ``gold`` (priority 200, quota 9 GPUs, TTFT SLO 1 s) with deployment ``chat`` on vLLM,
  ``silver`` (priority 100, quota 3, may borrow 3, SLO 2 s) with ``embed`` on Triton (TensorRT-LLM
  in-flight batching), and ``bronze`` (priority 50, quota 3 GPUs, may borrow 9, TTFT SLO 3 s) with
  ``batch`` on DeepSpeed-MII behind its request meter; each is served by its engine's service model
  (``controlplane.sim.service_models``) and reports what that engine can. The clusters hold 6 GPUs
  each (18 in all), so when ``chat`` bursts it takes back the GPUs ``bronze`` borrowed: preemptions;
* **a bursty workload**, a step-Poisson load per deployment and zone: ``batch`` rises early and
  borrows the idle GPUs, ``chat`` bursts from 40 % to 75 % of the run. With ``--trace`` the arrival
  shape of an Azure LLM inference trace replaces ``chat``'s schedule: the whole trace is compressed
  into the run (one step per second of demo time) and scaled so its busiest second offers the
  built-in burst rate;
* at 55 % of the run the lease holder is **SIGKILLed**; the failover time is measured from the kill to
  the first survivor reporting a new lease holder with a newer epoch; the killed coordinator is
  restarted a few seconds later and rejoins.

The live view (rich, 2 Hz; plain status lines when stdout is not a terminal or with ``--no-live``)
reads ``Admin.Status`` of every node (role, term, lease holder and epoch), ``Deployments.
ListDeployments`` and ``GetDeployment`` (replicas by state and zone, preempted instances), a
``Scaling.Watch`` stream (transitions and decisions; it resumes on another node across the kill) and
the backends' request statistics (load, SLO attainment, TTFT). Circuit breakers are not exposed by
the API: the view derives them from the watched instance events with the breaker code itself
(:mod:`controlplane.core.breaker`), which is what the lease holder feeds them with, and says so.

At the end: a summary table, ``OUT/demo-summary.json`` and ``OUT/demo.png`` (replicas over time per
deployment against the load, the failover marked).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.simulated import SimulatedBackend, SimulatedConfig
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.ids import local_name, qualified_id

ZONE_COUNT = 3
GPUS_PER_CLUSTER = 6
POOL = "h100"
MODEL = "llama3-8b-h100"
COLD_START_MS, WARM_START_MS = 3_000, 500
POLICY = {
    "target_concurrency": 4.0, "stable_window_ms": 6_000, "ewma_half_life_ms": 1_000, "panic_window_ms": 2_000,
    "panic_hold_ms": 3_000, "scale_down_stabilization_ms": 4_000, "scale_down_cooldown_ms": 1_000, "max_step_down": 4,
}
"""Fast reactions for a short demo (the product defaults assume minutes, not seconds)."""


@dataclass(frozen=True)
class TenantPlan:
    tenant: str
    priority: int
    quota: int
    borrow: int
    slo_ms: int
    deployment: str
    min_replicas: int
    max_replicas: int
    engine: str = "vllm"
    simulated: tuple[tuple[str, Any], ...] = ()
    """Extra fields of the deployment's simulated engines (``adapters.simulated.SimDeploymentConfig``)."""


TENANTS = (
    TenantPlan("gold", 200, 9, 0, 1_000, "chat", ZONE_COUNT, 4 * ZONE_COUNT),
    TenantPlan("silver", 100, 3, 3, 2_000, "embed", ZONE_COUNT, 2 * ZONE_COUNT, "triton",
               (("triton", {"batching": "inflight"}),)),
    TenantPlan("bronze", 50, 3, 9, 3_000, "batch", ZONE_COUNT, 4 * ZONE_COUNT, "deepspeed-mii"),
)
"""One deployment per engine: ``chat`` on vLLM, ``embed`` on Triton (TensorRT-LLM in-flight batching,
the backend Triton serves LLMs with), ``batch`` on DeepSpeed-MII behind its request meter. 18 GPUs:
the quotas take 15, so bronze's borrowing is what gold's burst takes back (preemption)."""
CALM_RPS, BURST_RPS = 1.5, 10.0
"""``chat`` per zone: calm and burst (about 3 replicas per zone at ``target_concurrency`` 4)."""
BATCH_LOW_RPS, BATCH_RPS = 2.0, 9.0
"""``batch`` per zone: it wants about 3 replicas per zone, more than its quota: it borrows."""
EMBED_LOW_RPS, EMBED_RPS = 1.5, 6.0
"""``embed`` per zone: one replica per zone, about two while its own burst lasts."""
EMBED_FROM, EMBED_TO = 0.15, 0.55
BURST_FROM, BURST_TO, BATCH_FROM, BATCH_TO = 0.40, 0.75, 0.08, 0.85
KILL_AT = 0.55
RESTART_AFTER_S = 3.0
"""The killed coordinator is restarted this long after the new lease holder appeared."""
LOAD_OFFSET_S = 100_000.0
"""The backends' schedules are shifted this far into the future (no load while the group starts);
:meth:`DemoBackend.start_load` moves them back to the moment the workload starts."""
DEFAULT_DURATION_S = 150
SETUP_TIMEOUT_S = 60.0
PLAIN_EVERY_S = 5.0
DEFAULT_TRACE_ZONE_PEAK = BURST_RPS


# ---------------------------------------------------------------------------------------------
# workload


@dataclass(frozen=True)
class Workload:
    name: str
    schedules: dict[str, list[tuple[float, float]]]
    """Per deployment: ``(at_s, requests/s per zone)`` steps, seconds since the workload started."""

    def rate(self, deployment: str, t_s: float) -> float:
        rate = 0.0
        for at, rps in self.schedules[deployment]:
            if at <= t_s:
                rate = rps
            else:
                break
        return rate


def builtin_workload(duration_s: float) -> Workload:
    d = duration_s
    return Workload("built-in bursty", {
        "chat": [(0.0, CALM_RPS), (BURST_FROM * d, BURST_RPS), (BURST_TO * d, CALM_RPS)],
        "batch": [(0.0, BATCH_LOW_RPS), (BATCH_FROM * d, BATCH_RPS), (BATCH_TO * d, BATCH_LOW_RPS)],
        "embed": [(0.0, EMBED_LOW_RPS), (EMBED_FROM * d, EMBED_RPS), (EMBED_TO * d, EMBED_LOW_RPS)],
    })


def trace_workload(path: str, duration_s: float, zone_peak_rps: float = DEFAULT_TRACE_ZONE_PEAK) -> Workload:
    """``chat`` follows the arrival shape of an Azure trace: the whole trace compressed into
    ``duration_s`` (accelerated by ``trace length / duration``), one step per demo second, scaled so
    the busiest second offers ``zone_peak_rps`` per zone; ``batch`` keeps its built-in schedule."""
    from controlplane.sim.workload import TraceError, read_azure_trace

    try:
        requests = read_azure_trace(path)
    except TraceError as exc:
        raise ControlPlaneError(f"--trace: {exc}") from None
    if len(requests) < 2:
        raise ControlPlaneError(f"--trace: {path}: needs at least two requests")
    span_ms = max(1, requests[-1].arrival_ms - requests[0].arrival_ms)
    bins = max(1, int(duration_s))
    counts = [0] * bins
    for r in requests:
        counts[min(bins - 1, (r.arrival_ms - requests[0].arrival_ms) * bins // (span_ms + 1))] += 1
    peak = max(counts)
    steps = [(float(i), round(max(0.2, c / peak * zone_peak_rps), 3)) for i, c in enumerate(counts)]
    merged = [s for k, s in enumerate(steps) if k == 0 or s[1] != steps[k - 1][1]]
    builtin = builtin_workload(duration_s)
    acceleration = span_ms / 1000 / duration_s
    return Workload(f"trace {Path(path).name} ({len(requests)} requests, {acceleration:.0f}x faster)",
                    {"chat": merged, "batch": builtin.schedules["batch"], "embed": builtin.schedules["embed"]})


# ---------------------------------------------------------------------------------------------
# the simulated clusters (in this process)


class TtftScore:
    """Every finished request's time to first token against its deployment's SLO: the simulated
    backend's ``on_request_done`` callback (called with the backend's lock held)."""

    def __init__(self, slo_ms: dict[str, int]) -> None:
        self.slo_ms = slo_ms
        self._lock = threading.Lock()
        self._met: dict[str, int] = {d: 0 for d in slo_ms}
        self._ttfts: dict[str, list[int]] = {d: [] for d in slo_ms}

    def __call__(self, req: Any, now_ms: int) -> None:
        if req.dropped:
            return
        ttft = req.first_token_ms - req.arrival_ms
        dep = local_name(req.deployment)  # the backend knows the id, "<tenant>/<name>"
        with self._lock:
            self._ttfts[dep].append(ttft)
            if ttft <= self.slo_ms[dep]:
                self._met[dep] += 1

    def met(self, deployment: str) -> int:
        with self._lock:
            return self._met.get(deployment, 0)

    def count(self, deployment: str) -> int:
        with self._lock:
            return len(self._ttfts.get(deployment, ()))

    def ttft_lists(self) -> dict[str, list[int]]:
        with self._lock:
            return {d: list(xs) for d, xs in self._ttfts.items()}


@dataclass
class DemoCluster:
    """One zone's simulated cluster (served in this process) and its TTFT score."""

    backend: SimulatedBackend
    score: TtftScore

    def start_load(self, at_ms: int) -> None:
        """Start the schedule at ``at_ms`` (it was configured ``LOAD_OFFSET_S`` late)."""
        self.backend.restart_load(int(at_ms - LOAD_OFFSET_S * 1000))

    def ttft_lists(self) -> dict[str, list[int]]:
        return self.score.ttft_lists()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {local_name(dep): {"arrived": st["arrived"], "completed": st["completed"], "dropped": st["dropped"],
                                  "met": self.score.met(local_name(dep)), "gpu_ms": st["gpu_ms"],
                                  "ttfts": self.score.count(local_name(dep))}
                for dep, st in self.backend.statistics().items()}


def backend_config(index: int, workload: Workload) -> SimulatedConfig:
    return SimulatedConfig.model_validate({
        "seed": index + 1,
        "deployments": [{
            "deployment": qualified_id(t.tenant, t.deployment), "model": MODEL, "cold_start_ms": COLD_START_MS, "warm_start_ms": WARM_START_MS,
            "max_queue_ms": 10_000, "engine": t.engine, **dict(t.simulated),
            "load": [{"at_s": 0, "rps": 0}] + [{"at_s": LOAD_OFFSET_S + at, "rps": rps}
                                               for at, rps in workload.schedules[t.deployment]],
        } for t in TENANTS],
    })


# ---------------------------------------------------------------------------------------------
# what the demo observes


@dataclass
class NodeView:
    node_id: str
    zone: str
    pid: int | None = None
    reachable: bool = False
    role: str = ""
    term: int = 0
    leader: str = ""
    holder: str = ""
    epoch: int = 0
    remaining_ms: int = 0
    applied: int = 0
    note: str = ""


@dataclass
class DeploymentView:
    name: str
    tenant: str
    desired: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    by_zone_state: dict[str, dict[str, int]] = field(default_factory=dict)
    preempted_ids: set[str] = field(default_factory=set)
    peak_serving: int = 0
    peak_desired: int = 0
    decisions: int = 0


@dataclass
class Failover:
    killed: str = ""
    killed_epoch: int = 0
    killed_at_s: float | None = None
    killed_mono: float = 0.0
    new_holder: str = ""
    new_epoch: int = 0
    failover_ms: float | None = None
    new_at_s: float | None = None
    restarted_at_s: float | None = None
    rejoined_at_s: float | None = None


class BreakerMirror:
    """Breaker phases derived from watched instance events, fed exactly as the lease holder feeds
    them (``warmed`` closes, ``warmup_failed`` counts against the deployment on that cluster,
    ``lost`` against the cluster). The API does not expose the replicated breaker records, so this is
    a reconstruction: the phases match, the jittered open periods do not."""

    def __init__(self, clusters: list[str]) -> None:
        from controlplane.domain.records import CLOSED_BREAKER

        self.records: dict[str, Any] = {f"cluster {c}": CLOSED_BREAKER for c in clusters}
        self.failures: dict[str, int] = {k: 0 for k in self.records}
        self._rng = random.Random(0)

    def feed(self, cluster: str, deployment: str, event: str, at_ms: int) -> None:
        from controlplane.core import breaker as br
        from controlplane.domain.records import CLOSED_BREAKER

        ckey, dkey = f"cluster {cluster}", f"{deployment}@{cluster}"
        for key in (ckey, dkey):
            self.records.setdefault(key, CLOSED_BREAKER)
            self.failures.setdefault(key, 0)
        if event == "warmed":
            for key in (ckey, dkey):
                self.records[key] = br.on_success(self.records[key], at_ms)
        elif event in ("warmup_failed", "lost"):
            key = dkey if event == "warmup_failed" else ckey
            self.failures[key] += 1
            self.records[key] = br.on_failure(self.records[key], at_ms, br.DEFAULT_CONFIG, self._rng)

    def phases(self) -> dict[str, str]:
        return {k: r.phase.value for k, r in sorted(self.records.items()) if k.startswith("cluster") or self.failures[k]}


class Watcher(threading.Thread):
    """``Scaling.Watch`` (instances and decisions) on its own client; resumes across the kill."""

    def __init__(self, client_factory, mirror: BreakerMirror, t0: list[float]) -> None:
        super().__init__(name="demo-watch", daemon=True)
        self._factory = client_factory
        self.mirror = mirror
        self.lock = threading.Lock()
        self.recent: deque[str] = deque(maxlen=7)
        self.transitions = 0
        self.decisions: list[tuple[float, str, int, str]] = []
        self.notices: list[str] = []
        self.stopping = threading.Event()
        self._t0 = t0

    def _rel(self) -> float:
        return time.monotonic() - self._t0[0] if self._t0[0] else 0.0

    def run(self) -> None:
        from controlplane.api.v1 import api_pb2

        class _Stop(Exception):
            pass

        def backoff(_round: int) -> None:
            if self.stopping.wait(0.3):
                raise _Stop

        client = self._factory()
        try:
            for ev in client.watch(api_pb2.WatchRequest(kinds=["Instance", "Decision"], all=True), max_rounds=10_000,
                                   backoff=backoff):
                if self.stopping.is_set():
                    return
                if not hasattr(ev, "type"):  # a Notice: the stream moved to another node
                    with self.lock:
                        self.notices.append(ev.message)
                        self.recent.append(f"{self._rel():6.1f}s  watch: {ev.message[:90]}")
                    continue
                with self.lock:
                    if ev.type == "TRANSITION":
                        self.transitions += 1
                        self.mirror.feed(ev.cluster, ev.deployment, ev.event, ev.at_ms)
                        if ev.event in ("create", "warmed", "drain", "warmup_failed", "lost"):
                            self.recent.append(f"{self._rel():6.1f}s  {ev.deployment:5} {ev.name[-18:]:18} "
                                               f"{ev.event:8} -> {ev.to_state.lower():9} {ev.zone}")
                    elif ev.type == "DECIDED":
                        self.decisions.append((self._rel(), ev.deployment, ev.replicas, ev.reason))
                        self.recent.append(f"{self._rel():6.1f}s  {ev.deployment:5} decided {ev.replicas} ({ev.reason[:48]})")
        except _Stop:
            return
        except Exception as exc:  # noqa: BLE001 - the watch is a view; the demo goes on without it
            if not self.stopping.is_set():
                with self.lock:
                    self.notices.append(f"watch ended: {exc}")
        finally:
            client.close()


# ---------------------------------------------------------------------------------------------
# the run


class _Interrupted(Exception):
    pass


@dataclass
class DemoArgs:
    trace: str | None = None
    duration_s: float = DEFAULT_DURATION_S
    live: bool = True
    out: str = "out"


class Demo:
    def __init__(self, args: DemoArgs) -> None:
        self.args = args
        self.duration = float(args.duration_s)
        self.workload = trace_workload(args.trace, self.duration) if args.trace else builtin_workload(self.duration)
        self.out = Path(args.out)
        self.stopping = threading.Event()
        self.signal_name = ""
        self.children: list[subprocess.Popen] = []
        self.procs: dict[str, subprocess.Popen] = {}
        self.servers: list[Any] = []
        self.backends: dict[str, DemoCluster] = {}
        self.nodes: dict[str, NodeView] = {}
        self.deps = {t.deployment: DeploymentView(t.deployment, t.tenant) for t in TENANTS}
        self.failover = Failover()
        self.timeline: list[dict[str, Any]] = []
        self.t0 = [0.0]
        self.start_ms = 0
        self.setup_s = 0.0
        self.base_gpu_ms: dict[str, float] = {}
        self.last_stats: dict[str, dict[str, Any]] = {}
        self.rate_window: deque[tuple[float, dict[str, int]]] = deque(maxlen=8)
        self.watcher: Watcher | None = None
        self.mirror: BreakerMirror | None = None
        self.log_lines: deque[str] = deque(maxlen=4)
        self.base: Path | None = None
        self.last_holder: tuple[str, int] = ("", 0)
        self.unplanned: list[dict[str, Any]] = []
        """Lease changes the demo did not cause (a holder that missed its renewals)."""
        self._shut = False

    # -- plumbing -------------------------------------------------------------------------------
    def _sleep(self, s: float) -> None:
        if self.stopping.wait(s):
            raise _Interrupted

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signal_name = signal.Signals(signum).name
        self.stopping.set()

    def t(self) -> float:
        return time.monotonic() - self.t0[0] if self.t0[0] else 0.0

    def say(self, text: str) -> None:
        self.log_lines.append(text)
        if not self.live:
            print(f"demo: {text}", flush=True)

    def client(self, timeout_s: float = 2.0):
        from controlplane.api.client import ApiClient

        return ApiClient(self.endpoints, token=self.security.admin_token, ca_file=str(self.security.ca_file),
                         timeout_s=timeout_s)

    # -- setup ----------------------------------------------------------------------------------
    def start(self) -> None:
        from adapters.service import serve_adapter
        from controlplane.fencing import FenceVerifier
        from controlplane.cli.up import (
            make_local_security,
            plan_group,
            spawn_coordinator,
            write_tenantctl_config,
        )

        self.base = Path(tempfile.mkdtemp(prefix="controlplane-demo-"))
        self._quiet_logs()
        self.security = make_local_security(self.base)
        self.plan, adapters = plan_group(ZONE_COUNT, self.base, GPUS_PER_CLUSTER, security=self.security)
        self.endpoints = [n.api_address for n in self.plan]
        self.tenantctl = write_tenantctl_config(self.base / "tenantctl.yaml", self.endpoints, self.security)
        token = self.security.adapter_token_file.read_text(encoding="utf-8").strip()
        # The adapters serve mutual TLS (coordinator certificates only) and verify signed epochs, as in `up`.
        tls = (self.security.cert_file.read_bytes(), self.security.key_file.read_bytes())
        client_ca = self.security.ca_file.read_bytes()
        assert self.security.fence_public_key_file is not None
        verifier = FenceVerifier.from_files([self.security.fence_public_key_file])
        slo = {t.deployment: t.slo_ms for t in TENANTS}
        for i, a in enumerate(adapters):
            score = TtftScore(slo)
            backend = SimulatedBackend(a["id"], backend_config(i, self.workload), on_request_done=score)
            self.backends[a["id"]] = DemoCluster(backend, score)
            self.servers.append(serve_adapter(a["id"], a["adapter_address"], self.base / "adapters", backend,
                                              auth_token=token, tls=tls, client_ca=client_ca, fence_verifier=verifier))
        for node in self.plan:
            proc = spawn_coordinator(node, self.base)
            self.children.append(proc)
            self.procs[node.node_id] = proc
            self.nodes[node.node_id] = NodeView(node.node_id, node.zone, proc.pid)
        self.mirror = BreakerMirror([a["id"] for a in adapters])
        self.api = self.client()

    def _quiet_logs(self) -> None:
        """The in-process adapters log JSON lines into ``adapters.log``, not over the live view."""
        import logging

        import structlog

        handle = open(self.base / "adapters.log", "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the run
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
                        structlog.processors.JSONRenderer(sort_keys=True)],
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
            logger_factory=structlog.PrintLoggerFactory(handle), cache_logger_on_first_use=False)
        logging.getLogger().setLevel(logging.WARNING)

    def wait_for_lease(self) -> None:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            self.poll_status()
            holders = {n.holder for n in self.nodes.values() if n.reachable and n.remaining_ms > 0}
            if len(holders) == 1 and all(n.reachable and n.holder in holders for n in self.nodes.values()):
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"demo: no lease holder after {SETUP_TIMEOUT_S:.0f} s (logs in {self.base})")
            self._check_children()
            self._sleep(0.2)

    def _check_children(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and name != self.failover.killed:
                raise ControlPlaneError(f"demo: coordinator {name} exited with status {proc.returncode} "
                                        f"(log: {self.base / (name + '.log')})")

    def create_tenants(self) -> None:
        from controlplane.api.client import ApiError, Unreachable
        from controlplane.api.v1 import api_pb2

        deadline = time.monotonic() + SETUP_TIMEOUT_S
        for t in TENANTS:
            tenant = api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name=t.tenant), spec=api_pb2.TenantSpec(
                priority=t.priority, quota={POOL: t.quota}, borrow_limit={POOL: t.borrow} if t.borrow else {},
                slo=api_pb2.Slo(ttft_p99_ms=t.slo_ms)))
            dep = api_pb2.Deployment(metadata=api_pb2.ObjectMeta(name=t.deployment), spec=api_pb2.DeploymentSpec(
                tenant=t.tenant, engine=t.engine, model=MODEL, pool=POOL, min_replicas=t.min_replicas,
                max_replicas=t.max_replicas, warm_pool=0, policy=api_pb2.ScalingPolicy(**POLICY)))
            for service, method, request in (("Tenants", "CreateTenant", api_pb2.CreateTenantRequest(tenant=tenant)),
                                             ("Deployments", "ApplyDeployment", api_pb2.ApplyDeploymentRequest(deployment=dep))):
                while True:
                    try:
                        self.api.call(service, method, request, idempotent=service != "Tenants")
                        break
                    except ApiError as exc:
                        if exc.code.name == "ALREADY_EXISTS":
                            break  # an earlier attempt whose answer was lost did create it
                        if time.monotonic() > deadline or exc.code.name not in ("UNAUTHENTICATED", "UNAVAILABLE"):
                            raise ControlPlaneError(f"demo: {method} {t.tenant}: {exc}") from None
                    except Unreachable as exc:
                        if time.monotonic() > deadline:
                            raise ControlPlaneError(f"demo: {method} {t.tenant}: {exc}") from None
                    self._sleep(0.3)
            self.say(f"tenant {t.tenant} (priority {t.priority}, quota {t.quota} GPUs, borrow {t.borrow}, "
                     f"TTFT SLO {t.slo_ms} ms) with deployment {t.deployment} created through the API")

    def wait_for_minimums(self) -> None:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            self.poll_deployments()
            if all(_serving(d.by_state) >= t.min_replicas for t, d in zip(TENANTS, self.deps.values())):
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"demo: the minimum replicas never became ready (logs in {self.base})")
            self._check_children()
            self._sleep(0.25)

    def start_load(self) -> None:
        from controlplane.runtime.clock import wall_ms

        self.start_ms = wall_ms()
        for b in self.backends.values():
            b.start_load(self.start_ms)
        self.t0[0] = time.monotonic()
        stats = self.stats()
        self.base_gpu_ms = {d: s["gpu_ms"] for d, s in stats.items()}

    # -- polling --------------------------------------------------------------------------------
    def poll_status(self, nodes: list[str] | None = None, timeout_s: float = 0.5) -> None:
        from controlplane.api.client import ApiError, Unreachable
        from controlplane.api.v1 import admin_pb2

        for plan in self.plan:
            if nodes is not None and plan.node_id not in nodes:
                continue
            view = self.nodes[plan.node_id]
            try:
                r = self.api.call("Admin", "Status", admin_pb2.StatusRequest(), endpoint=plan.api_address,
                                  timeout_s=timeout_s)
            except (ApiError, Unreachable):
                view.reachable = False
                continue
            view.reachable, view.role, view.term, view.leader = True, r.role, r.term, r.leader_id
            view.holder, view.epoch, view.remaining_ms, view.applied = (r.lease_holder, r.lease_epoch,
                                                                        r.lease_remaining_ms, r.applied_index)
            view.pid = r.pid

    def holder(self) -> NodeView | None:
        live = [n for n in self.nodes.values() if n.reachable and n.remaining_ms > 0 and n.holder == n.node_id]
        if live:
            return max(live, key=lambda n: n.epoch)
        seen = [n for n in self.nodes.values() if n.reachable and n.holder]
        return self.nodes.get(max(seen, key=lambda n: n.epoch).holder) if seen else None

    def poll_deployments(self) -> None:
        from controlplane.api.client import ApiError, Unreachable
        from controlplane.api.v1 import api_pb2

        try:
            listing = self.api.call("Deployments", "ListDeployments", api_pb2.ListRequest())
            for item in listing.items:
                d = self.deps.get(item.metadata.name)
                if d is None:
                    continue
                d.desired = item.status.desired_replicas
                d.by_state = dict(item.status.replicas_by_state)
                d.peak_desired = max(d.peak_desired, d.desired)
                if self.t0[0]:
                    d.peak_serving = max(d.peak_serving, _serving(d.by_state))
            for d in self.deps.values():
                got = self.api.call("Deployments", "GetDeployment", api_pb2.GetRequest(name=qualified_id(d.tenant, d.name)))
                zones: dict[str, dict[str, int]] = {}
                for inst in got.status.instances:
                    zones.setdefault(inst.zone, {}).setdefault(inst.state, 0)
                    zones[inst.zone][inst.state] += 1
                    if inst.preempted:
                        d.preempted_ids.add(inst.id)
                d.by_zone_state = zones
        except (ApiError, Unreachable) as exc:
            self.log_lines.append(f"{self.t():6.1f}s  read failed, retrying: {str(exc)[:80]}")

    def stats(self) -> dict[str, dict[str, Any]]:
        total: dict[str, dict[str, Any]] = {t.deployment: {"arrived": 0, "completed": 0, "dropped": 0, "met": 0,
                                                             "gpu_ms": 0.0} for t in TENANTS}
        for b in self.backends.values():
            for dep, s in b.snapshot().items():
                for k in total[dep]:
                    total[dep][k] += s[k]
        return total

    def sample(self) -> None:
        now = self.t()
        stats = self.stats()
        self.last_stats = stats
        self.rate_window.append((now, {d: s["arrived"] for d, s in stats.items()}))
        holder = self.holder()
        if holder is not None and holder.node_id != self.last_holder[0] and holder.epoch > self.last_holder[1]:
            f = self.failover
            if self.last_holder[0] and not (f.killed and self.last_holder[0] == f.killed and f.new_holder == holder.node_id):
                self.unplanned.append({"t_s": round(now, 2), "from": self.last_holder[0], "to": holder.node_id,
                                       "epoch": holder.epoch})
                self.say(f"lease moved from {self.last_holder[0]} to {holder.node_id} (epoch {holder.epoch}) without "
                         "a kill: a renewal missed its deadline (CPU starvation?)")
            self.last_holder = (holder.node_id, holder.epoch)
        point: dict[str, Any] = {"t_s": round(now, 2), "holder": holder.node_id if holder else "",
                                 "epoch": holder.epoch if holder else 0}
        for name, d in self.deps.items():
            point[name] = {"desired": d.desired, "serving": _serving(d.by_state),
                           "starting": d.by_state.get("pending", 0) + d.by_state.get("warming", 0),
                           "draining": d.by_state.get("draining", 0), "offered_rps": self.offered(name, now),
                           "arrival_rps": round(self.arrival_rate(name), 2), "preempted": len(d.preempted_ids),
                           "slo": _attainment(stats[name]),
                           "serving_by_zone": {z: _serving(st) for z, st in sorted(d.by_zone_state.items())}}
        self.timeline.append(point)

    def offered(self, deployment: str, t_s: float) -> float:
        return round(self.workload.rate(deployment, t_s) * ZONE_COUNT, 3)

    def arrival_rate(self, deployment: str) -> float:
        if len(self.rate_window) < 2:
            return 0.0
        (t_a, a), (t_b, b) = self.rate_window[0], self.rate_window[-1]
        return (b[deployment] - a[deployment]) / max(1e-3, t_b - t_a)

    # -- the failover -----------------------------------------------------------------------------
    def kill_leader(self) -> None:
        holder = self.holder()
        if holder is None:
            self.say("no lease holder to kill right now; trying again shortly")
            return
        f = self.failover
        f.killed, f.killed_epoch = holder.node_id, holder.epoch
        proc = self.procs[holder.node_id]
        f.killed_mono = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        f.killed_at_s = self.t()
        self.nodes[holder.node_id].note = "killed"
        self.say(f"SIGKILL lease holder {holder.node_id} (epoch {holder.epoch}, pid {proc.pid}) at {f.killed_at_s:.1f} s")

    def watch_failover(self) -> None:
        """Poll the survivors until one reports a new lease holder with a newer epoch."""
        f = self.failover
        survivors = [n for n in self.nodes if n != f.killed]
        self.poll_status(survivors, timeout_s=0.3)
        for n in survivors:
            v = self.nodes[n]
            if v.reachable and v.holder and v.holder != f.killed and v.epoch > f.killed_epoch and v.remaining_ms > 0:
                f.failover_ms = (time.monotonic() - f.killed_mono) * 1000
                f.new_holder, f.new_epoch, f.new_at_s = v.holder, v.epoch, self.t()
                self.say(f"failover: {v.holder} holds the lease (epoch {v.epoch}) {f.failover_ms:.0f} ms after the kill")
                return

    def restart_killed(self) -> None:
        from controlplane.cli.up import spawn_coordinator

        f = self.failover
        node = next(n for n in self.plan if n.node_id == f.killed)
        proc = spawn_coordinator(node, self.base)
        self.children.append(proc)
        self.procs[f.killed] = proc
        f.restarted_at_s = self.t()
        self.nodes[f.killed].note = "restarted"
        self.nodes[f.killed].pid = proc.pid
        self.say(f"restarted {f.killed} (pid {proc.pid}); it rejoins as a follower")

    # -- the main loop ----------------------------------------------------------------------------
    def run(self) -> int:
        self.live = self.args.live and sys.stdout.isatty()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        setup_t0 = time.monotonic()
        try:
            print(f"controlplane demo: {ZONE_COUNT} coordinators + {ZONE_COUNT} simulated clusters on 127.0.0.1, "
                  f"workload {self.workload.name}, {self.duration:.0f} s; Ctrl-C stops everything", flush=True)
            self.start()
            print(f"  state and logs in {self.base}; while it runs: export TENANTCTL_CONFIG={self.tenantctl}",
                  flush=True)
            self.wait_for_lease()
            self.create_tenants()
            self.wait_for_minimums()
            self.watcher = Watcher(lambda: self.client(timeout_s=3.0), self.mirror, self.t0)
            self.watcher.start()
            self.setup_s = time.monotonic() - setup_t0
            self.start_load()
            self.say(f"group up in {self.setup_s:.1f} s; workload started")
            self.loop()
            self.sample()
        except _Interrupted:
            print(f"controlplane demo: {self.signal_name or 'interrupted'}: stopping everything", file=sys.stderr)
            self.shutdown()
            if self.base is not None:
                shutil.rmtree(self.base, ignore_errors=True)
            return 130
        finally:
            self.shutdown()
            for s, h in old.items():
                signal.signal(s, h)
        summary = self.summary()
        self.print_summary(summary)
        ok = summary["failover"]["new_holder"] and not summary["problems"]
        if ok:
            shutil.rmtree(self.base, ignore_errors=True)
        else:
            print(f"controlplane demo: logs kept in {self.base}", file=sys.stderr)
        return 0 if ok else 1

    def loop(self) -> None:
        from contextlib import nullcontext

        live_ctx: Any = nullcontext()
        if self.live:
            from rich.live import Live

            live_ctx = Live(self.render(), refresh_per_second=4, transient=False, auto_refresh=False)
        next_view = next_plain = 0.0
        f = self.failover
        with live_ctx as live:
            while True:
                now = self.t()
                if now >= self.duration:
                    break
                if f.killed_at_s is None and now >= KILL_AT * self.duration:
                    self.poll_status()
                    self.kill_leader()
                if f.killed_at_s is not None and f.failover_ms is None:
                    self.watch_failover()
                    if f.failover_ms is None and time.monotonic() - f.killed_mono > 30:
                        self.say("no new lease holder 30 s after the kill")
                        f.failover_ms = float("nan")
                elif f.new_at_s is not None and f.restarted_at_s is None and now >= f.new_at_s + RESTART_AFTER_S:
                    self.restart_killed()
                if now >= next_view:
                    next_view = now + 0.5
                    self.poll_status()
                    self.poll_deployments()
                    self.sample()
                    if (f.restarted_at_s is not None and f.rejoined_at_s is None
                            and self.nodes[f.killed].reachable and self.nodes[f.killed].holder == f.new_holder):
                        f.rejoined_at_s = self.t()
                        self.nodes[f.killed].note = "rejoined"
                        self.say(f"{f.killed} rejoined (follows {f.new_holder})")
                    if live is not None:
                        live.update(self.render(), refresh=True)
                    elif now >= next_plain:
                        next_plain = now + PLAIN_EVERY_S
                        print(self.plain_line(), flush=True)
                pending_failover = f.killed_at_s is not None and f.failover_ms is None
                self._sleep(0.05 if pending_failover else 0.1)

    # -- views ----------------------------------------------------------------------------------
    def plain_line(self) -> str:
        h = self.holder()
        parts = [f"t={self.t():5.1f}s", f"lease {h.node_id}@{h.epoch}" if h else "lease -"]
        for name, d in self.deps.items():
            s = self.last_stats.get(name, {})
            parts.append(f"{name}: desired {d.desired} serving {_serving(d.by_state)} "
                         f"load {self.arrival_rate(name):.1f}/s SLO {_pct(_attainment(s))} preempted {len(d.preempted_ids)}")
        return "demo: " + " | ".join(parts)

    def render(self):
        from rich import box
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table

        t = self.t()
        h = self.holder()
        head = (f"[b]controlplane demo[/b]  t = {t:5.1f} / {self.duration:.0f} s   workload: {self.workload.name}   "
                f"lease: [b]{h.node_id if h else '-'}[/b] epoch {h.epoch if h else '-'}")
        nodes = Table(title="coordinators (Admin.Status)", box=box.SIMPLE_HEAD, expand=True, title_justify="left",
                      padding=(0, 1))
        for col in ("node", "zone", "pid", "role", "term", "raft leader", "lease holder@epoch", "lease left here",
                    "applied", ""):
            nodes.add_column(col)
        for n in self.nodes.values():
            if not n.reachable:
                nodes.add_row(n.node_id, n.zone, str(n.pid or "-"), "[red]down[/red]", "", "", "", "", "", n.note)
                continue
            role = f"[green]{n.role}[/green]" if n.role == "leader" else n.role
            nodes.add_row(n.node_id, n.zone, str(n.pid), role, str(n.term), n.leader or "-",
                          f"{n.holder or '-'}@{n.epoch}", f"{n.remaining_ms} ms", str(n.applied), n.note)
        f = self.failover
        fo = "failover: at 55 % of the run the lease holder is SIGKILLed"
        if f.killed_at_s is not None:
            fo = f"failover: killed {f.killed} (epoch {f.killed_epoch}) at {f.killed_at_s:.1f} s"
            if f.failover_ms is not None and not math.isnan(f.failover_ms):
                fo += f" -> {f.new_holder} epoch {f.new_epoch} after [b]{f.failover_ms:.0f} ms[/b]"
            if f.restarted_at_s is not None:
                fo += f"; restarted at {f.restarted_at_s:.1f} s" + (", rejoined" if f.rejoined_at_s else "")
        zones = [n.zone for n in self.plan]
        deps = Table(title="deployments (ListDeployments / GetDeployment; load and SLO from the simulated clusters)",
                     box=box.SIMPLE_HEAD, expand=True, title_justify="left", padding=(0, 1))
        for col in ["deployment", "tenant", "desired", "by state", *zones, "load /s", "offered", "preempted",
                    "SLO so far", "GPU-s"]:
            deps.add_column(col)
        for tp in TENANTS:
            d = self.deps[tp.deployment]
            s = self.last_stats.get(d.name, {})
            gpu_s = (s.get("gpu_ms", 0.0) - self.base_gpu_ms.get(d.name, 0.0)) / 1000 if s else 0.0
            deps.add_row(d.name, f"{tp.tenant} (p{tp.priority})", str(d.desired), _states(d.by_state),
                         *[_states(d.by_zone_state.get(z, {})) for z in zones],
                         f"{self.arrival_rate(d.name):.1f}", f"{self.offered(d.name, t):.1f}", str(len(d.preempted_ids)),
                         f"{_pct(_attainment(s))} (<= {tp.slo_ms} ms)", f"{gpu_s:.0f}")
        parts: list[str] = []
        recent: list[str] = []
        if self.watcher is not None and self.mirror is not None:
            with self.watcher.lock:
                for key, phase in self.mirror.phases().items():
                    colour = "green" if phase == "closed" else "red"
                    fails = self.mirror.failures.get(key, 0)
                    parts.append(f"{key} [{colour}]{phase}[/{colour}]" + (f" ({fails} failures)" if fails else ""))
                recent = list(self.watcher.recent)
        breakers = ("[b]breakers[/b] (derived from watched instance events; the API does not expose them): "
                    + (", ".join(parts) or "-"))
        events = "\n".join(recent) or "(waiting for events)"
        log = "\n".join(self.log_lines)
        return Group(Panel(head + "\n" + fo + "\n" + breakers), nodes, deps,
                     Panel(events, title="Scaling.Watch (latest)", title_align="left"),
                     Panel(log, title="demo", title_align="left"))

    # -- the end --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        from controlplane.cli.up import stop_children

        if self._shut:
            return
        self._shut = True
        if self.watcher is not None:
            self.watcher.stopping.set()
        stop_children(self.children)
        for server in self.servers:
            with contextlib.suppress(Exception):  # best effort on the way out
                server.stop(0.5)
        api = getattr(self, "api", None)
        if api is not None:
            api.close()

    def summary(self) -> dict[str, Any]:
        f = self.failover
        stats = self.last_stats or {}
        tenants = {}
        problems = []
        ttfts: dict[str, list[int]] = {t.deployment: [] for t in TENANTS}
        for b in self.backends.values():
            for dep, xs in b.ttft_lists().items():
                ttfts.setdefault(dep, []).extend(xs)
        decisions = self.watcher.decisions if self.watcher is not None else []
        for tp in TENANTS:
            d = self.deps[tp.deployment]
            s = stats.get(tp.deployment, {})
            xs = sorted(ttfts[tp.deployment])
            tenants[tp.tenant] = {
                "priority": tp.priority, "deployment": tp.deployment, "engine": tp.engine, "quota_gpus": tp.quota,
                "borrow_gpus": tp.borrow,
                "slo_ttft_ms": tp.slo_ms, "requests": s.get("arrived", 0), "completed": s.get("completed", 0),
                "dropped": s.get("dropped", 0), "slo_met": s.get("met", 0), "slo_attainment": _attainment(s),
                "ttft_p50_ms": xs[len(xs) // 2] if xs else None,
                "ttft_p99_ms": xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else None,
                "ttft_mean_ms": round(statistics.fmean(xs), 1) if xs else None,
                "gpu_seconds": round((s.get("gpu_ms", 0.0) - self.base_gpu_ms.get(tp.deployment, 0.0)) / 1000, 1),
                "min_replicas": tp.min_replicas, "peak_serving_replicas": d.peak_serving,
                "peak_desired_replicas": d.peak_desired, "preempted_instances": len(d.preempted_ids),
                "decisions": sum(1 for x in decisions if x[1] == tp.deployment),
            }
            if d.peak_serving <= tp.min_replicas:
                problems.append(f"{tp.deployment} never scaled above its minimum ({tp.min_replicas})")
        if not f.new_holder:
            problems.append("no failover was observed")
        failover_ms = f.failover_ms if f.failover_ms is not None and not math.isnan(f.failover_ms) else None
        return {
            "workload": self.workload.name, "duration_s": self.duration, "setup_s": round(self.setup_s, 1),
            "zones": ZONE_COUNT, "gpus_per_cluster": GPUS_PER_CLUSTER,
            "failover": {"killed": f.killed, "killed_epoch": f.killed_epoch, "killed_at_s": _r(f.killed_at_s),
                         "new_holder": f.new_holder, "new_epoch": f.new_epoch, "failover_ms": _r(failover_ms),
                         "restarted_at_s": _r(f.restarted_at_s), "rejoined_at_s": _r(f.rejoined_at_s)},
            "tenants": tenants,
            "unplanned_lease_changes": self.unplanned,
            "preemptions": sum(len(d.preempted_ids) for d in self.deps.values()),
            "breakers": self.mirror.phases() if self.mirror else {},
            "watch": {"transitions": self.watcher.transitions if self.watcher else 0, "decisions": len(decisions),
                      "notices": list(self.watcher.notices) if self.watcher else []},
            "problems": problems,
            "coordinator_pids": [ch.pid for ch in self.children],
            "timeline": self.timeline,
        }

    def print_summary(self, summary: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.table import Table

        self.out.mkdir(parents=True, exist_ok=True)
        json_path, png_path = self.out / "demo-summary.json", self.out / "demo.png"
        json_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        write_demo_plot(summary, png_path)
        console = Console() if sys.stdout.isatty() else Console(width=150)
        table = Table(title=f"controlplane demo: {summary['workload']}, {summary['duration_s']:.0f} s "
                            f"(+{summary['setup_s']:.0f} s start-up)", title_justify="left")
        for col in ("tenant", "priority", "deployment", "requests", "dropped", "SLO (TTFT)", "attainment",
                    "TTFT p50", "TTFT p99", "GPU-s", "replicas min/peak", "preempted"):
            table.add_column(col, justify="right" if col not in ("tenant", "deployment") else "left")
        for name, t in summary["tenants"].items():
            table.add_row(name, str(t["priority"]), t["deployment"], str(t["requests"]), str(t["dropped"]),
                          f"<= {t['slo_ttft_ms']} ms", _pct(t["slo_attainment"]), _ms(t["ttft_p50_ms"]),
                          _ms(t["ttft_p99_ms"]), f"{t['gpu_seconds']:.0f}",
                          f"{t['min_replicas']}/{t['peak_serving_replicas']}", str(t["preempted_instances"]))
        console.print(table)
        fo = summary["failover"]
        if fo["new_holder"]:
            console.print(f"failover: SIGKILL of {fo['killed']} (epoch {fo['killed_epoch']}) at {fo['killed_at_s']} s -> "
                          f"{fo['new_holder']} holds epoch {fo['new_epoch']} after {fo['failover_ms']:.0f} ms; "
                          f"{fo['killed']} restarted at {fo['restarted_at_s']} s"
                          + (f", rejoined at {fo['rejoined_at_s']} s" if fo["rejoined_at_s"] is not None else ""))
        console.print(f"preemptions: {summary['preemptions']} instances drained for a higher-priority tenant; "
                      f"breakers: {', '.join(f'{k} {v}' for k, v in summary['breakers'].items()) or '-'}")
        for u in summary["unplanned_lease_changes"]:
            console.print(f"[yellow]note:[/yellow] at {u['t_s']} s the lease moved from {u['from']} to {u['to']} "
                          f"(epoch {u['epoch']}) without a kill (a holder that missed its renewals)")
        for p in summary["problems"]:
            console.print(f"[red]problem:[/red] {p}")
        console.print(f"summary: {json_path}\nplot:    {png_path}")


def write_demo_plot(summary: dict[str, Any], path: Path) -> None:
    """Per deployment: serving / starting / draining replicas and the desired count against the
    offered and measured load; the kill and the new lease holder marked. Below: SLO attainment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = summary["timeline"]
    names = [t["deployment"] for t in summary["tenants"].values()]
    fig, axes = plt.subplots(len(names) + 1, 1, figsize=(11, 3.2 * (len(names) + 1)), sharex=True)
    xs = [p["t_s"] for p in tl]
    fo = summary["failover"]
    for ax, (tenant, info) in zip(axes, summary["tenants"].items()):
        dep = info["deployment"]
        serving = [p[dep]["serving"] for p in tl]
        starting = [p[dep]["starting"] for p in tl]
        draining = [p[dep]["draining"] for p in tl]
        ax.stackplot(xs, serving, starting, draining, labels=["serving (ready+busy)", "starting", "draining"],
                     colors=["#2ca02c", "#ffbb78", "#ff9896"], step="post")
        ax.step(xs, [p[dep]["desired"] for p in tl], where="post", color="black", lw=1, label="desired")
        ax.set_ylabel("replicas")
        ax.set_title(f"{dep} (tenant {tenant}, priority {info['priority']}): "
                     f"{info['preempted_instances']} preempted, SLO attainment {_pct(info['slo_attainment'])}",
                     fontsize=10, loc="left")
        load = ax.twinx()
        load.plot(xs, [p[dep]["offered_rps"] for p in tl], color="#1f77b4", lw=1, ls="--", label="offered load")
        load.plot(xs, [p[dep]["arrival_rps"] for p in tl], color="#1f77b4", lw=0.8, label="measured arrivals")
        load.set_ylabel("requests / s")
        load.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = load.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=7, ncol=3)
    slo_ax = axes[-1]
    for tenant, info in summary["tenants"].items():
        ys = [p[info["deployment"]]["slo"] for p in tl]
        slo_ax.plot(xs, [y * 100 if y is not None else float("nan") for y in ys],
                    label=f"{tenant} (TTFT <= {info['slo_ttft_ms']} ms)")
    lows = [p[i["deployment"]]["slo"] for p in tl for i in summary["tenants"].values()]
    low = min((x for x in lows if x is not None), default=1.0)
    slo_ax.set_ylim(max(0.0, 100 * low - 5), 100.5)
    slo_ax.set_ylabel("SLO attainment so far (%)")
    slo_ax.set_xlabel("seconds since the workload started")
    slo_ax.legend(loc="lower left", fontsize=7)
    for ax in axes:
        for u in summary.get("unplanned_lease_changes", []):
            ax.axvline(u["t_s"], color="orange", lw=1, ls=":")
        if fo["killed_at_s"] is not None:
            ax.axvline(fo["killed_at_s"], color="red", lw=1)
            end = fo["killed_at_s"] + (fo["failover_ms"] or 0) / 1000
            ax.axvspan(fo["killed_at_s"], end, color="red", alpha=0.15)
    if fo["killed_at_s"] is not None:
        label = f"SIGKILL {fo['killed']}"
        if fo["failover_ms"] is not None:
            label += f" -> {fo['new_holder']} after {fo['failover_ms']:.0f} ms"
        axes[0].annotate(label, xy=(fo["killed_at_s"], 0.04), xycoords=("data", "axes fraction"), xytext=(4, 0),
                         textcoords="offset points", color="red", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def _serving(by_state: dict[str, int]) -> int:
    return by_state.get("ready", 0) + by_state.get("busy", 0)


def _states(by_state: dict[str, int]) -> str:
    short = {"pending": "P", "warming": "W", "ready": "R", "busy": "B", "standby": "S", "draining": "D"}
    parts = [f"{short.get(k, k)}{v}" for k, v in sorted(by_state.items(), key=lambda kv: list(short).index(kv[0])
                                                       if kv[0] in short else 99) if v]
    return " ".join(parts) or "-"


def _attainment(s: dict[str, Any]) -> float | None:
    finished = s.get("completed", 0) + s.get("dropped", 0)
    return s.get("met", 0) / finished if finished else None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} ms"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def run_cli(trace: str | None, duration_s: float, live: bool, out: str) -> int:
    if duration_s < 20:
        raise ControlPlaneError(f"--duration-s: must be >= 20 (the bursts and the failover need time), got {duration_s:g}")
    if trace is not None and not Path(trace).is_file():
        raise ControlPlaneError(f"--trace: {trace}: no such file")
    return Demo(DemoArgs(trace=trace, duration_s=duration_s, live=live, out=out)).run()
