"""What ``get -o yaml|json|jsonpath`` prints for an object, and ``--sort-by``.

* ``-o yaml`` is for people: times are RFC 3339 (``metadata.creationTimestamp``,
  ``metadata.updateTimestamp``, ``status.decidedTime``, ``status.instances[].sinceTime``) instead of
  epoch milliseconds, like kubectl's. ``tenantctl apply -f`` takes the result back (the timestamps and
  ``status`` are output-only and ignored).
* ``-o json`` is for programs: the raw milliseconds stay under their own names (``createdMs``,
  ``decided_ms``...), and the RFC 3339 ``creationTimestamp`` / ``updateTimestamp`` come next to them.
"""

from __future__ import annotations

from typing import Any

from controlplane.api import manifests as mf
from controlplane.cli.tenantctl import jsonpath
from controlplane.cli.tenantctl.render import INSTANT_KEYS, person_yaml, rfc3339

STATUS_TIMES = INSTANT_KEYS
"""Fields holding a wall-clock time (ms) and their RFC 3339 names in ``-o yaml``; every other ``_ms``
field is a duration and stays as it is (``spec.policy.stable_window_ms``)."""
META_TIMES = (("createdMs", "creationTimestamp"), ("updatedMs", "updateTimestamp"))


def object_data(kind: str, obj: Any, fmt: str = "json") -> dict[str, Any]:
    """An API object as ``-o <fmt>`` prints it (``fmt`` ``yaml``: for people; else for programs)."""
    if kind == "Token":
        return mf.plain(obj)  # -o yaml: render.person_yaml writes createdTime / expiresTime
    data = mf.envelope(kind, obj)
    meta = data["metadata"]
    labels = dict(sorted(obj.metadata.labels.items()))
    if labels:  # right after the name, as kubectl shows them
        data["metadata"] = meta = {"name": meta.pop("name"), "labels": labels, **meta}
    for ms_key, time_key in META_TIMES:
        if ms_key in meta:
            if fmt == "yaml":
                meta[time_key] = rfc3339(meta.pop(ms_key))
            else:
                meta[time_key] = rfc3339(meta[ms_key])
    if fmt == "yaml" and "status" in data:
        data["status"] = person_yaml(data["status"])
    return data


def sort_key_of(path: str) -> Any:
    """A key function ordering object data by the value at JSONPath ``path`` (``--sort-by``):
    numbers numerically, everything else as text, objects without the field first (kubectl's
    order); raises :class:`jsonpath.JsonPathError` for a bad path."""
    expr = jsonpath.parse_path(path)

    def key(data: dict[str, Any]) -> tuple[int, float, str]:
        found = jsonpath.find(expr, data)
        if not found or found[0] is None:
            return (0, 0.0, "")
        v = found[0]
        if isinstance(v, bool):
            return (1, float(v), "")
        if isinstance(v, (int, float)):
            return (1, float(v), "")
        return (2, 0.0, v if isinstance(v, str) else str(v))

    return key
