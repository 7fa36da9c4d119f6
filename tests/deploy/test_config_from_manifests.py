"""The configuration the manifests hand to the processes, loaded by the real loaders
(``controlplane.config.load_config``, ``adapters.config.load_adapter_config``) with the environment
each pod gets, and the ports in it compared with containerPorts, Services and probes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from adapters.config import load_adapter_config
from controlplane.cli.tenantctl import config as tenantctl_config
from controlplane.config import ConfigError, CoordinatorConfig, load_config
from controlplane.fencing import make_fence_key
from controlplane.tls import issue_coordinator_cert, make_dev_pki, make_raft_pki
from controlplane.tokens import new_token
from tests.deploy.manifests import (
    DEPLOY,
    OVERLAYS,
    Obj,
    container_port,
    exec_probes,
    kubectl,
    load_yaml,
    mounted_file,
    one,
    port_of,
    render,
    service_port,
)

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl is not on PATH")

COORDINATOR_OVERLAYS = [o for o in OVERLAYS if kubectl() and any(x["kind"] == "StatefulSet" for x in render(o))]
ADAPTER_OVERLAYS = [o for o in OVERLAYS if kubectl() and any(x["metadata"]["name"] == "adapter" and x["kind"] == "Deployment"
                                                              for x in render(o))]
SECRETS = "/run/secrets/controlplane/"
STATE = "/var/lib/controlplane/"


def remap(text: str, tmp: Path) -> str:
    """The configuration with the pod's mount points moved under ``tmp``."""
    return text.replace(SECRETS, f"{tmp}/secrets/").replace(STATE, f"{tmp}/state/")


def pod_env(container: Obj, pod_name: str, zone: str) -> dict[str, str]:
    """The CONTROLPLANE_* variables the kubelet would set (Downward API resolved for ``pod_name``,
    ``$(VAR)`` references to variables defined before expanded)."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), e["value"])
            continue
        path = e["valueFrom"]["fieldRef"]["fieldPath"]
        env[e["name"]] = {"metadata.name": pod_name, "metadata.labels['topology.kubernetes.io/zone']": zone}[path]
    return env


def write_secret_files(cfg_text: str, tmp: Path, *, placeholder_from: dict[str, bytes] | None = None) -> None:
    """A usable file (or, with ``placeholder_from``, the shipped content) at every secret path the
    configuration names."""
    pki = make_dev_pki(tmp / "pki", hosts=("127.0.0.1", "localhost"))
    fence = make_fence_key(tmp / "fence")
    usable = {"password": b"a-raft-password-of-32-characters", "tls.crt": pki.server_cert.read_bytes(),
              "tls.key": pki.server_key.read_bytes(), "ca.crt": pki.ca_cert.read_bytes(),
              "admin": new_token()[0].encode(), "adapter": b"an-adapter-token-of-32-characters", "token": b"an-adapter-token-of-32-characters",
              "fence-key.pem": fence.private_key.read_bytes(), "fence.pub.pem": fence.public_key.read_bytes()}
    for word in cfg_text.split():
        if word.startswith(SECRETS):
            target = tmp / "secrets" / word[len(SECRETS):]
            target.parent.mkdir(parents=True, exist_ok=True)
            source = placeholder_from if placeholder_from is not None else usable
            target.write_bytes(source[target.name])


def adapter_tls_paths(env: dict[str, str]) -> list[str]:
    """The files ``CONTROLPLANE_ADAPTER_TLS`` (JSON) names for one pod."""
    import json

    return list(json.loads(env["CONTROLPLANE_ADAPTER_TLS"]).values())


def write_member_cert(env: dict[str, str], tmp: Path, pod: str) -> dict[str, str]:
    """This member's adapter client certificate where its (remapped) ``CONTROLPLANE_ADAPTER_TLS`` says."""
    import json

    from controlplane.tls import DevPki, issue_coordinator_cert

    pki = DevPki(tmp / "pki", tmp / "pki" / "ca.pem", tmp / "pki" / "ca-key.pem", tmp / "pki" / "server.pem",
                 tmp / "pki" / "server-key.pem")
    cert, key = issue_coordinator_cert(pki, pod)
    tls = {k: remap(v, tmp) for k, v in json.loads(env["CONTROLPLANE_ADAPTER_TLS"]).items()}
    for field, source in (("ca_file", pki.ca_cert), ("cert_file", cert), ("key_file", key)):
        Path(tls[field]).parent.mkdir(parents=True, exist_ok=True)
        Path(tls[field]).write_bytes(source.read_bytes())
    return {**env, "CONTROLPLANE_ADAPTER_TLS": json.dumps(tls)}


def raft_tls_env(env: dict[str, str], spec: Obj, container: Obj, objs: list[Obj], tmp: Path) -> dict[str, str]:
    """Check that the pod's CONTROLPLANE_RAFT_TLS names mounted Secret keys, write a usable Raft CA and
    member certificate there (for the pod named in the env), and return the env remapped under ``tmp``."""
    tls = json.loads(env["CONTROLPLANE_RAFT_TLS"])
    assert set(tls) == {"ca_file", "cert_file", "key_file"}
    for path in tls.values():
        assert mounted_file(spec, container, path, objs) is not None, f"{path}: not a mounted Secret key"
    pki = make_raft_pki(tmp / "raft-pki", [])
    node_id = env["CONTROLPLANE_NODE_ID"]
    cert, key = issue_coordinator_cert(pki, node_id)
    for field, source in (("ca_file", pki.ca_cert), ("cert_file", cert), ("key_file", key)):
        target = Path(remap(tls[field], tmp))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    return {**env, "CONTROLPLANE_RAFT_TLS": remap(env["CONTROLPLANE_RAFT_TLS"], tmp)}


def coordinator_parts(folder: str) -> tuple[list[Obj], Obj, Obj, str]:
    objs = list(render(folder))
    sts = one(objs, "StatefulSet", "coordinator")
    [container] = sts["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["coordinator", "--config"]
    found = mounted_file(sts["spec"]["template"]["spec"], container, args[2], objs)
    assert found is not None, f"{args[2]} is not a mounted ConfigMap key"
    cm, key = found
    return objs, sts, container, cm["data"][key]


@pytest.mark.parametrize("folder", COORDINATOR_OVERLAYS)
def test_every_member_loads_its_configuration_with_the_real_loader(folder: str, tmp_path: Path) -> None:
    objs, sts, container, text = coordinator_parts(folder)
    spec = sts["spec"]["template"]["spec"]
    # every secret path in the file is a key of a Secret mounted there
    for word in text.split():
        if word.startswith(SECRETS):
            assert mounted_file(spec, container, word, objs) is not None, f"{word}: not a mounted Secret key"
    n = sts["spec"]["replicas"]
    peers = load_yaml(text)["peers"]
    path = tmp_path / "coordinator.yaml"
    path.write_text(remap(text, tmp_path), encoding="utf-8")
    write_secret_files(text, tmp_path)
    ns, service = sts["metadata"]["namespace"], sts["spec"]["serviceName"]
    for i in range(n):
        pod = f"{sts['metadata']['name']}-{i}"
        env = pod_env(container, pod, zone=f"real-zone-{i}")
        assert set(env) <= {f"CONTROLPLANE_{f.upper()}" for f in CoordinatorConfig.model_fields}, "env names a real field"
        for file in adapter_tls_paths(env):  # this member's own adapter certificate, by pod name
            assert mounted_file(spec, container, file, objs) is not None, f"{pod}: {file}: not a mounted Secret key"
        assert f"/{pod}.crt" in env["CONTROLPLANE_ADAPTER_TLS"]
        env = write_member_cert(env, tmp_path, pod)
        env = raft_tls_env(env, spec, container, objs, tmp_path)
        cfg = load_config(path, env=env)
        assert cfg.adapter_tls is not None and cfg.adapter_tls.cert_file.name == f"{pod}.crt"
        assert cfg.fence_key_file is not None
        assert cfg.raft_tls is not None and cfg.raft_tls.cert_file.name == f"{pod}.crt"  # its own certificate
        assert cfg.node_id == pod and cfg.zone == f"real-zone-{i}"
        assert [p.node_id for p in cfg.peers] == [p["node_id"] for p in peers if p["node_id"] != pod]
        assert cfg.raft_address == f"{pod}.{service}.{ns}.svc.cluster.local:{container_port(container, 'raft')}"
        assert cfg.api_address == f"{pod}.{service}.{ns}.svc.cluster.local:{container_port(container, 'api')}"
        assert cfg.api_tls is not None and cfg.api_tls.ca_file is not None
        assert cfg.password is not None and cfg.admin_token_file is not None and cfg.adapter_token_file is not None
        assert cfg.data_dir == tmp_path / "state" / "raft"
        assert cfg.fsync == "entry"


@pytest.mark.parametrize("folder", COORDINATOR_OVERLAYS)
def test_coordinator_ports_agree_everywhere(folder: str) -> None:
    objs, sts, container, text = coordinator_parts(folder)
    cfg = load_yaml(text)
    raft_ports = {port_of(p["raft_address"]) for p in cfg["peers"]}
    api_ports = {port_of(p["api_address"]) for p in cfg["peers"]}
    assert raft_ports == {container_port(container, "raft")}
    assert api_ports == {container_port(container, "api")}
    peers_svc = one(objs, "Service", sts["spec"]["serviceName"])
    assert service_port(peers_svc, "raft") == (container_port(container, "raft"), "raft")
    assert service_port(peers_svc, "api") == (container_port(container, "api"), "api")
    client = one(objs, "Service", "coordinator")
    assert service_port(client, "api")[1] == "api"
    metrics_port = port_of(cfg["metrics_address"])
    assert container_port(container, "metrics") == metrics_port
    policy = one(objs, "NetworkPolicy", "coordinator")
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == raft_ports | api_ports | {metrics_port}
    (scrapers,) = [rule for rule in policy["spec"]["ingress"] if {p["port"] for p in rule["ports"]} == {metrics_port}]
    assert all("namespaceSelector" in peer for peer in scrapers["from"])  # not open to every pod
    # the probes check exactly the file the process reads (so api_address and its TLS)
    probes = exec_probes(container)
    assert len(probes) == 3
    for probe in probes:
        assert probe[:4] == ["controlplane", "health", "--config", container["args"][2]]


@pytest.mark.parametrize("folder", ADAPTER_OVERLAYS)
def test_the_adapter_loads_its_configuration_and_its_ports_agree(folder: str, tmp_path: Path) -> None:
    objs = list(render(folder))
    dep = one(objs, "Deployment", "adapter")
    spec = dep["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["args"][:2] == ["adapter", "--config"]
    cm, key = mounted_file(spec, container, container["args"][2], objs) or (None, None)
    assert cm is not None
    text = cm["data"][key]
    for word in text.split():
        if word.startswith(SECRETS):
            assert mounted_file(spec, container, word, objs) is not None, f"{word}: not a mounted Secret key"
    path = tmp_path / "adapter.yaml"
    path.write_text(remap(text, tmp_path), encoding="utf-8")
    write_secret_files(text, tmp_path)
    cfg = load_adapter_config(path)
    assert cfg.backend == "kubernetes" and cfg.nvml is False
    assert cfg.state_dir.is_relative_to(tmp_path / "state")
    assert cfg.auth_token() is not None
    assert cfg.client_ca() is not None and cfg.fence_verifier() is not None  # mutual TLS, signed epochs
    port = port_of(cfg.listen)
    assert container_port(container, "grpc") == port
    probes = exec_probes(container)
    assert len(probes) == 3
    assert cfg.tls is not None
    for probe in probes:  # grpc.health.v1 over the adapter's mutual TLS, with files the pod mounts
        assert probe[:4] == ["controlplane", "health", "--endpoint", f"127.0.0.1:{port}"]
        flags = dict(zip(probe[4::2], probe[5::2]))
        assert flags["--ca-file"] == str(cfg.tls.client_ca_file).replace(f"{tmp_path}/secrets/", SECRETS)
        for flag in ("--ca-file", "--cert-file", "--key-file"):
            assert mounted_file(spec, container, flags[flag], objs) is not None, flags[flag]
    assert service_port(one(objs, "Service", "adapter"), "grpc") == (port, "grpc")
    policy = one(objs, "NetworkPolicy", "adapter")
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [port]
    # the state directory is on the PersistentVolumeClaim
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    [state] = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert Path(load_yaml(text)["state_dir"]).is_relative_to(mounts[state["name"]])
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"


def test_the_shipped_placeholder_secrets_are_refused_so_an_unedited_install_fails_closed(tmp_path: Path) -> None:
    base = DEPLOY / "base"
    shipped = {"password": (base / "coordinator/secrets/raft-password").read_bytes(),
               "admin": (base / "coordinator/secrets/admin-token").read_bytes(),
               "token": (base / "adapter/secrets/adapter-token").read_bytes()}
    _, _, container, text = coordinator_parts("overlays/single-region")
    write_secret_files(text, tmp_path)
    path = tmp_path / "coordinator.yaml"
    path.write_text(remap(text, tmp_path), encoding="utf-8")
    env = write_member_cert(pod_env(container, "coordinator-0", "z"), tmp_path, "coordinator-0")
    objs, sts, _, _ = coordinator_parts("overlays/single-region")
    env = raft_tls_env(env, sts["spec"]["template"]["spec"], container, objs, tmp_path)
    load_config(path, env=env)  # usable secrets: fine
    raft_cert = Path(json.loads(env["CONTROLPLANE_RAFT_TLS"])["cert_file"])
    good_cert = raft_cert.read_bytes()
    raft_cert.write_bytes((base / "coordinator/secrets/raft-tls/coordinator-0.crt").read_bytes())
    with pytest.raises(ConfigError, match="raft_tls"):
        load_config(path, env=env)
    raft_cert.write_bytes(good_cert)
    shipped["fence-key.pem"] = (base / "coordinator/secrets/fence-key.pem").read_bytes()
    for name, field in (("raft/password", "password_file"), ("tokens/admin", "admin_token_file"),
                        ("fence/fence-key.pem", "fence_key_file")):
        secret = tmp_path / "secrets" / name
        good = secret.read_bytes()
        secret.write_bytes(shipped[secret.name])
        with pytest.raises(ConfigError, match=field):
            load_config(path, env=env)
        secret.write_bytes(good)
    adapter_text = one(render("overlays/single-region"), "ConfigMap", "adapter-config")["data"]["adapter.yaml"]
    apath = tmp_path / "adapter.yaml"
    apath.write_text(remap(adapter_text, tmp_path), encoding="utf-8")
    write_secret_files(adapter_text, tmp_path)
    load_adapter_config(apath)
    good_token = (tmp_path / "secrets" / "adapter-token" / "token").read_bytes()
    (tmp_path / "secrets" / "adapter-token" / "token").write_bytes(shipped["token"])
    with pytest.raises(ConfigError, match="auth_token_file"):
        load_adapter_config(apath)
    (tmp_path / "secrets" / "adapter-token" / "token").write_bytes(good_token)
    for name, field in (("adapter-tls/ca.crt", "tls.client_ca_file"), ("fence/fence.pub.pem", "fence_public_key_files[0]"),
                        ("adapter-tls/tls.crt", "tls.cert_file")):
        secret = tmp_path / "secrets" / name
        good = secret.read_bytes()
        secret.write_bytes((base / "adapter/secrets" / secret.name).read_bytes())
        with pytest.raises(ConfigError) as err:
            load_adapter_config(apath)
        assert err.value.field == field
        secret.write_bytes(good)
    # the PEM placeholders are not PEM: the TLS server cannot start with them
    for pem in ("tls.crt", "tls.key", "ca.crt", *(p.relative_to(base / "coordinator/secrets")
                                                  for p in (base / "coordinator/secrets/raft-tls").iterdir())):
        assert b"-----BEGIN" not in (base / "coordinator/secrets" / pem).read_bytes()


def _groups_and_adapters(folders: list[str]) -> tuple[list[dict], list[tuple[str, dict, Obj]]]:
    groups, adapters = [], []
    for f in folders:
        objs = render(f)
        if any(o["kind"] == "StatefulSet" for o in objs):
            groups.append(load_yaml(one(objs, "ConfigMap", "coordinator-config")["data"]["coordinator.yaml"]))
        adapters.append((f, load_yaml(one(objs, "ConfigMap", "adapter-config")["data"]["adapter.yaml"]),
                         one(objs, "Service", "adapter")))
    return groups, adapters


@pytest.mark.parametrize("topology", ["single-region", "multi-region"])
def test_each_cluster_has_one_owner_and_its_adapter_address_matches_the_adapter(topology: str) -> None:
    folders = [o for o in OVERLAYS if o.startswith(f"overlays/{topology}")]
    groups, adapters = _groups_and_adapters(folders)
    owned = [c for g in groups for c in g["clusters"]]
    ids = [c["id"] for c in owned]
    assert len(ids) == len(set(ids)), "a cluster belongs to exactly one coordinator group"
    by_id = {c["id"]: c for c in owned}
    assert {a["cluster_id"] for _, a, _ in adapters} == set(by_id), "every owned cluster has an adapter overlay"
    for folder, adapter, svc in adapters:
        cluster = by_id[adapter["cluster_id"]]
        assert port_of(cluster["adapter_address"]) == service_port(svc, "grpc")[0] == port_of(adapter["listen"])
        host = cluster["adapter_address"].rpartition(":")[0]
        if host.endswith(".svc.cluster.local"):
            assert host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
        else:
            assert svc["spec"]["type"] == "LoadBalancer", f"{folder}: a remote adapter needs a reachable Service"
    for g in groups:
        assert len({c["region"] for c in g["clusters"]}) == 1, "a group owns only its own region's clusters"


def test_the_tenantctl_contexts_cover_every_region(tmp_path: Path) -> None:
    source = DEPLOY / "overlays" / "multi-region" / "tenantctl.yaml"
    path = tmp_path / "tenantctl.yaml"
    shutil.copy(source, path)
    cfg = tenantctl_config.load(path)
    groups, _ = _groups_and_adapters([o for o in OVERLAYS if o.startswith("overlays/multi-region")])
    regions = {g["clusters"][0]["region"] for g in groups}
    assert {c.region for c in cfg.contexts} == regions
    api_port = service_port(one(render("overlays/multi-region/us-east-1"), "Service", "coordinator"), "api")[0]
    for ctx in cfg.contexts:
        assert ctx.ca_file and ctx.token_file and not ctx.insecure
        assert all(port_of(e) == api_port for e in ctx.endpoints)
        assert ctx.region in ctx.endpoints[0]
