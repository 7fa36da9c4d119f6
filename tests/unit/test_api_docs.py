"""docs/api.md's reference is generated from the proto comments and must be current."""

from __future__ import annotations

import pytest

from controlplane.api import docgen


def test_reference_in_docs_matches_the_proto() -> None:
    text = docgen.DOC.read_text(encoding="utf-8")
    assert docgen.updated(text, docgen.render()) == text, "docs/api.md is stale: run `make docs`"


def test_reference_documents_every_method_and_message() -> None:
    reference = docgen.render()
    from controlplane.api.v1 import api_pb2

    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        assert f"service `controlplane.api.v1.{service.name}`" in reference
        for method in service.methods:
            assert f"| `{method.name}` |" in reference
    for name in api_pb2.DESCRIPTOR.message_types_by_name:
        assert f"message `{name}`" in reference


def test_missing_markers_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="markers"):
        docgen.updated("no markers here", "x")
