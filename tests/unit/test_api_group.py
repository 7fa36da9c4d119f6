"""The API on a three-member group (in-process coordinators): any member accepts writes (a follower
forwards them), a linearizable read on a follower sees a write acknowledged by another member, a
watch resumes on another member from the last revision seen, and a follower answers Explain with the
lease holder's live evaluation (it forwards that part)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import api_pb2
from controlplane.config import CoordinatorConfig
from controlplane.coordinator import Coordinator
from controlplane.tokens import new_token
from tests.raft.cluster import cluster_configs
from tests.support.waiting import wait_until
from tests.unit.test_api_server import Api, deployment_msg, tenant_msg


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Coordinator], str]]:
    base: Path = tmp_path_factory.mktemp("group")
    token, _, _ = new_token()
    (base / "admin.token").write_text(token + "\n", encoding="utf-8")
    cos = [Coordinator(CoordinatorConfig.model_validate(raw))
           for raw in cluster_configs(base, 3, admin_token_file=str(base / "admin.token"))]
    for co in cos:
        co.start()
    try:
        def ready() -> bool:
            for co in cos:
                try:
                    Api(co.cfg.api_address, token).tokens.WhoAmI(api_pb2.WhoAmIRequest(), timeout=2)
                except grpc.RpcError:
                    return False
            return True

        wait_until(ready, 30.0, "every member to know the admin token", 0.05)
        yield cos, token
    finally:
        for co in cos:
            co.stop()


def _holder(cos: list[Coordinator]) -> Coordinator:
    return wait_until(lambda: next((c for c in cos if c.guard.authority(c.node.clock_ms()) is not None), None),
                      10.0, "a lease holder")


def test_followers_accept_writes_and_linearizable_reads_see_them(members) -> None:
    cos, token = members
    holder = _holder(cos)
    followers = [c for c in cos if c is not holder]
    a = Api(followers[0].cfg.api_address, token)
    b = Api(followers[1].cfg.api_address, token)
    a.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg("g1")), timeout=10)
    got = b.tenants.GetTenant(api_pb2.GetRequest(name="g1", read=api_pb2.ReadOptions(linearizable=True)), timeout=10)
    assert got.metadata.name == "g1"


def test_a_watch_resumes_on_another_member(members) -> None:
    cos, token = members
    first = Api(cos[0].cfg.api_address, token)
    stream = first.scaling.Watch(api_pb2.WatchRequest(kinds=["Tenant"]), timeout=30)
    assert next(stream).type == "BOOKMARK"
    first.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg("r1")), timeout=10)
    seen = next(e for e in stream if e.type != "BOOKMARK")
    stream.cancel()
    first.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg("r2")), timeout=10)
    other = Api(cos[2].cfg.api_address, token)
    resumed = other.scaling.Watch(api_pb2.WatchRequest(kinds=["Tenant"], since_revision=seen.revision), timeout=30)
    assert next(resumed).type == "BOOKMARK"
    nxt = next(e for e in resumed if e.type != "BOOKMARK")
    resumed.cancel()
    assert (nxt.name, nxt.served_by) == ("r2", cos[2].cfg.node_id) and nxt.revision > seen.revision


def test_a_follower_explains_with_the_holders_live_view(members) -> None:
    cos, token = members
    holder = _holder(cos)
    follower = next(c for c in cos if c is not holder)
    api = Api(follower.cfg.api_address, token)
    api.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg("x1")), timeout=10)
    api.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("dx1", "x1")), timeout=10)
    out = wait_until(lambda: (e := api.scaling.Explain(api_pb2.ExplainRequest(deployment="x1/dx1"), timeout=10))
                     .HasField("live") and e, 15.0, "the holder's live evaluation of dx1")
    assert out.lease_holder == holder.cfg.node_id and out.read.served_by == follower.cfg.node_id


def test_a_follower_reads_adapter_connectivity_from_the_lease_holder(members, monkeypatch: pytest.MonkeyPatch) -> None:
    cos, token = members
    holder = _holder(cos)
    follower = next(c for c in cos if c is not holder)
    api = Api(follower.cfg.api_address, token)
    api.clusters.RegisterCluster(api_pb2.RegisterClusterRequest(cluster=api_pb2.Cluster(
        metadata=api_pb2.ObjectMeta(name="cx"),
        spec=api_pb2.ClusterSpec(zone="zx", capacity={"l4": 1}, adapter_address="127.0.0.1:9"))), timeout=10)
    # what the holder's control loop knows (its loop hears no adapter here): cx delivers since t=1234
    monkeypatch.setattr(holder.api.core.holder, "adapter_links", lambda: {"cx": (True, 1234)})  # type: ignore[union-attr]

    def adapter(cl: api_pb2.Cluster) -> api_pb2.Condition:
        return next(c for c in cl.status.conditions if c.type == "AdapterConnected")

    got = adapter(api.clusters.GetCluster(api_pb2.GetRequest(name="cx"), timeout=10))
    assert (got.status, got.reason, got.last_transition_ms) == ("True", "Connected", 1234)
    listed = next(cl for cl in api.clusters.ListClusters(api_pb2.ListRequest(), timeout=10).items if cl.metadata.name == "cx")
    assert adapter(listed).status == "True"
    zone = api.clusters.GetZone(api_pb2.GetRequest(name="zx"), timeout=10)
    assert [(c.type, c.status) for c in zone.status.conditions][0] == ("Ready", "True")
    # no holder to ask: Unknown (a call the follower itself forwarded is never forwarded again)
    monkeypatch.setattr(follower.api.core, "holder_api_address", lambda: None)  # type: ignore[union-attr]
    got = adapter(api.clusters.GetCluster(api_pb2.GetRequest(name="cx"), timeout=10))
    assert (got.status, got.reason) == ("Unknown", "NoLeaseHolder")
