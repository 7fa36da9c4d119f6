"""Issue 18, points 2 and 3, against the real coordinator with the real tenantctl
(:mod:`tests.support.real_ctl`): unchanged objects write nothing, server-side dry runs of every
kind (a new tenant with its deployment in one file), ``diff`` and its exit codes, and whole
validation (every problem once, strict types, "did you mean")."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from controlplane.api.client import ApiError
from controlplane.api.v1 import api_pb2
from controlplane.cli.main import main as controlplane_main
from controlplane.domain import commands as c
from raft import codec
from tests.support.real_ctl import RealCtl, real_ctl

TEAM = """\
apiVersion: controlplane.io/v1
kind: Tenant
metadata: {name: search}
spec: {priority: 5, quota: {h100: 4}}
---
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {name: chat}
spec: {tenant: search, engine: vllm, model: llama3-8b-h100, pool: h100, max_replicas: 4}
---
apiVersion: controlplane.io/v1
kind: Zone
metadata: {name: z1}
spec: {region: eu}
---
apiVersion: controlplane.io/v1
kind: Cluster
metadata: {name: c1}
spec: {zone: z1, region: eu, capacity: {h100: 8}}
"""
OBJECT_PUTS = (c.PutTenant, c.PutDeployment, c.PutCluster, c.PutZone)
OBJECT_KINDS = ("Tenant", "Deployment", "Cluster", "Zone")


@pytest.fixture()
def g(tmp_path: Path) -> Iterator[RealCtl]:
    with real_ctl(tmp_path) as group:
        yield group


def write(tmp_path: Path, text: str, name: str = "team.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


class PutRecorder:
    """Every object put proposed to the Raft node (the API's writes; the control loop's own
    commands are other kinds)."""

    def __init__(self, g: RealCtl) -> None:
        self.puts: list[Any] = []
        node = g.co.node
        real = node.submit

        def submit(payload: bytes, **kw: Any) -> object:
            batch = codec.decode(payload)
            self.puts.extend(cmd for cmd in getattr(batch, "commands", ()) if isinstance(cmd, OBJECT_PUTS))
            return real(payload, **kw)

        node.submit = submit  # type: ignore[method-assign]


def versions(g: RealCtl) -> dict[str, int]:
    a = g.admin
    return {
        "tenant": a.tenants.GetTenant(api_pb2.GetRequest(name="search"), timeout=10).metadata.resource_version,
        "deployment": a.deployments.GetDeployment(api_pb2.GetRequest(name="search/chat"), timeout=10).metadata.resource_version,
        "cluster": a.clusters.GetCluster(api_pb2.GetRequest(name="c1"), timeout=10).metadata.resource_version,
        "zone": a.clusters.GetZone(api_pb2.GetRequest(name="z1"), timeout=10).metadata.resource_version,
    }


def object_events(g: RealCtl, since: int) -> list[api_pb2.Event]:
    events = g.admin.scaling.Watch(api_pb2.WatchRequest(once=True, since_revision=since), timeout=10)
    return [e for e in events if e.kind in OBJECT_KINDS and e.type in ("ADDED", "MODIFIED", "DELETED")]


# --- point 2: apply semantics -------------------------------------------------------------------------


def test_reapplying_an_unchanged_file_writes_nothing(g: RealCtl, tmp_path: Path) -> None:
    f = write(tmp_path, TEAM)
    code, out, err = g.ctl("apply", "-f", f)
    assert code == 0, err
    assert out.splitlines() == ["zone/z1 created", "cluster/c1 created", "tenant/search created", "deployment/chat created"]
    before = versions(g)
    revision = g.co.node.state_copy().applied
    recorder = PutRecorder(g)
    code, out, err = g.ctl("apply", "-f", f)
    assert code == 0, err
    assert out.splitlines() == ["zone/z1 unchanged", "cluster/c1 unchanged", "tenant/search unchanged",
                                "deployment/chat unchanged"]
    assert recorder.puts == []  # no Raft entry proposed: the log does not grow
    assert versions(g) == before
    assert object_events(g, revision) == []  # no watch wakes up
    # a real change is still written, and says so
    code, out, err = g.ctl("apply", "-f", write(tmp_path, TEAM.replace("priority: 5", "priority: 6"), "b.yaml"))
    assert code == 0, err
    assert "tenant/search configured" in out and "deployment/chat unchanged" in out
    assert [type(p) for p in recorder.puts] == [c.PutTenant]
    after = versions(g)
    assert after["tenant"] > before["tenant"] and after["deployment"] == before["deployment"]


def test_an_unchanged_tenant_leaves_the_state_revision_where_it_was(g: RealCtl, tmp_path: Path) -> None:
    """With no deployment the control loop commits nothing itself: the replicated state's revision
    (the counter of resource_version) must not move at all (the Raft index moves with lease renewals)."""
    f = write(tmp_path, TEAM.split("---\n")[0])
    assert g.ctl("apply", "-f", f)[1] == "tenant/search created\n"
    revision = g.co.node.state_copy().applied
    for _ in range(3):
        assert g.ctl("apply", "-f", f)[1] == "tenant/search unchanged\n"
    assert g.co.node.state_copy().applied == revision


def test_every_writer_takes_dry_run_and_writes_nothing(g: RealCtl) -> None:
    a = g.admin
    recorder = PutRecorder(g)
    digest = g.state_digest()
    zone = api_pb2.Zone(metadata=api_pb2.ObjectMeta(name="z9"), spec=api_pb2.ZoneSpec(region="eu"))
    cluster = api_pb2.Cluster(metadata=api_pb2.ObjectMeta(name="c9"),
                              spec=api_pb2.ClusterSpec(zone="z9", region="eu", capacity={"h100": 2}))
    tenant = api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name="t9"), spec=api_pb2.TenantSpec(priority=3))
    replies = [
        a.clusters.RegisterZone(api_pb2.RegisterZoneRequest(zone=zone, dry_run=True), timeout=10),
        a.clusters.RegisterCluster(api_pb2.RegisterClusterRequest(cluster=cluster, dry_run=True), timeout=10),
        a.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant, dry_run=True), timeout=10),
    ]
    assert [r.metadata.apply_result for r in replies] == ["created"] * 3
    assert replies[2].spec.priority == 3 and replies[2].spec.slo.ttft_p99_ms == 2000  # defaults applied
    # UpdateTenant and ApplyDeployment need the tenant: refused exactly as the real write would be
    with pytest.raises(grpc.RpcError) as exc:
        a.tenants.UpdateTenant(api_pb2.UpdateTenantRequest(tenant=tenant, dry_run=True), timeout=10)
    assert exc.value.code() is grpc.StatusCode.NOT_FOUND
    dep = api_pb2.Deployment(metadata=api_pb2.ObjectMeta(name="d9"), spec=api_pb2.DeploymentSpec(
        tenant="t9", engine="vllm", model="llama3-8b-h100", pool="h100"))
    with pytest.raises(grpc.RpcError) as exc:
        a.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=dep, dry_run=True), timeout=10)
    assert exc.value.code() is grpc.StatusCode.NOT_FOUND and "t9" in exc.value.details()
    assert recorder.puts == [] and g.state_digest() == digest
    # once the tenant exists: the dry-run update says configured / unchanged, and still writes nothing
    a.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant), timeout=10)
    recorder.puts.clear()
    digest = g.state_digest()
    same = a.tenants.UpdateTenant(api_pb2.UpdateTenantRequest(tenant=tenant, dry_run=True), timeout=10)
    tenant.spec.priority = 4
    changed = a.tenants.UpdateTenant(api_pb2.UpdateTenantRequest(tenant=tenant, dry_run=True), timeout=10)
    made = a.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=dep, dry_run=True), timeout=10)
    assert (same.metadata.apply_result, changed.metadata.apply_result) == ("unchanged", "configured")
    assert changed.spec.priority == 4 and made.metadata.apply_result == "created" and made.spec.max_replicas == 64
    assert recorder.puts == [] and g.state_digest() == digest


def test_server_dry_run_of_a_new_tenant_with_its_deployment(g: RealCtl, tmp_path: Path) -> None:
    f = write(tmp_path, TEAM)
    recorder = PutRecorder(g)
    digest = g.state_digest()
    code, out, err = g.ctl("apply", "--dry-run=server", "-f", f)
    assert code == 0, err
    assert out.splitlines() == ["zone/z1 created (server dry run)", "cluster/c1 created (server dry run)",
                                "tenant/search created (server dry run)", "deployment/chat created (server dry run)"]
    code, out, err = g.ctl("dry-run", "-f", f)
    assert code == 0, err
    assert "tenant/search created" in out and "deployment/chat would be created" in out
    assert "NOT_FOUND" not in err and "skipped" not in err
    code, out, _ = g.ctl("dry-run", "-f", f, "-o", "json")
    by_ref = {o["object"]: o for o in json.loads(out)}
    assert by_ref["deployment/chat"]["result"] == "created" and by_ref["deployment/chat"]["target_after"] == 1
    assert recorder.puts == [] and g.state_digest() == digest
    assert g.ctl("get", "tenant", "search")[0] == 1  # nothing was written
    # bare --dry-run stays the client-side check: nothing is sent
    code, out, _ = g.ctl("apply", "--dry-run", "-f", f)
    assert code == 0 and "tenant/search valid (dry run: nothing sent)" in out
    assert g.ctl("apply", "--dry-run=client", "-f", f)[1] == out


def test_server_dry_run_shows_each_refusal_once(g: RealCtl, tmp_path: Path) -> None:
    assert g.ctl("apply", "-f", write(tmp_path, TEAM))[0] == 0
    digest = g.state_digest()
    moved = TEAM.replace("pool: h100, max_replicas: 4", "pool: a100, max_replicas: 4") + """\
---
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {name: other}
spec: {tenant: nobody, engine: vllm, model: llama3-8b-h100, pool: h100}
"""
    code, out, err = g.ctl("apply", "--dry-run=server", "-f", write(tmp_path, moved, "moved.yaml"))
    assert code == 1
    assert "tenant/search unchanged (server dry run)" in out  # the other objects are still evaluated
    assert err.count("pool and gpus_per_instance cannot change") == 1
    assert err.count("tenant 'nobody' not found") == 1 and "deployment/other" in err
    assert g.state_digest() == digest
    # a tenant's token cannot dry-run another kind: said per object
    token = g.token_for("search")
    code, out, err = g.ctl_as(token, "apply", "--dry-run=server", "-f", write(tmp_path, TEAM, "t.yaml"))
    assert code == 1 and "PERMISSION_DENIED" in err and "deployment/chat unchanged (server dry run)" in out


def test_diff_exit_codes_and_output(g: RealCtl, tmp_path: Path) -> None:
    f = write(tmp_path, TEAM)
    code, out, err = g.ctl("diff", "-f", f)
    assert code == 1, err
    assert "--- live/tenant/search" in out and "+++ merged/tenant/search" in out and "+kind: Tenant" in out
    assert g.ctl("apply", "-f", f)[0] == 0
    assert g.ctl("diff", "-f", f) == (0, "", "")
    code, out, err = g.ctl("diff", "-f", write(tmp_path, TEAM.replace("max_replicas: 4", "max_replicas: 6"), "b.yaml"))
    assert code == 1, err
    assert "-  max_replicas: 4\n+  max_replicas: 6\n" in out and "+++ merged/deployment/search/chat" in out
    assert "tenant/search" not in out  # unchanged objects print nothing
    for output_only in ("resourceVersion", "createdMs", "updatedMs", "status", "applyResult", "desired_replicas"):
        assert output_only not in out
    # refused by the server, invalid file, unreachable: > 1
    code, _, err = g.ctl("diff", "-f", write(tmp_path, TEAM.replace("pool: h100,", "pool: a100,"), "c.yaml"))
    assert code == 2 and err.count("pool and gpus_per_instance cannot change") == 1
    assert g.ctl("diff", "-f", write(tmp_path, "kind: Tenant\n", "d.yaml"))[0] == 2
    assert g.ctl("diff", "-f", f, "--endpoint", "127.0.0.1:1", "--timeout", "0.5")[0] == 3


# --- point 3: whole validation --------------------------------------------------------------------------

BAD_POLICY = """\
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {name: chat}
spec:
  tenant: search
  engine: vllm
  model: llama3-8b-h100
  pool: h100
  policy:
    target_concurrency: 0
    max_step_up: -1
    tolerance: 5
"""


def test_a_file_with_three_policy_problems_reports_all_three_once(g: RealCtl, tmp_path: Path) -> None:
    f = write(tmp_path, BAD_POLICY)
    for args in (("apply", "-f", f), ("apply", "--dry-run=server", "-f", f), ("dry-run", "-f", f)):
        code, out, err = g.ctl(*args)
        assert code == 1 and out == ""
        for field, line in (("spec.policy.target_concurrency", 10), ("spec.policy.max_step_up", 11),
                            ("spec.policy.tolerance", 12)):
            assert err.count(f"{field}:") == 1, err
            assert f"team.yaml:{line}: object 1 (Deployment/chat): {field}: must be between" in err
        assert "nothing was sent" in err


def test_strict_types_and_did_you_mean(g: RealCtl, tmp_path: Path) -> None:
    yaml_file = write(tmp_path, BAD_POLICY.replace("  policy:\n    target_concurrency: 0\n    max_step_up: -1\n"
                                                   "    tolerance: 5\n", "  max_replicas: true\n  min_replica: 2\n"))
    code, _, err = g.ctl("apply", "-f", yaml_file)
    assert code == 1
    assert "team.yaml:9: object 1 (Deployment/chat): spec.max_replicas: input should be a valid integer, got True" in err
    assert "spec.min_replica: unknown field (did you mean 'min_replicas'?)" in err
    json_file = write(tmp_path, json.dumps({"apiVersion": "controlplane.io/v1", "kind": "Tenant",
                                            "metadata": {"name": "team-a"}, "spec": {"priority": "5"}}), "t.json")
    code, _, err = g.ctl("apply", "-f", json_file)
    assert code == 1 and "spec.priority: input should be a valid integer, got '5'" in err
    yaml_string = write(tmp_path, "apiVersion: controlplane.io/v1\nkind: Tenant\nmetadata: {name: team-a}\n"
                                  "spec: {priority: '5'}\n", "t.yaml")
    assert g.ctl("apply", "-f", yaml_string)[2].count("spec.priority: input should be a valid integer, got '5'") == 1
    code, _, err = g.ctl("apply", "-f", write(tmp_path, "apiVersion: controlplane.io/v1\nkind: Tenant\nmetdata: {}\n", "m.yaml"))
    assert code == 1 and "metdata: unknown field (did you mean 'metadata'?)" in err
    assert g.ctl("get", "tenant", "team-a")[0] == 1


def test_an_invalid_name_is_reported_once(tmp_path: Path) -> None:
    """It is checked with the envelope and again by the spec model: printed once all the same."""
    from controlplane.cli.tenantctl import run

    f = write(tmp_path, "apiVersion: controlplane.io/v1\nkind: Tenant\nmetadata: {name: A_b}\nspec: {priority: 1}\n")
    err = io.StringIO()
    assert run(["apply", "--dry-run", "-f", f], out=io.StringIO(), err=err) == 1
    assert err.getvalue().count("metadata.name: 'A_b' is not a valid id") == 1


def test_the_server_reports_every_field_violation(g: RealCtl) -> None:
    g.admin.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=api_pb2.Tenant(
        metadata=api_pb2.ObjectMeta(name="search"), spec=api_pb2.TenantSpec(priority=1))), timeout=10)
    dep = api_pb2.Deployment(metadata=api_pb2.ObjectMeta(name="chat"), spec=api_pb2.DeploymentSpec(
        tenant="search", engine="vllm", model="llama3-8b-h100", pool="h100",
        policy=api_pb2.ScalingPolicy(target_concurrency=0.001, max_step_up=-1, tolerance=5)))
    for dry in (False, True):
        with pytest.raises(grpc.RpcError) as exc:
            g.admin.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=dep, dry_run=dry), timeout=10)
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        status = rpc_status.from_call(exc.value)
        assert status is not None
        bad = error_details_pb2.BadRequest()
        status.details[0].Unpack(bad)
        assert [v.field for v in bad.field_violations] == [
            "spec.policy.target_concurrency", "spec.policy.tolerance", "spec.policy.max_step_up"]


def test_tenantctl_prints_each_server_violation_once() -> None:
    from controlplane.cli.tenantctl.app import build_parser, report
    from controlplane.cli.tenantctl.app import Session

    err = io.StringIO()
    s = Session(build_parser().parse_args(["get", "tenants"]), io.StringIO(), err, io.StringIO())
    exc = ApiError("127.0.0.1:1", grpc.StatusCode.INVALID_ARGUMENT, "spec.a: bad; spec.b: worse",
                   [("spec.a", "bad"), ("spec.b", "worse")])
    assert report(s, exc, "apply deployment/chat") == 1
    text = err.getvalue()
    assert "INVALID_ARGUMENT: 2 problems" in text
    assert text.count("spec.a: bad") == 1 and text.count("spec.b: worse") == 1


SCENARIO = """\
name: broken
duration_s: 60
clusters:
  - {id: c1, zone: z1, capacity: {h100: 8}}
tenants:
  - {id: t1, priority: "5", quota: {h100: 8}}
deployments:
  - id: d1
    tenant: t1
    engine: vllm
    model: llama3-8b-h100
    pool: h100
    max_replicas: true
    min_replica: 2
    policy: {target_concurrency: 0, max_step_up: -1, tolerance: 5}
    workload:
      generator: {duration_s: 60, base_rps: 1}
"""


@pytest.mark.parametrize("argv", [["simulate", "--scenario"], ["bench", "fleet", "--fleet"]])
def test_scenario_and_fleet_files_report_every_problem(tmp_path: Path, argv: list[str],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, SCENARIO, "scenario.yaml")
    extra = ["--out", str(tmp_path / "out")] if argv[0] == "bench" else []
    code = controlplane_main([*argv, path, *extra])
    err = capsys.readouterr().err
    assert code != 0
    for needle in ("scenario.yaml:6: tenants[0].priority: Input should be a valid integer, got '5'",
                   "scenario.yaml:13: deployments[0].max_replicas: Input should be a valid integer, got True",
                   "scenario.yaml:14: deployments[0].min_replica: unknown field (did you mean 'min_replicas'?)",
                   "deployments[0].policy.target_concurrency: must be between",
                   "deployments[0].policy.max_step_up: must be between",
                   "deployments[0].policy.tolerance: must be between"):
        assert err.count(needle) == 1, err
    assert not (tmp_path / "out").exists()
