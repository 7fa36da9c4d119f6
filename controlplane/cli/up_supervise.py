"""What ``controlplane up`` does while its group runs and when it ends: restart a coordinator that
died (bounded), and remove its state folder on exit unless asked to keep it.

* **Restarts.** A coordinator child that exits while ``up`` runs is started again from the same
  configuration and data (its Raft journal brings it back up to date), one line on stderr per restart.
  At most :data:`MAX_RESTARTS` restarts per node within :data:`RESTART_WINDOW_S`: a node that keeps
  dying is left down and ``up`` prints the exact command to start it by hand. Nothing is restarted
  when something already listens on the node's addresses (it was restarted by hand), nor with
  ``--no-restart`` (then the command is printed at once).
* **The state folder** holds the admin token, the CA key and the Raft password. A folder ``up``
  created itself (no ``--dir``) is removed on exit (Ctrl-C, SIGTERM) unless ``--keep``; a ``--dir``
  given is never removed; when the whole group died the folder is kept for its logs. Either way
  ``up`` says which.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0


class RestartBudget:
    """At most ``limit`` restarts per name within any ``window_s`` (pure: ``now`` passed in)."""

    def __init__(self, limit: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S) -> None:
        self.limit = limit
        self.window_s = window_s
        self._times: dict[str, deque[float]] = {}

    def take(self, name: str, now: float) -> int:
        """The number of this restart (1..limit), or 0 when the budget of ``name`` is spent."""
        q = self._times.setdefault(name, deque())
        while q and now - q[0] >= self.window_s:
            q.popleft()
        if len(q) >= self.limit:
            return 0
        q.append(now)
        return len(q)


def hand_command(exe: Sequence[str], config: Path, log: Path) -> str:
    """The shell command that starts one coordinator of the group as ``up`` does."""
    return f"{shlex.join([*exe, 'coordinator', '--config', str(config)])} 2>>{shlex.quote(str(log))}"


class Supervisor:
    """The coordinators of an ``up`` group: ``check(now)`` restarts the ones that exited."""

    def __init__(self, nodes: Sequence[Any], children: Sequence[subprocess.Popen], base: Path,
                 spawn: Callable[[Any], subprocess.Popen], exe: Sequence[str], *, restart: bool = True,
                 budget: RestartBudget | None = None, listening: Callable[[str], bool] | None = None,
                 err: TextIO | None = None) -> None:
        self.nodes = list(nodes)
        self.current: list[subprocess.Popen | None] = list(children)
        self.spawned: list[subprocess.Popen] = []
        """Every coordinator started after the first ones (stop them too on exit)."""
        self._base = base
        self._spawn = spawn
        self._exe = list(exe)
        self._restart = restart
        self._budget = budget or RestartBudget()
        self._listening = listening or (lambda _addr: False)
        self._err = err

    @property
    def running(self) -> list[subprocess.Popen]:
        return [ch for ch in self.current if ch is not None]

    def _say(self, text: str) -> None:
        print(f"controlplane: {text}", file=self._err or sys.stderr, flush=True)

    def check(self, now: float) -> None:
        for i, node in enumerate(self.nodes):
            ch = self.current[i]
            if ch is None or ch.poll() is None:
                continue
            self.current[i] = None
            log = self._base / f"{node.node_id}.log"
            what = f"{node.node_id} (pid {ch.pid}) exited with status {ch.returncode}"
            by_hand = hand_command(self._exe, node.config, log)
            if self._listening(node.api_address) or self._listening(node.raft_address):
                self._say(f"{what}; something else listens on its addresses (restarted by hand?): not restarting it")
                continue
            if not self._restart:
                self._say(f"{what}; not restarting it (--no-restart). Start it by hand: {by_hand}")
                continue
            n = self._budget.take(node.node_id, now)
            if n == 0:
                self._say(f"{what}: {self._budget.limit} restarts within {self._budget.window_s:g} s already, not "
                          f"restarting it again (log: {log}). Start it by hand: {by_hand}")
                continue
            new = self._spawn(node)
            self.current[i] = new
            self.spawned.append(new)
            self._say(f"{what}; restarted it as pid {new.pid} (restart {n} of at most {self._budget.limit} in "
                      f"{self._budget.window_s:g} s; log: {log})")


def finish_state(base: Path, *, created: bool, keep: bool, failed: bool, err: TextIO | None = None) -> bool:
    """Remove ``base`` (the state folder) or say why it stays; True when removed."""
    out = err or sys.stderr
    why = ("--keep" if keep else "--dir was given" if not created else
           "the group failed: its logs are there" if failed else "")
    if why:
        print(f"controlplane: kept the state folder {base} ({why}); it holds the admin token and the CA key: "
              f"remove it when done (rm -r {shlex.quote(str(base))})", file=out, flush=True)
        return False
    shutil.rmtree(base, ignore_errors=True)
    if base.exists():
        print(f"controlplane: could not remove the state folder {base}: remove it by hand", file=out, flush=True)
        return False
    print(f"controlplane: removed the state folder {base} (--keep keeps it)", file=out, flush=True)
    return True
