"""Issue 18 point 7: a real ``controlplane up`` says where its state folder is, restarts a coordinator
killed with SIGKILL (one line per restart), removes the folder it created on Ctrl-C unless ``--keep``,
and prints the exact command that starts a coordinator by hand when it does not restart it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.waiting import alive, listening, wait_until

EXE = [sys.executable, "-m", "controlplane.cli.main"]


class Up:
    """``controlplane up --nodes 1 --json`` with its state folder under ``tmp`` (TMPDIR), stderr
    collected line by line while it runs."""

    def __init__(self, tmp: Path, *flags: str) -> None:
        env = dict(os.environ, TMPDIR=str(tmp))
        self.proc = subprocess.Popen(EXE + ["up", "--nodes", "1", "--json", *flags], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.listing = json.loads(self.proc.stdout.readline())
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()
        self.dir = Path(self.listing["dir"])
        [self.node] = self.listing["nodes"]

    def text(self) -> str:
        return "".join(self.err)

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(40)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(20)


def test_a_killed_coordinator_comes_back_and_ctrl_c_removes_the_state_folder(tmp_path: Path) -> None:
    up = Up(tmp_path)
    try:
        assert up.dir.parent == tmp_path and (up.dir / "admin.token").exists()
        assert up.listing["removed_on_exit"] is True
        api = up.node["api_address"]
        wait_until(lambda: listening(api), 30.0, "the coordinator's API", 0.1)
        os.kill(up.node["pid"], signal.SIGKILL)
        line = wait_until(lambda: next((ln for ln in up.err if "restarted it as pid" in ln), None), 20.0,
                          "the restart line", 0.1)
        new_pid = int(re.search(r"restarted it as pid (\d+)", line).group(1))
        assert f"coord-a (pid {up.node['pid']}) exited with status -9" in line and "restart 1 of at most 3" in line
        wait_until(lambda: listening(api), 30.0, "the restarted coordinator's API", 0.1)
        assert alive(new_pid) and new_pid != up.node["pid"]
        assert up.interrupt() == 0, up.text()
        assert not up.dir.exists()
        assert f"removed the state folder {up.dir}" in up.text()
        assert not alive(new_pid)
    finally:
        up.close()


def test_keep_keeps_the_folder_and_no_restart_prints_the_command_that_works(tmp_path: Path) -> None:
    up = Up(tmp_path, "--keep", "--no-restart")
    by_hand = None
    try:
        assert up.listing["removed_on_exit"] is False
        api = up.node["api_address"]
        wait_until(lambda: listening(api), 30.0, "the coordinator's API", 0.1)
        os.kill(up.node["pid"], signal.SIGKILL)
        line = wait_until(lambda: next((ln for ln in up.err if "Start it by hand: " in ln), None), 20.0,
                          "the command to start it by hand", 0.1)
        command = line.split("Start it by hand: ", 1)[1].strip()
        assert "coordinator --config" in command and str(up.dir / "coord-a.yaml") in command
        by_hand = subprocess.Popen(["bash", "-c", f"exec {command}"], stdout=subprocess.DEVNULL)
        wait_until(lambda: listening(api), 30.0, "the coordinator started by hand", 0.1)
        assert up.proc.poll() is None  # it counts as running: up goes on
        by_hand.send_signal(signal.SIGTERM)
        by_hand.wait(20)
        by_hand = None
        assert up.interrupt() == 0, up.text()
        assert up.dir.exists() and (up.dir / "admin.token").exists()
        assert f"kept the state folder {up.dir} (--keep)" in up.text()
    finally:
        if by_hand is not None:
            by_hand.kill()
            by_hand.wait(10)
        up.close()
