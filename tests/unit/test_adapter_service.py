"""The adapter's fencing guard and gRPC service, through the coordinators' RemoteAdapter client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.client import RemoteAdapter
from adapters.service import FencingGuard, RecordingBackend, serve_adapter
from controlplane.domain.errors import StaleEpoch, ValidationError
from controlplane.domain.instances import InitMethod, Instance, InstanceState
from controlplane.ports import AdapterCommand, Fence

INST = Instance("d1-1", "d1", "t1", "c1", "az-a", "h100", 1, InstanceState.PENDING, InitMethod.COLD, 0, 0)


@pytest.fixture
def adapter(tmp_path: Path):
    record = tmp_path / "record.jsonl"
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", RecordingBackend(record))
    client = RemoteAdapter({"c1": f"127.0.0.1:{server.port}"}, deadline_s=2.0)
    yield server, client, record
    server.stop(0.1)


def lines(record: Path) -> list[dict]:
    return [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []


def test_commands_below_the_highest_epoch_are_rejected_and_not_applied(adapter) -> None:
    server, client, record = adapter
    client.send("c1", AdapterCommand("e5-1", "create", INST), Fence(5, 1, "n1"), 0)
    client.fence("c1", Fence(9, 1, "n2"), 0)  # a new holder fences the adapter
    with pytest.raises(StaleEpoch) as err:
        client.send("c1", AdapterCommand("e5-2", "drain", INST, 10), Fence(5, 2, "n1"), 0)
    assert (err.value.got, err.value.highest) == (5, 9)
    with pytest.raises(StaleEpoch):
        client.fence("c1", Fence(8, 3, "n3"), 0)
    client.send("c1", AdapterCommand("e9-2", "drain", INST, 10), Fence(9, 2, "n2"), 0)
    got = [(x["action"], x["epoch"], x["accepted"]) for x in lines(record)]
    assert got == [("create", 5, True), ("fence", 9, True), ("drain", 5, False), ("fence", 8, False), ("drain", 9, True)]
    assert server.servicer.stale_rejected == 2


def test_equal_epoch_from_another_holder_is_rejected(adapter) -> None:
    _, client, _ = adapter
    client.fence("c1", Fence(4, 1, "n1"), 0)
    client.fence("c1", Fence(4, 2, "n1"), 0)
    with pytest.raises(StaleEpoch):
        client.fence("c1", Fence(4, 1, "n2"), 0)


def test_request_ids_apply_at_most_once(adapter) -> None:
    _, client, record = adapter
    for _ in range(3):
        client.send("c1", AdapterCommand("e1-1", "create", INST), Fence(1, 1, "n1"), 0)
    assert [x["action"] for x in lines(record)] == ["create"]


def test_bad_requests_are_invalid_argument(adapter) -> None:
    _, client, _ = adapter
    with pytest.raises(ValidationError, match="action"):
        client.send("c1", AdapterCommand("e1-1", "explode", INST), Fence(1, 1, "n1"), 0)
    client._stubs["c9"] = client._stubs["c1"]
    with pytest.raises(ValidationError, match="cluster_id"):
        client.fence("c9", Fence(1, 1, "n1"), 0)


def test_the_guard_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "c1.epoch.json"
    guard = FencingGuard(path)
    guard.admit(7, "n2")
    again = FencingGuard(path)
    assert (again.epoch, again.holder) == (7, "n2")
    with pytest.raises(StaleEpoch):
        again.admit(6, "n1")
