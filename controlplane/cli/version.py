"""``--version`` of ``tenantctl`` and ``controlplane``: one line, from the installed package's
metadata (``controlplane.__version__`` when running from a source tree without it)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("controlplane")
    except metadata.PackageNotFoundError:
        import controlplane

        return controlplane.__version__


def version_line(prog: str) -> str:
    return f"{prog} {version()}"
