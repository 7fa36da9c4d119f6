"""What `controlplane up` writes before it starts anything: every file loads with the loader of the
process that reads it (coordinator, adapter, tenantctl), secrets are 0600, and the demo load bursts."""

from __future__ import annotations

from pathlib import Path

import yaml

from adapters.config import load_adapter_config
from adapters.simulated import SimulatedConfig
from controlplane.cli.up import (
    BURST_RPS,
    CALM_RPS,
    DEMO_DEPLOYMENT,
    add_demo,
    demo_load,
    make_local_security,
    plan_group,
    write_adapter_configs,
    write_tenantctl_config,
)
from controlplane.config import load_config
from controlplane.domain.tokens import parse_token


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_security_material_is_private_and_the_admin_token_is_a_cp_token(tmp_path: Path) -> None:
    sec = make_local_security(tmp_path)
    for secret in (sec.admin_token_file, sec.adapter_token_file, sec.key_file):
        assert mode(secret) == 0o600, secret
    assert parse_token(sec.admin_token) is not None
    adapter_token = sec.adapter_token_file.read_text().strip()
    assert len(adapter_token) >= 32 and adapter_token != sec.admin_token
    admin, ca = sec.admin_token, sec.ca_file.read_bytes()
    again = make_local_security(tmp_path)  # a second `up` in the same --dir reuses what is there
    assert (again.admin_token, again.ca_file.read_bytes()) == (admin, ca)
    sec.admin_token_file.write_text("garbage")
    assert parse_token(make_local_security(tmp_path).admin_token) is not None  # ... unless it is unusable


def test_plan_group_without_security_is_plain_loopback(tmp_path: Path) -> None:
    nodes, _ = plan_group(3, tmp_path)
    cfg = load_config(nodes[0].config)
    assert cfg.api_tls is None and cfg.admin_token_file is None and cfg.adapter_token_file is None
    assert mode(nodes[0].config) == 0o600


def test_every_file_loads_with_its_reader(tmp_path: Path) -> None:
    sec = make_local_security(tmp_path)
    nodes, adapters = plan_group(3, tmp_path, security=sec)
    add_demo(nodes, adapters)
    for node in nodes:
        assert mode(node.config) == 0o600  # the Raft password
        cfg = load_config(node.config)
        assert cfg.api_tls is not None and cfg.api_tls.cert_file == sec.cert_file and cfg.api_tls.ca_file == sec.ca_file
        assert (cfg.admin_token_file, cfg.adapter_token_file) == (sec.admin_token_file, sec.adapter_token_file)
        assert [d.id for d in cfg.deployments] == [DEMO_DEPLOYMENT]
        assert cfg.deployments[0].min_replicas == 3 and cfg.deployments[0].max_replicas == 12
    paths = write_adapter_configs(tmp_path, adapters, sec)
    for a, path in zip(adapters, paths):
        cfg = load_adapter_config(path)
        assert (cfg.cluster_id, cfg.listen, cfg.backend) == (a["id"], a["adapter_address"], "simulated")
        assert cfg.auth_token() == sec.adapter_token_file.read_text().strip()
        assert cfg.simulated is not None and [d.deployment for d in cfg.simulated.deployments] == [DEMO_DEPLOYMENT]
        assert sec.admin_token not in path.read_text() and cfg.auth_token() not in path.read_text()


def test_the_tenantctl_config_has_context_local_and_loads(tmp_path: Path) -> None:
    from controlplane.cli.tenantctl.config import load, resolve

    sec = make_local_security(tmp_path)
    path = write_tenantctl_config(tmp_path / "tenantctl.yaml", ["127.0.0.1:7001", "127.0.0.1:7002"], sec)
    assert mode(path) == 0o600
    raw = yaml.safe_load(path.read_text())
    assert raw["current-context"] == "local"
    file_cfg = load(path)
    ctx = resolve(file_cfg.contexts[0], path, None)
    assert (ctx.name, ctx.endpoints, ctx.ca_file, ctx.token) == (
        "local", ["127.0.0.1:7001", "127.0.0.1:7002"], str(sec.ca_file), sec.admin_token)


def test_the_demo_load_is_calm_then_bursts_repeatedly() -> None:
    steps = demo_load()
    SimulatedConfig.model_validate({"deployments": [{"deployment": "chat", "load": steps}]})  # a valid schedule
    assert steps[0] == {"at_s": 0, "rps": CALM_RPS}
    rates = [s["rps"] for s in steps]
    assert rates[:5] == [CALM_RPS, BURST_RPS, CALM_RPS, BURST_RPS, CALM_RPS]
    assert steps[-1]["rps"] == CALM_RPS and steps[-1]["at_s"] >= 3_600 - 120
