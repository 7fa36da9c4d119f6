"""Test-only helpers (fault injection, process harnesses). Never imported by production code."""
