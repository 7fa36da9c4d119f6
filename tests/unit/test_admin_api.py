"""The coordinator's gRPC surface: Admin.Status (with a token), grpc.health.v1 and reflection, on
127.0.0.1. The server runs over a stand-in node whose replica holds one admin and one tenant token."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from controlplane.api import protogen
from controlplane.api.admin import (
    Credentials,
    FencedClusterStatus,
    NodeStatus,
    PeerStatus,
    change_member,
    fetch_status,
)
from controlplane.api.server import SERVICE_NAMES, serve
from controlplane.config import CoordinatorConfig
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.state import ControlState
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.tokens import new_token
from tests.raft.cluster import cluster_configs

STATUS = NodeStatus(
    node_id="n1", zone="az-a", role="leader", term=3, leader_id="n1", lease_holder="n1", lease_epoch=7,
    lease_remaining_ms=900, commit_index=12, applied_index=11, raft_address="127.0.0.1:7001",
    api_address="127.0.0.1:7101",
    peers=(PeerStatus("n2", "az-b", "127.0.0.1:7002", "127.0.0.1:7102", True),
           PeerStatus("n3", "az-c", "127.0.0.1:7003", "127.0.0.1:7103", False)),
    fenced_clusters=(FencedClusterStatus("gpu-b1", 7, 9, 1_700_000_000_000),),
)


ADMIN, ADMIN_ID, ADMIN_SHA = new_token()
TENANT, TENANT_ID, TENANT_SHA = new_token()


class StandInNode:
    """The read side of a Raft node: a replica holding two tokens."""

    node_id = "n1"

    def __init__(self) -> None:
        self.state = ControlState()
        self.state.tokens = {ADMIN_ID: TokenRecord(ADMIN_ID, ADMIN_SHA, Role.ADMIN),
                             TENANT_ID: TokenRecord(TENANT_ID, TENANT_SHA, Role.TENANT, "a")}

    def state_copy(self) -> ControlState:
        return self.state


class Members:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def add_member(self, node_id: str, raft_address: str, api_address: str) -> int:
        self.calls.append(("add", node_id, raft_address, api_address))
        return 42

    def remove_member(self, raft_address: str) -> int:
        self.calls.append(("remove", raft_address))
        return 43


@pytest.fixture
def members() -> Members:
    return Members()


@pytest.fixture
def server(tmp_path: Path, members: Members):
    [raw] = cluster_configs(tmp_path, 1)
    api = serve(CoordinatorConfig.model_validate(raw), StandInNode(), status=lambda: STATUS, members=members,
                address="127.0.0.1:0")
    yield api
    api.stop(0.1)


def test_status_round_trips_every_field_for_an_admin(server) -> None:
    [got] = fetch_status([f"127.0.0.1:{server.port}"], creds=Credentials(token=ADMIN))
    assert got["reachable"] is True
    assert (got["node_id"], got["zone"], got["role"], got["term"], got["leader_id"]) == ("n1", "az-a", "leader", 3, "n1")
    assert got["lease"] == {"holder": "n1", "epoch": 7, "remaining_ms": 900}
    assert (got["commit_index"], got["applied_index"]) == (12, 11)
    assert got["pid"] == STATUS.pid > 0
    assert (got["raft_address"], got["api_address"]) == ("127.0.0.1:7001", "127.0.0.1:7101")
    assert [p["reachable"] for p in got["peers"]] == [True, False]
    assert got["peers"][1]["api_address"] == "127.0.0.1:7103"
    assert got["fenced_clusters"] == [{"cluster_id": "gpu-b1", "epoch": 7, "adapter_epoch": 9,
                                       "since_ms": 1_700_000_000_000}]


def test_a_tenant_sees_no_addresses_pids_or_epochs(server) -> None:
    """A current epoch and holder copied from a tenant's Status were half of a forged adapter command;
    addresses and pids are operators' details. Roles, terms, ids and reachability stay."""
    [got] = fetch_status([f"127.0.0.1:{server.port}"], creds=Credentials(token=TENANT))
    assert got["reachable"] is True
    assert (got["node_id"], got["zone"], got["role"], got["term"], got["leader_id"]) == ("n1", "az-a", "leader", 3, "n1")
    assert got["lease"] == {"holder": "n1", "epoch": 0, "remaining_ms": 900}
    assert (got["pid"], got["raft_address"], got["api_address"], got["fenced_clusters"]) == (0, "", "", [])
    assert [(p["node_id"], p["raft_address"], p["api_address"], p["reachable"]) for p in got["peers"]] == [
        ("n2", "", "", True), ("n3", "", "", False)]
    text = repr(got)
    for secret in ("127.0.0.1:700", "127.0.0.1:710", str(STATUS.pid), "'epoch': 7", "gpu-b1"):
        assert secret not in text


def test_status_needs_a_token(server) -> None:
    [got] = fetch_status([f"127.0.0.1:{server.port}"])
    assert got["reachable"] is False and got["error"].startswith("UNAUTHENTICATED")


def test_membership_changes_need_an_admin(server, members: Members) -> None:
    endpoint = f"127.0.0.1:{server.port}"
    with pytest.raises(ControlPlaneError, match="PERMISSION_DENIED"):
        change_member(endpoint, "add", "n4", "127.0.0.1:7004", "127.0.0.1:7104", creds=Credentials(token=TENANT))
    with pytest.raises(ControlPlaneError, match="UNAUTHENTICATED"):
        change_member(endpoint, "remove", "", "127.0.0.1:7004", "")
    assert members.calls == []
    assert change_member(endpoint, "add", "n4", "127.0.0.1:7004", "127.0.0.1:7104", creds=Credentials(token=ADMIN)) == 42
    assert change_member(endpoint, "remove", "", "127.0.0.1:7004", "", creds=Credentials(token=ADMIN)) == 43
    with pytest.raises(ControlPlaneError, match="INVALID_ARGUMENT: node_id: must not be empty"):
        change_member(endpoint, "add", "", "127.0.0.1:7004", "127.0.0.1:7104", creds=Credentials(token=ADMIN))


def test_unreachable_endpoint_is_reported_not_raised() -> None:
    [got] = fetch_status(["127.0.0.1:1"], timeout_s=0.5)
    assert got["reachable"] is False and "UNAVAILABLE" in got["error"]


def test_health_service_reports_serving_then_not_serving(server) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", *SERVICE_NAMES):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        server.set_serving(False)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_reflection_lists_the_services(server) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=2)
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert {*SERVICE_NAMES, "grpc.health.v1.Health"} <= names


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    """The committed *_pb2*.py files are exactly what `make proto` generates from proto/."""
    produced = protogen.generate(tmp_path)
    assert produced
    for path in produced:
        committed = protogen.REPO / path.relative_to(tmp_path)
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `make proto`"
