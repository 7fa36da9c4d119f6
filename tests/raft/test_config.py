"""CoordinatorConfig / load_config: every rejection names the file and the field in one message."""

from __future__ import annotations

import json

from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.config import DEFAULT_RAFT_MAX_FRAME, MAX_ENTRY_BYTES, ConfigError, CoordinatorConfig, load_config
from raft import codec
from tests.support.raft_pki import shared_raft_tls

GOOD: dict[str, Any] = {
    "node_id": "coord-a",
    "zone": "az-1",
    "raft_address": "127.0.0.1:7001",
    "api_address": "127.0.0.1:8001",
    "password": "0123456789abcdef",
    "raft_tls": shared_raft_tls("coord-a"),
    "peers": [
        {"node_id": "coord-b", "zone": "az-2", "raft_address": "127.0.0.1:7002", "api_address": "127.0.0.1:8002"},
        {"node_id": "coord-c", "zone": "az-3", "raft_address": "127.0.0.1:7003", "api_address": "127.0.0.1:8003"},
    ],
}


def write(tmp_path: Path, data: dict[str, Any], name: str = "node.yaml") -> Path:
    data = {"data_dir": str(tmp_path / "data"), **data}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_good_config_loads_with_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD), env={})
    assert cfg.node_id == "coord-a"
    assert [p.node_id for p in cfg.peers] == ["coord-b", "coord-c"]
    assert (cfg.raft_min_timeout_ms, cfg.raft_max_timeout_ms, cfg.append_entries_period_ms) == (1000, 1500, 40)
    assert (cfg.leader_fallback_timeout_ms, cfg.connection_retry_ms) == (900, 200)
    assert (cfg.lease_duration_ms, cfg.lease_renew_ms, cfg.lease_margin_ms, cfg.drift_rho) == (1200, 250, 100, 0.01)
    assert (cfg.step_down_timeout_ms, cfg.commit_timeout_ms, cfg.tick_ms, cfg.fsync) == (2000, 1000, 250, "entry")
    assert cfg.holder_validity_ms == 1088
    assert (tmp_path / "data").is_dir()
    assert "0123456789abcdef" not in repr(cfg)  # SecretStr
    assert cfg.member_by_address("127.0.0.1:7002").node_id == "coord-b"  # type: ignore[union-attr]
    assert cfg.raft_tls is not None and cfg.raft_max_frame_bytes == DEFAULT_RAFT_MAX_FRAME
    assert (cfg.raft_handshake_timeout_ms, cfg.raft_half_frame_timeout_ms, cfg.raft_idle_timeout_ms) == (3000, 10_000, 10_000)
    assert (cfg.raft_max_connections, cfg.raft_max_connections_per_ip) == (64, 16)


def test_the_frame_limit_follows_the_largest_legal_entry() -> None:
    assert MAX_ENTRY_BYTES == codec.MAX_PAYLOAD_BYTES
    assert codec.MAX_PAYLOAD_BYTES < DEFAULT_RAFT_MAX_FRAME < 32 * 1024 * 1024


def test_env_overrides_file(tmp_path: Path) -> None:
    env = {
        "CONTROLPLANE_NODE_ID": "coord-z",
        "CONTROLPLANE_RAFT_TLS": json.dumps(shared_raft_tls("coord-z")),
        "CONTROLPLANE_LEASE_DURATION_MS": "1500",
        "CONTROLPLANE_FSYNC": "none",
        "CONTROLPLANE_PASSWORD": "another-password-123",
        "CONTROLPLANE_PEERS": '[{"node_id": "coord-y", "zone": "az-9", "raft_address": "127.0.0.1:7009",'
        ' "api_address": "127.0.0.1:8009"}]',
        "UNRELATED": "x",
    }
    cfg = load_config(write(tmp_path, GOOD), env=env)
    assert cfg.node_id == "coord-z"
    assert cfg.lease_duration_ms == 1500
    assert cfg.fsync == "none"
    assert cfg.password is not None and cfg.password.get_secret_value() == "another-password-123"
    assert [p.node_id for p in cfg.peers] == ["coord-y"]


def test_password_file_relative_to_config(tmp_path: Path) -> None:
    (tmp_path / "raft.pass").write_text("a-very-long-password-from-file\n", encoding="utf-8")
    data = {k: v for k, v in GOOD.items() if k != "password"}
    cfg = load_config(write(tmp_path, {**data, "password_file": "raft.pass"}), env={})
    assert cfg.password is not None and cfg.password.get_secret_value() == "a-very-long-password-from-file"


NO_PASSWORD = {k: v for k, v in GOOD.items() if k != "password"}

# (case, changes to GOOD, field named in the message, words in the message)
REJECTIONS: list[tuple[str, dict[str, Any], str, str]] = [
    ("password missing", {"password": None}, "password",
     "required: Raft members prove it to each other inside mutual TLS (a second layer besides raft_tls)"),
    ("password short", {"password": "short"}, "password", "at least 16 characters"),
    ("password and file", {"password_file": "/nonexistent"}, "password", "not both"),
    ("bad node id", {"node_id": "Coord_A"}, "node_id", "not a valid id"),
    ("bad zone", {"zone": ""}, "zone", "must not be empty"),
    ("raft address", {"raft_address": "127.0.0.1"}, "raft_address", "not 'host:port'"),
    ("raft port", {"raft_address": "127.0.0.1:70000"}, "raft_address", "port must be"),
    ("api address", {"api_address": "no port:1"}, "api_address", "not a valid host"),
    ("unknown field", {"lease_ms": 5}, "lease_ms", "unknown field"),
    ("negative", {"lease_margin_ms": -1}, "lease_margin_ms", "greater than or equal to 0"),
    ("fsync", {"fsync": "always"}, "fsync", "'none' or 'entry'"),
    ("raft min vs period", {"raft_min_timeout_ms": 120}, "raft_min_timeout_ms", "3*append_entries_period_ms"),
    ("raft max vs min", {"raft_max_timeout_ms": 150}, "raft_max_timeout_ms", "must exceed raft_min_timeout_ms"),
    ("fallback above min", {"leader_fallback_timeout_ms": 1001}, "leader_fallback_timeout_ms",
     "at most raft_min_timeout_ms"),
    ("fallback below period", {"leader_fallback_timeout_ms": 40}, "leader_fallback_timeout_ms",
     "above append_entries_period_ms"),
    ("renew too slow", {"lease_renew_ms": 401}, "lease_renew_ms", "renew at least 3 times"),
    ("validity vs renew", {"lease_renew_ms": 300, "lease_duration_ms": 900, "lease_margin_ms": 300},
     "lease_duration_ms", "so a renewal can complete"),
    ("lease vs step-down", {"lease_duration_ms": 3000}, "lease_duration_ms",
     "lease longer than the step-down timeout allows"),
    ("fallback vs step-down", {"step_down_timeout_ms": 120, "lease_duration_ms": 300, "lease_renew_ms": 50,
                               "lease_margin_ms": 150, "raft_min_timeout_ms": 200, "leader_fallback_timeout_ms": 190},
     "leader_fallback_timeout_ms", "exceeds step_down_timeout_ms"),
    ("duplicate id", {"peers": [dict(GOOD["peers"][0], node_id="coord-a")]}, "peers[0].node_id", "used twice"),
    ("duplicate address", {"peers": [dict(GOOD["peers"][0], raft_address="127.0.0.1:7001")]},
     "peers[0].raft_address", "used twice"),
    ("peer field", {"peers": [dict(GOOD["peers"][0], zone="AZ 2")]}, "peers[0].zone", "not a valid id"),
    ("raft_tls missing", {"raft_tls": None}, "raft_tls", "required: Raft members authenticate each other with mutual TLS"),
    ("raft_tls unreadable", {"raft_tls": dict(GOOD["raft_tls"], cert_file="/nonexistent.pem")}, "raft_tls.cert_file",
     "cannot read '/nonexistent.pem'"),
    ("raft_tls other key", {"raft_tls": dict(GOOD["raft_tls"], key_file=shared_raft_tls("coord-b")["key_file"])},
     "raft_tls", "key_file: cannot use"),
    ("raft_tls other member", {"raft_tls": shared_raft_tls("coord-b")}, "raft_tls.cert_file",
     "names coordinator identity 'coord-b', but this member is node_id 'coord-a'"),
    ("raft_tls not a CA", {"raft_tls": dict(GOOD["raft_tls"], ca_file=__file__)}, "raft_tls", "ca_file:"),
    ("frame too small", {"raft_max_frame_bytes": 1 << 20}, "raft_max_frame_bytes", "greater than or equal to"),
    ("keepalive vs idle", {"raft_keepalive_ms": 5000}, "raft_keepalive_ms", "exceeds raft_idle_timeout_ms"),
    ("accept backoff", {"raft_accept_backoff_ms": 2000}, "raft_accept_backoff_max_ms", "below raft_accept_backoff_ms"),
]


@pytest.mark.parametrize(("changes", "field", "words"), [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS])
def test_rejections_name_file_and_field(tmp_path: Path, changes: dict[str, Any], field: str, words: str) -> None:
    data = {**GOOD, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    msg = str(info.value)
    assert msg.startswith(f"{path}: {field}: "), msg
    assert words in msg, msg
    assert info.value.field == field


def test_unwritable_data_dir_rejected(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    path = write(tmp_path, {**GOOD, "data_dir": str(blocker / "sub")})
    with pytest.raises(ConfigError, match=r"data_dir: cannot create"):
        load_config(path, env={})


def test_existing_but_unwritable_data_dir_rejected(tmp_path: Path) -> None:
    """/proc/sys/kernel exists and refuses new files even to root (a chmod'ed directory would not)."""
    with pytest.raises(ConfigError, match=r"data_dir: '/proc/sys/kernel' is not writable"):
        load_config(write(tmp_path, {**GOOD, "data_dir": "/proc/sys/kernel"}), env={})


def test_data_dir_under_proc_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data_dir: cannot create '/proc/"):
        load_config(write(tmp_path, {**GOOD, "data_dir": "/proc/controlplane-test"}), env={})


def test_file_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing.yaml: cannot read"):
        load_config(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("node_id: [unclosed", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.yaml:1: not valid YAML: expected ',' or ']'") as err:
        load_config(bad, env={})
    assert "\n" not in str(err.value)  # one line, whatever PyYAML's own message looks like
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"list.yaml: the top level must be a mapping"):
        load_config(lst, env={})
    with pytest.raises(ConfigError, match=r"CONTROLPLANE_PEERS: peers must be a JSON list"):
        load_config(write(tmp_path, GOOD), env={"CONTROLPLANE_PEERS": "[oops"})


def test_several_problems_reported_as_one_message(tmp_path: Path) -> None:
    path = write(tmp_path, {**GOOD, "node_id": "BAD", "zone": "ALSO BAD"})
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value).count("\n") == 0
    assert "(and 1 more problem)" in str(info.value)


def test_direct_construction_validates_too(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="password"):
        CoordinatorConfig(**{**NO_PASSWORD, "data_dir": tmp_path})
