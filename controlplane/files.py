"""File checks shared by the configuration models (a leaf: imports nothing of the project)."""

from __future__ import annotations

from pathlib import Path


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read, or None."""
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        return f"cannot read {str(path)!r}: {exc.strerror or exc}"
    return None
