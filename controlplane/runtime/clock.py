"""The wall clock the control loop and the adapters share.

Everything the loop stamps into the replicated state (``at_ms``, ``state_since_ms``, breaker and
scale-memory times) is read back by whichever member leads next, possibly on another machine, so it
must be a clock the members share: NTP-synchronised wall time, error ~ms. A monotonic clock starts
at each machine's boot and would make timeouts fire at once, or never, after a failover. Leases are
the exception: each node judges its own on its monotonic clock (``raft.node.monotonic_ms``), so that
a wall-clock step can never extend one. Adapters stamp observations with this clock too; the
coordinators map them onto their own (``adapters.client.ClockMap``).
"""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000
