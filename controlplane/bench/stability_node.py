"""One instrumented coordinator member for ``controlplane bench stability``: RaftNode + LeaseGuard from
a config file, a :class:`raft.tickwatch.TickWatch` fed by every tick, every inbound Raft message, GC
and a lease sampler. ``MODE`` (second argument, default ``node``):

* ``node``: RaftNode + LeaseGuard only (the stand-in used for the leadership measurements);
* ``coordinator``: the whole coordinator started as ``controlplane coordinator`` starts it
  (``controlplane.cli.main`` imported, JSON logging, ``controlplane.member.launch``: Raft first, then
  the API, control loop and adapter clients); inbound messages are not observed in this mode;
* ``coordinator-eager``: the whole coordinator in the order before ``launch`` (everything imported
  and built, then started), kept to compare start-up orders under the same conditions.

Line protocol on stdin, JSON lines on stdout:

    (at start)  {"started": node_id, "t_s": monotonic seconds after RaftNode.start(),
                 "phases": {"main_s", "config_s", "raft_started_s", "ready_s"}: monotonic seconds when
                 main() began (imports done), the configuration was loaded, RaftNode.start() returned,
                 and everything the member runs had started}
    report      {"report": TickWatch.summary() + durability + first_authority_s}
    quit        stop and exit 0
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from controlplane.config import load_config
from controlplane.runtime.lease_guard import LeaseGuard
from raft.node import RaftNode, RaftStatus
from raft.tickwatch import TickWatch

SAMPLE_S = 0.02


class _NamedWatch:
    """The transport's ``InboundFilter`` seam (raft/transport.py): hands every decoded inbound message
    to ``watch`` with the sender's node id (the transport names peers by Raft address); admits all."""

    def __init__(self, watch: TickWatch, ids: dict[str, str]) -> None:
        self._watch, self._ids = watch, ids

    def admit(self, sender: str, message: object, now_s: float) -> bool:
        self._watch.admit(self._ids.get(sender, sender), message, now_s)
        return True


MODES = ("node", "coordinator", "coordinator-eager")


def _start(cfg: Any, mode: str, watch: TickWatch, marks: dict[str, float],
           observe: Callable[[RaftNode, LeaseGuard], None]) -> tuple[RaftNode, LeaseGuard, Any]:
    """Build and start the member in ``mode``; ``observe(node, guard)`` right after RaftNode.start()
    (the lease sampler starts there, so a lease taken while the rest still loads is seen when taken).
    Returns (node, guard, coordinator or None)."""
    def on_tick(st: RaftStatus) -> None:
        watch.observe_tick(time.monotonic(), st.role, st.term, st.leader_id)

    def raft_started(node: RaftNode, guard: LeaseGuard) -> None:
        marks["raft_started_s"] = time.monotonic()
        observe(node, guard)

    if mode == "node":
        addr_to_id = {m.raft_address: m.node_id for m in cfg.members()}
        node = RaftNode(cfg, inbound_filter=_NamedWatch(watch, addr_to_id))
        node.add_tick_observer(on_tick)
        guard = LeaseGuard(node)
        node.start()
        raft_started(node, guard)
        guard.start()
        return node, guard, None
    if mode == "coordinator":
        from controlplane.cli.main import start_coordinator

        coord = start_coordinator(cfg, before_start=lambda m: m.node.add_tick_observer(on_tick),
                                  after_member=lambda m: raft_started(m.node, m.guard))
        return coord.node, coord.guard, coord
    from controlplane.cli.logs import service_logging
    from controlplane.coordinator import Coordinator, topology_of

    service_logging()  # the former order: logging, then everything imported and built, then started
    coord = Coordinator(cfg, topology_of(cfg))
    coord.node.add_tick_observer(on_tick)
    raft_started(coord.node, coord.guard)  # Coordinator.start() starts the RaftNode first, at once
    coord.start()
    return coord.node, coord.guard, coord


def main(argv: list[str]) -> int:
    marks = {"main_s": time.monotonic()}
    mode = argv[2] if len(argv) > 2 else "node"
    if mode not in MODES:
        print(f"stability_node: MODE must be one of {', '.join(MODES)}, got {mode!r}", file=sys.stderr)
        return 2
    if mode == "node":
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    else:  # what the ``controlplane`` console script imports first
        import controlplane.cli.main  # noqa: F401
    cfg = load_config(argv[1])
    marks["config_s"] = time.monotonic()
    watch = TickWatch(cfg.node_id, time.monotonic)
    gc.callbacks.append(watch.gc_callback)
    first_auth: list[float] = []
    stop = threading.Event()

    def sample(node: RaftNode, guard: LeaseGuard) -> None:
        while not stop.is_set():
            rec, _ = node.lease_view()
            now = time.monotonic()
            watch.observe_lease(now, rec.holder, rec.epoch)
            if not first_auth and guard.authority(node.clock_ms()) is not None:
                first_auth.append(now)
            stop.wait(SAMPLE_S)

    def observe(node: RaftNode, guard: LeaseGuard) -> None:
        threading.Thread(target=sample, args=(node, guard), name="lease-sampler", daemon=True).start()

    node, guard, coord = _start(cfg, mode, watch, marks, observe)
    started = marks["raft_started_s"]
    marks["ready_s"] = time.monotonic()
    print(json.dumps({"started": cfg.node_id, "t_s": started, "mode": mode, "phases": marks}), flush=True)
    try:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "quit":
                break
            if cmd == "report":
                rep: dict[str, Any] = watch.summary()
                rep["durability"] = asdict(node.durability())
                rep["first_authority_s"] = first_auth[0] if first_auth else None
                rep["started_s"] = started
                print(json.dumps({"report": rep}), flush=True)
    finally:
        stop.set()
        if coord is not None:
            coord.stop()
        else:
            guard.stop()
            node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
