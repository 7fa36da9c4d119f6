"""``controlplane.member.launch``: the Raft member starts first, the rest of the coordinator after it;
when the rest cannot be built the member is stopped (lease released) before the error propagates.
The coordinator half is replaced by a fake here: no process, no port."""

from __future__ import annotations

import pytest

import controlplane.coordinator as coordinator_module
from controlplane import member as member_module
from controlplane.config import ConfigError


class FakeMember:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.node = self.guard = None

    def start(self) -> None:
        self.calls.append("member.start")

    def stop(self) -> None:
        self.calls.append("member.stop")


def fake_coordinator(calls: list[str], fail: bool):
    class Coordinator:
        def __init__(self, cfg, topology, *, member) -> None:
            calls.append("coordinator.build")
            if fail:
                raise ConfigError("admin_token_file: unreadable", field="admin_token_file")
            self.member = member

        def start(self) -> None:
            calls.append("coordinator.start")

    return Coordinator


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(member_module, "build_member", lambda cfg: FakeMember(calls))
    monkeypatch.setattr(coordinator_module, "topology_of", lambda cfg: None)
    return calls


def test_raft_starts_before_the_rest_of_the_coordinator_is_built(calls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "Coordinator", fake_coordinator(calls, fail=False))
    coord = member_module.launch(object(), before_start=lambda m: calls.append("before_start"),
                                 after_member=lambda m: calls.append("after_member"))
    assert calls == ["before_start", "member.start", "after_member", "coordinator.build", "coordinator.start"]
    assert isinstance(coord.member, FakeMember)


def test_a_coordinator_that_cannot_be_built_stops_its_started_member(calls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "Coordinator", fake_coordinator(calls, fail=True))
    with pytest.raises(ConfigError, match="admin_token_file"):
        member_module.launch(object())
    assert calls == ["member.start", "coordinator.build", "member.stop"]
