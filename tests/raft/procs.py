"""Drive ``tests/raft/harness.py`` processes: start, ask, stream, SIGKILL, restart."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
ASK_TIMEOUT_S = 10.0


class HarnessProc:
    """One harness process. Answers go to a queue; ``{"ack": i}`` lines are collected in ``acks``."""

    def __init__(self, cfg: dict[str, Any], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.extra_env = env or {}
        self.node_id = cfg["node_id"]
        self.config_path = workdir / f"{self.node_id}.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        self.log_path = workdir / f"{self.node_id}.log"
        self.proc: subprocess.Popen[str] | None = None
        self.acks: list[int] = []
        self.events: list[dict[str, Any]] = []
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.acks = []
        self._answers = queue.Queue()
        log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 (lives as long as the process)
        env = {**os.environ, "PYTHONPATH": str(REPO), **self.extra_env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.raft.harness", str(self.config_path)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, env=env,
        )
        log.close()
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()
        first = self._next(START_TIMEOUT_S)
        if not first.get("started"):
            raise AssertionError(f"{self.node_id} did not start: {first} (log: {self.log_tail()})")

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "ack" in obj:
                self.acks.append(obj["ack"])
            elif "stream_error" in obj:
                self.events.append(obj)
            else:
                self._answers.put(obj)

    def _next(self, timeout_s: float) -> dict[str, Any]:
        try:
            return self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"{self.node_id}: no answer in {timeout_s}s (log: {self.log_tail()})") from None

    def ask(self, line: str, timeout_s: float = ASK_TIMEOUT_S) -> dict[str, Any]:
        if self.proc is None or self.proc.stdin is None or self.proc.poll() is not None:
            raise AssertionError(f"{self.node_id} is not running")
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._next(timeout_s)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, then wait for the exit and for every line it had written to be read."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(10)
        if self._reader is not None:
            self._reader.join(10)

    def quit(self) -> None:
        if not self.alive:
            return
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8")[-n:]
        except OSError:
            return ""


def statuses(procs: list[HarnessProc]) -> dict[str, dict[str, Any]]:
    return {p.node_id: p.ask("status") for p in procs if p.alive}


def wait_holder(procs: list[HarnessProc], timeout_s: float, newer_than: int = 0) -> tuple[HarnessProc, int]:
    """The one live process whose guard grants authority with an epoch above ``newer_than``."""

    def find() -> tuple[HarnessProc, int] | None:
        found = []
        for p in procs:
            if p.alive:
                st = p.ask("status")
                if st["epoch"] is not None and st["epoch"] > newer_than:
                    found.append((p, st["epoch"]))
        return found[0] if len(found) == 1 else None

    return wait_until(find, timeout_s, f"a lease holder with epoch > {newer_than}", interval_s=0.05)


def stop_all(procs: list[HarnessProc]) -> None:
    for p in procs:
        p.quit()
    for p in procs:
        if p.alive:
            p.kill()


def sigkill_all(procs: list[HarnessProc]) -> float:
    """SIGKILL every process as close together as possible; returns the spread in seconds."""
    t0 = time.monotonic()
    for p in procs:
        if p.proc is not None:
            p.proc.kill()
    spread = time.monotonic() - t0
    for p in procs:
        p.kill()
    return spread
