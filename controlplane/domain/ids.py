"""Identifiers and units.

Ids are ``NewType`` strings so a ``TenantId`` cannot be passed where a ``DeploymentId`` is expected
under a type checker, while staying plain ``str`` at run time (cheap to hash, encode and compare).
Time is always integer milliseconds, named with a ``_ms`` suffix; GPU counts are integers.
"""

from __future__ import annotations

import hashlib
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


# --- deployment ids: per-tenant names ------------------------------------------------------------------
# A deployment created through the API has the qualified id ``"<tenant>/<name>"``: names are per tenant
# (like Kubernetes ``namespace/name``), so two tenants can both own ``chat``. An unqualified id (one
# DNS-1123 label) stays valid: the simulator and scenario files use them, and state written before
# names were per tenant holds them (a *legacy* id, visible to its tenant under that name). The core
# treats both as opaque strings; only what is derived from an id for another system (instance ids,
# which become pod annotations and object keys) goes through :func:`instance_prefix`.

QUALIFIER = "/"
INSTANCE_PREFIX_CHARS = 40
"""Length bound of :func:`instance_prefix`: leaves room for ``-<ms timestamp>-<k>`` in a 63-character id."""
_HASH_CHARS = 10


def qualified_id(tenant: str, name: str) -> DeploymentId:
    """The id of deployment ``name`` of ``tenant`` (both assumed valid labels)."""
    return DeploymentId(f"{tenant}{QUALIFIER}{name}")


def split_deployment_id(deployment_id: str) -> tuple[str | None, str]:
    """``(tenant, name)`` of a qualified id, ``(None, id)`` of a legacy one."""
    tenant, sep, name = deployment_id.partition(QUALIFIER)
    return (tenant, name) if sep else (None, deployment_id)


def local_name(deployment_id: str) -> str:
    """The tenant-local name of a deployment id (the id itself for a legacy id)."""
    return split_deployment_id(deployment_id)[1]


def deployment_id_problem(value: object) -> str | None:
    """Why ``value`` is neither a legacy id (one label) nor a qualified ``tenant/name`` id, or ``None``."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if QUALIFIER not in value:
        return id_problem(value)
    tenant, _, name = value.partition(QUALIFIER)
    for part, what in ((tenant, "tenant"), (name, "name")):
        problem = id_problem(part)
        if problem:
            return f"{value[:80]!r} is not '<tenant>/<name>': its {what} part {problem}"
    return None


def instance_prefix(deployment_id: str) -> str:
    """The start of the ids of a deployment's instances, a valid DNS-1123 label prefix of at most
    :data:`INSTANCE_PREFIX_CHARS` characters. A legacy id keeps its historical prefix (its first 40
    characters: simulator runs stay byte-for-byte the same). A qualified id has no '/' in it: its
    readable part (``tenant-name``, cut) is followed by a hash of the full id, so two ids that read
    alike once cut (``a/b-c`` and ``a-b/c``, or long names sharing 29 characters) still differ."""
    if QUALIFIER not in deployment_id:
        return deployment_id[:INSTANCE_PREFIX_CHARS]
    digest = hashlib.sha256(deployment_id.encode()).hexdigest()[:_HASH_CHARS]
    readable = deployment_id.replace(QUALIFIER, "-")[: INSTANCE_PREFIX_CHARS - _HASH_CHARS - 1]
    return f"{readable}-{digest}"
