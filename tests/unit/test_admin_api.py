"""The coordinator's gRPC surface: Admin.Status, grpc.health.v1 and reflection, on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from controlplane.api import protogen
from controlplane.api.admin import NodeStatus, PeerStatus, fetch_status, serve

STATUS = NodeStatus(
    node_id="n1", zone="az-a", role="leader", term=3, leader_id="n1", lease_holder="n1", lease_epoch=7,
    lease_remaining_ms=900, commit_index=12, applied_index=11, raft_address="127.0.0.1:7001",
    api_address="127.0.0.1:7101",
    peers=(PeerStatus("n2", "az-b", "127.0.0.1:7002", "127.0.0.1:7102", True),
           PeerStatus("n3", "az-c", "127.0.0.1:7003", "127.0.0.1:7103", False)),
)


@pytest.fixture
def server():
    api = serve("127.0.0.1:0", lambda: STATUS)
    yield api
    api.stop(0.1)


def test_status_round_trips_every_field(server) -> None:
    [got] = fetch_status([f"127.0.0.1:{server.port}"])
    assert got["reachable"] is True
    assert (got["node_id"], got["zone"], got["role"], got["term"], got["leader_id"]) == ("n1", "az-a", "leader", 3, "n1")
    assert got["lease"] == {"holder": "n1", "epoch": 7, "remaining_ms": 900}
    assert (got["commit_index"], got["applied_index"]) == (12, 11)
    assert got["pid"] == STATUS.pid > 0
    assert [p["reachable"] for p in got["peers"]] == [True, False]
    assert got["peers"][1]["api_address"] == "127.0.0.1:7103"


def test_unreachable_endpoint_is_reported_not_raised() -> None:
    [got] = fetch_status(["127.0.0.1:1"], timeout_s=0.5)
    assert got["reachable"] is False and "UNAVAILABLE" in got["error"]


def test_health_service_reports_serving_then_not_serving(server) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", "controlplane.api.v1.Admin"):
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
    assert {"controlplane.api.v1.Admin", "grpc.health.v1.Health"} <= names


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    """The committed *_pb2*.py files are exactly what `make proto` generates from proto/."""
    produced = protogen.generate(tmp_path)
    assert produced
    for path in produced:
        committed = protogen.REPO / path.relative_to(tmp_path)
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `make proto`"
