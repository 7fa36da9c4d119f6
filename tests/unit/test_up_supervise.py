"""``controlplane up``'s supervision (``controlplane/cli/up_supervise.py``) with stand-in processes:
the restart budget per node and window, the lines it prints, and what becomes of the state folder."""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from pathlib import Path

from controlplane.cli.up_supervise import RestartBudget, Supervisor, finish_state, hand_command

_pids = itertools.count(1000)


class Proc:
    def __init__(self) -> None:
        self.pid = next(_pids)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class Node:
    node_id: str
    config: Path
    api_address: str = "127.0.0.1:7001"
    raft_address: str = "127.0.0.1:7101"


def test_the_budget_is_per_node_and_per_window() -> None:
    b = RestartBudget(limit=3, window_s=60)
    assert [b.take("a", t) for t in (0, 1, 2, 3)] == [1, 2, 3, 0]
    assert b.take("b", 3) == 1
    assert b.take("a", 59.9) == 0 and b.take("a", 60) == 3  # the first one left the window: 3 in it again


def test_the_supervisor_restarts_until_the_budget_is_spent_then_prints_the_command(tmp_path: Path) -> None:
    node = Node("coord-a", tmp_path / "coord-a.yaml")
    first = Proc()
    err = io.StringIO()
    sup = Supervisor([node], [first], tmp_path, lambda nd: Proc(), ["python", "-m", "controlplane.cli.main"],
                     budget=RestartBudget(2, 60), err=err)
    sup.check(0)
    assert sup.spawned == [] and err.getvalue() == ""  # running: nothing to do
    for t in range(3):
        sup.running[0].returncode = -9
        sup.check(float(t))
    lines = err.getvalue().splitlines()
    assert len(lines) == 3 and len(sup.spawned) == 2 and sup.running == []
    assert lines[0].startswith(f"controlplane: coord-a (pid {first.pid}) exited with status -9; restarted it as pid "
                               f"{sup.spawned[0].pid} (restart 1 of at most 2 in 60 s")
    assert "restart 2 of at most 2" in lines[1]
    assert "2 restarts within 60 s already" in lines[2]
    assert lines[2].endswith("Start it by hand: " + hand_command(["python", "-m", "controlplane.cli.main"],
                                                                 node.config, tmp_path / "coord-a.log"))
    sup.check(4.0)
    assert len(err.getvalue().splitlines()) == 3  # said once


def test_no_restart_under_a_coordinator_restarted_by_hand_or_with_no_restart(tmp_path: Path) -> None:
    node = Node("coord-a", tmp_path / "coord-a.yaml")
    for kw, said in (({"listening": lambda addr: addr == node.api_address}, "restarted by hand?"),
                     ({"restart": False}, "not restarting it (--no-restart). Start it by hand: ")):
        p, err = Proc(), io.StringIO()
        sup = Supervisor([node], [p], tmp_path, lambda nd: Proc(), ["controlplane"], err=err, **kw)
        p.returncode = 1
        sup.check(0)
        assert sup.spawned == [] and said in err.getvalue()


def test_hand_command_quotes_paths(tmp_path: Path) -> None:
    cmd = hand_command(["/usr/bin/python3", "-m", "controlplane.cli.main"], Path("/t/my dir/coord-a.yaml"),
                       Path("/t/my dir/coord-a.log"))
    assert cmd == ("/usr/bin/python3 -m controlplane.cli.main coordinator --config '/t/my dir/coord-a.yaml' "
                   "2>>'/t/my dir/coord-a.log'")


def test_the_state_folder(tmp_path: Path) -> None:
    for kw, removed, said in (
        ({"created": True, "keep": False, "failed": False}, True, "removed the state folder"),
        ({"created": True, "keep": True, "failed": False}, False, "(--keep)"),
        ({"created": False, "keep": False, "failed": False}, False, "(--dir was given)"),
        ({"created": True, "keep": False, "failed": True}, False, "(the group failed: its logs are there)"),
    ):
        base = tmp_path / "state"
        base.mkdir(exist_ok=True)
        (base / "admin.token").write_text("x")
        err = io.StringIO()
        assert finish_state(base, err=err, **kw) is removed
        assert base.exists() is not removed and said in err.getvalue()
        assert err.getvalue().count("\n") == 1
