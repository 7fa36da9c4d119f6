"""Identifiers and units.

Ids are ``NewType`` strings so a ``TenantId`` cannot be passed where a ``DeploymentId`` is expected
under a type checker, while staying plain ``str`` at run time (cheap to hash, encode and compare).
Time is always integer milliseconds, named with a ``_ms`` suffix; GPU counts are integers.
"""

from __future__ import annotations

import re
from typing import NewType

TenantId = NewType("TenantId", str)
DeploymentId = NewType("DeploymentId", str)
InstanceId = NewType("InstanceId", str)
ZoneId = NewType("ZoneId", str)
ClusterId = NewType("ClusterId", str)
PoolId = NewType("PoolId", str)
"""A GPU pool: one kind of accelerator (``h100``, ``a100-80g``...) that quotas are counted in."""
RequestId = NewType("RequestId", str)
Epoch = NewType("Epoch", int)
"""Fencing epoch: the Raft log index of the entry that granted the lease. Strictly increasing."""

Millis = int
"""Milliseconds. Monotonic or virtual, never wall-clock inside the pure layers."""

MS_PER_S = 1000
MS_PER_HOUR = 3_600_000

# Ids travel in Kubernetes object names and labels, so they follow the DNS-1123 label rules
# (lower-case alphanumerics and '-', at most 63 characters, starting and ending alphanumeric).
_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def id_problem(value: object) -> str | None:
    """Return why ``value`` is not a valid id, or ``None`` when it is one."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > 63:
        return f"must be at most 63 characters, got {len(value)}"
    if not _ID_RE.fullmatch(value):  # not match(): '$' also matches before a trailing newline
        return (
            f"{value!r} is not a valid id: use lower-case letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return None
