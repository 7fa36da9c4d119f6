"""The chaos adapters' simulated gateway gives up on a request well within the settle wait.

Each chaos adapter is its own simulator, offered the full load whatever runs where: a request
offered to a cluster with no instance of the deployment can only time out, and until it does the
control loop counts it as demand. With the simulator's 30 s default (the settle wait), ``high ->
low`` runs whose instances sat on one cluster kept ``max_replicas`` for the whole settle wait
(docs/reliability.md, "Convergence failures beside CPU burners")."""

from __future__ import annotations

from pathlib import Path

from adapters.config import load_adapter_config
from controlplane.chaos import cluster, runner


def test_every_chaos_adapter_drops_stranded_requests_well_within_the_settle_wait(tmp_path: Path) -> None:
    c = cluster.ChaosCluster(tmp_path, 3, 2)
    try:
        assert len(c.adapters) == 2
        for proc in c.adapters:
            sim = load_adapter_config(str(proc.config)).simulated
            assert sim is not None
            (dep,) = [d for d in sim.deployments if d.deployment == cluster.DEPLOYMENT]
            assert dep.max_queue_ms == cluster.MAX_QUEUE_MS
    finally:
        c.close()
    # the queue empties, then the stable window and the scale-down stabilization pass, then a drain
    assert cluster.MAX_QUEUE_MS + cluster.POLICY["stable_window_ms"] + cluster.POLICY["scale_down_stabilization_ms"] \
        <= runner.SETTLE_TIMEOUT_S * 1000 / 2
    # and a stranded queue still lasts many ticks, so it keeps driving a high load to max_replicas
    assert cluster.MAX_QUEUE_MS >= 20 * 250
