"""The node-local model cache in deploy/: the DaemonSet, its least-privilege Role, the engines loading
from it read-only, the adapter reading its ConfigMaps, and the fetch script it runs."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.deploy.manifests import DEPLOY, OVERLAYS, containers, ident, load_yaml, of_kind, one, render, role_grants

HOST_PATH = "/var/lib/controlplane/model-cache"


def _fetch_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_cache_fetch", DEPLOY / "base" / "model-cache" / "fetch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch = _fetch_module()


def _host_paths(spec: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_gpu_cluster_runs_the_cache_daemonset_where_its_adapter_reads(folder: str) -> None:
    objs = render(folder)
    adapter_cfg = load_yaml(one(objs, "ConfigMap", "adapter-config")["data"]["adapter.yaml"])
    ds = one(objs, "DaemonSet", "model-cache")
    assert adapter_cfg["kubernetes"]["model_cache"]["namespace"] == ds["metadata"]["namespace"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"controlplane.io/model-cache": "enabled"}
    assert _host_paths(spec) == {"cache": HOST_PATH}
    [c] = spec["containers"]
    assert {"name": "cache", "mountPath": "/models"} in c["volumeMounts"]  # the fetcher writes
    assert any(e["name"] == "POD_UID" and e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid" for e in c["env"])
    scripts = one(objs, "ConfigMap", "model-cache-fetch")
    assert {v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v} == {scripts["metadata"]["name"]}
    assert fetch.parse_models(scripts["data"]["models.txt"])  # the shipped list parses


@pytest.mark.parametrize("folder", OVERLAYS)
def test_the_cache_role_grants_only_its_configmaps(folder: str) -> None:
    objs = render(folder)
    role = one(objs, "Role", "model-cache")
    assert role_grants(role) == {("", "configmaps", v) for v in ("get", "create", "update")}
    binding = one(objs, "RoleBinding", "model-cache")
    sa = one(objs, "DaemonSet", "model-cache")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": role["metadata"]["namespace"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


@pytest.mark.parametrize("folder", OVERLAYS)
def test_engines_load_the_weights_the_init_container_links_from_the_read_only_cache(folder: str) -> None:
    objs = render(folder)
    names = {n for n, _, _ in fetch.parse_models(one(objs, "ConfigMap", "model-cache-fetch")["data"]["models.txt"])}
    users = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")
             and any(c["name"] == "weights" for c in o["spec"]["template"]["spec"].get("initContainers", []))]
    assert users, "no engine loads from the node cache"
    for o in users:
        spec = o["spec"]["template"]["spec"]
        cache_volumes = {n for n, p in _host_paths(spec).items() if p == HOST_PATH}
        assert len(cache_volumes) == 1, ident(o)
        for c in containers(spec):
            for m in c.get("volumeMounts", []):
                if m["name"] in cache_volumes:
                    assert m.get("readOnly") is True, f"{ident(o)} container {c['name']}: the node cache is read-only"
        [init] = [c for c in spec["initContainers"] if c["name"] == "weights"]
        cmd = " ".join(init["command"])
        out = re.search(r"--out=(\S+)", cmd).group(1)  # type: ignore[union-attr]
        assert re.search(r"--name=(\S+)", cmd).group(1) in names, ident(o)  # type: ignore[union-attr]
        [engine] = spec["containers"]
        assert f"--model={out}" in engine["args"], ident(o)


# --- fetch.py ---------------------------------------------------------------------------------------

def fake_download(calls: list[tuple[str, str | None, Path]]) -> Any:
    def download(repo: str, revision: str | None, into: Path) -> None:
        calls.append((repo, revision, into))
        (into / "model.safetensors").write_text("weights")
    return download


def test_parse_models_names_the_bad_line() -> None:
    assert fetch.parse_models("# c\nm1 org/a\n\nm2 org/b abc123  # pinned\n") == [
        ("m1", "org/a", None), ("m2", "org/b", "abc123")]
    for text, line in (("m1 org/a\nbad\n", 2), ("m1 org/a\nm1 org/b\n", 2), ("-x org/a\n", 1)):
        with pytest.raises(ValueError, match=f"models.txt:{line}:"):
            fetch.parse_models(text)


def test_fetch_is_atomic_and_done_once(tmp_path: Path) -> None:
    calls: list[tuple[str, str | None, Path]] = []
    fetch.fetch(tmp_path, "m1", "org/a", "rev", fake_download(calls))
    fetch.fetch(tmp_path, "m1", "org/a", "rev", fake_download(calls))
    assert len(calls) == 1 and calls[0][2] == tmp_path / "m1.partial"
    assert fetch.complete(tmp_path, "m1") and not (tmp_path / "m1.partial").exists()
    assert (tmp_path / "m1" / "model.safetensors").read_text() == "weights"


def test_an_engine_links_a_complete_copy_and_downloads_otherwise(tmp_path: Path) -> None:
    root, calls = tmp_path / "node", []
    fetch.fetch(root, "m1", "org/a", None, fake_download(calls))
    (root / "m2.partial").mkdir()  # still downloading on the node: not usable
    assert fetch.for_engine(root, "m1", "org/a", None, tmp_path / "w1", fake_download(calls)) == "cached"
    assert (tmp_path / "w1").resolve() == (root / "m1").resolve() and len(calls) == 1
    assert fetch.for_engine(root, "m2", "org/b", None, tmp_path / "w2", fake_download(calls)) == "cold"
    assert calls[-1] == ("org/b", None, tmp_path / "w2") and not (tmp_path / "w2").is_symlink()


def test_the_daemon_publishes_the_node_at_once_then_each_completed_model(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models.txt"
    models.write_text("m1 org/a\nm2 org/b\n")
    for key, value in (("NODE_NAME", "gpu-7"), ("POD_NAME", "model-cache-x"), ("POD_UID", "u-1"),
                       ("POD_NAMESPACE", "serving")):
        monkeypatch.setenv(key, value)
    published: list[dict[str, Any]] = []
    calls: list[tuple[str, str | None, Path]] = []
    args = argparse.Namespace(models=str(models), root=str(tmp_path / "root"), every_s=0.0)
    fetch.daemon(args, fake_download(calls), published.append, rounds=2)
    assert [p["data"]["models"] for p in published] == ["", "m1\n", "m1\nm2\n"]  # round 2 changed nothing
    first = published[0]
    assert first["metadata"]["name"] == "model-cache-gpu-7" and first["metadata"]["namespace"] == "serving"
    assert first["metadata"]["labels"] == {"controlplane.io/model-cache": "node"}
    assert first["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "model-cache-x",
                                                     "uid": "u-1"}]
    assert len(calls) == 2
