"""Manifest parsing and strict validation (controlplane/api/manifests.py): every problem names the
file, the line, the object and the field; valid files become exactly the API messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.api import manifests as mf
from controlplane.api.v1 import api_pb2

GOOD = """\
apiVersion: controlplane.io/v1
kind: Tenant
metadata:
  name: team-a
spec:
  priority: 100
---
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {name: chat, resourceVersion: 7}
spec:
  tenant: team-a
  engine: vllm
  model: llama3-8b-h100
  pool: h100
  policy: {target_concurrency: 16}
---
"""


def problems(text: str, source: str = "f.yaml") -> list[str]:
    with pytest.raises(mf.ManifestError) as info:
        mf.parse_text(text, source)
    return info.value.problems


def test_multi_document_yaml_becomes_api_messages() -> None:
    tenant, dep = mf.parse_text(GOOD, "f.yaml")
    assert (tenant.kind, tenant.name, tenant.spec, tenant.line) == ("Tenant", "team-a", {"priority": 100}, 1)
    msg = dep.to_proto()
    assert isinstance(msg, api_pb2.Deployment)
    assert msg.metadata.resource_version == 7
    assert msg.spec.policy.target_concurrency == 16.0
    assert not msg.spec.HasField("min_replicas")  # unset: the server's default


def test_json_object_list_and_kind_list() -> None:
    obj = {"apiVersion": "controlplane.io/v1", "kind": "Zone", "metadata": {"name": "z1"}}
    assert [m.name for m in mf.parse_text(json.dumps(obj), "z.json")] == ["z1"]
    assert len(mf.parse_text(json.dumps([obj, {**obj, "metadata": {"name": "z2"}}]), "z.json")) == 2
    assert len(mf.parse_text(json.dumps({"kind": "List", "items": [obj]}), "z.json")) == 1
    assert problems('{"kind": ', "z.json")[0].startswith("z.json:1: not valid JSON:")


@pytest.mark.parametrize(("text", "expected"), [
    ("kind: [\n", "f.yaml:2: not valid YAML:"),
    (GOOD.replace("priority: 100", "priority: 100\n  color: red"), "f.yaml:7: object 1 (Tenant/team-a): spec.color: unknown field"),
    (GOOD.replace("priority: 100", "priority: high"), "f.yaml:6: object 1 (Tenant/team-a): spec.priority: input should be a valid integer"),
    (GOOD.replace("priority: 100", "priority: -1"), "object 1 (Tenant/team-a): spec.priority: input should be greater than or equal to 0"),
    (GOOD.replace("pool: h100", "pool: h100\n  pool: a100"), "f.yaml:16: not valid YAML: duplicate key 'pool'"),
    (GOOD.replace("target_concurrency: 16", "target_concurency: 16"), "object 2 (Deployment/chat): spec.policy.target_concurency: unknown field"),
    (GOOD.replace("llama3-8b-h100", "gpt-9"), "object 2 (Deployment/chat): spec.model: unknown model profile 'gpt-9'"),
    (GOOD.replace("engine: vllm", "engine: vllm\n  min_replicas: 9\n  max_replicas: 3"), "spec.min_replicas: must not exceed max_replicas"),
    (GOOD.replace("resourceVersion: 7", "resourceVersion: seven"), "object 2 (Deployment/chat): metadata.resourceVersion: must be an integer"),
    (GOOD.replace("kind: Tenant", "kind: tenants"), "kind: must be one of Zone, Cluster, Tenant, Deployment, got 'tenants' (did you mean 'Tenant'?)"),
    (GOOD.replace("name: team-a", "name: Team_A"), "object 1 (Tenant/Team_A): metadata.name: 'Team_A' is not a valid id"),
    (GOOD.replace("name: chat", "name: team-a/chat"),
     "object 2 (Deployment/team-a/chat): metadata.name: 'team-a/chat' is qualified: metadata.name is the name within"),
    (GOOD.replace("apiVersion: controlplane.io/v1\nkind: Tenant", "apiVersion: v1\nkind: Tenant"), "apiVersion: must be 'controlplane.io/v1'"),
    (GOOD.replace("spec:\n  priority: 100", "spec:\n  quota: {h100: 2}"), "object 1 (Tenant/team-a): spec.priority: required"),
    (GOOD.replace("metadata:\n  name: team-a", "metadata:\n  name: team-a\n  annotations: {}"), "metadata.annotations: unknown field"),
    (GOOD.replace("metadata:\n  name: team-a", "metadata:\n  name: team-a\n  labels: {team: a b}"),
     "f.yaml:5: object 1 (Tenant/team-a): metadata.labels.team: a label value 'a b' is not valid"),
    ("- 1\n- 2\n", "f.yaml:1: object 1: must be a mapping"),
])
def test_every_problem_names_file_object_and_field(text: str, expected: str) -> None:
    found = problems(text)
    assert any(expected in p for p in found), found


def test_all_problems_are_reported_not_just_the_first() -> None:
    text = GOOD.replace("priority: 100", "priority: x\n  bogus: 1").replace("engine: vllm", "engine: tgi")
    found = problems(text)
    assert len(found) == 3
    assert [p.split(": ", 2)[1] for p in found] == ["object 1 (Tenant/team-a)"] * 2 + ["object 2 (Deployment/chat)"]


def test_files_duplicates_stdin_and_empty(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text(GOOD)
    with pytest.raises(mf.ManifestError) as info:
        mf.load_files([str(f), "-"], stdin_text=GOOD)
    assert "Tenant/team-a is also defined at" in info.value.problems[0]
    with pytest.raises(mf.ManifestError, match="no objects found"):
        mf.load_files(["-"], "---\n")
    with pytest.raises(mf.ManifestError, match="cannot read"):
        mf.load_files([str(tmp_path / "missing.yaml")])


def test_cluster_and_zone_specs() -> None:
    text = ("apiVersion: controlplane.io/v1\nkind: Cluster\nmetadata: {name: c1}\n"
            "spec: {zone: z1, capacity: {h100: 8}, adapter_address: 'nohost'}\n")
    assert "spec.adapter_address: 'nohost' is not 'host:port'" in problems(text)[0]
    [c] = mf.parse_text(text.replace("'nohost'", "'10.0.0.1:7400'"), "c.yaml")
    assert c.to_proto().spec.capacity["h100"] == 8
    assert "spec.zone: required" in problems(text.replace("zone: z1, ", ""))[0]


def test_envelope_of_an_api_object_parses_back() -> None:
    t = api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name="a", resource_version=3, created_ms=5, updated_ms=6),
                       spec=api_pb2.TenantSpec(priority=4, quota={"h100": 2}, slo=api_pb2.Slo(ttft_p99_ms=900)),
                       status=api_pb2.TenantStatus(deployments=1))
    data = mf.envelope("Tenant", t)
    assert data["metadata"] == {"name": "a", "resourceVersion": 3, "createdMs": 5, "updatedMs": 6}
    assert data["status"] == {"deployments": 1}
    [m] = mf.parse_text(json.dumps(data), "t.json")
    assert m.to_proto().spec == t.spec and m.resource_version == 3


def test_tenantctl_with_a_bad_file_exits_1_and_names_file_object_field(tmp_path: Path) -> None:
    """The real console entry point, in a subprocess: no traceback, exit 1, nothing contacted (the
    endpoint does not exist: had anything been sent, the exit status would be 3)."""
    f = tmp_path / "bad.yaml"
    f.write_text(GOOD.replace("pool: h100", "pool: h100\n  replicas: 3"))
    proc = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.tenantctl", "--config", str(tmp_path / "none.yaml"),
         "--endpoint", "127.0.0.1:1", "apply", "-f", str(f)],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"{f}:16: object 2 (Deployment/chat): spec.replicas: unknown field" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
