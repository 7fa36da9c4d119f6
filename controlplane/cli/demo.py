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
  admin token), and **a bursty workload** (or an Azure trace's arrival shape): see
  :mod:`controlplane.cli.demo_load`. The clusters hold 18 GPUs, so when ``chat`` bursts it takes back
  the GPUs ``bronze`` borrowed: preemptions;
* at 55 % of the run the lease holder is **SIGKILLed**; the failover time is measured from the kill to
  the first survivor reporting a new lease holder with a newer epoch; the killed coordinator is
  restarted a few seconds later and rejoins.

The live view (:mod:`controlplane.cli.demo_view`; rich, 2 Hz; plain status lines when stdout is not a
terminal or with ``--no-live``) reads ``Admin.Status`` of every node, ``Deployments.ListDeployments``
and ``GetDeployment`` (replicas by state and zone, preempted instances), a ``Scaling.Watch`` stream
(:mod:`controlplane.cli.demo_watch`; it resumes on another node across the kill; breakers derived
from it) and the backends' request statistics (load, TTFT p99 over the last ``TTFT_WINDOW_S``, SLO
attainment). ``--record-view FILE`` keeps every frame for ``python -m controlplane.cli.demo_view FILE``.

At the end: a summary table, ``OUT/demo-summary.json`` and ``OUT/demo.png``
(:mod:`controlplane.cli.demo_plot`: replicas against load per deployment, every tenant's TTFT p99
against its SLO, the failover and the preemptions marked).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.simulated import SimulatedBackend
from controlplane.cli.demo_load import (
    GPUS_PER_CLUSTER,
    MODEL,
    POLICY,
    POOL,
    TENANTS,
    ZONE_COUNT,
    DemoCluster,
    TtftScore,
    backend_config,
    builtin_workload,
    trace_workload,
)
from controlplane.cli.demo_view import (
    BreakerRow,
    DeploymentRow,
    EventRow,
    LiveFrame,
    NodeRow,
    ViewState,
    nearest_rank_p99,
    plain_line,
    serving,
)
from controlplane.cli.demo_watch import BreakerMirror, DeploymentView, Failover, Watcher
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.ids import qualified_id

KILL_AT = 0.55
RESTART_AFTER_S = 3.0
"""The killed coordinator is restarted this long after the new lease holder appeared."""
DEFAULT_DURATION_S = 150
SETUP_TIMEOUT_S = 60.0
PLAIN_EVERY_S = 5.0
TTFT_WINDOW_S = 5.0
"""The live view's and the plot's TTFT p99 is over the requests that finished this long before."""


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
    record_view: str | None = None
    """A JSON line per live-view frame (``python -m controlplane.cli.demo_view FILE`` plays it back)."""


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
        self.nodes: dict[str, NodeRow] = {}
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
        self.ttft_window: dict[str, deque[tuple[float, list[int]]]] = {t.deployment: deque() for t in TENANTS}
        """Per deployment: (sample time, the TTFTs and drop waits that came in since the sample before)."""
        self.ttft_p99: dict[str, float | None] = {t.deployment: None for t in TENANTS}
        self.preemptions: list[dict[str, Any]] = []
        """Per poll that saw newly preempted instances: when, whose, which."""
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
            self.nodes[node.node_id] = NodeRow(node.node_id, node.zone, proc.pid)
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
            self.say(f"tenant {t.tenant} (priority {t.priority}, quota {t.quota} + borrow {t.borrow} GPUs, "
                     f"TTFT SLO {t.slo_ms:,} ms), deployment {t.deployment}: created")

    def wait_for_minimums(self) -> None:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            self.poll_deployments()
            if all(serving(d.by_state) >= t.min_replicas for t, d in zip(TENANTS, self.deps.values())):
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

    def holder(self) -> NodeRow | None:
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
                    d.peak_serving = max(d.peak_serving, serving(d.by_state))
            for d in self.deps.values():
                got = self.api.call("Deployments", "GetDeployment", api_pb2.GetRequest(name=qualified_id(d.tenant, d.name)))
                zones: dict[str, dict[str, int]] = {}
                fresh = []
                for inst in got.status.instances:
                    zones.setdefault(inst.zone, {}).setdefault(inst.state, 0)
                    zones[inst.zone][inst.state] += 1
                    if inst.preempted and inst.id not in d.preempted_ids:
                        d.preempted_ids.add(inst.id)
                        fresh.append(inst.id)
                d.by_zone_state = zones
                if fresh:
                    self.preemptions.append({"t_s": round(self.t(), 2), "deployment": d.name, "tenant": d.tenant,
                                             "count": len(fresh), "instances": sorted(fresh)})
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
        self.sample_ttfts(now)
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
            point[name] = {"desired": d.desired, "serving": serving(d.by_state),
                           "starting": d.by_state.get("pending", 0) + d.by_state.get("warming", 0),
                           "draining": d.by_state.get("draining", 0), "offered_rps": self.offered(name, now),
                           "arrival_rps": round(self.arrival_rate(name), 2), "preempted": len(d.preempted_ids),
                           "slo": _attainment(stats[name]), "ttft_p99_ms": self.ttft_p99[name],
                           "serving_by_zone": {z: serving(st) for z, st in sorted(d.by_zone_state.items())}}
        self.timeline.append(point)

    def sample_ttfts(self, now: float) -> None:
        """TTFT p99 per deployment over the last ``TTFT_WINDOW_S`` (drops count with their wait)."""
        fresh: dict[str, list[int]] = {d: [] for d in self.ttft_window}
        for b in self.backends.values():
            for dep, xs in b.score.take_recent().items():
                fresh[dep].extend(xs)
        for dep, window in self.ttft_window.items():
            window.append((now, fresh[dep]))
            while window and window[0][0] <= now - TTFT_WINDOW_S:
                window.popleft()
            self.ttft_p99[dep] = nearest_rank_p99([x for _, xs in window for x in xs])

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
            # one short line each, so that a 100-column terminal wraps none of them
            print(f"controlplane demo: {ZONE_COUNT} coordinators + {ZONE_COUNT} simulated clusters on 127.0.0.1\n"
                  f"  workload {self.workload.name}, {self.duration:.0f} s; Ctrl-C stops everything", flush=True)
            self.start()
            print(f"  state and logs in {self.base}\n  while it runs: export TENANTCTL_CONFIG={self.tenantctl}",
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

            live_ctx = Live(LiveFrame(self.view_state()), refresh_per_second=4, transient=False, auto_refresh=False)
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
                    state = self.view_state()
                    self.record(state)
                    if live is not None:
                        live.update(LiveFrame(state), refresh=True)
                    elif now >= next_plain:
                        next_plain = now + PLAIN_EVERY_S
                        print(plain_line(state), flush=True)
                pending_failover = f.killed_at_s is not None and f.failover_ms is None
                self._sleep(0.05 if pending_failover else 0.1)

    # -- the view ------------------------------------------------------------------------------
    def view_state(self) -> ViewState:
        t, h = self.t(), self.holder()
        deployments = []
        for tp in TENANTS:
            d, s = self.deps[tp.deployment], self.last_stats.get(tp.deployment, {})
            gpu_s = (s.get("gpu_ms", 0.0) - self.base_gpu_ms.get(d.name, 0.0)) / 1000 if s else 0.0
            deployments.append(DeploymentRow(
                d.name, tp.tenant, tp.priority, tp.slo_ms, d.desired, dict(d.by_state),
                {z: dict(st) for z, st in d.by_zone_state.items()}, len(d.preempted_ids),
                round(self.arrival_rate(d.name), 2), self.offered(d.name, t), self.ttft_p99[d.name], _attainment(s),
                s.get("dropped", 0), round(gpu_s, 1)))
        breakers: list[BreakerRow] = []
        events: tuple[EventRow, ...] = ()
        if self.watcher is not None and self.mirror is not None:
            with self.watcher.lock:
                breakers = [BreakerRow(k, p, self.mirror.failures.get(k, 0)) for k, p in self.mirror.phases().items()]
                events = tuple(self.watcher.recent)
        nodes = tuple(dataclasses.replace(n) for n in self.nodes.values())  # copies: polling goes on
        return ViewState(round(t, 1), self.duration, self.workload.name, h.node_id if h else "", h.epoch if h else 0,
                         self.failover_line(), tuple(n.zone for n in self.plan), nodes, tuple(deployments),
                         tuple(breakers), events, tuple(self.log_lines), TTFT_WINDOW_S)

    def failover_line(self) -> str:
        f = self.failover
        if f.killed_at_s is None:
            return f"failover: at {KILL_AT:.0%} of the run the lease holder is SIGKILLed"
        line = f"failover: killed {f.killed} (epoch {f.killed_epoch}) at {f.killed_at_s:.1f} s"
        if f.failover_ms is not None and not math.isnan(f.failover_ms):
            line += f" -> {f.new_holder} epoch {f.new_epoch} after [b]{f.failover_ms:.0f} ms[/b]"
        if f.restarted_at_s is not None:
            line += f"; restarted at {f.restarted_at_s:.1f} s" + (", rejoined" if f.rejoined_at_s else "")
        return line

    def record(self, state: ViewState) -> None:
        if self.args.record_view:
            with open(self.args.record_view, "a", encoding="utf-8") as fh:
                fh.write(state.to_json() + "\n")

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
            "preemption_events": self.preemptions,
            "ttft_window_s": TTFT_WINDOW_S,
            "breakers": self.mirror.phases() if self.mirror else {},
            "watch": {"transitions": self.watcher.transitions if self.watcher else 0, "decisions": len(decisions),
                      "notices": list(self.watcher.notices) if self.watcher else []},
            "problems": problems,
            "coordinator_pids": [ch.pid for ch in self.children],
            "timeline": self.timeline,
        }

    def print_summary(self, summary: dict[str, Any]) -> None:
        from controlplane.cli.demo_plot import write_demo_plot
        from controlplane.cli.demo_view import print_summary

        self.out.mkdir(parents=True, exist_ok=True)
        json_path, png_path = self.out / "demo-summary.json", self.out / "demo.png"
        json_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        write_demo_plot(summary, png_path)
        print_summary(summary, json_path, png_path)


def _attainment(s: dict[str, Any]) -> float | None:
    finished = s.get("completed", 0) + s.get("dropped", 0)
    return s.get("met", 0) / finished if finished else None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def run_cli(trace: str | None, duration_s: float, live: bool, out: str, record_view: str | None = None) -> int:
    if duration_s < 20:
        raise ControlPlaneError(f"--duration-s: must be >= 20 (the bursts and the failover need time), got {duration_s:g}")
    if trace is not None and not Path(trace).is_file():
        raise ControlPlaneError(f"--trace: {trace}: no such file")
    if record_view is not None:
        try:
            Path(record_view).write_text("", encoding="utf-8")
        except OSError as exc:
            raise ControlPlaneError(f"--record-view: {record_view}: {exc.strerror or exc}") from None
    return Demo(DemoArgs(trace=trace, duration_s=duration_s, live=live, out=out, record_view=record_view)).run()
