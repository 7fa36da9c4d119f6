"""Runs chaos schedules against one :class:`~controlplane.chaos.cluster.ChaosCluster` and checks them.

One bench invocation starts the processes once and runs the schedules one after the other; between
runs only what a fault killed is restarted (at heal). That is sound because every property is
checked over the whole history (the checkers are incremental: a run adds records), and each run
ends healed and settled: every node up, caught up and agreeing, replicas converged.

A run (seed ``seed + k`` for run ``k``; ``controlplane bench chaos --runs 1 --seed <that>`` replays
the same schedule):

1. offered load := the schedule's start level;
2. per fault: inject, hold ``duration_s``, end it, wait until the group recovered (a valid lease
   holder and a client write acknowledged after the end; the time is the fault's recovery time),
   then ``gap_s``;
3. heal and settle: heal the network, resume/restart everything, clock and disk back to normal,
   offered load := the final level; the client pauses; wait until every node has every
   acknowledged write and the replicas converged to the final level's decision (``min_replicas`` for
   ``low``, ``max_replicas`` for ``high``);
4. check the new history (checker.py).

Throughout, a client creates one tenant every ~0.1 s on a random coordinator (any coordinator
accepts writes); what was acknowledged must survive everything. And a prober (``isolation.py``)
calls every API method as the tenant ``bravo`` against the tenant ``alpha``'s objects and against
missing ones, about one round of every method a second; after settling, alpha's objects must be
unchanged on every node.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.chaos import checker, isolation
from controlplane.chaos.cluster import (
    DEPLOYMENT,
    MAX_REPLICAS,
    MIN_REPLICAS,
    ChaosCluster,
    Proc,
)
from controlplane.chaos.history import FaultRecord, JournalReader, Writes
from controlplane.chaos.nemesis import Fault, Schedule, generate

START_TIMEOUT_S = 90.0
RECOVER_TIMEOUT_S = 10.0
SETTLE_TIMEOUT_S = 30.0
WRITE_EVERY_S = 0.1
WRITE_TIMEOUT_S = 1.0
EXPECTED = {"low": MIN_REPLICAS, "high": MAX_REPLICAS}


class ChaosError(Exception):
    """The harness itself could not run (the group never started...)."""


class Client(threading.Thread):
    """Creates tenants ``cw-<run>-<i>`` on random coordinators; records what was acknowledged."""

    def __init__(self, endpoints: list[str], token: str, seed: int) -> None:
        super().__init__(name="chaos-client", daemon=True)
        self.endpoints = endpoints
        self.token = token
        self.rng = random.Random(seed)
        self.writes = Writes()
        self.run_index = 0
        self.paused = threading.Event()
        self.stopped = threading.Event()
        self.idle = threading.Event()
        self._i = 0
        self.codes: dict[str, int] = {}

    def run(self) -> None:
        from controlplane.api.client import ApiClient, ApiError, Unreachable
        from controlplane.api.v1 import api_pb2

        client = ApiClient(self.endpoints, token=self.token, timeout_s=WRITE_TIMEOUT_S)
        try:
            while not self.stopped.is_set():
                if self.paused.is_set():
                    self.idle.set()
                    self.stopped.wait(0.05)
                    continue
                self.idle.clear()
                self._i += 1
                name = f"cw-{self.run_index}-{self._i}"
                ep = self.rng.choice(self.endpoints)
                tenant = api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name=name), spec=api_pb2.TenantSpec(priority=1))
                try:
                    client.call("Tenants", "CreateTenant", api_pb2.CreateTenantRequest(tenant=tenant),
                                idempotent=False, endpoint=ep, timeout_s=WRITE_TIMEOUT_S)
                    self.writes.ack(name)
                except ApiError as exc:
                    self.codes[exc.code.name] = self.codes.get(exc.code.name, 0) + 1
                    if exc.outcome_unknown:
                        self.writes.unknown += 1
                    else:
                        self.writes.failed += 1
                except Unreachable:
                    self.codes["unreachable"] = self.codes.get("unreachable", 0) + 1
                    self.writes.failed += 1
                self.stopped.wait(WRITE_EVERY_S)
        finally:
            self.idle.set()
            client.close()

    def pause(self, timeout_s: float = 5.0) -> None:
        self.paused.set()
        self.idle.wait(timeout_s)

    def resume(self) -> None:
        self.paused.clear()


@dataclass
class RunResult:
    run: int
    seed: int
    schedule: dict[str, Any]
    description: str
    faults: list[FaultRecord]
    violations: list[str] = field(default_factory=list)
    convergence: str | None = None
    duration_s: float = 0.0
    acked_writes: int = 0
    isolation_probes: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


class Harness:
    def __init__(self, root: Path, *, nodes: int = 3, adapters: int = 2, faults_per_run: int = 3,
                 log: Callable[[str], None] = print) -> None:
        self.root = root
        self.nodes, self.n_adapters, self.faults_per_run = nodes, adapters, faults_per_run
        self.log = log
        self.cluster: ChaosCluster | None = None
        self.client: Client | None = None
        self.prober: isolation.Prober | None = None
        self.isolation = checker.IsolationChecker()
        self.alpha_before: tuple[str, str] | None = None
        self.readers: dict[str, JournalReader] = {}
        self.stale = checker.StaleChecker()
        self.lease = checker.LeaseChecker()
        self.transitions = checker.TransitionChecker()
        self.reported: set[str] = set()
        self.min_gap_ms: float | None = None
        self.lost_names: set[str] = set()
        self._last_probes = 0
        self.counts = {"stale": 0, "lost_write": 0, "transition": 0, "lease": 0, "convergence": 0,
                       "isolation": 0}

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self, seed: int) -> None:
        self.cluster = c = ChaosCluster(self.root, self.nodes, self.n_adapters)
        for p in c.coords + c.adapters:
            self.readers[p.name] = JournalReader(p.directory / "journal.jsonl")
        c.set_load("low")
        c.start_all()
        self.client = Client(c.endpoints, c.token, seed)
        self.client.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if c.holder() is not None and self.client.writes.acked:
                break
            time.sleep(0.2)
        else:
            raise ChaosError(f"no lease holder and no acknowledged write within {START_TIMEOUT_S:.0f}s "
                             f"(logs under {self.root / 'chaos'})")
        self._start_prober(seed, deadline)

    def _start_prober(self, seed: int, deadline: float) -> None:
        """Tenants alpha and bravo, bravo's token, alpha's objects on every node; then the prober."""
        c = self.cluster
        assert c is not None
        try:
            bravo = isolation.set_up(c.endpoints, c.token, timeout_s=max(10.0, deadline - time.monotonic()))
        except TimeoutError as exc:
            raise ChaosError(str(exc)) from None
        names = {checker.ISO_ALPHA, checker.ISO_BRAVO}
        while time.monotonic() < deadline + 10.0:
            answers = {s for s in isolation.alpha_specs(c.endpoints, c.token).values() if s is not None}
            if (len(answers) == 1 and not next(iter(answers))[0].startswith("error ")
                    and all(names <= set(c.tenants(p)[1]) for p in c.coords)):
                self.alpha_before = answers.pop()
                break
            time.sleep(0.2)
        else:
            raise ChaosError("isolation set-up: tenants alpha and bravo not on every node, or alpha's objects "
                             "answered differently by the nodes")
        self.prober = isolation.Prober(c.endpoints, bravo, seed)
        self.prober.start()

    def close(self) -> None:
        if self.prober is not None:
            self.prober.stopped.set()
            self.prober.join(5.0)
        if self.client is not None:
            self.client.stopped.set()
            self.client.join(5.0)
        if self.cluster is not None:
            self.cluster.close()

    # --- one run ------------------------------------------------------------------------------------
    def run_one(self, k: int, seed: int) -> RunResult:
        c, client = self.cluster, self.client
        assert c is not None and client is not None
        t0 = time.monotonic()
        sched = generate(seed, nodes=self.nodes, adapters=self.n_adapters, faults=self.faults_per_run,
                         lease_ms=c.lease_ms, drift_bound_ms=c.drift_bound_ms)
        rng = random.Random(seed ^ 0x5EED)
        client.run_index = k
        client.resume()
        c.set_load(sched.start_load)
        records: list[FaultRecord] = []
        for fault in sched.faults:
            rec = self._inject(fault, k, rng)
            time.sleep(fault.duration_s)
            self._end(fault, rec)
            rec.ended = time.monotonic()
            records.append(rec)
            deadline = rec.ended + RECOVER_TIMEOUT_S
            while time.monotonic() < deadline:
                if c.holder() is not None and client.writes.first_ack_after(rec.ended) is not None:
                    rec.recovered = time.monotonic()
                    break
                time.sleep(0.05)
            rec.outage_ms = client.writes.longest_gap_ms(rec.started, rec.recovered or time.monotonic())
            time.sleep(fault.gap_s)
        # heal and settle
        c.heal_all()
        c.set_load(sched.final_load)
        client.pause()
        result = RunResult(k, seed, sched.to_json(), sched.describe(), records, acked_writes=len(client.writes.acked))
        violation = self._settle(sched)
        if violation is not None:
            result.convergence = str(violation)
        result.violations = self._check(violation)
        result.isolation_probes = self._last_probes
        result.duration_s = time.monotonic() - t0
        return result

    def abort_run(self, k: int, seed: int, error: str) -> RunResult:
        """A run the harness could not finish: heal everything, settle, check what was recorded."""
        c, client = self.cluster, self.client
        assert c is not None and client is not None
        t0 = time.monotonic()
        self.counts["harness"] = self.counts.get("harness", 0) + 1
        try:
            c.heal_all()
        except (OSError, RuntimeError, TimeoutError) as exc:
            error += f"; heal: {exc}"
        client.pause()
        sched = generate(seed, nodes=self.nodes, adapters=self.n_adapters, faults=self.faults_per_run,
                         lease_ms=c.lease_ms, drift_bound_ms=c.drift_bound_ms)
        c.set_load(sched.final_load)
        result = RunResult(k, seed, sched.to_json(), sched.describe(), [], acked_writes=len(client.writes.acked))
        violation = self._settle(sched)
        result.convergence = f"harness error: {error}" + (f"; {violation}" if violation else "")
        result.violations = self._check(violation)
        result.isolation_probes = self._last_probes
        result.duration_s = time.monotonic() - t0
        return result

    def _pick(self, fault: Fault, rng: random.Random) -> Proc:
        c = self.cluster
        assert c is not None
        holder = c.holder()
        if fault.target == "holder" and holder is not None:
            return holder
        if fault.target.isdigit():
            return c.coord_by_index(int(fault.target))
        others = [p for p in c.coords if p is not holder]
        return rng.choice(others)

    def _inject(self, fault: Fault, k: int, rng: random.Random) -> FaultRecord:
        c = self.cluster
        assert c is not None
        now = time.monotonic()
        if fault.kind == "kill_adapter":
            proc = c.adapters[int(fault.target) % len(c.adapters)]
            c.kill(proc)
            return FaultRecord(k, fault.kind, proc.name, now)
        if fault.kind == "split":
            minority = [c.coords[int(i) % len(c.coords)] for i in fault.peer.split(",") if i]
            majority = [p for p in c.coords if p not in minority]
            c.net.partition([c.address(p) for p in minority], [c.address(p) for p in majority])
            return FaultRecord(k, fault.kind, ",".join(p.name for p in minority), now)
        proc = self._pick(fault, rng)
        detail = ""
        if fault.kind == "kill":
            c.kill(proc)
        elif fault.kind == "pause":
            c.pause(proc)
        elif fault.kind == "isolate":
            c.net.cut_off(c.address(proc))
        elif fault.kind == "one_way":
            dst = c.coord_by_index(int(fault.peer))
            if dst is proc:
                dst = c.coords[(c.coords.index(proc) + 1) % len(c.coords)]
            c.net.one_way(c.address(proc), c.address(dst))
            detail = f"->{dst.name}"
        elif fault.kind == "clock":
            c.set_fault(proc, clock_offset_ms=fault.value)
            detail = f"{fault.value:+d} ms"
        elif fault.kind == "slow_disk":
            c.set_fault(proc, fsync_delay_ms=fault.value)
            detail = f"fsync +{fault.value} ms"
        return FaultRecord(k, fault.kind, proc.name, now, detail=detail)

    def _end(self, fault: Fault, rec: FaultRecord) -> None:
        c = self.cluster
        assert c is not None
        procs = {p.name: p for p in c.coords + c.adapters}
        proc = procs.get(rec.target)
        if fault.kind in ("kill", "kill_adapter") and proc is not None:
            c.start(proc)
        elif fault.kind == "pause" and proc is not None:
            c.resume(proc)
        elif fault.kind in ("isolate", "split", "one_way"):
            c.net.heal()
        elif fault.kind == "clock" and proc is not None:
            c.set_fault(proc, clock_offset_ms=0)
        elif fault.kind == "slow_disk" and proc is not None:
            c.set_fault(proc, fsync_delay_ms=0)

    def _settle(self, sched: Schedule) -> checker.Violation | None:
        """Wait until every node has every acknowledged write and the replicas converged."""
        c, client = self.cluster, self.client
        assert c is not None and client is not None
        expected = EXPECTED[sched.final_load]
        acked = set(client.writes.names())
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        last: checker.Violation | None = None
        while time.monotonic() < deadline:
            statuses = {p.name: c.status(p) for p in c.coords}
            if all(statuses.values()) and all(acked.issubset(c.tenants(p)[1]) for p in c.coords):
                desired = {n: (s or {}).get("desired", {}).get(DEPLOYMENT) for n, s in statuses.items()}
                serving = c.serving()
                last = checker.converged(expected, desired, -1 if serving is None else serving)
                if last is not None:
                    inst = {n: (s or {}).get("instances", {}).get(DEPLOYMENT) for n, s in statuses.items()}
                    phases = {a.name: ((c.status(a) or {}).get("phases") or {}).get(DEPLOYMENT) for a in c.adapters}
                    last = checker.Violation(last.prop, f"{last.detail}; instances by node {inst}; at the adapters {phases}")
                if last is None:
                    return None
            time.sleep(0.2)
        if last is None:  # never even got every node up with every write
            down = [p.name for p in c.coords if c.status(p) is None]
            last = checker.Violation("convergence", f"nodes not up/caught up after {SETTLE_TIMEOUT_S:.0f}s: down={down}")
        return last

    def evidence(self) -> dict[str, int]:
        """How much the checker saw (a property checked over nothing proves nothing)."""
        iso = self.isolation
        return {"fencing_verdicts_accepted": self.stale.accepted, "fencing_verdicts_rejected": self.stale.rejected,
                "lease_intervals": len(self.lease.intervals), "transitions": len(self.transitions.events),
                "isolation_probes": iso.probes, "isolation_pairs_compared": iso.compared,
                "isolation_pairs_skipped_in_failover": iso.skipped, "isolation_answers_ok": iso.answered_ok,
                "isolation_methods": len(iso.methods),
                "isolation_rounds": self.prober.probes.rounds if self.prober is not None else 0}

    def _check_isolation(self) -> tuple[list[checker.Violation], int]:
        """The probes recorded since the last check; after settling, alpha's objects unchanged."""
        c = self.cluster
        assert c is not None
        if self.prober is None:
            return [], 0
        probes = self.prober.probes.drain()
        found = self.isolation.feed(probes)
        for ep, now in isolation.alpha_specs(c.endpoints, c.token).items():
            if now is not None and now != self.alpha_before:
                v = checker.Violation("isolation", f"alpha's objects changed on {ep}: {self.alpha_before} -> {now}")
                self.isolation.violations.append(v)
                found.append(v)
        return found, len(probes)

    def _check(self, convergence: checker.Violation | None) -> list[str]:
        c, client = self.cluster, self.client
        assert c is not None and client is not None
        for p in c.adapters:
            self.stale.feed(p.name, self.readers[p.name].read())
        for p in c.coords:
            recs = self.readers[p.name].read()
            self.lease.feed(recs)
            self.transitions.feed(p.name, recs)
        found: list[checker.Violation] = list(self.stale.violations)
        lease_v, gap = self.lease.check()
        self.min_gap_ms = gap
        found += lease_v
        found += self.transitions.check()
        iso_found, self._last_probes = self._check_isolation()
        found += iso_found
        present = {p.name: set(c.tenants(p)[1]) for p in c.coords}
        names = client.writes.names()
        missing = {w for have in present.values() for w in names if w not in have} - self.lost_names
        if missing:
            self.lost_names |= missing
            self.counts["lost_write"] += len(missing)
        new = [str(v) for v in checker.lost_writes(sorted(missing), present)]
        for v in found:
            key = str(v)
            if key in self.reported:
                continue
            self.reported.add(key)
            self.counts[v.prop] = self.counts.get(v.prop, 0) + 1
            new.append(key)
        self.reported.update(new)
        if convergence is not None:
            self.counts["convergence"] += 1
        return new
