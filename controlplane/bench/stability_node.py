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


class _NamedWatch:
    """The transport's ``InboundFilter`` seam (raft/transport.py): hands every decoded inbound message
    to ``watch`` with the sender's node id (the transport names peers by Raft address); admits all."""

    def __init__(self, watch: TickWatch, ids: dict[str, str]) -> None:
        self._watch, self._ids = watch, ids

    def admit(self, sender: str, message: object, now_s: float) -> bool:
        self._watch.admit(self._ids.get(sender, sender), message, now_s)
        return True


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    cfg = load_config(argv[1])
    watch = TickWatch(cfg.node_id, time.monotonic)
    gc.callbacks.append(watch.gc_callback)
    addr_to_id = {m.raft_address: m.node_id for m in cfg.members()}
    node = RaftNode(cfg, inbound_filter=_NamedWatch(watch, addr_to_id))

    def on_tick(st: RaftStatus) -> None:
        watch.observe_tick(time.monotonic(), st.role, st.term, st.leader_id)

    node.add_tick_observer(on_tick)
    guard = LeaseGuard(node)
    node.start()
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
