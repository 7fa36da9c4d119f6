"""deploy/: every overlay renders with ``kubectl kustomize``, every object is valid against the
Kubernetes 1.37 schemas (strict: unknown fields are errors), and the properties that keep the
control plane safe hold. Each checker is also shown failing on a mutated object."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate
import pytest

from tests.deploy.manifests import (
    BASES,
    DEPLOY,
    K8S_VERSION,
    OVERLAYS,
    REPO,
    Obj,
    containers,
    ident,
    kubectl,
    load_yaml,
    nonroot_problems,
    of_kind,
    one,
    pdb_problems,
    is_controlplane,
    pod_spec,
    port_of,
    rbac_problems,
    render,
    role_grants,
    secret_problems,
    spread_problems,
)

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl is not on PATH")

WITH_COORDINATORS = [o for o in OVERLAYS if any(x["kind"] == "StatefulSet" for x in render(o))] if kubectl() else []


def test_the_overlays_the_docs_promise_exist() -> None:
    assert {"overlays/single-region", "overlays/multi-region/us-east-1", "overlays/multi-region/eu-west-1"} <= set(OVERLAYS)
    assert {"base/coordinator", "base/adapter", "base/engines", "base/namespace"} <= set(BASES)


@pytest.mark.parametrize("folder", OVERLAYS + BASES)
def test_every_object_is_valid_for_kubernetes_1_37_strict(folder: str) -> None:
    objs = render(folder)
    assert objs
    problems = []
    for o in objs:
        try:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{ident(o)}: {str(exc).splitlines()[0]}")
    assert not problems, "\n".join(problems)


def test_strict_validation_rejects_an_unknown_field_and_a_wrong_type() -> None:
    sts = copy.deepcopy(one(render("overlays/single-region"), "StatefulSet"))
    sts["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
    svc = copy.deepcopy(one(render("overlays/single-region"), "Service", "coordinator-peers"))
    svc["spec"]["ports"][0]["port"] = "4321"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(svc, K8S_VERSION, strict=True)


# --- coordinators: spread and quorum ---------------------------------------------------------------


@pytest.mark.parametrize("folder", WITH_COORDINATORS)
def test_coordinators_are_spread_one_per_zone_and_a_pdb_keeps_a_quorum(folder: str) -> None:
    objs = render(folder)
    sts = one(objs, "StatefulSet", "coordinator")
    cfg = load_yaml(one(objs, "ConfigMap", "coordinator-config")["data"]["coordinator.yaml"])
    assert len(cfg["peers"]) == sts["spec"]["replicas"], "every member is listed in peers"
    assert [p["node_id"] for p in cfg["peers"]] == [f"coordinator-{i}" for i in range(sts["spec"]["replicas"])]
    zones = {p["zone"] for p in cfg["peers"]}
    assert len(zones) >= 3
    assert spread_problems(sts) == []
    assert pdb_problems(sts, of_kind(objs, "PodDisruptionBudget"), len(zones)) == []
    assert sts["spec"]["replicas"] in (3, 5)


def test_spread_and_pdb_checkers_catch_what_they_are_for() -> None:
    objs = render("overlays/single-region")
    sts, pdb = one(objs, "StatefulSet"), one(objs, "PodDisruptionBudget")
    soft = copy.deepcopy(sts)
    for c in soft["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        c["whenUnsatisfiable"] = "ScheduleAnyway"
    assert spread_problems(soft)
    hostname_only = copy.deepcopy(sts)
    hostname_only["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
        c for c in sts["spec"]["template"]["spec"]["topologySpreadConstraints"] if c["topologyKey"] != "topology.kubernetes.io/zone"]
    assert spread_problems(hostname_only)
    loose = copy.deepcopy(pdb)
    loose["spec"]["maxUnavailable"] = 2
    assert "quorum" in pdb_problems(sts, [loose], 3)[0]
    by_min = copy.deepcopy(pdb)
    del by_min["spec"]["maxUnavailable"]
    by_min["spec"]["minAvailable"] = "50%"  # Kubernetes rounds up: 2 of 3, a quorum
    assert pdb_problems(sts, [by_min], 3) == []
    by_min["spec"]["minAvailable"] = 1
    assert pdb_problems(sts, [by_min], 3)
    assert pdb_problems(sts, [], 3)
    assert any("losing a zone" in p for p in pdb_problems(sts, [pdb], 2))


# --- RBAC -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", OVERLAYS)
def test_rbac_has_no_wildcards_and_nothing_cluster_wide(folder: str) -> None:
    assert rbac_problems(render(folder)) == []


def test_rbac_checker_catches_wildcards_and_cluster_roles() -> None:
    role = copy.deepcopy(one(render("overlays/single-region"), "Role", "controlplane-adapter"))
    role["rules"][0]["verbs"] = ["*"]
    role["rules"][1]["resources"] = ["*"]
    problems = rbac_problems([role])
    assert len(problems) == 2 and "verbs" in problems[0] and "resources" in problems[1]
    cluster_role = {**copy.deepcopy(role), "kind": "ClusterRole"}
    assert any("cluster-wide" in p for p in rbac_problems([cluster_role]))


# Kubernetes client method -> the (apiGroup, resource, verb) it needs.
_CALLS = {
    "read_namespaced_deployment": ("apps", "deployments", "get"),
    "read_namespaced_stateful_set": ("apps", "statefulsets", "get"),
    "patch_namespaced_deployment": ("apps", "deployments", "patch"),
    "patch_namespaced_stateful_set": ("apps", "statefulsets", "patch"),
    "read_namespaced_deployment_scale": ("apps", "deployments/scale", "get"),
    "read_namespaced_stateful_set_scale": ("apps", "statefulsets/scale", "get"),
    "replace_namespaced_deployment_scale": ("apps", "deployments/scale", "update"),
    "replace_namespaced_stateful_set_scale": ("apps", "statefulsets/scale", "update"),
    "list_namespaced_pod": ("", "pods", "list"),
    "patch_namespaced_pod": ("", "pods", "patch"),
    "delete_namespaced_pod": ("", "pods", "delete"),
    "list_namespaced_config_map": ("", "configmaps", "list"),
}


def backend_calls() -> set[tuple[str, str, str]]:
    """What adapters/kubernetes.py calls, read from its source (so a new call fails this test until
    the Role grants it, and a dropped one until the Role stops granting it)."""
    source = "\n".join((REPO / "adapters" / name).read_text(encoding="utf-8")
                        for name in ("kubernetes.py", "kube_drain.py", "model_cache.py", "node_maps.py"))
    methods = set(re.findall(r"self\._(?:apps|core)\.(\w+)", source))
    unknown = methods - set(_CALLS)
    assert not unknown, f"adapters/kubernetes.py calls {sorted(unknown)}: add them to _CALLS and to the Role"
    needed = {_CALLS[m] for m in methods}
    if re.search(r"\.stream\(\s*self\._core\.list_namespaced_pod", source):
        needed.add(("", "pods", "watch"))
    return needed


@pytest.mark.parametrize("folder", [o for o in OVERLAYS] + ["base/adapter"])
def test_the_adapter_role_grants_exactly_what_the_backend_calls(folder: str) -> None:
    objs = render(folder)
    adapter_cfg = load_yaml(one(objs, "ConfigMap", "adapter-config")["data"]["adapter.yaml"])
    namespaces = {w["namespace"] for w in adapter_cfg["kubernetes"]["workloads"]}
    adapter_sa = one(objs, "Deployment", "adapter")["spec"]["template"]["spec"]["serviceAccountName"]
    bound = {b["roleRef"]["name"] for b in of_kind(objs, "RoleBinding")
             if any(sub["name"] == adapter_sa for sub in b["subjects"])}
    roles = [r for r in of_kind(objs, "Role") if r["metadata"]["name"] in bound]
    assert {r["metadata"]["namespace"] for r in roles} == namespaces, "one Role per managed namespace, no more"
    for role in roles:
        assert role_grants(role) == backend_calls(), ident(role)
        [binding] = [b for b in of_kind(objs, "RoleBinding") if b["metadata"]["namespace"] == role["metadata"]["namespace"]
                     and b["roleRef"]["name"] == role["metadata"]["name"]]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
        deployment = one(objs, "Deployment", "adapter")
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": deployment["metadata"]["namespace"]}]


def test_the_standalone_rbac_file_matches_the_base_role() -> None:
    import yaml

    docs = list(yaml.safe_load_all((DEPLOY / "rbac" / "adapter-rbac.yaml").read_text(encoding="utf-8")))
    [role] = [d for d in docs if d["kind"] == "Role"]
    assert role_grants(role) == backend_calls()
    assert rbac_problems(docs) == []


# --- pods ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_container_runs_as_non_root_without_privileges(folder: str) -> None:
    assert nonroot_problems(render(folder)) == []


def test_nonroot_checker_catches_root_and_a_writable_root_filesystem() -> None:
    objs = render("overlays/single-region")
    sts = copy.deepcopy(one(objs, "StatefulSet"))
    sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0
    sts["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    problems = nonroot_problems([sts])
    assert any("uid/gid 0" in p for p in problems) and any("writable" in p for p in problems)
    vllm = copy.deepcopy(one(objs, "Deployment", "chat-vllm"))
    del vllm["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]
    assert any("runAsNonRoot" in p for p in nonroot_problems([vllm]))


@pytest.mark.parametrize("folder", OVERLAYS)
def test_every_secret_is_used_and_every_used_secret_exists(folder: str) -> None:
    objs = render(folder)
    assert of_kind(objs, "Secret")
    assert secret_problems(objs) == []


def test_secret_checker_catches_an_unused_and_a_missing_secret() -> None:
    objs = list(render("overlays/single-region"))
    stray: Obj = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "stray", "namespace": "controlplane"}}
    assert secret_problems([*objs, stray]) == ["Secret/controlplane/stray: not used by any pod"]
    without = [o for o in objs if not (o["kind"] == "Secret" and o["metadata"]["name"].startswith("coordinator-raft"))]
    assert any("coordinator-raft" in p and "not in the output" in p for p in secret_problems(without))


@pytest.mark.parametrize("folder", OVERLAYS)
def test_controlplane_pods_have_no_service_links_and_coordinators_no_api_token(folder: str) -> None:
    objs = render(folder)
    for o in objs:
        spec = pod_spec(o)
        if spec is None or not any(c["image"].startswith("registry.example.com/controlplane") for c in containers(spec)):
            continue
        assert spec.get("enableServiceLinks") is False, ident(o)
    if any(o["kind"] == "StatefulSet" for o in objs):
        sts = one(objs, "StatefulSet")
        assert sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
        assert sts["spec"]["serviceName"] == one(objs, "Service", "coordinator-peers")["metadata"]["name"]
        assert one(objs, "Service", "coordinator-peers")["spec"]["clusterIP"] == "None"
        assert one(objs, "Service", "coordinator-peers")["spec"]["publishNotReadyAddresses"] is True
        [claim] = sts["spec"]["volumeClaimTemplates"]
        mounts = {m["name"]: m["mountPath"] for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
        cfg = load_yaml(one(objs, "ConfigMap", "coordinator-config")["data"]["coordinator.yaml"])
        assert Path(cfg["data_dir"]).is_relative_to(mounts[claim["metadata"]["name"]]), "Raft data on the PVC"


@pytest.mark.parametrize("folder", OVERLAYS)
def test_engines_match_the_contracts(folder: str) -> None:
    """Labels, readiness as CONTRACTS.md says, and vLLM with sleep mode for the warm pool."""
    objs = render(folder)
    adapter_cfg = load_yaml(one(objs, "ConfigMap", "adapter-config")["data"]["adapter.yaml"])
    for w in adapter_cfg["kubernetes"]["workloads"]:
        [wl] = [o for o in objs if o["kind"] == w["kind"] and o["metadata"]["name"] == w["name"]
                and o["metadata"]["namespace"] == w["namespace"]]
        labels = wl["spec"]["template"]["metadata"]["labels"]
        assert f"{labels['controlplane.io/tenant']}/{labels['controlplane.io/deployment']}" == w["deployment"]
        assert labels["controlplane.io/engine"] == w["engine"]
        assert wl["spec"]["replicas"] == 0, "the adapter owns replicas"
        [c] = wl["spec"]["template"]["spec"]["containers"]
        ports = {p["containerPort"] for p in c["ports"]}
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        probe = c["readinessProbe"]

        def resolve(port: int | str, named: dict[str, int] = named) -> int | str:
            return named.get(port, port)  # type: ignore[arg-type]

        assert w["port"] in ports
        args = " ".join(c.get("args", []) + c.get("command", []))
        if w["engine"] == "vllm":
            assert probe["httpGet"]["path"] == "/health" and resolve(probe["httpGet"]["port"]) == w["port"]
            assert "--enable-sleep-mode" in c["args"] and f"--port={w['port']}" in c["args"]
            assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in c["env"]
            assert int(re.search(r"--shutdown-timeout=(\d+)", args).group(1)) < wl["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        elif w["engine"] == "triton":
            assert probe["httpGet"]["path"] == "/v2/health/ready" and resolve(probe["httpGet"]["port"]) == w["port"]
            assert "--model-control-mode=explicit" in c["args"] and f"--http-port={w['port']}" in c["args"]
            assert w.get("metrics_port", 8002) in ports and f"--metrics-port={w.get('metrics_port', 8002)}" in c["args"]
            assert f"--load-model={w['model']}" in c["args"]
        else:
            assert resolve(probe["tcpSocket"]["port"]) == w.get("grpc_port", 50050)
            assert w.get("grpc_port", 50050) in ports
            assert f'deployment_name="{w["model"]}"' in args and f"restful_api_port={w['port']}" in args
            assert f"port_number={w.get('grpc_port', 50050)}" in args and 'restful_api_host="0.0.0.0"' in args
            assert w.get("meter_port") is not None, "MII client traffic goes through the mii-meter sidecar"
            assert mii_meter_problems(objs, wl, w) == []
        assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"]


def serving_problems(objs: tuple[dict, ...] | list[dict], workloads: list[dict]) -> list[str]:
    """Drains stop routing through the ``controlplane.io/serving`` label (adapters/kube_drain.py): each
    managed workload's pod template carries it "true", its own selector never names it, and a Service
    selects its pods only with it."""
    label = "controlplane.io/serving"
    problems = []
    services = [o for o in objs if o["kind"] == "Service"]
    for w in workloads:
        [wl] = [o for o in objs if o["kind"] == w["kind"] and o["metadata"]["name"] == w["name"]
                and o["metadata"]["namespace"] == w["namespace"]]
        template = wl["spec"]["template"]["metadata"]["labels"]
        if template.get(label) != "true":
            problems.append(f"{w['name']}: pod template lacks {label}: \"true\"")
        if label in wl["spec"]["selector"].get("matchLabels", {}):
            problems.append(f"{w['name']}: the workload selector names {label} (a drained pod would be orphaned)")
        routed = [s for s in services if s["metadata"]["namespace"] == w["namespace"]
                  and all(template.get(k) == v for k, v in s["spec"].get("selector", {}).items())]
        if not routed:
            problems.append(f"{w['name']}: no Service selects its pods")
        for s in routed:
            if s["spec"]["selector"].get(label) != "true":
                problems.append(f"Service {s['metadata']['name']}: selects {w['name']} without {label}: \"true\"")
    return problems


@pytest.mark.parametrize("folder", OVERLAYS)
def test_engine_services_route_only_to_serving_pods(folder: str) -> None:
    objs = render(folder)
    adapter_cfg = load_yaml(one(objs, "ConfigMap", "adapter-config")["data"]["adapter.yaml"])
    assert serving_problems(objs, adapter_cfg["kubernetes"]["workloads"]) == []


def test_serving_checker_catches_a_missing_label_and_a_selector_naming_it() -> None:
    objs = render(OVERLAYS[0])
    workloads = load_yaml(one(objs, "ConfigMap", "adapter-config")["data"]["adapter.yaml"])["kubernetes"]["workloads"]
    broken = copy.deepcopy(list(objs))
    w = workloads[0]
    [wl] = [o for o in broken if o["kind"] == w["kind"] and o["metadata"]["name"] == w["name"]]
    wl["spec"]["selector"]["matchLabels"]["controlplane.io/serving"] = "true"
    for s in broken:
        if s["kind"] == "Service":
            s["spec"]["selector"].pop("controlplane.io/serving", None)
    problems = serving_problems(broken, workloads)
    assert any("workload selector names" in p for p in problems)
    assert any("without controlplane.io/serving" in p for p in problems)


def mii_meter_problems(objs: tuple[Obj, ...] | list[Obj], wl: Obj, w: dict) -> list[str]:
    """The mii-meter sidecar of an MII workload ``wl`` (adapter workload ``w``): a native sidecar in the
    controlplane image listening on ``meter_port`` and forwarding to the gateway on 127.0.0.1, ready
    on its own /metrics; every Service that selects the pods targets the meter, never the gateway;
    the engines' NetworkPolicy lets traffic reach it."""
    from controlplane.cli.main import _parser

    out = []
    spec, port, meter_port = wl["spec"]["template"]["spec"], w["port"], w["meter_port"]
    sidecars = [c for c in spec.get("initContainers", []) if is_controlplane(c) and c.get("args", [])[:1] == ["mii-meter"]]
    if len(sidecars) != 1:
        return [f"{ident(wl)}: expected one mii-meter sidecar, got {len(sidecars)}"]
    [c] = sidecars
    if c.get("restartPolicy") != "Always":
        out.append(f"{ident(wl)}: mii-meter is not a native sidecar (restartPolicy Always)")
    args = _parser().parse_args(c["args"])
    if port_of(args.listen) != meter_port or meter_port not in {p["containerPort"] for p in c.get("ports", [])}:
        out.append(f"{ident(wl)}: mii-meter does not listen on meter_port {meter_port}")
    if args.upstream != f"http://127.0.0.1:{port}":
        out.append(f"{ident(wl)}: mii-meter upstream {args.upstream} is not the gateway on 127.0.0.1:{port}")
    named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    probe = c.get("readinessProbe", {}).get("httpGet", {})
    if probe.get("path") != "/metrics" or named.get(probe.get("port"), probe.get("port")) != meter_port:
        out.append(f"{ident(wl)}: mii-meter has no readiness probe on its /metrics")
    labels = wl["spec"]["template"]["metadata"]["labels"]
    services = [o for o in of_kind(objs, "Service") if o["metadata"]["namespace"] == wl["metadata"]["namespace"]
                and o["spec"].get("selector") and o["spec"]["selector"].items() <= labels.items()]
    if not services:
        out.append(f"{ident(wl)}: no Service routes client traffic to it")
    for svc in services:
        for sp in svc["spec"]["ports"]:
            target = sp.get("targetPort", sp["port"])
            if named.get(target, target) != meter_port:
                out.append(f"{ident(svc)}: port {sp['port']} targets {target}, not the meter ({meter_port})")
    policy = one(objs, "NetworkPolicy", "engines")
    if not any(p["port"] == meter_port for rule in policy["spec"]["ingress"] for p in rule["ports"]):
        out.append(f"{ident(policy)}: does not admit the meter port {meter_port}")
    return out


def test_mii_meter_checker_catches_a_bypassing_service_and_a_missing_sidecar() -> None:
    objs = list(render("overlays/single-region"))
    cfg = load_yaml(one(objs, "ConfigMap", "adapter-config")["data"]["adapter.yaml"])
    [w] = [w for w in cfg["kubernetes"]["workloads"] if w["engine"] == "deepspeed-mii"]
    wl = one(objs, "Deployment", w["name"])
    assert mii_meter_problems(objs, wl, w) == []
    bypass = copy.deepcopy(one(objs, "Service", w["name"]))
    bypass["spec"]["ports"][0]["targetPort"] = "http"  # MII's gateway port, not the meter
    problems = mii_meter_problems([o for o in objs if o["kind"] != "Service"] + [bypass], wl, w)
    assert problems and "not the meter" in problems[0]
    bare = copy.deepcopy(wl)
    del bare["spec"]["template"]["spec"]["initContainers"]
    assert "expected one mii-meter sidecar" in mii_meter_problems(objs, bare, w)[0]
    wrong = copy.deepcopy(wl)
    args = wrong["spec"]["template"]["spec"]["initContainers"][0]["args"]
    args[args.index("--upstream") + 1] = "http://127.0.0.1:9"
    assert any("upstream" in p for p in mii_meter_problems(objs, wrong, w))
