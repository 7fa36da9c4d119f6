"""tenantctl's kubectl habits (issue 18 point 6), each driven through the real CLI against the real
in-process coordinator (tests/support/real_ctl.py): labels and ``-l`` selectors evaluated by the
server, ``-o jsonpath=``, ``--sort-by``, ``scale`` (with a conflicting writer), ``edit`` (an EDITOR
script), ``delete --wait / --ignore-not-found``, ``config set-context / current-context``,
``apply -f DIR -R``, ``--version``, describe's layout and RFC 3339 times, and the yaml round trip."""

from __future__ import annotations

import io
import json
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from controlplane.api.client import ApiClient
from controlplane.api.v1 import api_pb2
from controlplane.cli.main import main as controlplane_main
from controlplane.cli.tenantctl import run
from controlplane.cli.tenantctl.jsonpath import JsonPathError, render
from controlplane.cli.tenantctl.render import person_times, person_yaml, rfc3339
from controlplane.cli.version import version
from controlplane.domain.errors import ValidationError
from controlplane.domain.labels import check_labels, parse_selector
from tests.support.real_ctl import RealCtl, real_ctl
from tests.unit.test_api_server import MODEL, code_of
from tests.unit.test_tenantctl_fake import ADMIN_TOKEN, FakeGroup

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z")
EPOCH_MS = re.compile(r"\b1[6-9]\d{11}\b")


def tenant(name: str, priority: int = 10, labels: dict[str, str] | None = None) -> str:
    return yaml.safe_dump({"apiVersion": "controlplane.io/v1", "kind": "Tenant",
                           "metadata": {"name": name, **({"labels": labels} if labels else {})},
                           "spec": {"priority": priority, "quota": {"h100": 4}}})


def deployment(name: str, tenant_name: str, labels: dict[str, str] | None = None, **spec: Any) -> str:
    return yaml.safe_dump({"apiVersion": "controlplane.io/v1", "kind": "Deployment",
                           "metadata": {"name": name, **({"labels": labels} if labels else {})},
                           "spec": {"tenant": tenant_name, "engine": "vllm", "model": MODEL, "pool": "h100",
                                    "min_replicas": 0, "max_replicas": 4, **spec}})


@pytest.fixture(scope="module")
def g(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCtl]:
    with real_ctl(tmp_path_factory.mktemp("kubectl")) as group:
        yield group


def ok(g: RealCtl, *args: str, stdin: str = "") -> str:
    code, out, err = g.ctl(*args, stdin=stdin)
    assert code == 0, (args, out, err)
    return out


def apply(g: RealCtl, *docs: str) -> str:
    return ok(g, "apply", "-f", "-", stdin="---\n".join(docs))


# --------------------------------------------------------------------------------------------------
# --version
# --------------------------------------------------------------------------------------------------


def test_version_of_both_commands(g: RealCtl, capsys: pytest.CaptureFixture[str]) -> None:
    assert ok(g, "--version") == f"tenantctl {version()}\n"
    with pytest.raises(SystemExit) as info:
        controlplane_main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"controlplane {version()}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", version())


# --------------------------------------------------------------------------------------------------
# labels and selectors
# --------------------------------------------------------------------------------------------------


def test_label_and_selector_syntax_is_kubernetes() -> None:
    check_labels("x", {"team": "search", "example.com/tier": "", "a.b_c-d": "V1.2_x-y"})
    for bad in ({"": "x"}, {"-a": "x"}, {"a" * 64: "x"}, {"Example.com/a": "x"}, {"a": "b c"}, {"a": "-b"},
                {f"k{i}": "v" for i in range(65)}):
        with pytest.raises(ValidationError):
            check_labels("x", bad)
    labels = {"team": "search", "tier": "gold"}
    cases = {"team=search": True, "team==search": True, "team!=search": False, "team": True, "!team": False,
             "!zone": True, "tier in (gold,silver)": True, "tier notin (gold)": False, "zone notin (a)": True,
             "zone!=a": True, "team=search,tier=bronze": False, " team = search , tier ": True, "": True}
    for text, expected in cases.items():
        assert parse_selector(text).matches(labels) is expected, text
    for bad in ("team in (a", "team in ()", "=x", "team=a=b", "!team=x", "team ~ x", "a b", "team,", "in (a)"):
        with pytest.raises(ValidationError) as info:
            parse_selector(bad)
        assert info.value.field == "label_selector" and "is not a valid label selector" in info.value.problem, bad


def test_labels_round_trip_and_select_on_the_server(g: RealCtl) -> None:
    apply(g, tenant("lab-a", labels={"team": "search", "example.com/tier": "gold"}),
          tenant("lab-b", labels={"team": "batch"}), tenant("lab-c"),
          yaml.safe_dump({"apiVersion": "controlplane.io/v1", "kind": "Zone",
                          "metadata": {"name": "lab-z", "labels": {"site": "fra"}}, "spec": {"region": "local"}}))
    data = yaml.safe_load(ok(g, "get", "tenant", "lab-a", "-o", "yaml"))
    assert data["metadata"]["labels"] == {"example.com/tier": "gold", "team": "search"}
    assert yaml.safe_load(ok(g, "get", "zone", "lab-z", "-o", "yaml"))["metadata"]["labels"] == {"site": "fra"}

    def names(selector: str) -> list[str]:
        out = ok(g, "get", "tenants", "-l", selector, "-o", "name")
        return [line.split("/")[1] for line in out.split() if line.startswith("tenant/lab-")]

    assert names("team=search") == ["lab-a"]
    assert names("team!=search") == ["lab-b", "lab-c"]
    assert names("team") == ["lab-a", "lab-b"]
    assert names("!team") == ["lab-c"]
    assert names("team in (batch,search),example.com/tier notin (silver)") == ["lab-a", "lab-b"]
    assert names("team in (search,other),example.com/tier notin (silver)") == ["lab-a"]
    assert names("example.com/tier notin (gold)") == ["lab-b", "lab-c"]
    # evaluated by the server: the List reply itself holds only the matching objects
    reply = g.admin.tenants.ListTenants(api_pb2.ListRequest(label_selector="team=batch"), timeout=10)
    assert [t.metadata.name for t in reply.items] == ["lab-b"]
    err = code_of(g.admin.tenants.ListTenants, api_pb2.ListRequest(label_selector="team in (a"))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT and "label_selector" in err.details()
    code, out, stderr = g.ctl("get", "tenants", "-l", "team in (a")
    assert code == 1 and out == ""
    assert "INVALID_ARGUMENT: label_selector: 'team in (a' is not a valid label selector" in stderr
    # --show-labels and describe show them; a cordon keeps them; an apply without them removes them
    table = ok(g, "get", "tenants", "--show-labels", "-l", "team")
    assert "LABELS" in table and "example.com/tier=gold,team=search" in table and "team=batch" in table
    assert all(line == line.rstrip() for line in table.splitlines())  # no padding left at line ends
    ok(g, "zone", "cordon", "lab-z")
    assert yaml.safe_load(ok(g, "get", "zone", "lab-z", "-o", "yaml"))["metadata"]["labels"] == {"site": "fra"}
    apply(g, tenant("lab-b"))
    assert names("team") == ["lab-a"]


def test_bad_labels_are_refused_by_the_file_check_and_by_the_server(g: RealCtl) -> None:
    code, out, err = g.ctl("apply", "-f", "-", stdin=tenant("lab-bad", labels={"team": "a b"}))
    assert code == 1 and "metadata.labels.team: a label value 'a b' is not valid" in err and "nothing was sent" in err
    msg = api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name="lab-bad", labels={"-x": "1"}),
                         spec=api_pb2.TenantSpec(priority=1))
    err2 = code_of(g.admin.tenants.CreateTenant, api_pb2.CreateTenantRequest(tenant=msg))
    assert err2.code() is grpc.StatusCode.INVALID_ARGUMENT and "metadata.labels.-x" in err2.details()


def test_delete_by_selector(g: RealCtl) -> None:
    apply(g, tenant("sel-a", labels={"gone": "yes"}), tenant("sel-b", labels={"gone": "yes"}), tenant("sel-c"))
    out = ok(g, "delete", "tenants", "-l", "gone=yes")
    assert "tenant/sel-a deleted" in out and "tenant/sel-b deleted" in out and "sel-c" not in out
    assert "tenant/sel-c" in ok(g, "get", "tenants", "-o", "name")
    assert "sel-a" not in ok(g, "get", "tenants", "-o", "name")


# --------------------------------------------------------------------------------------------------
# -o jsonpath, custom-columns, --sort-by
# --------------------------------------------------------------------------------------------------


def test_jsonpath_templates() -> None:
    data = {"items": [{"metadata": {"name": "a", "labels": {"x.io/t": "1"}}, "spec": {"n": 3, "pool": "h100"}},
                      {"metadata": {"name": "b"}, "spec": {"n": 1, "pool": "a100"}}]}
    assert render("{.items[*].metadata.name}", data) == "a b"
    assert render('{range .items[*]}{.metadata.name}{"\\t"}{.spec.n}{"\\n"}{end}', data) == "a\t3\nb\t1\n"
    assert render('{.items[?(@.spec.pool=="a100")].metadata.name}', data) == "b"
    assert render("{.items[?(@.spec.n>2)].metadata.name}", data) == "a"
    assert render("{.items[-1].metadata.name} {.items[0:1].spec.n}", data) == "b 3"
    assert render("{.items[0].metadata.labels['x.io/t']}", data) == "1"
    assert render("{..name}", data) == "a b"
    assert render(".items[1].spec", data) == '{"n":1,"pool":"a100"}'
    assert render("{.items[5].metadata.name}", data) == ""  # a missing key matches nothing
    for bad in ("{.items[", "{range .items[*]}x", "{end}", "{.a b}", "{.items[?(@.n=1)]}"):
        with pytest.raises(JsonPathError):
            render(bad, data)


def test_jsonpath_custom_columns_and_sort_by(g: RealCtl) -> None:
    apply(g, tenant("srt-b", priority=30), tenant("srt-a", priority=20), tenant("srt-c", priority=5))
    out = ok(g, "get", "tenants", "-o", "jsonpath={.items[*].metadata.name}")
    assert {"srt-a", "srt-b", "srt-c"} <= set(out.split())
    out = ok(g, "get", "tenants", "--sort-by", ".spec.priority",
             "-o", 'jsonpath={range .items[*]}{.metadata.name}={.spec.priority}{"\\n"}{end}')
    ours = [line for line in out.splitlines() if line.startswith("srt-")]
    assert ours == ["srt-c=5", "srt-a=20", "srt-b=30"]
    out = ok(g, "get", "tenants", "--sort-by", "{.metadata.name}", "-o", "name")
    listed = [line for line in out.splitlines() if "srt-" in line]
    assert listed == ["tenant/srt-a", "tenant/srt-b", "tenant/srt-c"]
    assert ok(g, "get", "tenant", "srt-a", "-o", "jsonpath={.spec.priority}") == "20"
    created = ok(g, "get", "tenant", "srt-a", "-o", "jsonpath={.metadata.creationTimestamp}")
    assert RFC3339.fullmatch(created)
    out = ok(g, "get", "tenants", "--sort-by", ".spec.priority", "-o", "custom-columns=NAME:.metadata.name,PRIO:.spec.priority")
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["NAME", "PRIO"] and [r for r in lines if r[0].startswith("srt-")][0] == ["srt-c", "5"]
    code, _, err = g.ctl("get", "tenants", "-o", "jsonpath={.items[")
    assert code == 2 and "-o jsonpath:" in err
    code, _, err = g.ctl("get", "tenants", "--sort-by", ".a b")
    assert code == 2 and "--sort-by:" in err
    assert g.ctl("get", "tenants", "-o", "jsonpath")[0] == 2  # argparse: "jsonpath needs a template"


# --------------------------------------------------------------------------------------------------
# scale
# --------------------------------------------------------------------------------------------------


def _spec(g: RealCtl, name: str) -> api_pb2.DeploymentSpec:
    return g.admin.deployments.GetDeployment(api_pb2.GetRequest(name=name), timeout=10).spec


def test_scale_pins_or_sets_bounds(g: RealCtl) -> None:
    apply(g, tenant("sc"), deployment("web", "sc", labels={"app": "web"}))
    assert ok(g, "scale", "deployment", "sc/web", "--replicas", "3") == "deployment/sc/web scaled\n"
    spec = _spec(g, "sc/web")
    assert (spec.min_replicas, spec.max_replicas) == (3, 3)
    ok(g, "scale", "deploy", "web", "--tenant", "sc", "--min", "1", "--max", "6")
    spec = _spec(g, "sc/web")
    assert (spec.min_replicas, spec.max_replicas) == (1, 6)
    got = g.admin.deployments.GetDeployment(api_pb2.GetRequest(name="sc/web"), timeout=10)
    assert dict(got.metadata.labels) == {"app": "web"}  # the read-modify-write keeps what it did not touch
    for args, problem in ((["--replicas", "2", "--min", "1"], "give it alone"), ([], "give --replicas N"),
                          (["--max", "-1"], "--max: must be >= 0")):
        code, _, err = g.ctl("scale", "deployment", "sc/web", *args)
        assert code == 2 and problem in err, err
    code, _, err = g.ctl("scale", "deployment", "sc/web", "--min", "9")
    assert code == 1 and "min_replicas" in err  # the server's refusal: min above max
    code, _, err = g.ctl("scale", "tenant", "sc", "--replicas", "1")
    assert code == 2


def test_scale_retries_when_another_writer_changes_the_deployment(g: RealCtl, monkeypatch: pytest.MonkeyPatch) -> None:
    apply(g, tenant("race"), deployment("job", "race"))
    real_call = ApiClient.call
    writes = {"n": 0}

    def racing(self: ApiClient, service: str, method: str, request: Any, **kw: Any) -> Any:
        if method == "ApplyDeployment" and writes["n"] < 2:  # another writer wins twice in a row
            writes["n"] += 1
            current = g.admin.deployments.GetDeployment(api_pb2.GetRequest(name="race/job"), timeout=10)
            current.spec.warm_pool = writes["n"] + 1  # a real change (the default 1 would be `unchanged`)
            g.admin.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=api_pb2.Deployment(
                metadata=api_pb2.ObjectMeta(name="job"), spec=current.spec)), timeout=10)
        return real_call(self, service, method, request, **kw)

    monkeypatch.setattr(ApiClient, "call", racing)
    assert ok(g, "scale", "deployment", "race/job", "--replicas", "2") == "deployment/race/job scaled\n"
    spec = _spec(g, "race/job")
    assert writes["n"] == 2 and (spec.min_replicas, spec.max_replicas, spec.warm_pool) == (2, 2, 3)


def test_scale_gives_up_after_bounded_conflicts(g: RealCtl, monkeypatch: pytest.MonkeyPatch) -> None:
    apply(g, tenant("race2"), deployment("job", "race2"))
    real_call = ApiClient.call

    def always(self: ApiClient, service: str, method: str, request: Any, **kw: Any) -> Any:
        if method == "ApplyDeployment":
            request.deployment.metadata.resource_version = 1  # always stale
        return real_call(self, service, method, request, **kw)

    monkeypatch.setattr(ApiClient, "call", always)
    code, _, err = g.ctl("scale", "deployment", "race2/job", "--replicas", "2")
    assert code == 1 and "changed under every one of 5 attempts" in err
    assert _spec(g, "race2/job").max_replicas == 4


# --------------------------------------------------------------------------------------------------
# edit
# --------------------------------------------------------------------------------------------------

EDITOR = r"""
import os, pathlib, re, sys
path = pathlib.Path(sys.argv[-1])  # the editor gets the file as its last argument
log = pathlib.Path(os.environ["EDIT_LOG"])
mode = os.environ["EDIT_MODE"]
text = path.read_text()
rounds = log.read_text().count("\n") if log.exists() else 0
comments = [line for line in text.splitlines() if line.startswith("#")]
log.write_text((log.read_text() if log.exists() else "") + " | ".join(comments) + "\n")
if mode == "priority":
    path.write_text(re.sub(r"priority: \d+", "priority: 42", text))
elif mode == "fix-after-error":
    path.write_text(re.sub(r"priority: -?\d+", "priority: -1" if rounds == 0 else "priority: 7", text))
elif mode == "always-bad":
    path.write_text(re.sub(r"priority: -?\d+", "priority: -1", text))
elif mode == "stale":  # a version someone else moved past, then (told so) no version at all
    if rounds == 0:
        path.write_text(re.sub(r"resourceVersion: (\d+)", lambda m: f"resourceVersion: {int(m.group(1)) - 1}",
                               re.sub(r"priority: \d+", "priority: 8", text)))
    else:
        path.write_text(re.sub(r"\n *resourceVersion: \d+", "", text))
elif mode == "empty":
    path.write_text("")
elif mode == "fail":
    sys.exit(3)
"""


def edit(g: RealCtl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, *args: str
         ) -> tuple[int, str, str, list[str]]:
    """``tenantctl edit ARGS`` with EDITOR set to the script above in ``mode``; the last item is the
    comment lines the editor saw, one entry per time it was opened."""
    script = tmp_path / "editor.py"
    script.write_text(EDITOR)
    log = tmp_path / f"{mode}.log"
    log.unlink(missing_ok=True)
    monkeypatch.delenv("KUBE_EDITOR", raising=False)
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    monkeypatch.setenv("EDIT_LOG", str(log))
    monkeypatch.setenv("EDIT_MODE", mode)
    code, out, err = g.ctl("edit", *args)
    return code, out, err, log.read_text().splitlines() if log.exists() else []


def test_edit_applies_cancels_and_reopens_on_error(g: RealCtl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apply(g, tenant("ed"))
    code, out, err, _ = edit(g, tmp_path, monkeypatch, "none", "tenant", "ed")
    assert (code, out) == (0, "Edit cancelled, no changes made.\n"), err
    code, out, _, _ = edit(g, tmp_path, monkeypatch, "empty", "tenant", "ed")
    assert (code, out) == (0, "Edit cancelled, no changes made.\n")
    before = g.admin.tenants.GetTenant(api_pb2.GetRequest(name="ed"), timeout=10).metadata.resource_version
    code, out, err, _ = edit(g, tmp_path, monkeypatch, "priority", "tenant", "ed")
    assert (code, out) == (0, "tenant/ed edited\n"), err
    t = g.admin.tenants.GetTenant(api_pb2.GetRequest(name="ed"), timeout=10)
    assert t.spec.priority == 42 and t.metadata.resource_version > before
    code, out, err, seen = edit(g, tmp_path, monkeypatch, "fix-after-error", "tenant", "ed")
    assert (code, out) == (0, "tenant/ed edited\n"), err
    assert len(seen) == 2 and seen[0].startswith("# Please edit") and "spec.priority" not in seen[0]
    assert "# edit:9: object 1 (Tenant/ed): spec.priority: input should be greater than or equal to 0" in seen[1]
    assert g.admin.tenants.GetTenant(api_pb2.GetRequest(name="ed"), timeout=10).spec.priority == 7
    code, out, err, seen = edit(g, tmp_path, monkeypatch, "stale", "tenant", "ed")
    assert (code, out) == (0, "tenant/ed edited\n"), err
    assert len(seen) == 2 and "FAILED_PRECONDITION" in seen[1] and "resource_version" in seen[1]
    assert g.admin.tenants.GetTenant(api_pb2.GetRequest(name="ed"), timeout=10).spec.priority == 8
    ok(g, "apply", "-f", "-", stdin=tenant("ed", priority=7))
    code, _, err, seen = edit(g, tmp_path, monkeypatch, "always-bad", "tenant", "ed")
    assert code == 1 and "still invalid" in err and len(seen) == 2
    code, _, err, _ = edit(g, tmp_path, monkeypatch, "fail", "tenant", "ed")
    assert code == 1 and "exited with status 3" in err
    assert g.admin.tenants.GetTenant(api_pb2.GetRequest(name="ed"), timeout=10).spec.priority == 7


def test_edit_a_deployment_keeps_its_version_check(g: RealCtl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apply(g, tenant("ed2"), deployment("svc", "ed2"))
    script = tmp_path / "bump.py"
    script.write_text("import re,sys\np=sys.argv[-1]\nt=open(p).read()\n"
                      "open(p,'w').write(re.sub(r'max_replicas: \\d+', 'max_replicas: 9', t))\n")
    monkeypatch.delenv("KUBE_EDITOR", raising=False)
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    assert ok(g, "edit", "deployment", "ed2/svc") == "deployment/ed2/svc edited\n"
    assert _spec(g, "ed2/svc").max_replicas == 9


# --------------------------------------------------------------------------------------------------
# delete --wait / --ignore-not-found
# --------------------------------------------------------------------------------------------------


def test_delete_wait_and_ignore_not_found(g: RealCtl) -> None:
    apply(g, tenant("dw"), deployment("gone", "dw"))
    out = ok(g, "delete", "deployment", "dw/gone", "--wait", "--timeout", "30")
    assert out.startswith("deployment/dw/gone deleted (revision ")
    err = code_of(g.admin.deployments.GetDeployment, api_pb2.GetRequest(name="dw/gone"))
    assert err.code() is grpc.StatusCode.NOT_FOUND  # really gone, not only scaling to zero
    assert g.ctl("delete", "deployment", "dw/gone", "--ignore-not-found") == (0, "", "")
    code, _, stderr = g.ctl("delete", "deployment", "dw/gone")
    assert code == 1 and "NOT_FOUND" in stderr
    out = ok(g, "delete", "tenant", "dw", "--wait")
    assert out.startswith("tenant/dw deleted")


def test_delete_wait_gives_up_at_the_timeout(tmp_path: Path) -> None:
    """Against the fake (whose deleted deployments never go away): --wait polls with growing pauses
    and stops at --timeout, exit 1."""
    fake = FakeGroup(1)
    try:
        cfg = tmp_path / "fake.yaml"
        cfg.write_text(yaml.safe_dump({"apiVersion": "controlplane.io/v1", "kind": "Config", "contexts": [
            {"name": "f", "endpoints": fake.addresses, "insecure": True, "token": ADMIN_TOKEN}]}))
        sleeps: list[float] = []

        def ctl(*args: str, stdin: str = "") -> tuple[int, str, str]:
            out, err = io.StringIO(), io.StringIO()
            code = run(["--config", str(cfg), *args], out=out, err=err, stdin=io.StringIO(stdin), sleep=sleeps.append)
            return code, out.getvalue(), err.getvalue()

        assert ctl("apply", "-f", "-", stdin=tenant("t") + "---\n" + deployment("d", "t"))[0] == 0
        code, out, err = ctl("delete", "deployment", "t/d", "--wait", "--timeout", "3")
        assert code == 1 and out.startswith("deployment/t/d deletion started (scaling to zero)")
        assert "error: delete deployment/t/d: still there after the --timeout of 3 s" in err
        assert sleeps[:4] == [0.1, 0.2, 0.4, 0.8] and max(sleeps) <= 2.0 and sum(sleeps) == pytest.approx(3.0)
    finally:
        fake.stop()


# --------------------------------------------------------------------------------------------------
# config current-context / set-context
# --------------------------------------------------------------------------------------------------


def test_config_set_context_and_current_context(g: RealCtl, tmp_path: Path) -> None:
    cfg = tmp_path / "fresh" / "tenantctl.yaml"
    token_file = g.base / "admin.token"

    def ctl(*args: str) -> tuple[int, str, str]:
        return g.ctl(*args, config=cfg)

    code, _, err = ctl("config", "set-context", "lab")
    assert code == 2 and "set-context lab: endpoints: required (give --endpoint HOST:PORT)" in err and not cfg.exists()
    code, _, err = ctl("config", "set-context", "lab", "--endpoint", g.endpoint, "--insecure", "--ca-file", "ca.pem")
    assert code == 2 and "exclude each other" in err and not cfg.exists()
    code, out, err = ctl("config", "set-context", "lab", "--endpoint", g.endpoint, "--insecure", "--token-file",
                         str(token_file), "--current")
    assert code == 0 and "Context 'lab' created" in out, err
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    assert ctl("config", "current-context") == (0, "lab\n", "")
    assert ctl("whoami")[0] == 0  # the new context reaches the server with the token file
    code, out, _ = ctl("config", "set-context", "other", "--endpoint", "127.0.0.1:1", "--insecure")
    assert code == 0 and "created" in out
    assert ctl("config", "current-context") == (0, "lab\n", "")
    code, out, _ = ctl("config", "set-context", "other", "--endpoint", g.endpoint, "--token-file", str(token_file),
                       "--current")
    assert code == 0 and "Context 'other' modified" in out
    assert ctl("config", "current-context") == (0, "other\n", "")
    assert ctl("get", "tenants")[0] == 0
    raw = yaml.safe_load(cfg.read_text())
    assert [c["name"] for c in raw["contexts"]] == ["lab", "other"] and raw["contexts"][1]["endpoints"] == [g.endpoint]
    code, _, err = ctl("config", "set-context", "Bad_Name", "--endpoint", g.endpoint, "--insecure")
    assert code == 2 and "Bad_Name" in err
    cfg.write_text(yaml.safe_dump({"apiVersion": "controlplane.io/v1", "kind": "Config", "contexts": [
        {"name": "a", "endpoints": [g.endpoint], "insecure": True}, {"name": "b", "endpoints": [g.endpoint],
                                                                      "insecure": True}]}))
    code, _, err = ctl("config", "current-context")
    assert code == 1 and "current-context is not set" in err


# --------------------------------------------------------------------------------------------------
# apply -f DIR -R (delete -f, dry-run -f)
# --------------------------------------------------------------------------------------------------


def test_apply_delete_and_dry_run_a_directory(g: RealCtl, tmp_path: Path) -> None:
    root = tmp_path / "manifests"
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "10-tenant.yaml").write_text(tenant("dir"))
    (root / "20-other.yml").write_text(tenant("dir2"))
    (root / "notes.txt").write_text("not a manifest")
    (root / "nested" / "app.json").write_text(json.dumps(yaml.safe_load(deployment("app", "dir"))))
    (root / "nested" / "deeper" / "db.yaml").write_text(deployment("db", "dir"))
    out = ok(g, "apply", "-f", str(root))
    assert out.splitlines() == ["tenant/dir created", "tenant/dir2 created"]
    out = ok(g, "apply", "-f", str(root), "-R")
    assert "deployment/app created" in out and "deployment/db created" in out and "tenant/dir unchanged" in out  # nothing to write
    out = ok(g, "dry-run", "-f", str(root / "nested"), "--recursive")
    assert "deployment/app" in out and "deployment/db" in out
    out = ok(g, "delete", "-f", str(root), "-R", "--wait")  # a tenant goes once its deployments are gone
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["deployment/dir/app", "deployment/dir/db", "tenant/dir",
                                                   "tenant/dir2"], out  # files sorted by path, kinds reversed
    assert all(line.split()[1] == "deleted" for line in lines)
    assert "tenant/dir" not in ok(g, "get", "tenants", "-o", "name").split()
    (tmp_path / "empty").mkdir()
    code, _, err = g.ctl("apply", "-f", str(tmp_path / "empty"))
    assert code == 1 and "no .yaml, .yml or .json files" in err


# --------------------------------------------------------------------------------------------------
# describe, RFC 3339, the yaml round trip
# --------------------------------------------------------------------------------------------------


def test_describe_is_laid_out_like_kubectl(g: RealCtl) -> None:
    apply(g, tenant("desc", labels={"team": "x", "example.com/tier": "gold"}),
          deployment("chat", "desc", labels={"app": "chat"}))
    for kind, name in (("tenant", "desc"), ("deployment", "desc/chat")):
        out = ok(g, "describe", kind, name)
        lines = out.splitlines()
        assert all(line == line.rstrip() for line in lines), [line for line in lines if line != line.rstrip()]
        assert not EPOCH_MS.search(out), out  # no epoch milliseconds anywhere a person reads
        assert RFC3339.search(out)
        assert lines[0].startswith("Name:") and lines[0].split() == ["Name:", name.split("/")[-1]]
        created = next(line for line in lines if line.startswith("Created:"))
        assert RFC3339.search(created) and created.endswith("ago)")
        # values of one block line up
        top = [line for line in lines[:lines.index("Spec:")] if re.match(r"^[A-Z][A-Za-z]+:\s+\S", line)]
        assert len({line.index(line.split(":", 1)[1].strip()) for line in top}) == 1, top
        assert any(line.startswith("  ") and not line.startswith("   ") for line in lines)  # nested by two
    out = ok(g, "describe", "tenant", "desc")
    i = out.splitlines().index(next(line for line in out.splitlines() if line.startswith("Labels:")))
    assert out.splitlines()[i].endswith("example.com/tier=gold") and out.splitlines()[i + 1].strip() == "team=x"
    out = ok(g, "describe", "deployment", "desc/chat")
    assert "Tenant:" in out and "Instances:" in out and "Decisions:" in out and "Events:" in out
    status = api_pb2.DeploymentStatus.DESCRIPTOR.fields_by_name
    assert ("Conditions:" in out) is (status.get("conditions") is not None)


def test_yaml_times_json_ms_and_the_round_trip(g: RealCtl) -> None:
    apply(g, tenant("rt", labels={"team": "rt"}), deployment("svc", "rt", labels={"app": "svc"}))
    for kind, name in (("tenant", "rt"), ("deployment", "rt/svc")):
        text = ok(g, "get", kind, name, "-o", "yaml")
        data = yaml.safe_load(text)
        meta = data["metadata"]
        assert RFC3339.fullmatch(meta["creationTimestamp"]) and RFC3339.fullmatch(meta["updateTimestamp"])
        assert "createdMs" not in meta and not EPOCH_MS.search(text), text
        js = json.loads(ok(g, "get", kind, name, "-o", "json"))["metadata"]
        assert isinstance(js["createdMs"], int) and js["creationTimestamp"] == meta["creationTimestamp"]
        before = json.loads(ok(g, "get", kind, name, "-o", "json"))
        out = ok(g, "apply", "-f", "-", stdin=text)
        assert re.fullmatch(rf"{kind}/{name.split('/')[-1]} unchanged\n", out), out  # nothing to write: it is what is stored
        after = json.loads(ok(g, "get", kind, name, "-o", "json"))
        assert after["spec"] == before["spec"] and after["metadata"]["labels"] == before["metadata"]["labels"]
    status = yaml.safe_load(ok(g, "get", "deployment", "rt/svc", "-o", "yaml")).get("status", {})
    assert "decided_ms" not in status and ("decidedTime" not in status or RFC3339.fullmatch(status["decidedTime"]))
    events = yaml.safe_load(ok(g, "events", "--deployment", "rt/svc", "-o", "yaml"))
    assert events and all(RFC3339.fullmatch(e["time"]) and "at_ms" not in e for e in events)
    assert all(isinstance(e["at_ms"], int) for e in json.loads(ok(g, "events", "--deployment", "rt/svc", "-o", "json")))
    tokens = yaml.safe_load(ok(g, "token", "list", "-o", "yaml"))["items"]
    assert tokens and all(RFC3339.fullmatch(t["createdTime"]) for t in tokens if "createdTime" in t)
    assert all("created_ms" not in t for t in tokens)


def test_person_yaml_leaves_durations_and_virtual_times() -> None:
    data = {"at_ms": 1796160940691, "stable_window_ms": 30000, "items": [{"since_ms": 5000},
                                                                        {"decided_ms": 1796160940000}]}
    assert person_yaml(data) == {"time": "2026-12-01T21:35:40.691Z", "stable_window_ms": 30000,
                                 "items": [{"since_ms": 5000}, {"decidedTime": "2026-12-01T21:35:40Z"}]}


# --------------------------------------------------------------------------------------------------
# completion, messages
# --------------------------------------------------------------------------------------------------


def _complete(script: str, words: list[str]) -> list[str]:
    line = " ".join(words)
    cmd = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _tenantctl; "
           'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_completion_knows_the_new_commands_and_options(g: RealCtl) -> None:
    script = ok(g, "completion", "bash")
    assert {"scale", "edit"} <= set(_complete(script, ["tenantctl", "sc"]) + _complete(script, ["tenantctl", "ed"]))
    assert "--sort-by" in _complete(script, ["tenantctl", "get", "tenants", "--so"])
    assert {"--selector", "--show-labels"} <= set(_complete(script, ["tenantctl", "get", "tenants", "--s"]))
    assert {"--wait", "--ignore-not-found", "--recursive"} <= set(
        _complete(script, ["tenantctl", "delete", "deployments", "--"]))
    assert {"--replicas", "--min", "--max"} <= set(_complete(script, ["tenantctl", "scale", "deployment", "x", "--"]))
    assert {"set-context", "current-context"} <= set(_complete(script, ["tenantctl", "config", ""]))
    assert "jsonpath=" in _complete(script, ["tenantctl", "get", "tenants", "-o", "j"])


def test_server_messages_show_wall_clock_instants_in_rfc3339() -> None:
    assert person_times("panic until t=1796160940691ms (threshold 1.6x)") == (
        f"panic until {rfc3339(1796160940691)} (threshold 1.6x)")
    assert person_times("last scale-down at t=5000ms") == "last scale-down at t=5000ms"  # virtual time
