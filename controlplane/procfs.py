"""Readings of another process from ``/proc`` (Linux), for the benches: None once it is gone."""

from __future__ import annotations

import os


def rss_kib(pid: int) -> int | None:
    """Resident memory of ``pid`` in KiB (``VmRSS``), None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    """Descriptors ``pid`` has open, None when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
