"""Label selectors at the API's edge (``ListRequest.label_selector``).

The syntax is Kubernetes' (:mod:`controlplane.domain.labels`); a bad selector becomes an
``INVALID_ARGUMENT`` field violation on ``label_selector``, and a List reply keeps only the items the
selector matches. (Labels themselves are validated with the object: ``convert._labels``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from controlplane.api import convert as cv
from controlplane.domain.errors import ValidationError
from controlplane.domain.labels import parse_selector

T = TypeVar("T")


def selected(request: Any, items: Sequence[T]) -> list[T]:
    """``items`` (API objects) whose labels match ``request.label_selector`` (all when empty)."""
    try:
        selector = parse_selector(request.label_selector)
    except ValidationError as exc:
        raise cv.invalid("label_selector", exc.problem) from None
    if selector.empty:
        return list(items)
    return [i for i in items if selector.matches(i.metadata.labels)]  # type: ignore[attr-defined]
