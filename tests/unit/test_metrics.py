"""A coordinator's Prometheus endpoint (``metrics_address``): the pure families and a real scrape."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.api.channel import open_channel
from controlplane.api.v1 import api_pb2, api_pb2_grpc
from controlplane.cli.up import free_ports
from controlplane.config import ConfigError, CoordinatorConfig, load_config
from controlplane.coordinator import Coordinator
from controlplane.domain.records import BreakerPhase, BreakerRecord
from controlplane.domain.state import ControlState
from controlplane.runtime.metrics import CoordinatorCollector, MetricsView
from controlplane.tokens import new_token
from tests.raft.cluster import cluster_configs
from tests.support.waiting import wait_until


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def view(**changes: object) -> MetricsView:
    base = dict(node_id="coord-a", zone="az-a", raft_leader=True, term=3, commit_index=40, applied_index=39,
                peers=(("coord-b", True), ("coord-c", False)), lease_holder=True, lease_epoch=5,
                lease_remaining_ms=850, state=ControlState())
    return MetricsView(**{**base, **changes})  # type: ignore[arg-type]


def scrape(v: MetricsView) -> dict:
    registry = CollectorRegistry()
    registry.register(CoordinatorCollector(lambda: v))
    return samples(generate_latest(registry).decode())


def test_families_report_raft_lease_and_breakers() -> None:
    state = ControlState()
    state.breakers["deployment/c1/d1"] = BreakerRecord(phase=BreakerPhase.OPEN, trips=3)
    state.breakers["cluster/c2"] = BreakerRecord()
    got = scrape(view(state=state))
    assert got[("controlplane_info", (("node_id", "coord-a"), ("version", got_version(got)), ("zone", "az-a")))] == 1
    assert got[("controlplane_raft_leader", ())] == 1
    assert got[("controlplane_raft_term", ())] == 3
    assert got[("controlplane_raft_applied_index", ())] == 39
    assert got[("controlplane_raft_peer_reachable", (("peer", "coord-b"),))] == 1
    assert got[("controlplane_raft_peer_reachable", (("peer", "coord-c"),))] == 0
    assert got[("controlplane_lease_holder", ())] == 1
    assert got[("controlplane_lease_epoch", ())] == 5
    assert got[("controlplane_lease_remaining_seconds", ())] == pytest.approx(0.85)
    assert got[("controlplane_breaker_open", (("breaker", "deployment/c1/d1"),))] == 1
    assert got[("controlplane_breaker_trips", (("breaker", "deployment/c1/d1"),))] == 3
    assert got[("controlplane_breaker_open", (("breaker", "cluster/c2"),))] == 0


def test_unknown_load_is_exported_per_signal() -> None:
    from controlplane.domain.ids import DeploymentId, PoolId, TenantId
    from controlplane.domain.tenants import Deployment, Engine

    state = ControlState()
    state.deployments[DeploymentId("chat")] = Deployment(DeploymentId("chat"), TenantId("t"), Engine.DEEPSPEED_MII,
                                                         "llama3-8b-h100", PoolId("h100"), 1)
    got = scrape(view(state=state, load_unknown={"chat": frozenset({"kv_usage", "concurrency"})}))
    for name in ("kv_usage", "concurrency"):
        assert got[("controlplane_deployment_load_unknown",
                    (("deployment", "chat"), ("signal", name), ("tenant", "t")))] == 1
    assert not [k for k in scrape(view(state=state)) if k[0] == "controlplane_deployment_load_unknown"]


def got_version(got: dict) -> str:
    (key,) = [k for k in got if k[0] == "controlplane_info"]
    return dict(key[1])["version"]


def test_a_follower_reports_no_lease_and_no_remaining_time() -> None:
    got = scrape(view(raft_leader=False, lease_holder=False, lease_remaining_ms=-20))
    assert got[("controlplane_raft_leader", ())] == 0
    assert got[("controlplane_lease_holder", ())] == 0
    assert got[("controlplane_lease_remaining_seconds", ())] == 0


def test_metrics_address_must_not_reuse_the_raft_or_api_port(tmp_path: Path) -> None:
    [raw] = cluster_configs(tmp_path, 1)
    path = tmp_path / "c.yaml"
    import yaml

    path.write_text(yaml.safe_dump({**raw, "metrics_address": raw["api_address"]}), encoding="utf-8")
    with pytest.raises(ConfigError, match="metrics_address"):
        load_config(path)
    path.write_text(yaml.safe_dump({**raw, "metrics_address": "nowhere"}), encoding="utf-8")
    with pytest.raises(ConfigError, match="metrics_address"):
        load_config(path)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Coordinator, str, str]]:
    base: Path = tmp_path_factory.mktemp("metrics")
    token, _, _ = new_token()
    (base / "admin.token").write_text(token + "\n", encoding="utf-8")
    [port] = free_ports(1)
    [raw] = cluster_configs(base, 1, admin_token_file=str(base / "admin.token"), metrics_address=f"127.0.0.1:{port}")
    co = Coordinator(CoordinatorConfig.model_validate(raw))
    co.start()
    try:
        yield co, token, f"http://127.0.0.1:{port}/metrics"
    finally:
        co.stop()


def test_a_real_coordinator_serves_its_metrics(coordinator: tuple[Coordinator, str, str]) -> None:
    co, token, url = coordinator
    channel = open_channel(co.cfg.api_address, token=token)
    tenants, deps = api_pb2_grpc.TenantsStub(channel), api_pb2_grpc.DeploymentsStub(channel)
    wait_until(lambda: co.status().lease_remaining_ms > 0, 20.0, "the single member to hold the lease")

    def created() -> bool:
        try:
            tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=api_pb2.Tenant(
                metadata=api_pb2.ObjectMeta(name="search"),
                spec=api_pb2.TenantSpec(priority=5, quota={"h100": 8}, slo=api_pb2.Slo(ttft_p99_ms=1500)))), timeout=5)
            return True
        except Exception:  # the bootstrap admin token is registered by the first holder tick
            return False

    wait_until(created, 20.0, "the tenant to be created")
    deps.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=api_pb2.Deployment(
        metadata=api_pb2.ObjectMeta(name="chat"),
        spec=api_pb2.DeploymentSpec(tenant="search", engine="vllm", model="llama3-8b-h100", pool="h100"))), timeout=10)

    def read() -> dict:
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            return samples(resp.read().decode())

    labels = (("deployment", "search/chat"), ("tenant", "search"))  # the id: names are per tenant
    wait_until(lambda: ("controlplane_deployment_desired_replicas", labels) in read(), 20.0, "a decision for chat")
    got = read()
    assert got[("controlplane_raft_leader", ())] == 1
    assert got[("controlplane_lease_holder", ())] == 1
    assert got[("controlplane_lease_epoch", ())] >= 1
    assert got[("controlplane_deployment_slo_ttft_p99_seconds", labels)] == 1.5
    assert got[("controlplane_ticks_total", (("outcome", "ok"),))] >= 1
    assert got[("controlplane_tick_duration_seconds_count", ())] >= 1
    assert not any(token.split("_")[-1] in str(k) for k in got)  # nothing secret in label values
    channel.close()


def test_raft_transport_counters_are_exported() -> None:
    got = scrape(view(raft_transport={"oversize_frames": 2, "emfile_backoffs": 3, "tls_rejected": 0}))
    assert got[("controlplane_raft_transport_events_total", (("event", "oversize_frames"),))] == 2
    assert got[("controlplane_raft_transport_events_total", (("event", "emfile_backoffs"),))] == 3
    assert got[("controlplane_raft_transport_events_total", (("event", "tls_rejected"),))] == 0
