"""controlplane: the scaling control plane for LLM inference fleets.

Layers (dependencies point inward, machine-checked by ``tests/unit/test_layering.py``):

* ``controlplane.domain`` -- pure values and the replicated state machine (stdlib only).
* ``controlplane.core`` -- pure decisions over domain values; ``now_ms`` is always an argument.
* ``controlplane.runtime`` -- the imperative shell (gather -> decide -> act), logging, metrics.
* ``controlplane.sim`` -- the discrete-event simulator that drives the same core in virtual time.
* ``controlplane.cli`` -- the ``controlplane`` operator CLI and ``tenantctl``.
"""

import os as _os

__version__ = "0.1.0"

# gRPC's fork handlers (grpcio >= 1.81) restart its poller thread in a forked child; a
# subprocess.Popen child then dies or hangs before exec() with "epoll_wait error: Bad file
# descriptor" once close_fds has closed the poller's epoll fd (grpc/grpc#43055, open). Our
# processes spawn children (up, demo, the chaos, soak and hostile harnesses) but never use gRPC in
# a forked child, so fork support stays off, as it was before that release. Set before anything
# imports grpc (every entry point imports this package first); an explicit setting wins.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
