"""Issue 18 point 5: ``tenantctl watch`` / ``events`` send the significant events by default
(server-side: ``WatchRequest.all`` / ``types``), ``--all`` and ``--type`` for the rest, and a
filtered watch still resumes exactly. The real CLI against the real in-process coordinator."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator

import grpc
import pytest

from controlplane.api.v1 import api_pb2
from controlplane.cli.tenantctl import run
from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId
from controlplane.domain.instances import InstanceEvent as E
from raft import codec
from tests.support.real_ctl import RealCtl, real_ctl
from tests.unit.test_api_server import deployment_msg, tenant_msg

INSTANCE = "i-flip-1"


@pytest.fixture(scope="module")
def rc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCtl]:
    with real_ctl(tmp_path_factory.mktemp("watchfilter")) as g:
        a = g.admin
        a.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg("acme", quota={"h100": 4})), timeout=10)
        a.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("chat", "acme")),
                                      timeout=10)
        a.clusters.RegisterCluster(api_pb2.RegisterClusterRequest(cluster=api_pb2.Cluster(
            metadata=api_pb2.ObjectMeta(name="c1"), spec=api_pb2.ClusterSpec(zone="z1", capacity={"h100": 8}))),
            timeout=10)
        d, i = DeploymentId("acme/chat"), InstanceId(INSTANCE)
        for cmd in (c.CreateInstance(i, d, ClusterId("c1"), 1), c.TransitionInstance(i, E.START_WARMUP, 2),
                    c.TransitionInstance(i, E.WARMED, 3), c.TransitionInstance(i, E.WORK, 4),
                    c.TransitionInstance(i, E.IDLE, 5), c.TransitionInstance(i, E.WORK, 6),
                    # one entry, so that no decision of the control loop comes between the two
                    c.Batch((c.SetDesired(d, 5, 0, "marker-first", 7), c.SetDesired(d, 5, 0, "marker-same", 8)))):
            result = g.co.node.submit(codec.encode(cmd), timeout_s=10)
            assert getattr(result, "ok", False), result
        yield g


def events_json(rc: RealCtl, *flags: str) -> list[dict]:
    code, out, err = rc.ctl("events", "-o", "json", *flags)
    assert code == 0, err
    return json.loads(out)


def mine(events: list[dict]) -> list[tuple[str, str]]:
    return [(e.get("from_state", ""), e.get("to_state", "")) for e in events if e.get("name") == INSTANCE]


def test_events_by_default_are_the_significant_ones(rc: RealCtl) -> None:
    default = events_json(rc)
    assert mine(default) == [("", "Pending"), ("Pending", "Warming"), ("Warming", "Ready")]  # no Busy flips
    reasons = [e.get("reason") for e in default if e.get("kind") == "Decision"]
    assert "marker-first" in reasons and "marker-same" not in reasons  # the same count is no news
    lease = [e for e in default if e.get("kind") == "Lease"]
    assert lease and lease[0]["to_state"] == rc.co.cfg.node_id and lease[0]["event"] == "acquire"
    assert all(e.get("significant") for e in default)
    kinds = {e["kind"] for e in default}
    assert {"Tenant", "Deployment", "Cluster", "Instance", "Decision", "Lease"} <= kinds


def test_all_and_type_show_the_rest(rc: RealCtl) -> None:
    everything = events_json(rc, "--all")
    assert mine(everything) == [("", "Pending"), ("Pending", "Warming"), ("Warming", "Ready"), ("Ready", "Busy"),
                                ("Busy", "Ready"), ("Ready", "Busy")]
    assert "marker-same" in [e.get("reason") for e in everything]
    busy = events_json(rc, "--type", "busy")
    assert mine(busy) == [("Ready", "Busy"), ("Busy", "Ready"), ("Ready", "Busy")]
    assert {e["kind"] for e in busy} == {"Instance"}
    two = events_json(rc, "--type", "decision", "--type", "LEASE")
    assert {e["kind"] for e in two} == {"Decision", "Lease"}
    assert {"marker-first", "marker-same"} <= {e.get("reason") for e in two}


def test_the_table_and_bad_types(rc: RealCtl) -> None:
    code, out, _ = rc.ctl("events", "--type", "lease")
    assert code == 0 and "Lease" in out and "holds the lease at epoch" in out
    code, _, err = rc.ctl("events", "--type", "flips")
    assert code == 2 and err.count("\n") == 1 and "--type: unknown type 'flips'" in err
    code, _, err = rc.ctl("events", "--type", "busy", "--all")
    assert code == 2 and "--type and --all" in err
    bad = pytest.raises(grpc.RpcError, lambda: list(rc.admin.scaling.Watch(
        api_pb2.WatchRequest(once=True, types=["nope"]), timeout=10)))
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "types[0]" in bad.value.details()


def test_a_filtered_watch_resumes_exactly(rc: RealCtl) -> None:
    """The bookmark of a filtered watch carries the head revision even when the newest events were
    filtered out, and resuming after any revision gives exactly the events after it."""
    everything = list(rc.admin.scaling.Watch(api_pb2.WatchRequest(once=True, all=True), timeout=10))
    assert everything[-1].type == "BOOKMARK"
    head = everything[-1].revision
    default = list(rc.admin.scaling.Watch(api_pb2.WatchRequest(once=True), timeout=10))
    assert default[-1].type == "BOOKMARK" and default[-1].revision == head
    significant = [e for e in everything[:-1] if e.significant]
    assert [e.revision for e in default[:-1]] == [e.revision for e in significant]
    for cut in {e.revision for e in significant}:
        resumed = list(rc.admin.scaling.Watch(api_pb2.WatchRequest(once=True, since_revision=cut), timeout=10))
        assert [e.revision for e in resumed[:-1]] == [e.revision for e in significant if e.revision > cut]


class _Until(io.StringIO):
    """stdout that hangs up (as a closed pipe) once ``marker`` was written."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def write(self, text: str) -> int:
        n = super().write(text)
        if self.marker in self.getvalue():
            raise BrokenPipeError
        return n


def test_live_watch_sends_the_significant_events(rc: RealCtl) -> None:
    out, err = _Until("marker-first"), io.StringIO()
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(
        run(["--config", str(rc.config), "watch", "--since", "0"], out=out, err=err)), daemon=True)
    t.start()
    t.join(30)
    assert codes == [0], err.getvalue()
    lines = out.getvalue().splitlines()
    assert any("Lease" in ln and "holds the lease" in ln for ln in lines)
    flips = [ln for ln in lines if INSTANCE in ln]
    assert len(flips) == 3 and not any("Busy" in ln for ln in flips)


def test_old_clients_get_the_significant_events(rc: RealCtl) -> None:
    """A request without ``all`` / ``types`` (what a client from before them sends): significant only."""
    old = list(rc.admin.scaling.Watch(api_pb2.WatchRequest(once=True, kinds=["Instance"]), timeout=10))
    states = [(e.from_state, e.to_state) for e in old if e.name == INSTANCE]
    assert ("Ready", "Busy") not in states and ("Warming", "Ready") in states
