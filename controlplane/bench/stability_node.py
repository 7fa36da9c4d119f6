"""One instrumented coordinator member for ``controlplane bench stability``: RaftNode + LeaseGuard from
a config file, a :class:`raft.tickwatch.TickWatch` fed by every tick, every inbound Raft message, GC
and a lease sampler. Line protocol on stdin, JSON lines on stdout:

    (at start)  {"started": node_id, "t_s": monotonic seconds after RaftNode.start()}
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
from dataclasses import asdict
from typing import Any

from controlplane.config import load_config
from controlplane.runtime.lease_guard import LeaseGuard
from raft.node import RaftNode, RaftStatus
from raft.tickwatch import TickWatch

SAMPLE_S = 0.02


def _observe_inbound(node: RaftNode, watch: TickWatch, ids: dict[str, str]) -> None:
    """Measurement only: route pysyncobj's decoded inbound messages through ``watch.admit`` first.
    Reaches pysyncobj's private transport (the project's own transport will call an InboundFilter
    instead, with the same signature)."""
    transport = node._obj._SyncObj__transport  # type: ignore[union-attr]
    inner = transport._onMessageReceivedCallback

    def cb(peer: Any, message: Any) -> None:
        addr = str(getattr(peer, "id", peer))
        watch.admit(ids.get(addr, addr), message, time.monotonic())
        inner(peer, message)

    transport.setOnMessageReceivedCallback(cb)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    cfg = load_config(argv[1])
    node = RaftNode(cfg)
    watch = TickWatch(cfg.node_id, time.monotonic)
    gc.callbacks.append(watch.gc_callback)
    addr_to_id = {m.raft_address: m.node_id for m in cfg.members()}

    def on_tick(st: RaftStatus) -> None:
        watch.observe_tick(time.monotonic(), st.role, st.term, st.leader_id)

    node.add_tick_observer(on_tick)
    guard = LeaseGuard(node)
    node.start()
    _observe_inbound(node, watch, addr_to_id)
    guard.start()
    started = time.monotonic()
    first_auth: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rec, _ = node.lease_view()
            now = time.monotonic()
            watch.observe_lease(now, rec.holder, rec.epoch)
            if not first_auth and guard.authority(node.clock_ms()) is not None:
                first_auth.append(now)
            stop.wait(SAMPLE_S)

    threading.Thread(target=sample, name="lease-sampler", daemon=True).start()
    print(json.dumps({"started": cfg.node_id, "t_s": started}), flush=True)
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
                rep["addresses"] = addr_to_id
                print(json.dumps({"report": rep}), flush=True)
    finally:
        stop.set()
        guard.stop()
        node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
