"""Where a fuzz test may put a mutation inside a JSON/YAML document."""

from __future__ import annotations

from typing import Any


def paths(doc: Any, prefix: tuple[Any, ...] = (), max_items: int | None = None) -> list[tuple[Any, ...]]:
    """Every key path in ``doc`` (dict keys and list indexes), the root excluded; ``max_items``
    bounds how many items of each list are descended into."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, prefix + (k,), max_items)
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:max_items]):
            out += paths(v, prefix + (i,), max_items)
    return out
