"""Checks of tenantctl's numeric and list flags that argparse's types cannot express: each problem is
a :class:`~controlplane.cli.tenantctl.app.UsageError`-style ``ValueError`` with one line naming the
flag (exit 2), never a request the server would refuse or a silent "no limit".

* ``--timeout``: a finite number of seconds > 0 (``-1``, ``0``, ``nan`` and ``inf`` are refused).
* ``--limit`` (``events``, ``explain``): >= 1 when given.
* ``--since``: >= 0. ``--resource-version``: >= 0.
* ``--type``: one of :data:`controlplane.runtime.event_types.TYPES`; not with ``--all``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from controlplane.runtime.event_types import TYPES, parse_types


class FlagError(ValueError):
    """A nonsensical flag value (tenantctl exits 2 with this one-line message)."""


def check(args: argparse.Namespace) -> None:
    """Raise :class:`FlagError` for the first nonsensical flag of ``args``."""
    timeout = getattr(args, "timeout", None)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise FlagError(f"--timeout: must be a number of seconds > 0, got {timeout:g}")
    limit = getattr(args, "limit", None)
    if limit is not None and limit < 1:
        raise FlagError(f"--limit: must be >= 1, got {limit} (leave it out for every one)")
    since = getattr(args, "since", None)
    if since is not None and since < 0:
        raise FlagError(f"--since: must be a revision >= 0, got {since}")
    rv = getattr(args, "resource_version", None)
    if rv is not None and rv < 0:
        raise FlagError(f"--resource-version: must be >= 0, got {rv}")


def watch_types(values: Sequence[str], all_events: bool) -> list[str]:
    """``--type`` values, normalized (lower case, each once, in :data:`TYPES` order)."""
    if values and all_events:
        raise FlagError("--type and --all: give one (--type selects by type whatever the significance)")
    for v in values:
        try:
            parse_types([v])
        except ValueError:
            raise FlagError(f"--type: unknown type {v[:40]!r} (one of {', '.join(TYPES)})") from None
    chosen = parse_types(values)
    return [t for t in TYPES if t in chosen]
