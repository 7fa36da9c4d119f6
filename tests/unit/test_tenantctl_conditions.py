"""Status conditions through the real tenantctl against a real in-process coordinator (issue 18,
point 1): an impossible deployment says why, a cluster without adapter is not Ready, a preemption
names the tenant that took the GPUs. The control loop is paused (its authority withdrawn) so the
test decides when the planner runs: the real ``reconcile.plan`` on the group's state, its commands
committed through the group's replicator like a tick's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.core import reconcile
from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId
from controlplane.domain.instances import InstanceEvent
from controlplane.runtime.clock import wall_ms
from tests.support.real_ctl import RealCtl, real_ctl

FLEET = """
apiVersion: controlplane.io/v1
kind: Cluster
metadata: {name: c1}
spec: {zone: z1, capacity: {h100: 8}}
---
apiVersion: controlplane.io/v1
kind: Tenant
metadata: {name: silver}
spec: {priority: 10, quota: {a100: 2}, borrow_limit: {h100: 8}}
---
apiVersion: controlplane.io/v1
kind: Tenant
metadata: {name: gold}
spec: {priority: 100, quota: {h100: 4}}
"""

DEPLOYMENT = """
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {{name: {name}}}
spec: {{tenant: {tenant}, engine: vllm, model: {model}, pool: {pool}, min_replicas: {min}, warm_pool: 0}}
"""


@pytest.fixture(scope="module")
def rc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCtl]:
    base = tmp_path_factory.mktemp("conditions")
    with real_ctl(base) as g:
        g.co.loop._authority = lambda now_ms: None  # the planner runs when a test says so
        path = base / "fleet.yaml"
        path.write_text(FLEET, encoding="utf-8")
        code, _, err = g.ctl("apply", "-f", str(path))
        assert code == 0, err
        yield g


def apply_deployment(rc: RealCtl, tmp: Path, name: str, tenant: str, model: str, pool: str, min_replicas: int = 1):
    path = tmp / f"{name}.yaml"
    path.write_text(DEPLOYMENT.format(name=name, tenant=tenant, model=model, pool=pool, min=min_replicas), encoding="utf-8")
    return rc.ctl("apply", "-f", str(path))


def tick(rc: RealCtl) -> None:
    """One real planning step on the group's state, committed like the loop's."""
    now = wall_ms()
    state = rc.co.replicator.state
    p = reconcile.plan(state, {d: None for d in state.deployments}, {}, now, reconcile.ReconcileConfig())
    assert rc.co.replicator.commit(p.commands, now).ok


def row_of(out: str, name: str) -> dict[str, str]:
    lines = out.splitlines()
    headers = lines[0].split()
    for line in lines[1:]:
        cells = line.split()
        if cells and cells[0] == name:
            return dict(zip(headers, cells))
    raise AssertionError(f"{name} not in:\n{out}")


def test_a_deployment_in_a_pool_no_cluster_has_says_no_capacity_in_pool(rc: RealCtl, tmp_path: Path) -> None:
    code, out, err = apply_deployment(rc, tmp_path, "vision", "silver", "llama3-8b-a100", "a100")
    assert code == 0 and "deployment/vision created" in out
    assert ("Warning: deployment/vision: Schedulable=False NoCapacityInPool: no registered cluster has capacity in "
            "pool a100 (model llama3-8b-a100, 1 GPUs per instance); pools: h100") in err
    tick(rc)
    code, out, _ = rc.ctl("get", "deployments")
    assert code == 0 and row_of(out, "vision")["STATUS"] == "NoCapacityInPool"
    code, out, _ = rc.ctl("describe", "deployment", "silver/vision")
    assert code == 0
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Conditions:"))
    assert lines[head + 1].split() == ["TYPE", "STATUS", "REASON", "MESSAGE", "LAST", "TRANSITION"]
    sched = next(line for line in lines[head:] if line.split()[:1] == ["Schedulable"])
    assert sched.split()[1:3] == ["False", "NoCapacityInPool"] and "model llama3-8b-a100" in sched
    assert sched.rstrip().endswith("Z") and "T" in sched.split()[-1]  # RFC 3339, not epoch ms
    assert [line.split()[0] for line in lines[head + 2:head + 7]] == [
        "Ready", "Schedulable", "QuotaExceeded", "Preempted", "BreakerOpen"]
    code, out, _ = rc.ctl("explain", "silver/vision")
    assert code == 0 and "capacity" in out and "allocation granted" not in out


def test_a_cluster_without_adapter_is_not_ready(rc: RealCtl) -> None:
    code, out, _ = rc.ctl("get", "clusters")
    assert code == 0 and row_of(out, "c1")["STATUS"] == "NoAdapter"
    code, out, _ = rc.ctl("describe", "cluster", "c1")
    line = next(x for x in out.splitlines() if x.split()[:1] == ["AdapterConnected"])
    assert line.split()[1:3] == ["False", "NoAdapter"]
    code, out, _ = rc.ctl("get", "zones")
    assert row_of(out, "z1")["STATUS"] == "NoClusterReady"


def test_a_cluster_whose_adapter_never_answers_is_adapter_disconnected(rc: RealCtl, tmp_path: Path) -> None:
    path = tmp_path / "c2.yaml"
    path.write_text("apiVersion: controlplane.io/v1\nkind: Cluster\nmetadata: {name: c2}\n"
                    "spec: {zone: z2, capacity: {l4: 2}, adapter_address: '127.0.0.1:9'}\n", encoding="utf-8")
    code, _, err = rc.ctl("apply", "-f", str(path))
    assert code == 0 and "Warning: cluster/c2: AdapterConnected=False AdapterDisconnected" in err
    code, out, _ = rc.ctl("get", "clusters")
    assert row_of(out, "c2")["STATUS"] == "AdapterDisconnected"


def test_a_preempted_deployment_names_the_tenant_that_took_its_gpus(rc: RealCtl, tmp_path: Path) -> None:
    code, _, err = apply_deployment(rc, tmp_path, "batch", "silver", "llama3-8b-h100", "h100")
    assert code == 0 and "Warning" not in err
    state = rc.co.replicator.state
    did = next(d for d in state.deployments if d.endswith("batch"))
    now = wall_ms()
    cmds: list[c.Command] = [c.SetDesired(DeploymentId(did), 7, 0, "set by test", now)]
    for k in range(7):  # seven serving instances (the loop is paused: placed here as the adapter would report)
        iid = InstanceId(f"batch-{k}")
        cmds += [c.CreateInstance(iid, DeploymentId(did), ClusterId("c1"), now),
                 c.TransitionInstance(iid, InstanceEvent.START_WARMUP, now + 1),
                 c.TransitionInstance(iid, InstanceEvent.WARMED, now + 2)]
    assert rc.co.replicator.commit(cmds, now).ok
    code, _, _ = apply_deployment(rc, tmp_path, "chat", "gold", "llama3-8b-h100", "h100", min_replicas=4)
    assert code == 0
    tick(rc)
    code, out, _ = rc.ctl("get", "deployments")
    assert row_of(out, "batch")["STATUS"] == "PreemptedByTenant" and row_of(out, "batch")["READY"] == "4/4"
    code, out, _ = rc.ctl("describe", "deployment", "silver/batch")
    line = next(x for x in out.splitlines() if x.split()[:1] == ["Preempted"])
    assert line.split()[1:3] == ["True", "PreemptedByTenant"]
    assert "preempted by tenant gold (priority 100): granted 4 of 7 replicas x 1 GPUs" in line
    code, out, _ = rc.ctl("events", "--tenant", "silver")
    assert "preempted" in out and "allocation granted" not in out
    # The preempted tenant's own token learns why, never who: the name and priority stay with admins.
    token = rc.token_for("silver")
    for args in (("describe", "deployment", "batch"), ("explain", "batch"), ("events", "--type", "decision"),
                 ("get", "deployment", "batch", "-o", "yaml")):
        code, out, err = rc.ctl_as(token, *args)
        assert code == 0, err
        assert "gold" not in out and "priority 100" not in out, out
        if args[0] in ("describe", "explain", "events"):
            assert "preempted by a higher-priority tenant" in out, out
