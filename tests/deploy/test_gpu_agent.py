"""The GPU memory node agent in deploy/: a DaemonSet on every GPU node of every overlay, reading
NVML through the NVIDIA runtime without taking a GPU, writing only its ConfigMaps, where the
adapter's `kubernetes.gpu_memory` reads them; `nvml: false` only where no GPU is (the adapter pod)."""

from __future__ import annotations

import pytest

from adapters.gpu_report import NODE_LABEL, GpuReportConfig
from controlplane.cli.main import _parser
from tests.deploy.manifests import OVERLAYS, containers, load_yaml, of_kind, one, render, role_grants


def env(c: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_gpu_cluster_runs_the_agent_where_its_adapter_reads(folder: str) -> None:
    objs = render(folder)
    adapter = load_yaml(one(objs, "ConfigMap", "adapter-config")["data"]["adapter.yaml"])
    ds = one(objs, "DaemonSet", "gpu-agent")
    cfg = GpuReportConfig.model_validate(adapter["kubernetes"]["gpu_memory"])
    assert cfg.namespace == ds["metadata"]["namespace"] and cfg.selector == f"{NODE_LABEL}=node"
    assert adapter["nvml"] is False  # the adapter pod has no GPU: its memory comes from the agents
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["runtimeClassName"] == "nvidia"
    [c] = containers(spec)
    e = env(c)
    assert e["NVIDIA_VISIBLE_DEVICES"] == "all" and e["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert e["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert e["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}  # the ConfigMap is owned by the pod
    for part in ("requests", "limits"):  # no GPU taken from the engines
        assert not any("nvidia.com" in k for k in c["resources"].get(part, {})), part
    args = _parser().parse_args(c["args"])
    assert args.command == "gpu-agent" and 1 <= args.interval_s <= 30


@pytest.mark.parametrize("folder", OVERLAYS)
def test_the_agent_role_grants_only_writing_its_configmaps_and_the_adapter_may_list_them(folder: str) -> None:
    objs = render(folder)
    role = one(objs, "Role", "gpu-agent")
    assert role_grants(role) == {("", "configmaps", "create"), ("", "configmaps", "update")}
    binding = one(objs, "RoleBinding", "gpu-agent")
    sa = one(objs, "DaemonSet", "gpu-agent")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": role["metadata"]["namespace"]}]
    adapter_role = one(objs, "Role", "controlplane-adapter")
    assert adapter_role["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert ("", "configmaps", "list") in role_grants(adapter_role)


@pytest.mark.parametrize("folder", OVERLAYS)
def test_nvml_is_off_only_in_pods_without_a_gpu(folder: str) -> None:
    objs = render(folder)
    for o in of_kind(objs, "ConfigMap"):
        for text in (o.get("data") or {}).values():
            if "nvml:" in text and "backend:" in text:
                cfg = load_yaml(text)
                assert cfg["nvml"] is False and cfg["kubernetes"].get("gpu_memory") is not None, o["metadata"]["name"]
