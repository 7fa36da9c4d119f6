"""Background load for the stability bench and tests: CPU burners and a disk-heavy writer, each a
separate process that stops by itself after ``--seconds`` (and is killed by its starter earlier).

    python -m controlplane.bench.load cpu --seconds 60
    python -m controlplane.bench.load disk --dir /tmp/x --seconds 60 [--max-mb 256] [--chunk-kb 1024]

The disk writer writes ``chunk-kb`` blocks of random bytes round-robin into one file of at most
``max-mb`` MiB inside ``--dir`` (which must exist), fsyncs every ``FSYNC_EVERY`` blocks and leaves a
share of the writes buffered, so it both floods the page cache (writeback) and queues flushes, like
a package install or a database next door. It deletes its file when it ends (SIGTERM included).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MAX_SECONDS = 3600
MAX_DISK_MB = 2048
FSYNC_EVERY = 8


def burn_cpu(seconds: float) -> int:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for _ in range(10_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    return 0


def write_disk(directory: Path, seconds: float, max_mb: int, chunk_kb: int) -> int:
    path = directory / f"disk-load-{os.getpid()}.bin"
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    buf = os.urandom(chunk_kb * 1024)
    limit = max(len(buf), max_mb * 1024 * 1024)
    end = time.monotonic() + seconds
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    off, n = 0, 0
    try:
        while not stop["now"] and time.monotonic() < end:
            os.pwrite(fd, buf, off)
            off = (off + len(buf)) % limit
            n += 1
            if n % FSYNC_EVERY == 0:
                os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return 0


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m controlplane.bench.load")
    sub = ap.add_subparsers(dest="kind", required=True)
    c = sub.add_parser("cpu")
    c.add_argument("--seconds", type=float, required=True)
    d = sub.add_parser("disk")
    d.add_argument("--dir", type=Path, required=True)
    d.add_argument("--seconds", type=float, required=True)
    d.add_argument("--max-mb", type=int, default=256)
    d.add_argument("--chunk-kb", type=int, default=1024)
    a = ap.parse_args(argv)
    if not 0 < a.seconds <= MAX_SECONDS:
        ap.error(f"--seconds: must be in (0, {MAX_SECONDS}], got {a.seconds}")
    if a.kind == "cpu":
        return burn_cpu(a.seconds)
    if not 1 <= a.max_mb <= MAX_DISK_MB:
        ap.error(f"--max-mb: must be between 1 and {MAX_DISK_MB}, got {a.max_mb}")
    if not 4 <= a.chunk_kb <= 16384:
        ap.error(f"--chunk-kb: must be between 4 and 16384, got {a.chunk_kb}")
    if not a.dir.is_dir():
        ap.error(f"--dir: {a.dir} is not a directory")
    return write_disk(a.dir, a.seconds, a.max_mb, a.chunk_kb)


@contextmanager
def background_load(cpu: int, disk_dir: Path | None, seconds: float, *, disk_mb: int = 256) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start ``cpu`` burners and (with ``disk_dir``) one disk writer, each ending by itself after
    ``seconds``; on exit kill whatever still runs and wait for it (the writer's file goes with it)."""
    procs: list[subprocess.Popen[bytes]] = []
    cmd = [sys.executable, "-m", "controlplane.bench.load"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    try:
        for _ in range(cpu):
            procs.append(subprocess.Popen([*cmd, "cpu", "--seconds", str(seconds)], env=env))
        if disk_dir is not None:
            procs.append(subprocess.Popen([*cmd, "disk", "--dir", str(disk_dir), "--seconds", str(seconds),
                                           "--max-mb", str(disk_mb)], env=env))
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if disk_dir is not None:
            for f in disk_dir.glob("disk-load-*.bin"):
                f.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
