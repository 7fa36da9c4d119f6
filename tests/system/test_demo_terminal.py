"""The demo's live view in a real terminal, at 100 and 200 columns.

Each run gets a pseudo-terminal of its own (``pty``, its size set with ``TIOCSWINSZ``, so the
program sees a terminal of that size exactly as in a terminal window), and what it writes there is
played into a VT100 screen (``pyte``, a test dependency: nothing to install on the machine). The
screen is twice as wide as the terminal the program sees, so a line the program writes past the
width shows as a longer line instead of wrapping (what ``tmux capture-pane -J`` shows).

Frames recorded from a real ``controlplane demo --record-view`` run (150 s, the failover under way:
the killed node down, the new holder named, instances preempted) played back by ``python -m
controlplane.cli.demo_view`` at both widths (a few seconds); and the real demo itself, 20 s, from
the live view to the summary table (about 35 s; at 100 columns, and at 200 too with ``CP_SLOW=1``).
Each capture must hold whole instance ids, every column header whole on one line, no cell cut with
an ellipsis, no line wider than the terminal, and the key fields. Waits poll the screen with a
deadline; the program's process group is killed in a ``finally``."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shlex
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pyte
import pytest

from controlplane.cli.demo_view import WIDE_COLUMNS, read_recording
from tests.conftest import REPO, long_mode
from tests.support.waiting import wait_until

FRAMES = Path(__file__).parent / "data" / "demo_view_frames.jsonl"
HEIGHT = 40
INSTANCE_ID = re.compile(r"(?<!\S)(?:gold-chat|silver-embed|bronze-batch)-[0-9a-f]{10}-\d{13}-\d+(?!\S)")
NODE_HEADERS = ("node", "zone", "pid", "role", "term", "raft leader", "lease@epoch", "lease left", "applied")
REPLICA_HEADERS = ("deployment", "tenant", "prio", "desired", "by state", "az-a", "az-b", "az-c", "preempted")
TRAFFIC_HEADERS = ("load/s", "offered/s", "TTFT p99 5s", "SLO", "met so far", "dropped", "GPU-s")
ROWS = (("chat", "gold", "200"), ("embed", "silver", "100"), ("batch", "bronze", "50"))


class Pane:
    """A pseudo-terminal of ``width`` x ``height`` running ``command`` (``bash -c``); what the
    program writes is fed to a :class:`pyte.HistoryScreen` by a reader thread."""

    def __init__(self, width: int, height: int, command: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
        env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
        for name in ("NO_COLOR", "COLUMNS", "LINES"):  # the terminal's own size must decide
            env.pop(name, None)
        self.proc = subprocess.Popen(["bash", "-c", command], stdin=slave, stdout=slave, stderr=slave, env=env,
                                     cwd=REPO, start_new_session=True, close_fds=True)
        os.close(slave)
        self.screen = pyte.HistoryScreen(2 * width, height, history=5_000)
        self.stream = pyte.ByteStream(self.screen)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, name="pane-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65_536)
            except OSError:  # EIO: the program's side of the terminal is closed
                return
            if not data:
                return
            with self.lock:
                self.stream.feed(data)

    def _text(self, line: dict) -> str:  # type: ignore[type-arg]
        return "".join(line[x].data for x in range(self.screen.columns)).rstrip()

    def capture(self, history: bool = False) -> str:
        with self.lock:
            lines = [self._text(line) for line in self.screen.history.top] if history else []
            lines += [row.rstrip() for row in self.screen.display]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines) + "\n"

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        os.close(self.master)
        self.reader.join(timeout=10)


def row(lines: list[str], *cells: str) -> str:
    """The first line holding every one of ``cells`` whole (blanks or the line's ends around each),
    in this order; other cells may come between."""
    pattern = re.compile(r".*?".join(rf"(?<!\S){re.escape(c)}(?!\S)" for c in cells))
    found = [line for line in lines if pattern.search(line)]
    assert found, f"no line with {cells} whole and in order:\n" + "\n".join(lines)
    return found[0]


def check_view(screen: str, width: int) -> list[str]:
    """What every capture of the live view must show; the instance ids seen."""
    lines = screen.splitlines()
    assert lines and max(len(line.rstrip()) for line in lines) <= width, screen
    assert "…" not in screen and "..." not in screen, screen
    for text in ("controlplane demo", "lease:", "failover:", "coordinators (Admin.Status", "Scaling.Watch (latest)"):
        assert text in screen, (text, screen)
    row(lines, *NODE_HEADERS)
    if width >= WIDE_COLUMNS:
        row(lines, *REPLICA_HEADERS, *TRAFFIC_HEADERS)
    else:
        row(lines, *REPLICA_HEADERS)
        row(lines, "deployment", "tenant", "prio", *TRAFFIC_HEADERS)
    for cells in ROWS:
        row(lines, *cells)
    for node in ("coord-a", "coord-b", "coord-c"):
        row(lines, node)
    ids = INSTANCE_ID.findall(screen)
    assert ids, screen
    return ids


@pytest.mark.parametrize("width", [100, 200])
def test_a_recorded_run_plays_back_whole_at_100_and_200_columns(width: int) -> None:
    last = read_recording(FRAMES)[-1]
    command = shlex.join([sys.executable, "-m", "controlplane.cli.demo_view", str(FRAMES), "--interval-s", "0.05",
                          "--hold-s", "120"])
    pane = Pane(width, HEIGHT, command)
    try:
        marker = f"t = {last.t_s:5.1f} / {last.duration_s:.0f} s"
        screen = wait_until(lambda: (lambda s: s if marker in s and "Scaling.Watch" in s else "")(pane.capture()),
                            60, f"the last recorded frame ({marker}) in the pane", interval_s=0.2)
        ids = check_view(screen, width)
        lines = screen.splitlines()
        newest = last.events[-1]
        row(lines, f"{newest.t_s:.1f}s", newest.deployment, newest.subject)
        assert {e.subject for e in last.events if INSTANCE_ID.fullmatch(e.subject)} >= set(ids)
        down = next(n for n in last.nodes if not n.reachable)
        row(lines, down.node_id, down.zone, str(down.pid), "down", down.note)
        failover_ms = re.search(r"after (?:\[b\])?(\d+ ms)", last.failover).group(1)  # type: ignore[union-attr]
        assert f"after {failover_ms}" in screen and f"lease: {last.holder} epoch {last.epoch}" in screen
        row(lines, "batch", "bronze", "50", str(next(d for d in last.deployments if d.name == "batch").desired))
    finally:
        pane.kill()


@pytest.mark.slow
@pytest.mark.parametrize("width", [100, 200] if long_mode() else [100])
def test_the_real_demo_in_a_terminal(tmp_path: Path, width: int) -> None:
    out = tmp_path / "out"
    command = (shlex.join([sys.executable, "-m", "controlplane.cli.main", "demo", "--duration-s", "20", "--out",
                           str(out)]) + "; echo demo-exit=$?; sleep 120")
    pane = Pane(width, HEIGHT, command)
    try:
        def failed_over() -> str:
            s = pane.capture()
            return s if re.search(r"failover: killed \S+ \(epoch \d+\) at [\d.]+ s -> \S+ epoch \d+ after", s) \
                and INSTANCE_ID.search(s) else ""

        check_view(wait_until(failed_over, 120, "the live view to show the failover", interval_s=0.25), width)
        end = wait_until(lambda: (lambda s: s if "demo-exit=" in s else "")(pane.capture(history=True)), 90,
                         "the demo to end", interval_s=0.5)
        assert "demo-exit=0" in end, end[-3000:]
        lines = end.splitlines()
        summary = lines[max(i for i, line in enumerate(lines) if line.startswith("controlplane demo: built-in")):]
        assert max(len(line.rstrip()) for line in summary) <= width and "…" not in "\n".join(summary)
        row(summary, "tenant", "prio", "deployment", "requests", "dropped", "SLO", "met", "p50", "p99", "GPU-s",
            "replicas", "preempted")
        assert (out / "demo.png").is_file()
    finally:
        pane.kill()
