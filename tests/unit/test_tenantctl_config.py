"""tenantctl's configuration file: contexts, token precedence, use-context, errors (exit 2)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import yaml

from controlplane.cli.tenantctl import config as cfgmod
from controlplane.cli.tenantctl import run
from controlplane.config import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch) -> None:
    for var in ("TENANTCTL_TOKEN", "TENANTCTL_CONTEXT", "TENANTCTL_CONFIG"):
        monkeypatch.delenv(var, raising=False)


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


BASE = {
    "apiVersion": "controlplane.io/v1", "kind": "Config", "current-context": "eu",
    "contexts": [
        {"name": "eu", "region": "eu-west", "endpoints": ["127.0.0.1:7001", "127.0.0.1:7002"], "ca_file": "ca.pem",
         "token_file": "admin.token"},
        {"name": "us", "region": "us-east", "endpoints": ["127.0.0.1:7101"], "insecure": True, "token": "cp_secret"},
    ],
}


def ctl(cfg: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = run(["--config", str(cfg), *args], out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_resolve_paths_relative_to_the_file_and_token_precedence(tmp_path, monkeypatch) -> None:
    path = write(tmp_path / "c.yaml", BASE)
    (tmp_path / "admin.token").write_text("cp_from_file\n")
    cfg = cfgmod.load(path)
    ctx = cfgmod.resolve(cfg.contexts[0], path, None)
    assert ctx.ca_file == str(tmp_path / "ca.pem")
    assert (ctx.token, ctx.token_source) == ("cp_from_file", "token_file")
    monkeypatch.setenv("TENANTCTL_TOKEN", "cp_env")
    assert cfgmod.resolve(cfg.contexts[0], path, None).token == "cp_env"
    assert cfgmod.resolve(cfg.contexts[0], path, "cp_flag").token_source == "--token"


@pytest.mark.parametrize(("change", "expected"), [
    ({"current-context": "asia"}, "current-context: no context named 'asia'"),
    ({"contexts": [{"name": "x", "endpoints": ["nohost"], "insecure": True}]}, "contexts[0].endpoints: [0]: 'nohost'"),
    ({"contexts": [{"name": "x", "endpoints": ["127.0.0.1:1"]}]}, "ca_file: required for TLS"),
    ({"contexts": [{"name": "x", "endpoints": ["127.0.0.1:1"], "insecure": True, "bogus": 1}]}, "contexts[0].bogus: unknown field"),
    ({"kind": "Pod"}, "kind: must be 'Config'"),
])
def test_config_errors_name_file_and_field(tmp_path, change, expected) -> None:
    data = {**BASE, **change}
    if "contexts" in change and "current-context" not in change:
        data.pop("current-context")
    path = write(tmp_path / "c.yaml", data)
    with pytest.raises(ConfigError) as info:
        cfgmod.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)
    rc, _, err = ctl(path, "get", "tenants")
    assert rc == 2 and str(path) in err and "Traceback" not in err


def test_get_contexts_use_context_and_view(tmp_path) -> None:
    path = write(tmp_path / "c.yaml", BASE)
    os.chmod(path, 0o600)
    rc, out, _ = ctl(path, "config", "get-contexts")
    assert rc == 0
    rows = [ln.split() for ln in out.splitlines()]
    assert rows[0] == ["CURRENT", "NAME", "REGION", "ENDPOINTS", "TRANSPORT", "AUTH"]
    assert rows[1][:2] == ["*", "eu"] and rows[2][0] == "us" and "plaintext" in rows[2]
    assert ctl(path, "config", "get-contexts", "-o", "name")[1] == "eu\nus\n"
    rc, out, _ = ctl(path, "config", "use-context", "us")
    assert rc == 0 and yaml.safe_load(path.read_text())["current-context"] == "us"
    assert path.stat().st_mode & 0o777 == 0o600
    assert ctl(path, "config", "use-context", "mars")[0] == 2
    rc, out, _ = ctl(path, "config", "view")
    assert "cp_secret" not in out and "REDACTED" in out
    assert "cp_secret" in ctl(path, "config", "view", "--raw")[1]


def test_missing_config_without_endpoint_is_a_usage_error(tmp_path) -> None:
    rc, _, err = ctl(tmp_path / "none.yaml", "get", "tenants")
    assert rc == 2 and "no configuration file" in err and "--endpoint" in err


def test_unreadable_token_file(tmp_path) -> None:
    path = write(tmp_path / "c.yaml", BASE)
    rc, _, err = ctl(path, "get", "tenants")
    assert rc == 2 and "token_file: cannot read" in err


def test_help_and_no_command(tmp_path) -> None:
    rc, out, _ = ctl(tmp_path / "c.yaml")
    assert rc == 0 and "apply" in out and "Exit codes" in out
