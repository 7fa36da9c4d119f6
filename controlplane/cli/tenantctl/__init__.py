"""``tenantctl``: the platform teams' CLI, a client of the control plane's gRPC API.

Usage, configuration file, manifests and exit codes: ``docs/tenantctl.md``.

* :func:`main` is the ``tenantctl`` console script.
* :func:`token_main` serves ``controlplane token create|list|revoke`` with the same code and options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from controlplane.api.tls_errors import quiet_grpc

quiet_grpc()  # before grpc is first imported (by app below): no gRPC C-core log lines on stderr

from controlplane.cli.tenantctl.app import (  # noqa: E402
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    _common,
    _token_commands,
    build_parser,
    run,
)

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "build_parser", "main",
           "run", "token_main", "token_parser"]


def main(argv: Sequence[str] | None = None) -> int:
    """``tenantctl ARGS``; returns the exit status."""
    return run(argv)


def token_parser(prog: str = "controlplane token") -> argparse.ArgumentParser:
    """``create|list|revoke`` with tenantctl's connection options (``--config``, ``--context``,
    ``--endpoint``, ``--token``, ``--ca-file``, ``--timeout``)."""
    common = _common()
    p = argparse.ArgumentParser(prog=prog, parents=[common], description="API tokens: create, list, revoke (admins).")
    p.set_defaults(command="token")
    _token_commands(p, common)
    return p


def token_main(argv: Sequence[str] | None = None, prog: str = "controlplane token") -> int:
    """``controlplane token create|list|revoke ...`` (same behaviour and exit codes as ``tenantctl token``)."""
    return run(argv, parser=token_parser(prog))


if __name__ == "__main__":
    sys.exit(main())
