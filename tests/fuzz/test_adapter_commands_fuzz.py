"""Adapter commands, fuzzed: the adapter's gRPC service (adapters/service.py) over the simulated
backend, called with random and near-valid ``Apply`` and ``Scale`` requests (Hypothesis strategies
from the proto descriptors: tests/support/protofuzz.py): unknown actions, empty, unknown and
malformed instance and deployment ids, negative and huge replica counts (up to 2**31 - 1), negative
or huge GPU counts and drain timeouts, repeated victims, victims that do not exist, wrong cluster
ids. The fence carries the adapter's current epoch, so requests get past fencing and reach the
command checks and the backend.

Every request is answered with a proper status (OK, INVALID_ARGUMENT, NOT_FOUND,
FAILED_PRECONDITION or UNAVAILABLE, with a message), never UNKNOWN or INTERNAL (an unhandled
exception), and a rejected request leaves the backend exactly as it was (the simulated cluster's
instances, their phases and GPUs; its clock is frozen so nothing moves by itself). The service
stays healthy throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.backend import FenceToken, InstanceCommand, InstanceSpec
from adapters.service import serve_adapter
from adapters.simulated import SimulatedBackend, SimulatedConfig
from controlplane.api.v1 import adapter_pb2, adapter_pb2_grpc
from tests.conftest import long_mode
from tests.support.protofuzz import messages, near_valid

_SLOW = long_mode()
FUZZ = settings(max_examples=300 if _SLOW else 60, deadline=None, derandomize=not _SLOW, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
S = grpc.StatusCode
ALLOWED = {S.OK, S.INVALID_ARGUMENT, S.NOT_FOUND, S.FAILED_PRECONDITION, S.UNAVAILABLE}
CLUSTER, DEP, NOW = "gpu-a1", "chat", 1_000_000
"""The simulated cluster's clock stands still at NOW: its state changes only through commands."""
EXISTING = ("chat-seed-0", "chat-seed-1")


@dataclass
class Adapter:
    backend: SimulatedBackend
    stub: Any
    channel: grpc.Channel
    epoch: int = 1

    def digest(self) -> dict[str, tuple[str, str, int]]:
        with self.backend._lock:
            return {str(i): (str(s.deployment), s.phase, s.gpus) for i, s in self.backend.fleet.instances.items()}

    def fence(self) -> adapter_pb2.FenceToken:
        return adapter_pb2.FenceToken(epoch=self.epoch, seq=1, holder="coord-a")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Adapter]:
    state = tmp_path_factory.mktemp("adapter-fuzz")
    cfg = SimulatedConfig.model_validate({"seed": 1, "deployments": [
        {"deployment": DEP, "model": "llama3-8b-h100", "load": [{"at_s": 0, "rps": 0}]}]})
    backend = SimulatedBackend(CLUSTER, cfg, clock_ms=lambda: NOW)
    for iid in EXISTING:
        backend.apply(InstanceCommand(f"seed-{iid}", "create", InstanceSpec(iid, DEP), FenceToken(1, 1, "coord-a")), NOW)
    server = serve_adapter(CLUSTER, "127.0.0.1:0", Path(state), backend, observe=False, clock_ms=lambda: NOW)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    a = Adapter(backend, adapter_pb2_grpc.ClusterAdapterStub(channel), channel)
    a.stub.Fence(adapter_pb2.FenceRequest(cluster_id=CLUSTER, fence=a.fence()), timeout=10)
    yield a
    channel.close()
    server.stop(0.1)


def valid_apply(a: Adapter) -> adapter_pb2.ApplyRequest:
    return adapter_pb2.ApplyRequest(cluster_id=CLUSTER, fence=a.fence(), request_id="r-1", action="sleep",
                                    instance=adapter_pb2.InstanceRef(instance_id=EXISTING[0], deployment_id=DEP,
                                                                     tenant_id="t", zone="az-a", pool="h100", gpus=1),
                                    drain_timeout_ms=1000)


def valid_scale(a: Adapter) -> adapter_pb2.ScaleRequest:
    return adapter_pb2.ScaleRequest(cluster_id=CLUSTER, fence=a.fence(), request_id="s-1", deployment_id=DEP,
                                    replicas=2, victims=[EXISTING[1]])


def with_current_fence(a: Adapter, request: Message, keep: bool) -> Message:
    """Most requests carry the adapter's current fence (so they reach the command checks)."""
    if not keep:
        request.fence.CopyFrom(a.fence())
        if request.DESCRIPTOR.fields_by_name.get("cluster_id") and not request.cluster_id.startswith("gpu"):
            request.cluster_id = CLUSTER
    return request


def call(a: Adapter, method: str, request: Message) -> tuple[grpc.StatusCode, str]:
    try:
        getattr(a.stub, method)(request, timeout=10)
        return S.OK, ""
    except grpc.RpcError as err:
        return err.code(), err.details() or ""


def check(a: Adapter, method: str, request: Message) -> None:
    before = a.digest()
    code, details = call(a, method, request)
    text = str(request).replace("\n", " ")[:300]
    assert code in ALLOWED, f"{method}({text}): {code.name}: {details}"
    if code is not S.OK:
        assert details.strip(), f"{method}: {code.name} without a message"
        assert a.digest() == before, f"{method}({text}) answered {code.name} but changed the cluster"
    # the service is still healthy: a plain read works
    a.stub.Recent(adapter_pb2.RecentRequest(cluster_id=CLUSTER, max_age_ms=1), timeout=10)


@FUZZ
@given(data=st.data(), keep_fence=st.integers(0, 9).map(lambda n: n == 0))
def test_apply_requests_get_a_proper_answer_and_rejections_change_nothing(adapter: Adapter, data: st.DataObject,
                                                                           keep_fence: bool) -> None:
    base = valid_apply(adapter)
    request = data.draw(st.one_of(near_valid(base), near_valid(base), messages(base.DESCRIPTOR)))
    request.request_id = request.request_id or "x"
    request.request_id += f"-{data.draw(st.integers(0, 10**9))}"  # fresh ids: no idempotent replays
    check(adapter, "Apply", with_current_fence(adapter, request, keep_fence))


@FUZZ
@given(data=st.data(), keep_fence=st.integers(0, 9).map(lambda n: n == 0))
def test_scale_requests_get_a_proper_answer_and_rejections_change_nothing(adapter: Adapter, data: st.DataObject,
                                                                           keep_fence: bool) -> None:
    base = valid_scale(adapter)
    request = data.draw(st.one_of(near_valid(base), near_valid(base), messages(base.DESCRIPTOR)))
    request.request_id = (request.request_id or "x") + f"-{data.draw(st.integers(0, 10**9))}"
    check(adapter, "Scale", with_current_fence(adapter, request, keep_fence))


@pytest.mark.parametrize(("method", "change", "code"), [
    ("Scale", {"replicas": 2**31 - 1}, S.INVALID_ARGUMENT),
    ("Scale", {"replicas": -1}, S.INVALID_ARGUMENT),
    ("Scale", {"victims": ["no-such-instance"]}, S.NOT_FOUND),
    ("Scale", {"deployment_id": "no-such-deployment"}, S.NOT_FOUND),
    ("Apply", {"instance": {"instance_id": "no-such-instance"}, "action": "wake"}, S.NOT_FOUND),
    ("Apply", {"instance": {"gpus": -3}, "action": "create"}, S.INVALID_ARGUMENT),
    ("Apply", {"action": "explode"}, S.INVALID_ARGUMENT),
])
def test_out_of_range_and_unknown_ids_are_typed_refusals(adapter: Adapter, method: str, change: dict[str, Any],
                                                         code: grpc.StatusCode) -> None:
    request = valid_scale(adapter) if method == "Scale" else valid_apply(adapter)
    request.request_id = f"edge-{method}-{sorted(change.items())!r}"
    for key, value in change.items():
        if key == "instance":
            for k, v in value.items():
                setattr(request.instance, k, v)
        elif key == "victims":
            del request.victims[:]
            request.victims.extend(value)
        else:
            setattr(request, key, value)
    before = adapter.digest()
    got, details = call(adapter, method, request)
    assert (got, adapter.digest()) == (code, before), details
