"""controlplane: the scaling control plane for LLM inference fleets.

Layers (dependencies point inward, machine-checked by ``tests/unit/test_layering.py``):

* ``controlplane.domain`` -- pure values and the replicated state machine (stdlib only).
* ``controlplane.core`` -- pure decisions over domain values; ``now_ms`` is always an argument.
* ``controlplane.runtime`` -- the imperative shell (gather -> decide -> act), logging, metrics.
* ``controlplane.sim`` -- the discrete-event simulator that drives the same core in virtual time.
* ``controlplane.cli`` -- the ``controlplane`` operator CLI and ``tenantctl``.
"""

__version__ = "0.1.0"
