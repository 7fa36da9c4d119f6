"""Generate the Python gRPC modules from ``proto/`` with grpcio-tools (``make proto``).

``generate(out_dir)`` writes them under ``out_dir``; the test suite generates into a temporary folder
and compares with the committed files, so the proto and the code cannot drift apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTOS = ("controlplane/api/v1/admin.proto", "controlplane/api/v1/adapter.proto", "controlplane/api/v1/api.proto")


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc  # a test/development dependency only

    out_dir.mkdir(parents=True, exist_ok=True)
    for proto in PROTOS:
        args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}", str(PROTO_ROOT / proto)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {proto}")
    produced = sorted(p for p in out_dir.rglob("*") if p.suffix in (".py", ".pyi"))
    return produced


def main() -> int:
    generate(REPO)
    print("generated:", ", ".join(str(p.relative_to(REPO)) for p in sorted((REPO / "controlplane/api/v1").glob("*_pb2*"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
