"""Tenant isolation under the nemesis: a prober that calls every API method as the tenant ``bravo``
against the tenant ``alpha``'s objects, and the same method against objects that do not exist,
while the chaos runner injects faults. What it records (:class:`~controlplane.chaos.history.Probe`)
is checked by :class:`~controlplane.chaos.checker.IsolationChecker`: alpha's objects must answer
exactly like missing ones (NOT_FOUND, left out of lists, never in a watch), admin-only methods
PERMISSION_DENIED, nothing UNKNOWN/INTERNAL, no mutation of alpha's objects succeeds.

The request table is the one of ``tests/security/test_isolation_under_faults.py`` (which pins a
failover in process); it lives here because ``controlplane bench chaos`` runs from the installed
package. :func:`every_method` lists every method of every API service from the descriptors, so a
new method without a probe request fails :func:`probe_requests` (and a unit test), not silently.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import grpc

from controlplane.api.channel import open_channel
from controlplane.api.client import STUBS
from controlplane.api.v1 import admin_pb2, api_pb2
from controlplane.chaos.checker import (
    ISO_ALPHA,
    ISO_ALPHA_DEP,
    ISO_BRAVO,
    ISO_BRAVO_DEP,
    ISO_GHOST,
    ISO_GHOST_DEP,
)
from controlplane.chaos.history import Probe, Probes

MODEL = "llama3-8b-h100"
PROBE_TIMEOUT_S = 0.5
"""Per call: a paused or cut-off node answers DEADLINE_EXCEEDED (not compared) without stalling a round long."""
ROUND_EVERY_S = 1.0
"""One full round of every method (alpha + ghost, plus the neutral probes) per second at most."""
WATCH_MAX_EVENTS = 2000


def tenant_msg(name: str, priority: int = 1, **spec: Any) -> api_pb2.Tenant:
    return api_pb2.Tenant(metadata=api_pb2.ObjectMeta(name=name), spec=api_pb2.TenantSpec(priority=priority, **spec))


def deployment_msg(name: str, tenant: str, **spec: Any) -> api_pb2.Deployment:
    """A deployment that never places an instance (``min_replicas`` 0, no load): it must not disturb
    the chaos deployment's convergence."""
    spec.setdefault("min_replicas", 0)
    spec.setdefault("max_replicas", 1)
    return api_pb2.Deployment(metadata=api_pb2.ObjectMeta(name=name),
                              spec=api_pb2.DeploymentSpec(tenant=tenant, engine="vllm", model=MODEL, pool="h100", **spec))


def every_method() -> list[tuple[str, str]]:
    """(service, method) for every method of every API service and Admin."""
    from controlplane.api.server import SERVICE_NAMES

    out = []
    for name in SERVICE_NAMES:
        service = name.rsplit(".", 1)[1]
        module = admin_pb2 if service == "Admin" else api_pb2
        out += [(service, m.name) for m in module.DESCRIPTOR.services_by_name[service].methods]
    return out


def probe_requests(tenant: str, dep: str) -> dict[str, Any]:
    """One request per method, naming ``tenant``'s objects wherever the method takes a name. Deployment
    names are per tenant, so a bare ``dep`` from bravo names bravo's own: the probes name
    ``tenant/dep``, the one way bravo can point at another tenant's deployment."""
    ref = f"{tenant}/{dep}"
    reqs = {
        "CreateTenant": api_pb2.CreateTenantRequest(tenant=tenant_msg(tenant)),
        "GetTenant": api_pb2.GetRequest(name=tenant),
        "ListTenants": api_pb2.ListRequest(),
        "UpdateTenant": api_pb2.UpdateTenantRequest(tenant=tenant_msg(tenant, 9)),
        "DeleteTenant": api_pb2.DeleteRequest(name=tenant),
        "ApplyDeployment": api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(dep, tenant)),
        "GetDeployment": api_pb2.GetRequest(name=ref),
        "ListDeployments": api_pb2.ListRequest(tenant=tenant),
        "DeleteDeployment": api_pb2.DeleteRequest(name=ref),
        "RegisterCluster": api_pb2.RegisterClusterRequest(cluster=api_pb2.Cluster(
            metadata=api_pb2.ObjectMeta(name="c9"), spec=api_pb2.ClusterSpec(zone="z1", capacity={"h100": 1}))),
        "GetCluster": api_pb2.GetRequest(name="c1"),
        "ListClusters": api_pb2.ListRequest(),
        "DeleteCluster": api_pb2.DeleteRequest(name="c1"),
        "CordonCluster": api_pb2.CordonRequest(name="c1", cordoned=True),
        "DrainCluster": api_pb2.DrainRequest(name="c1"),
        "RegisterZone": api_pb2.RegisterZoneRequest(zone=api_pb2.Zone(metadata=api_pb2.ObjectMeta(name="z9"))),
        "GetZone": api_pb2.GetRequest(name="z1"),
        "ListZones": api_pb2.ListRequest(),
        "DeleteZone": api_pb2.DeleteRequest(name="z1"),
        "CordonZone": api_pb2.CordonRequest(name="z1", cordoned=True),
        "DrainZone": api_pb2.DrainRequest(name="z1"),
        "Explain": api_pb2.ExplainRequest(deployment=ref),
        "Watch": api_pb2.WatchRequest(once=True, since_revision=0, tenant=tenant),
        "DryRun": api_pb2.DryRunRequest(deployment=deployment_msg(dep, tenant, max_replicas=3)),
        "CreateToken": api_pb2.CreateTokenRequest(role="tenant", tenant=tenant),
        "ListTokens": api_pb2.ListTokensRequest(tenant=tenant),
        "RevokeToken": api_pb2.RevokeTokenRequest(id="0123456789ab"),
        "WhoAmI": api_pb2.WhoAmIRequest(),
        "Status": admin_pb2.StatusRequest(),
        "AddMember": admin_pb2.MemberRequest(node_id="coord-9", raft_address="127.0.0.1:1", api_address="127.0.0.1:2"),
        "RemoveMember": admin_pb2.MemberRequest(raft_address="127.0.0.1:1"),
    }
    missing = {m for _, m in every_method()} - set(reqs)
    if missing:
        raise KeyError(f"isolation probe: no request for {sorted(missing)}")
    return reqs


NEUTRAL: list[tuple[str, str, Any]] = [
    ("Scaling", "Watch", api_pb2.WatchRequest(once=True, since_revision=0)),
    ("Deployments", "ListDeployments", api_pb2.ListRequest()),
]
"""Requests that name nothing: bravo's unfiltered watch and deployment list must never show alpha."""


def call(channel: grpc.Channel, service: str, method: str, request: Any,
         timeout_s: float = PROBE_TIMEOUT_S) -> tuple[str, str]:
    """``(status code name, reply text or error details)``; a stream is read to its end."""
    try:
        reply = getattr(STUBS[service](channel), method)(request, timeout=timeout_s)
        if method == "Watch":
            events = []
            for ev in reply:
                events.append(str(ev))
                if len(events) >= WATCH_MAX_EVENTS:
                    reply.cancel()
                    break
            return "OK", "\n".join(events)
        return "OK", str(reply)
    except grpc.RpcError as err:
        code = err.code()
        if code is grpc.StatusCode.CANCELLED:
            return "OK", ""  # our own cancel after WATCH_MAX_EVENTS
        return code.name, err.details() or ""


class Prober(threading.Thread):
    """As ``bravo``: every round, every method once naming alpha's objects and once naming missing
    ones, the two calls on the same (random) coordinator one right after the other; then the
    neutral probes. Records every answer to :attr:`probes`."""

    def __init__(self, endpoints: list[str], token: str, seed: int, every_s: float = ROUND_EVERY_S) -> None:
        super().__init__(name="chaos-isolation-prober", daemon=True)
        self.endpoints = endpoints
        self.token = token
        self.rng = random.Random(seed ^ 0x1507)
        self.every_s = every_s
        self.probes = Probes()
        self.stopped = threading.Event()
        self.methods = every_method()
        self.alpha = probe_requests(ISO_ALPHA, ISO_ALPHA_DEP)
        self.ghost = probe_requests(ISO_GHOST, ISO_GHOST_DEP)

    def run(self) -> None:
        channels = {ep: open_channel(ep, token=self.token) for ep in self.endpoints}
        try:
            while not self.stopped.is_set():
                t0 = time.monotonic()
                self.round(channels)
                self.probes.rounds += 1
                self.stopped.wait(max(0.05, self.every_s - (time.monotonic() - t0)))
        finally:
            for ch in channels.values():
                ch.close()

    def round(self, channels: dict[str, grpc.Channel]) -> None:
        for service, method in self.methods:
            if self.stopped.is_set():
                return
            ep = self.rng.choice(self.endpoints)
            t = time.monotonic()
            a = call(channels[ep], service, method, self.alpha[method])
            g = call(channels[ep], service, method, self.ghost[method])
            self.probes.add(Probe(t, ep, service, method, a, g))
        for service, method, request in NEUTRAL:
            ep = self.rng.choice(self.endpoints)
            self.probes.add(Probe(time.monotonic(), ep, service, method, call(channels[ep], service, method, request), None))


def set_up(endpoints: list[str], admin_token: str, timeout_s: float = 30.0) -> str:
    """As admin: tenants ``alpha`` and ``bravo`` with a deployment each, and a token scoped to
    ``bravo`` (returned). Retries until the group answers (creates that already happened are fine)."""
    from controlplane.api.client import ApiClient, ApiError, Unreachable

    deadline = time.monotonic() + timeout_s
    steps: list[tuple[str, str, Any, bool]] = []
    for tenant, dep in ((ISO_ALPHA, ISO_ALPHA_DEP), (ISO_BRAVO, ISO_BRAVO_DEP)):
        steps.append(("Tenants", "CreateTenant",
                      api_pb2.CreateTenantRequest(tenant=tenant_msg(tenant, quota={"h100": 1})), False))
        steps.append(("Deployments", "ApplyDeployment",
                      api_pb2.ApplyDeploymentRequest(deployment=deployment_msg(dep, tenant)), True))
    steps.append(("Tokens", "CreateToken", api_pb2.CreateTokenRequest(role="tenant", tenant=ISO_BRAVO), False))
    reply: Any = None
    last: Exception | None = None
    with ApiClient(endpoints, token=admin_token, timeout_s=5.0) as client:
        for service, method, request, idempotent in steps:
            while True:
                try:
                    reply = client.call(service, method, request, idempotent=idempotent)
                    break
                except ApiError as exc:
                    if exc.code is grpc.StatusCode.ALREADY_EXISTS:
                        break
                    last = exc
                except Unreachable as exc:
                    last = exc
                if time.monotonic() > deadline:
                    raise TimeoutError(f"isolation set-up: {service}.{method}: {last}")
                time.sleep(0.2)
    return str(reply.token)


def alpha_specs(endpoints: list[str], admin_token: str, timeout_s: float = 2.0) -> dict[str, tuple[str, str] | None]:
    """Per endpoint, as admin: (alpha's tenant spec, alpha's deployment spec) as text, or None when
    the endpoint did not answer both (the runner compares these with the ones after set-up)."""
    from controlplane.api.client import ApiClient, ApiError, Unreachable

    out: dict[str, tuple[str, str] | None] = {}
    with ApiClient(endpoints, token=admin_token, timeout_s=timeout_s) as client:
        for ep in endpoints:
            try:
                t = client.call("Tenants", "GetTenant", api_pb2.GetRequest(name=ISO_ALPHA), endpoint=ep)
                d = client.call("Deployments", "GetDeployment", api_pb2.GetRequest(name=f"{ISO_ALPHA}/{ISO_ALPHA_DEP}"),
                                endpoint=ep)
                out[ep] = (str(t.spec), str(d.spec))
            except ApiError as exc:
                out[ep] = None if exc.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED") else (f"error {exc.code.name}",
                                                                                             exc.message)
            except Unreachable:
                out[ep] = None
    return out
