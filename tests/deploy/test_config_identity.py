"""controlplane/config.py: one ``peers`` list for every member (the StatefulSet's shared file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.config import ConfigError, CoordinatorConfig
from controlplane.config import load_config as _load_config
from tests.support.raft_pki import shared_raft_tls

MEMBERS = [
    {"node_id": f"coordinator-{i}", "zone": f"zone-{'abc'[i]}",
     "raft_address": f"coordinator-{i}.peers.cp.svc.cluster.local:4321",
     "api_address": f"coordinator-{i}.peers.cp.svc.cluster.local:7443"}
    for i in range(3)
]


def load_config(path: Path, env: dict[str, str]) -> CoordinatorConfig:
    """The loader, with the Raft certificate of the member that ``env`` names (as its pod gets it)."""
    return _load_config(path, env={"CONTROLPLANE_RAFT_TLS": json.dumps(shared_raft_tls(env["CONTROLPLANE_NODE_ID"])), **env})


def write(tmp_path: Path, **extra: Any) -> Path:
    data = {"data_dir": str(tmp_path / "data"), "password": "0123456789abcdef", "api_insecure": True,
            "peers": MEMBERS, **extra}
    path = tmp_path / "coordinator.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("i", [0, 1, 2])
def test_a_member_takes_its_identity_from_its_own_entry(tmp_path: Path, i: int) -> None:
    cfg = load_config(write(tmp_path), env={"CONTROLPLANE_NODE_ID": f"coordinator-{i}"})
    me = MEMBERS[i]
    assert (cfg.node_id, cfg.zone, cfg.raft_address, cfg.api_address) == tuple(me.values())
    assert [p.node_id for p in cfg.peers] == [m["node_id"] for m in MEMBERS if m is not me]
    assert [m.node_id for m in cfg.members()] == [me["node_id"], *(m["node_id"] for m in MEMBERS if m is not me)]


def test_an_explicit_zone_wins_and_an_equal_explicit_address_is_fine(tmp_path: Path) -> None:
    env = {"CONTROLPLANE_NODE_ID": "coordinator-1", "CONTROLPLANE_ZONE": "us-east-1c",
           "CONTROLPLANE_RAFT_ADDRESS": MEMBERS[1]["raft_address"]}
    cfg = load_config(write(tmp_path), env=env)
    assert cfg.zone == "us-east-1c" and cfg.raft_address == MEMBERS[1]["raft_address"]


def test_an_entry_that_contradicts_an_explicit_address_is_another_node_under_the_same_id(tmp_path: Path) -> None:
    env = {"CONTROLPLANE_NODE_ID": "coordinator-1", "CONTROLPLANE_ZONE": "z",
           "CONTROLPLANE_RAFT_ADDRESS": "10.0.0.1:4321", "CONTROLPLANE_API_ADDRESS": "10.0.0.1:7443"}
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path), env=env)
    assert err.value.field == "peers[1].node_id"
    assert "node id 'coordinator-1' is used twice" in str(err.value)


def test_without_an_own_entry_nothing_changes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="zone: required"):
        load_config(write(tmp_path), env={"CONTROLPLANE_NODE_ID": "coordinator-9"})
    cfg = load_config(write(tmp_path, zone="z", raft_address="127.0.0.1:1", api_address="127.0.0.1:2"),
                      env={"CONTROLPLANE_NODE_ID": "coordinator-9"})
    assert len(cfg.peers) == 3


def test_two_entries_with_this_node_id_are_still_a_duplicate(tmp_path: Path) -> None:
    twice = [*MEMBERS, {**MEMBERS[0], "raft_address": "other:1", "api_address": "other:2"}]
    with pytest.raises(ConfigError, match="used twice"):
        load_config(write(tmp_path, peers=twice, zone="z", raft_address="a:1", api_address="a:2"),
                    env={"CONTROLPLANE_NODE_ID": "coordinator-0"})
