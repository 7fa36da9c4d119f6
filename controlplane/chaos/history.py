"""Reading the recorded history: the journals the chaos processes append (``node.py``), read
incrementally (each call returns only the complete lines written since the last one), and the
harness's own record of what it did (faults, acknowledged writes)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any


class JournalReader:
    """New complete JSON lines of one journal file since the previous :meth:`read`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unterminated tail (a process killed mid-write) waits
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # torn by a kill -9 mid-line: the rest of the file is still read
        return out


@dataclass
class FaultRecord:
    run: int
    kind: str
    target: str
    started: float
    ended: float | None = None
    recovered: float | None = None
    detail: str = ""
    outage_ms: float | None = None
    """Longest time without an acknowledged write from the injection until the group recovered."""

    @property
    def recovery_ms(self) -> float | None:
        if self.ended is None or self.recovered is None:
            return None
        return max(0.0, (self.recovered - self.ended) * 1000)


@dataclass
class Writes:
    """What the client saw: acknowledged writes with the time of the acknowledgement."""

    acked: list[tuple[float, str]] = field(default_factory=list)
    failed: int = 0
    unknown: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, name: str) -> None:
        with self._lock:
            self.acked.append((time.monotonic(), name))

    def first_ack_after(self, t: float) -> float | None:
        """When the first write acknowledged at or after ``t`` was acknowledged (None: none yet)."""
        first = None
        with self._lock:
            for at, _ in reversed(self.acked):  # appended in time order
                if at < t:
                    break
                first = at
        return first

    def longest_gap_ms(self, t0: float, t1: float) -> float:
        """The longest time in ``[t0, t1]`` without an acknowledged write (the write outage)."""
        with self._lock:
            times = [at for at, _ in self.acked if t0 <= at <= t1]
        edges = [t0, *times, t1]
        return max(0.0, max((b - a for a, b in pairwise(edges)), default=0.0) * 1000)

    def names(self) -> list[str]:
        with self._lock:
            return [n for _, n in self.acked]


@dataclass
class Probe:
    """One isolation probe of the prober (``isolation.py``): the same method called by the tenant
    ``bravo`` once naming ``alpha``'s objects and once naming objects that do not exist, on the same
    coordinator, one right after the other. ``alpha``/``ghost`` are ``(status code name, reply text or
    error details)``; ``ghost`` is None for a *neutral* probe (a request that names nothing, e.g. an
    unfiltered watch: only its answer is checked for alpha's data)."""

    t: float
    endpoint: str
    service: str
    method: str
    alpha: tuple[str, str]
    ghost: tuple[str, str] | None


@dataclass
class Probes:
    """The prober's record, drained by the checker (each probe is checked once, then dropped: replies
    such as a watch replayed from revision 0 are not kept for the whole bench)."""

    items: list[Probe] = field(default_factory=list)
    rounds: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, probe: Probe) -> None:
        with self._lock:
            self.items.append(probe)

    def drain(self) -> list[Probe]:
        with self._lock:
            out, self.items = self.items, []
        return out
