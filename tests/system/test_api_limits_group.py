"""Per-tenant limits on a real group: three `controlplane coordinator` processes on 127.0.0.1 (no
adapters: no cluster is configured), each Raft link through a fault-injecting proxy.

1. A watch flood from one tenant token (200 once-watches and 48 live watches, aimed at the lease
   holder) is refused beyond the tenant's share; meanwhile another tenant still watches, admins get
   ``Admin.Status`` from every member within a bounded deadline, and the lease does not move.
2. A member cut off from its peers (connections dropped) answers a write UNAVAILABLE at once,
   saying it was not submitted, instead of DEADLINE_EXCEEDED "unknown outcome" at the deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import yaml

from controlplane.api.admin import Credentials, fetch_status
from controlplane.api.v1 import admin_pb2, api_pb2
from controlplane.cli.up import plan_group
from controlplane.tokens import new_token
from tests.support.faultproxy import Mode, Partitioner
from tests.support.waiting import wait_until
from tests.unit.test_api_server import Api, deployment_msg, tenant_msg

REPO = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "controlplane.cli.main"]
DEADLINE_S = 30.0
STATUS_DEADLINE_S = 2.0
S = grpc.StatusCode


class Group:
    def __init__(self, root: Path, net: Partitioner, nodes) -> None:  # type: ignore[no-untyped-def]
        self.root, self.net, self.nodes = root, net, nodes
        self.procs: dict[str, subprocess.Popen] = {}
        token = new_token()[0]
        (root / "admin.token").write_text(token + "\n")
        self.token = token
        self.creds = Credentials(token=token)
        for node in nodes:
            cfg = yaml.safe_load(node.config.read_text())
            cfg.update(admin_token_file=str(root / "admin.token"), clusters=[],
                       raft_dial_overrides={p: f"127.0.0.1:{port}" for p, port in net.mapping_for(node.raft_address).items()})
            node.config.write_text(yaml.safe_dump(cfg))

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        for node in self.nodes:
            self.procs[node.node_id] = subprocess.Popen(
                EXE + ["coordinator", "--config", str(node.config)], env=env,
                stdout=subprocess.DEVNULL, stderr=open(self.root / f"{node.node_id}.log", "ab"))

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(8)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(3)

    def node(self, node_id: str):  # type: ignore[no-untyped-def]
        return next(n for n in self.nodes if n.node_id == node_id)

    def status(self, timeout_s: float = 1.0) -> dict[str, dict]:
        return {s["node_id"]: s for s in fetch_status([n.api_address for n in self.nodes], timeout_s, self.creds)
                if s["reachable"]}

    def wait_holder(self) -> tuple[str, int]:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            st = self.status()
            for nid, s in st.items():
                if s["lease"]["remaining_ms"] > 0 and s["lease"]["holder"] == nid and len(st) == 3:
                    return nid, s["lease"]["epoch"]
            time.sleep(0.2)
        raise AssertionError(f"no lease holder within {DEADLINE_S}s: {self.status()}")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    root = tmp_path_factory.mktemp("limits-group")
    nodes, _ = plan_group(3, root)
    with Partitioner([n.raft_address for n in nodes]) as net:
        g = Group(root, net, nodes)
        g.start()
        try:
            holder, _ = g.wait_holder()
            admin = Api(g.node(holder).api_address, g.token)
            for name in ("alpha", "bravo"):
                admin.tenants.CreateTenant(api_pb2.CreateTenantRequest(tenant=tenant_msg(name)), timeout=10)
            for i in range(30):  # something for the once-watches to read
                admin.deployments.ApplyDeployment(
                    api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(f"d{i}", "alpha")), timeout=10)
            yield g
        finally:
            g.stop()


def _token(g: Group, endpoint: str, tenant: str) -> str:
    admin = Api(endpoint, g.token)
    token = admin.tokens.CreateToken(api_pb2.CreateTokenRequest(role="tenant", tenant=tenant), timeout=10).token
    # every member must know it before it is used anywhere (docs/api.md: tokens replicate like the rest)
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            for n in g.nodes:
                Api(n.api_address, token).tokens.WhoAmI(api_pb2.WhoAmIRequest(), timeout=2)
            return token
        except grpc.RpcError:
            time.sleep(0.2)
    raise AssertionError("the new token did not reach every member")


def test_a_tenant_watch_flood_does_not_starve_status_nor_move_the_lease(group: Group) -> None:
    holder, epoch = group.wait_holder()
    target = group.node(holder).api_address
    alpha = Api(target, _token(group, target, "alpha"))
    bravo = Api(target, _token(group, target, "bravo"))
    live = [alpha.scaling.Watch(api_pb2.WatchRequest(), timeout=120) for _ in range(48)]
    try:
        first = []
        for s in live:
            try:
                first.append(next(s).type)
            except grpc.RpcError as exc:
                assert exc.code() is S.RESOURCE_EXHAUSTED and "api_max_watches_per_tenant" in exc.details()
                first.append("refused")
        assert first.count("BOOKMARK") == 4 and first.count("refused") == 44  # the default share: 4

        def once(_: int) -> S:
            try:
                list(alpha.scaling.Watch(api_pb2.WatchRequest(once=True), timeout=30))
                return S.OK
            except grpc.RpcError as exc:
                return exc.code()

        status_s: list[float] = []

        def flood_once() -> list[S]:
            with ThreadPoolExecutor(32) as pool:
                flood = pool.map(once, range(200))
                t_end = time.monotonic() + 3.0
                while time.monotonic() < t_end:
                    for n in group.nodes:
                        t0 = time.monotonic()
                        Api(n.api_address, group.token).admin.Status(admin_pb2.StatusRequest(), timeout=STATUS_DEADLINE_S)
                        status_s.append(time.monotonic() - t0)
                return list(flood)

        codes = flood_once()  # the tenant's share is held by its live watches
        assert set(codes) == {S.RESOURCE_EXHAUSTED}, codes
        other = bravo.scaling.Watch(api_pb2.WatchRequest(), timeout=30)
        assert next(other).type == "BOOKMARK"
        other.cancel()
    finally:
        for s in live:
            s.cancel()
    # the server frees a cancelled stream's slot when its handler notices (within its check period)
    wait_until(lambda: once(0) is S.OK, 20.0, "alpha's cancelled live watches to be released")
    codes = flood_once()  # once-watches alone: some run (4 at a time), the rest are refused
    assert set(codes) <= {S.OK, S.RESOURCE_EXHAUSTED} and S.OK in codes, codes
    print(f"Status during the floods: {len(status_s)} calls, max {max(status_s) * 1000:.0f} ms; "
          f"once-watches alone: {codes.count(S.OK)} served, {codes.count(S.RESOURCE_EXHAUSTED)} refused")
    assert max(status_s) < STATUS_DEADLINE_S
    assert group.wait_holder() == (holder, epoch), "the lease moved during the flood"


def test_a_member_cut_off_from_its_peers_answers_writes_unavailable_not_unknown(group: Group) -> None:
    holder, _ = group.wait_holder()
    victim = next(n for n in group.nodes if n.node_id != holder)
    group.net.cut_off(victim.raft_address, Mode.DROP)
    try:
        api = Api(victim.api_address, group.token)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:  # until it sees its links down
            st = fetch_status([victim.api_address], 2.0, group.creds)[0]
            if st["reachable"] and not any(p["reachable"] for p in st["peers"]):
                break
            time.sleep(0.2)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            api.deployments.ApplyDeployment(api_pb2.ApplyDeploymentRequest(deployment=deployment_msg("cut", "bravo")),
                                            timeout=10)
        took = time.monotonic() - t0
        assert err.value.code() is S.UNAVAILABLE, (err.value.code(), err.value.details())
        assert "not submitted" in err.value.details()
        assert dict(err.value.trailing_metadata() or ()).get("cp-outcome") != "unknown"
        print(f"cut-off member answered {err.value.code().name} in {took * 1000:.0f} ms")
        assert took < 1.0, took  # at once, not at the commit deadline
    finally:
        group.net.heal()
    group.wait_holder()
