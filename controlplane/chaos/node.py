"""The child processes of the chaos harness, with the evidence they write.

``python -m controlplane.chaos.node coordinator CONFIG DIR`` runs the real composition root
(:class:`controlplane.coordinator.Coordinator`) and ``python -m controlplane.chaos.node adapter CONFIG
DIR`` the real adapter service (:func:`adapters.service.serve_adapter`) over the simulated backend.
What this module adds lives here, in these processes only (no production path changes), as
``controlplane/bench/reaction.py`` does for its benchmark:

* **Journal** ``DIR/journal.jsonl``: one JSON object per line, flushed per line (it survives a kill -9
  of the process: the page cache keeps it), each stamped ``t`` = ``time.monotonic()``, which on Linux
  is CLOCK_MONOTONIC, one clock for every process on the host.

  - coordinator: ``lease`` -- after every successful acquire or renewal, the holder's validity
    interval ``[start_ms, until_ms)`` for its epoch (``start`` read before the request was sent,
    ``until`` the guard's ``valid_until``), converted from the node's (possibly jumped) lease clock
    to real monotonic ms; ``lease_end`` -- the node gave up or lost that authority (its guard stopped
  acting at or before this instant, e.g. before releasing the lease on a step-down); ``seg``/``cov``/``tr`` -- the instance transitions of the node's change feed
    (``controlplane/runtime/events.py``), which every replica derives from the log it applies, with
    their revisions, and which revision ranges this node's feed covered; ``clock``/``disk`` -- the
    faults applied.
  - adapter: ``admit`` -- every fencing verdict (epoch, holder, accepted or not, the highest epoch
    before), written under a lock held across the verdict so the file order is the decision order;
    ``cmd`` -- every command carried out (verb, epoch, seq, instance or deployment).

* **Status** ``DIR/status.json`` (rewritten atomically every ~100 ms): the coordinator's lease
  authority, Raft indices, desired replicas and live instances per deployment; the adapter's
  instances per deployment and phase. ``DIR/tenants.json``: the tenant ids in the coordinator's
  replicated state (rewritten when the set changes). The harness reads these; the checker reads the
  journals.

* **Faults from files**: ``DIR/fault.json`` (coordinator: ``clock_offset_ms`` -- a jump of the lease
  clock, clamped to the drift bound ``drift_rho * lease_duration_ms``; ``fsync_delay_ms`` -- every
  journal fsync is delayed this long: a slow disk) and ``DIR/load.json`` (adapter: requests/s per
  deployment), polled every 50 ms.

A child also exits when its parent dies (stdin closes), so a harness killed with SIGKILL leaves nothing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

POLL_S = 0.05
STATUS_EVERY_S = 0.1


class Journal:
    """Append-only JSON lines, one flush per line, thread-safe."""

    def __init__(self, path: Path) -> None:
        self._f = open(path, "a", encoding="utf-8")
        self.lock = threading.RLock()

    def write(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"t": time.monotonic(), "k": kind, **fields}, sort_keys=True)
        with self.lock:
            self._f.write(line + "\n")
            self._f.flush()


def write_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


class FaultClock:
    """A monotonic millisecond clock with an injected offset (a clock jump). Never goes backwards: a
    jump back makes it stand still until real time catches up (a slow clock), as a monotonic clock
    must. The offset is clamped to ``[-bound_ms, bound_ms]``."""

    def __init__(self, bound_ms: int) -> None:
        self.bound_ms = max(0, int(bound_ms))
        self.offset_ms = 0
        self._last = 0
        self._lock = threading.Lock()

    def set_offset(self, offset_ms: int) -> int:
        self.offset_ms = max(-self.bound_ms, min(self.bound_ms, int(offset_ms)))
        return self.offset_ms

    def ms(self) -> int:
        v = time.monotonic_ns() // 1_000_000 + self.offset_ms
        with self._lock:
            if v < self._last:
                return self._last
            self._last = v
            return v

    def to_real_ms(self, value_ms: int) -> float:
        """A reading of this clock as real monotonic ms (with the offset in force now)."""
        return float(value_ms - self.offset_ms)


def _exit_with_parent() -> None:
    """Exit when stdin (a pipe from the harness) closes: the parent died. It reads the raw descriptor:
    a daemon thread blocked in ``sys.stdin.buffer`` holds that object's lock, and the interpreter's
    shutdown then aborts with "Fatal Python error: _enter_buffered_busy" (seen on every clean stop)."""
    def watch() -> None:
        try:
            while os.read(0, 1):
                pass
        except (OSError, ValueError):
            pass
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _quiet_logging() -> None:
    import logging

    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.JSONRenderer(sort_keys=True)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


def _wait_for_signal() -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(1.0):
        pass


# =====================================================================================================
# coordinator
# =====================================================================================================


def coordinator_main(config: str, directory: str) -> int:
    import raft.journal as raft_journal
    import raft.node as raft_node
    from controlplane.config import load_config
    from controlplane.coordinator import Coordinator, topology_of
    from controlplane.runtime.events import TRANSITION, EventsCompacted

    _quiet_logging()
    _exit_with_parent()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(config)
    journal = Journal(out / "journal.jsonl")
    clock = FaultClock(int(cfg.drift_rho * cfg.lease_duration_ms))
    raft_node.monotonic_ms = clock.ms  # RaftNode's default clock: t_obs, the lease guard, authority
    faults = {"fsync_delay_ms": 0}
    original_timed = raft_journal.RaftJournal._timed

    def slow_timed(self: Any, fn: Any) -> None:  # every fsync of the Raft journal goes through _timed
        delay = faults["fsync_delay_ms"]
        if delay > 0:
            time.sleep(delay / 1000.0)
        original_timed(self, fn)

    raft_journal.RaftJournal._timed = slow_timed  # type: ignore[method-assign]
    coord = Coordinator(cfg, topology_of(cfg))
    node_id = cfg.node_id
    guard = coord.guard
    journal.write("start", node=node_id, pid=os.getpid())

    original_renew, original_acquire = guard._renew, guard._acquire

    def record(epoch: int | None, start_ms: int, what: str) -> None:
        with guard._lock:
            held, until = guard._epoch, guard._valid_until
        if held is not None and held == epoch and until > 0:
            journal.write("lease", node=node_id, epoch=held, what=what, start_ms=clock.to_real_ms(start_ms),
                          until_ms=clock.to_real_ms(until), offset_ms=clock.offset_ms)

    def renew(epoch: int) -> None:
        start = clock.ms()  # at or before the guard's own t_send
        original_renew(epoch)
        record(epoch, start, "renew")

    def acquire(rec: Any, t_obs: int, allowed: int | None) -> None:
        start = clock.ms()
        with guard._lock:
            before = guard._epoch
        original_acquire(rec, t_obs, allowed)
        with guard._lock:
            after = guard._epoch
        if after is not None and after != before:
            record(after, start, "acquire")

    original_lost, original_give_up = guard._lost, guard._give_up

    def ended(fn: Any, what: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with guard._lock:
                epoch = guard._epoch
            # The first thing both methods do is zero the authority (under the guard's lock); only then
            # does _give_up send its ReleaseLease, which another node must see committed before it may
            # acquire at once. So the authority ends within a millisecond of this reading, well
            # before anyone can acquire: that instant, not the return, is the end of the interval.
            end = clock.ms() + 1
            try:
                return fn(*args, **kwargs)
            finally:
                if epoch is not None:
                    journal.write("lease_end", node=node_id, epoch=epoch, what=what, at_ms=clock.to_real_ms(end))
        return wrapper

    guard._renew, guard._acquire = renew, acquire  # type: ignore[method-assign]
    guard._lost, guard._give_up = ended(original_lost, "lost"), ended(original_give_up, "give_up")  # type: ignore[method-assign]
    coord.start()
    stop = threading.Event()

    def faults_loop() -> None:
        path, seen = out / "fault.json", None
        while not stop.wait(POLL_S):
            data = read_json(path, {})
            key = json.dumps(data, sort_keys=True)
            if key == seen:
                continue
            seen = key
            offset = clock.set_offset(int(data.get("clock_offset_ms", 0)))
            delay = max(0, min(2000, int(data.get("fsync_delay_ms", 0))))
            if delay != faults["fsync_delay_ms"]:
                faults["fsync_delay_ms"] = delay
                journal.write("disk", node=node_id, fsync_delay_ms=delay)
            journal.write("clock", node=node_id, offset_ms=offset)

    def events_loop() -> None:
        last: int | None = None
        last_cov = 0.0
        while not stop.wait(0.2):
            log = coord.node.events
            try:
                if last is None or last < log.first_revision:
                    last = log.first_revision
                    journal.write("seg", node=node_id, rev=last)
                events = log.since(last)
            except EventsCompacted as exc:
                last = exc.oldest
                journal.write("seg", node=node_id, rev=last)
                continue
            for ev in events:
                if ev.type == TRANSITION and ev.kind == "Instance":  # not breakers, not the lease
                    journal.write("tr", node=node_id, rev=ev.revision, inst=ev.name, dep=ev.deployment,
                                  frm=ev.from_state, to=ev.to_state, ev=ev.event)
            if events:
                last = events[-1].revision
            now = time.monotonic()
            if now - last_cov > 1.0:  # alive and following (the tr lines themselves extend the coverage)
                journal.write("cov", node=node_id, rev=last)
                last_cov = now

    def status_loop() -> None:
        tenants_seen: list[str] | None = None
        while not stop.wait(STATUS_EVERY_S):
            try:
                raft = coord.node.status()
                state = coord.replicator.state
                epoch = guard.authority(clock.ms())
                rec, _ = coord.node.lease_view()
                live: dict[str, dict[str, int]] = {}
                for inst in state.instances.values():
                    per = live.setdefault(inst.deployment, {})
                    per[inst.state.value] = per.get(inst.state.value, 0) + 1
                write_atomic(out / "status.json", {
                    "t": time.monotonic(), "node": node_id, "pid": os.getpid(), "epoch": epoch,
                    "holder": rec.holder, "lease_epoch": rec.epoch, "role": raft.role, "leader": raft.leader_id, "term": raft.term,
                    "commit": raft.commit_index, "applied": raft.applied_index, "revision": state.applied,
                    "desired": {d: v.replicas for d, v in state.desired.items()}, "instances": live,
                    "tenants": len(state.tenants),
                })
                tenants = sorted(state.tenants)
                if tenants != tenants_seen:
                    write_atomic(out / "tenants.json", {"t": time.monotonic(), "applied": raft.applied_index,
                                                         "tenants": tenants})
                    tenants_seen = tenants
            except Exception as exc:  # the status must never take the node down
                journal.write("status_error", node=node_id, error=f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=fn, name=fn.__name__, daemon=True) for fn in (faults_loop, events_loop, status_loop)]
    for th in threads:
        th.start()
    _wait_for_signal()
    stop.set()
    coord.stop()
    return 0


# =====================================================================================================
# adapter
# =====================================================================================================


def adapter_main(config: str, directory: str) -> int:
    from adapters import service
    from adapters.config import load_adapter_config
    from adapters.simulated import SimulatedBackend
    from controlplane.domain.errors import StaleEpoch

    _quiet_logging()
    _exit_with_parent()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_adapter_config(config)
    journal = Journal(out / "journal.jsonl")
    cluster = cfg.cluster_id
    journal.write("start", cluster=cluster, pid=os.getpid())

    class JournalingGuard(service.FencingGuard):
        """Every verdict journaled while the verdict is still the latest (one lock around both)."""

        def admit(self, epoch: int, holder: str, token: Any = None) -> None:
            with journal.lock:
                highest, highest_holder = self.epoch, self.holder
                try:
                    super().admit(epoch, holder, token)
                except StaleEpoch:
                    journal.write("admit", cluster=cluster, epoch=epoch, holder=holder, ok=False,
                                  highest=highest, highest_holder=highest_holder)
                    raise
                journal.write("admit", cluster=cluster, epoch=epoch, holder=holder, ok=True,
                              highest=highest, highest_holder=highest_holder)

    class ChaosBackend(SimulatedBackend):
        """The simulated cluster with its offered load set from ``load.json`` (requests/s per
        deployment), and every command journaled.

        Inventory across restarts: the simulated engines live in this process, so a killed adapter
        comes back with none of them. Neither the adapter service nor the coordinators notice an
        instance that vanished while its adapter was down (nothing ever reports it ``lost``: the
        coordinators keep it as serving capacity for good; docs/reliability.md, "Bugs found"). This
        backend therefore remembers the instances it was told to create (``instances.json``) and, on
        start, reports every one it no longer runs as ``lost``, which is what an adapter that keeps
        its inventory would do. ``CP_CHAOS_NO_INVENTORY=1`` turns that off (to reproduce the bug)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._rps: dict[str, float] = {}
            super().__init__(*args, **kwargs)
            self._inventory_path = out / "instances.json"
            gone = sorted(read_json(self._inventory_path, []))
            self._inventory: set[str] = set(gone)  # kept: a crash before they are consumed reports them again
            if gone and not os.environ.get("CP_CHAOS_NO_INVENTORY"):
                from controlplane.domain.ids import InstanceId
                from controlplane.domain.observations import InstanceReport

                now = self._clock_ms()
                with self._lock:
                    for iid in gone:
                        self.fleet._reports.append(InstanceReport(InstanceId(iid), "lost", now, "adapter restarted"))
                journal.write("inventory_lost", cluster=cluster, instances=gone)

        def _remember(self, iid: str) -> None:
            if iid not in self._inventory:
                self._inventory.add(iid)
                write_atomic(self._inventory_path, sorted(self._inventory))

        def _rate(self, dep: Any, t_ms: float) -> tuple[float, float]:
            return self._rps.get(dep, self._rps.get("*", 0.0)), float("inf")

        def set_load(self, rps: dict[str, float]) -> None:
            with self._lock:
                self._advance(self._clock_ms())
                self._rps = dict(rps)
                for dep in list(self._next_arrival):
                    self._next_arrival[dep] = self._draw_arrival(dep, float(self._now_ms))

        def apply(self, command: Any, now_ms: int) -> None:
            if command.action == "create":
                self._remember(command.instance.instance_id)  # before it can exist
            super().apply(command, now_ms)
            f = command.fence
            journal.write("cmd", cluster=cluster, verb=command.action, epoch=f.epoch, seq=f.seq, holder=f.holder,
                          inst=command.instance.instance_id, rid=command.request_id)

        def scale(self, command: Any, now_ms: int) -> None:
            super().scale(command, now_ms)
            with self._lock:
                live = [str(i) for i in self.fleet.by_deployment.get(command.deployment_id, {})]
            for iid in live:
                self._remember(iid)
            f = command.fence
            journal.write("cmd", cluster=cluster, verb="scale", epoch=f.epoch, seq=f.seq, holder=f.holder,
                          dep=command.deployment_id, replicas=command.replicas, rid=command.request_id)

        def phases(self) -> dict[str, dict[str, int]]:
            with self._lock:
                self._advance(self._clock_ms())
                per: dict[str, dict[str, int]] = {}
                for dep, live in self.fleet.by_deployment.items():
                    counts: dict[str, int] = {}
                    for sim in live.values():
                        counts[sim.phase] = counts.get(sim.phase, 0) + 1
                    per[str(dep)] = counts
                return per

    service.FencingGuard = JournalingGuard  # this process only: serve_adapter builds the journaling guard
    assert cfg.simulated is not None, "the chaos adapter runs the simulated backend"
    backend = ChaosBackend(cluster, cfg.simulated)
    backend.set_load(read_json(out / "load.json", {}))
    server = service.serve_adapter(cluster, cfg.listen, cfg.state_dir, backend,
                                   observe_interval_ms=cfg.observe_interval_ms, ring_s=cfg.ring_s,
                                   auth_token=cfg.auth_token(), tls=cfg.tls_pair(), client_ca=cfg.client_ca(),
                                   fence_verifier=cfg.fence_verifier())
    stop = threading.Event()

    def loop() -> None:
        seen = None
        while not stop.wait(STATUS_EVERY_S):
            load = read_json(out / "load.json", {})
            key = json.dumps(load, sort_keys=True)
            if key != seen:
                seen = key
                backend.set_load({k: float(v) for k, v in load.items()})
                journal.write("load", cluster=cluster, rps=load)
            write_atomic(out / "status.json", {"t": time.monotonic(), "cluster": cluster, "pid": os.getpid(),
                                                "phases": backend.phases()})

    threading.Thread(target=loop, name="chaos-status", daemon=True).start()
    _wait_for_signal()
    stop.set()
    server.stop(0.5)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("coordinator", "adapter"):
        print("usage: python -m controlplane.chaos.node coordinator|adapter CONFIG DIR", file=sys.stderr)
        return 2
    return (coordinator_main if argv[0] == "coordinator" else adapter_main)(argv[1], argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
