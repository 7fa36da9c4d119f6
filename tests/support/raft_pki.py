"""Raft member certificates for tests that build a coordinator configuration by hand.

``raft_tls(directory, node_id)`` issues (once) a member certificate under ``directory/raft-pki``;
``shared_raft_tls(node_id)`` does the same in one temporary folder per test process (removed at
exit), for module-level configuration dicts."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from controlplane.tls import issue_coordinator_cert, make_raft_pki

_shared: Path | None = None


def raft_tls(directory: Path, node_id: str) -> dict[str, str]:
    pki = make_raft_pki(directory / "raft-pki", [])
    if not pki.cert(node_id).is_file():
        issue_coordinator_cert(pki, node_id)
    return pki.tls_fields(node_id)


def shared_raft_tls(node_id: str) -> dict[str, str]:
    global _shared
    if _shared is None:
        _shared = Path(tempfile.mkdtemp(prefix="cp-raft-pki-"))
        atexit.register(shutil.rmtree, _shared, True)
    return raft_tls(_shared, node_id)
