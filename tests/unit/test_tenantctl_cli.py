"""tenantctl's commands against the in-process fake API (tests/unit/test_tenantctl_fake.py):
output formats, failover, leader hints, watch resume, error reporting and exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from controlplane.api.v1 import api_pb2
from controlplane.cli.tenantctl import run, token_main
from tests.unit.test_tenantctl_fake import ADMIN_TOKEN, TENANT_TOKEN, FakeGroup

TENANTS = """\
apiVersion: controlplane.io/v1
kind: Tenant
metadata: {name: team-a}
spec:
  priority: 100
  quota: {h100: 8}
---
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {name: chat}
spec: {tenant: team-a, engine: vllm, model: llama3-8b-h100, pool: h100, min_replicas: 2}
---
apiVersion: controlplane.io/v1
kind: Cluster
metadata: {name: c1}
spec: {zone: z1, capacity: {h100: 16}}
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch) -> None:
    for var in ("TENANTCTL_TOKEN", "TENANTCTL_CONTEXT", "TENANTCTL_CONFIG"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def group():
    g = FakeGroup(2)
    yield g
    g.stop()


def write_config(path: Path, contexts: list[dict], current: str | None = None) -> Path:
    data = {"apiVersion": "controlplane.io/v1", "kind": "Config", "contexts": contexts}
    if current:
        data["current-context"] = current
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture
def cfg(tmp_path, group) -> Path:
    return write_config(tmp_path / "tenantctl.yaml", [
        {"name": "local", "endpoints": group.addresses, "insecure": True, "token": ADMIN_TOKEN}], "local")


class Ctl:
    def __init__(self, cfg: Path) -> None:
        self.cfg = cfg
        self.sleeps: list[float] = []

    def __call__(self, *args: str, stdin: str = "") -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = run(["--config", str(self.cfg), *args], out=out, err=err, stdin=io.StringIO(stdin),
                 sleep=self.sleeps.append)
        return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def ctl(cfg) -> Ctl:
    return Ctl(cfg)


def test_apply_creates_then_configures_in_dependency_order(ctl, group, tmp_path) -> None:
    f = tmp_path / "objs.yaml"
    # the deployment comes first in the file, its tenant second: apply sends the tenant first
    f.write_text(TENANTS.split("---\n")[1] + "---\n" + TENANTS.split("---\n")[0] + "---\n" + TENANTS.split("---\n")[2])
    rc, out, err = ctl("apply", "-f", str(f))
    assert rc == 0, err
    assert out.splitlines() == ["cluster/c1 created", "tenant/team-a created", "deployment/chat created"]
    assert group.store.tenants["team-a"].spec.quota["h100"] == 8
    assert not group.store.tenants["team-a"].spec.HasField("slo")  # unset fields: the server's defaults
    rc, out, _ = ctl("apply", "-f", str(f))
    assert rc == 0
    assert out.splitlines() == ["cluster/c1 configured", "tenant/team-a configured", "deployment/chat configured"]


def test_apply_from_stdin_json_list(ctl, group) -> None:
    doc = [{"apiVersion": "controlplane.io/v1", "kind": "Zone", "metadata": {"name": "z9"}, "spec": {"region": "eu"}}]
    rc, out, err = ctl("apply", "-f", "-", stdin=json.dumps(doc))
    assert (rc, out) == (0, "zone/z9 created\n"), err
    assert group.store.zones["z9"].spec.region == "eu"


def test_bad_file_sends_nothing_and_names_file_object_field(ctl, group, tmp_path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(TENANTS.replace("priority: 100", "priority: high"))
    rc, _, err = ctl("apply", "-f", str(f))
    assert rc == 1
    assert f"{f}:5: object 1 (Tenant/team-a): spec.priority:" in err
    assert "nothing was sent" in err
    assert group.store.calls == []


def test_get_table_wide_json_yaml_name(ctl, group, tmp_path) -> None:
    (tmp_path / "o.yaml").write_text(TENANTS)
    assert ctl("apply", "-f", str(tmp_path / "o.yaml"))[0] == 0
    rc, out, _ = ctl("get", "deployments")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "TENANT", "MODEL", "POOL", "READY", "WARM", "STATUS", "AGE"]
    assert lines[1].split()[:7] == ["chat", "team-a", "llama3-8b-h100", "h100", "1/2", "1/1", "Active"]
    rc, out, _ = ctl("get", "deploy", "-o", "wide")
    assert "ENGINE" in out.splitlines()[0] and "ready=1,standby=1" in out
    rc, out, _ = ctl("get", "tenant", "team-a", "-o", "json")
    data = json.loads(out)
    assert data["kind"] == "Tenant" and data["spec"] == {"priority": 100, "quota": {"h100": 8}}
    assert data["metadata"]["resourceVersion"] > 0
    rc, out, _ = ctl("get", "tenants", "-o", "yaml")
    listed = yaml.safe_load(out)
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["team-a"]
    rc, out, _ = ctl("get", "clusters", "-o", "name")
    assert out == "cluster/c1\n"


def test_get_output_applies_again(ctl, group, tmp_path) -> None:
    """`get -o yaml` is a valid file: apply it back (conditional on its resourceVersion)."""
    (tmp_path / "o.yaml").write_text(TENANTS)
    ctl("apply", "-f", str(tmp_path / "o.yaml"))
    _, out, _ = ctl("get", "tenants", "-o", "yaml")
    rc, out2, err = ctl("apply", "-f", "-", stdin=out)
    assert (rc, out2) == (0, "tenant/team-a configured\n"), err
    # the same (now stale) resourceVersion again: the server refuses, the message names it all
    rc, _, err = ctl("apply", "-f", "-", stdin=out)
    assert rc == 1
    assert "<stdin>:" in err and "object 1 (Tenant/team-a)" in err and "FAILED_PRECONDITION" in err
    assert group.addresses[0] in err


def test_not_found_names_endpoint_and_exits_1(ctl, group) -> None:
    rc, out, err = ctl("get", "deployment", "nope")
    assert rc == 1 and out == ""
    assert f"{group.addresses[0]}: NOT_FOUND: deployment 'nope' not found" in err


def test_bad_request_field_violations_are_printed(ctl, group, tmp_path) -> None:
    # the fake refuses a tenant without priority with google.rpc.BadRequest details; the client-side
    # check is bypassed by sending the request directly through the client
    from controlplane.api.client import ApiClient, ApiError

    with ApiClient(group.addresses, token=ADMIN_TOKEN) as client, pytest.raises(ApiError) as info:
        client.call("Tenants", "CreateTenant", api_pb2.CreateTenantRequest(
            tenant=api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name="x"))), idempotent=False)
    assert info.value.violations == [("spec.priority", "required")]


def test_unreachable_exits_3_and_failover_to_next_endpoint(ctl, group, cfg, tmp_path) -> None:
    group.endpoints[0].stop()
    rc, _, err = ctl("get", "tenants")
    assert rc == 0, err  # the second endpoint answered
    group.endpoints[1].stop()
    rc, _, err = ctl("get", "tenants")
    assert rc == 3
    assert "no endpoint of context 'local' answered" in err and group.addresses[1] in err


def test_leader_hint_is_followed_once(ctl, group, tmp_path) -> None:
    other = FakeGroup(1)
    try:
        other.store = group.store
        group.endpoints[0].leaderless_hint = other.addresses[0]
        group.endpoints[1].leaderless_hint = ""
        rc, _, err = ctl("cluster", "cordon", "c1")
        assert rc == 1 and "NOT_FOUND" in err  # reached the hinted leader, which answered
        assert [c for c in group.store.calls if c == "CordonCluster"] == ["CordonCluster", "CordonCluster"]
    finally:
        other.stop()


def test_no_leader_anywhere_reports_unavailable_exit_1(ctl, group) -> None:
    for ep in group.endpoints:
        ep.leaderless_hint = ""
    rc, _, err = ctl("get", "tenants")
    assert rc == 1 and "UNAVAILABLE: no leader" in err


def test_cordon_drain_uncordon_and_status(ctl, group, tmp_path) -> None:
    (tmp_path / "o.yaml").write_text(TENANTS)
    ctl("apply", "-f", str(tmp_path / "o.yaml"))
    assert ctl("cluster", "cordon", "c1")[1].startswith("cluster/c1 cordoned (status Cordoned")
    assert ctl("cluster", "drain", "c1")[1].startswith("cluster/c1 draining (status Draining")
    assert ctl("cluster", "uncordon", "c1")[1].startswith("cluster/c1 uncordoned (status Ready")
    assert ctl("zone", "cordon", "z1")[1].startswith("zone/z1 cordoned")
    rc, out, _ = ctl("status")
    assert rc == 0
    assert "leader" in out and "follower" in out and group.addresses[1] in out
    group.endpoints[1].stop()
    rc, out, _ = ctl("status", "-o", "json")
    assert rc == 1
    assert [n["reachable"] for n in json.loads(out)] == [True, False]


def test_delete_kind_name_and_by_file(ctl, group, tmp_path) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(TENANTS)
    ctl("apply", "-f", str(f))
    rc, out, _ = ctl("delete", "deployment", "chat")
    assert rc == 0 and out.startswith("deployment/chat deletion started")
    assert group.store.deployments["chat"].status.deleting
    rc, out, err = ctl("delete", "-f", str(f))
    # reverse order: deployment, tenant (refused: still owns the deployment), cluster
    assert rc == 1
    assert "tenant/team-a" in err and "FAILED_PRECONDITION" in err
    assert "cluster/c1 deleted" in out
    assert ctl("delete", "bogus", "x")[0] == 2


def test_tokens_create_list_revoke_and_whoami(ctl, group, tmp_path) -> None:
    (tmp_path / "o.yaml").write_text(TENANTS)
    ctl("apply", "-f", str(tmp_path / "o.yaml"))
    rc, out, err = ctl("token", "create", "--tenant", "team-a", "--ttl", "12h")
    assert rc == 0 and out.startswith("cp_") and out.count("\n") == 1  # only the token on stdout
    assert "tenant team-a" in err
    rc, out, _ = ctl("token", "list")
    assert rc == 0 and "team-a" in out
    rc, out, _ = ctl("token", "revoke", "000000000001")
    assert rc == 0 and "revoked" in out
    assert ctl("token", "revoke", "000000000001")[0] == 1
    assert ctl("token", "create", "--tenant", "x", "--ttl", "soon")[0] == 2
    rc, out, _ = ctl("whoami")
    assert rc == 0 and "admin" in out
    rc, out, _ = ctl("--token", TENANT_TOKEN, "whoami", "-o", "json")
    assert json.loads(out)["tenant"] == "team-a"


def test_token_main_is_the_same_code(group, cfg, capsys) -> None:
    rc = token_main(["--config", str(cfg), "create", "--admin"])
    assert rc == 0
    assert capsys.readouterr().out.startswith("cp_")
    assert token_main(["--config", str(cfg), "bogus"]) == 2


def test_missing_token_hints_where_to_put_one(tmp_path, group) -> None:
    cfg = write_config(tmp_path / "c.yaml", [{"name": "x", "endpoints": group.addresses, "insecure": True}])
    rc, _, err = Ctl(cfg)("get", "tenants")
    assert rc == 1 and "UNAUTHENTICATED" in err and "no token" in err


def test_token_env_overrides_context(tmp_path, group, monkeypatch) -> None:
    cfg = write_config(tmp_path / "c.yaml", [{"name": "x", "endpoints": group.addresses, "insecure": True,
                                              "token": "cp_wrong"}])
    assert Ctl(cfg)("get", "tenants")[0] == 1
    monkeypatch.setenv("TENANTCTL_TOKEN", ADMIN_TOKEN)
    assert Ctl(cfg)("get", "tenants")[0] == 0


def test_all_contexts_adds_a_context_column(tmp_path, group) -> None:
    other = FakeGroup(1)
    try:
        cfg = write_config(tmp_path / "c.yaml", [
            {"name": "eu", "region": "eu", "endpoints": group.addresses, "insecure": True, "token": ADMIN_TOKEN},
            {"name": "us", "region": "us", "endpoints": other.addresses, "insecure": True, "token": ADMIN_TOKEN}], "eu")
        ctl = Ctl(cfg)
        f = tmp_path / "t.yaml"
        f.write_text(TENANTS.split("---\n")[0])
        rc, out, _ = ctl("--all-contexts", "apply", "-f", str(f))
        assert out.splitlines() == ["eu: tenant/team-a created", "us: tenant/team-a created"]
        rc, out, _ = ctl("get", "tenants", "--all-contexts")
        lines = out.splitlines()
        assert lines[0].split()[:2] == ["CONTEXT", "NAME"]
        assert [ln.split()[0] for ln in lines[1:]] == ["eu", "us"]
        rc, out, _ = ctl("get", "tenants", "--all-contexts", "-o", "json")
        assert [c["context"] for c in json.loads(out)["contexts"]] == ["eu", "us"]
        other.stop()
        rc, out, err = ctl("get", "tenants", "--all-contexts")
        assert rc == 3 and "context us" in err and "eu" in out
    finally:
        other.stop()


def test_describe_explain_dry_run(ctl, group, tmp_path) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(TENANTS)
    ctl("apply", "-f", str(f))
    rc, out, _ = ctl("describe", "deployment", "chat")
    assert rc == 0
    assert "Name:" in out and "Instances:" in out and "i-1" in out and "Decisions:" in out
    rc, out, _ = ctl("explain", "chat")
    assert rc == 0 and "scale_up" in out and "concurrency" in out and "Live evaluation" in out
    rc, out, _ = ctl("explain", "chat", "-o", "json")
    assert json.loads(out)["history"][0]["replicas"] == 3
    rc, out, err = ctl("dry-run", "-f", str(f))
    assert rc == 0
    assert "deployment/chat would change" in out and "max_replicas" in out and "note: tenant a" in out
    assert "tenant/" in out and "cluster/" in out and "skipped" not in err  # the whole file is evaluated


def test_events_table_and_filters(ctl, group) -> None:
    group.emit(type="ADDED", kind="Deployment", name="chat", tenant="team-a")
    group.emit(type="TRANSITION", kind="Instance", name="i-1", deployment="chat", from_state="pending",
               to_state="warming", event="warmed", cluster="c1", zone="z1")
    group.emit(type="DECIDED", kind="Decision", name="chat", deployment="chat", replicas=3, warm_pool=1,
               reason="scale_up")
    rc, out, _ = ctl("events", "--since", "0")
    assert rc == 0
    assert "pending -> warming (warmed) on z1/c1" in out and "replicas 3, warm pool 1: scale_up" in out
    rc, out, _ = ctl("events", "--since", "0", "--kind", "instance", "-o", "json")
    assert [e["kind"] for e in json.loads(out)] == ["Instance"]
    assert ctl("events", "--kind", "bogus")[0] == 2


def test_watch_resumes_on_another_endpoint_without_loss_or_repeats(ctl, group) -> None:
    for i in range(6):
        group.emit(type="TRANSITION", kind="Instance", name=f"i-{i}", deployment="chat", from_state="pending",
                   to_state="warming", event="warmed")
    group.endpoints[0].break_after = 2  # the first endpoint dies after two events
    group.endpoints[1].break_after = 3
    rc, out, err = ctl("watch", "--since", "0", "-o", "json")
    names = [json.loads(line)["name"] for line in out.splitlines()]
    assert names == [f"i-{i}" for i in range(6)]
    assert "stream broke" in err and "resuming after revision" in err
    # the fake breaks every stream at its end: tenantctl gives up after its rounds, exit 1
    assert rc == 1


def test_watch_cursor_resumes_inside_a_batch() -> None:
    """Several events at one revision (a batch): a break in the middle resumes before the revision
    and skips the ones already delivered."""
    from controlplane.api.client import WatchCursor

    c = WatchCursor(None)
    c.on_reconnect(False)
    assert c.accept(api_pb2.Event(type="BOOKMARK", revision=4))
    a, b, d = (api_pb2.Event(type="TRANSITION", revision=5, name=n) for n in "abd")
    assert c.accept(a) and c.accept(b)
    assert c.resume_from() == 4
    c.on_reconnect(True)
    assert c.accept(api_pb2.Event(type="BOOKMARK", revision=9))  # the head, before the backlog
    assert [c.accept(e) for e in (a, b, d)] == [False, False, True]
    assert c.accept(api_pb2.Event(type="TRANSITION", revision=6))
    assert c.resume_from() == 5


def test_get_watch_prints_changed_rows(ctl, group, tmp_path) -> None:
    (tmp_path / "o.yaml").write_text(TENANTS)
    ctl("apply", "-f", str(tmp_path / "o.yaml"))
    group.emit(type="DECIDED", kind="Decision", name="chat", deployment="chat", replicas=2)  # before the list
    group.endpoints[0].on_watch.append(lambda: (
        group.emit(type="DECIDED", kind="Decision", name="chat", deployment="chat", replicas=3),
        group.emit(type="DELETED", kind="Deployment", name="gone", tenant="team-a")))
    _, out, _ = ctl("get", "deployments", "-w", "--timeout", "5")
    lines = out.splitlines()
    assert lines[0].startswith("NAME")
    # the fake ends every stream; each retry resumes after the last revision, so rows are not repeated
    assert sum(1 for ln in lines if ln.startswith("chat")) == 2
    assert any(ln.startswith("gone") and ln.rstrip().endswith("deleted") for ln in lines)


def test_usage_errors_exit_2(ctl) -> None:
    assert ctl("get")[0] == 2
    assert ctl("get", "widgets")[0] == 2
    assert ctl("explain", "x", "--limit", "0")[0] == 2
    assert ctl("--context", "nope", "get", "tenants")[0] == 2
    assert ctl("--endpoint", "not-an-address", "get", "tenants")[0] == 2


def test_completion_scripts(ctl) -> None:
    rc, out, _ = ctl("completion", "bash")
    assert rc == 0 and "complete -F _tenantctl tenantctl" in out and "use-context" in out and "--all-contexts" in out
    rc, out, _ = ctl("completion", "zsh")
    assert rc == 0 and out.startswith("#compdef tenantctl") and "bashcompinit" in out


def test_deployments_are_named_per_tenant(ctl, group, tmp_path) -> None:
    """Admins name a deployment TENANT/NAME (or NAME with --tenant); -o name prints that form, and
    apply/delete -f address the file's object by its spec.tenant (docs/tenantctl.md)."""
    (tmp_path / "t.yaml").write_text(TENANTS)
    assert ctl("apply", "-f", str(tmp_path / "t.yaml"))[0] == 0
    for args in (("get", "deployment", "team-a/chat"), ("get", "deployment", "chat", "--tenant", "team-a")):
        rc, out, err = ctl(*args, "-o", "json")
        assert rc == 0, err
        assert json.loads(out)["metadata"]["name"] == "chat" and json.loads(out)["spec"]["tenant"] == "team-a"
    rc, out, err = ctl("get", "deployment", "team-b/chat")
    assert rc == 1 and "deployment 'team-b/chat' not found" in err
    rc, out, _ = ctl("get", "deployments", "-o", "name")
    assert out == "deployment/team-a/chat\n"
    rc, out, _ = ctl("explain", "team-a/chat")
    assert rc == 0 and "chat" in out and "team-a" in out
    rc, out, _ = ctl("delete", "-f", str(tmp_path / "t.yaml"))  # (the tenant still owns the deployment: rc 1)
    assert "deployment/team-a/chat deletion started" in out
    assert group.store.deployments["chat"].status.deleting
