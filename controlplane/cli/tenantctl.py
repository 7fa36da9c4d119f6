"""``tenantctl``: the platform teams' CLI, a client of the control plane's gRPC API.

The gRPC API is not part of this release yet; until it is, every command says so and exits 2
rather than pretending to work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tenantctl", description="Manage tenants and model deployments.")
    p.add_argument("command", nargs="?", help="(the gRPC API is not available in this release)")
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 0
    print("tenantctl: error: the control plane's gRPC API is not available in this release", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
