"""YAML with line numbers: the parsed document plus, for every mapping key and sequence item, the line
it is written on, so that a validation error's field path (``deployments[2].workload.trace``) can be
reported as ``FILE:LINE: deployments[2].workload.trace: ...``.

PyYAML's own composer already records a start mark on every node; :func:`parse_with_lines` composes
the node tree once with ``SafeLoader``, builds the Python values from it (the same values
``yaml.safe_load`` returns) and walks it to record the marks. No second parser, no hand-written one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

Path_ = tuple[str | int, ...]
"""A field path as pydantic reports it: mapping keys and sequence indices."""


def parse_with_lines(text: str) -> tuple[Any, dict[Path_, int]]:
    """The document's value and a map from field path to its 1-based line. Raises ``yaml.YAMLError``
    (and ``RecursionError`` for absurd nesting), as ``yaml.safe_load`` does."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        value = loader.construct_document(node)
    finally:
        loader.dispose()
    lines: dict[Path_, int] = {(): node.start_mark.line + 1}
    stack: list[tuple[Path_, yaml.Node]] = [((), node)]
    seen: set[int] = set()
    while stack:  # iterative: the nesting depth is the user's
        path, n = stack.pop()
        if id(n) in seen:  # an alias: walk each node once (a billion-laughs document stays linear)
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            for key, val in n.value:
                if not isinstance(key, yaml.ScalarNode):
                    continue
                sub = (*path, key.value)
                lines.setdefault(sub, key.start_mark.line + 1)
                stack.append((sub, val))
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                sub = (*path, i)
                lines.setdefault(sub, item.start_mark.line + 1)
                stack.append((sub, item))
    return value, lines


def line_of(lines: Mapping[Path_, int], loc: Sequence[Any]) -> int | None:
    """The line of the longest prefix of ``loc`` that the document names (a missing field is reported
    on its parent's line; pydantic's union tags in ``loc`` are skipped by the caller)."""
    parts = tuple(loc)
    for end in range(len(parts), -1, -1):
        found = lines.get(parts[:end])
        if found is not None:
            return found
    return None
