"""The API over TLS and mutual TLS (certificates from ``controlplane.tls.make_dev_pki``): a client that
trusts the CA gets through, a plaintext one or one without the client certificate does not."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from controlplane.api.admin import Credentials, fetch_status
from controlplane.api.server import serve
from controlplane.config import CoordinatorConfig
from controlplane.tls import make_dev_pki
from tests.raft.cluster import cluster_configs
from tests.unit.test_admin_api import ADMIN, STATUS, StandInNode


def _server(tmp_path: Path, *, mutual: bool):
    pki = make_dev_pki(tmp_path / "pki", client=mutual)
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    if mutual:
        tls["client_ca_file"] = str(pki.ca_cert)
    [raw] = cluster_configs(tmp_path, 1, api_tls=tls)
    api = serve(CoordinatorConfig.model_validate(raw), StandInNode(), status=lambda: STATUS, address="127.0.0.1:0")
    return api, pki


@pytest.mark.parametrize("mutual", [False, True])
def test_tls_and_mutual_tls(tmp_path: Path, mutual: bool) -> None:
    api, pki = _server(tmp_path, mutual=mutual)
    endpoint = f"127.0.0.1:{api.port}"
    try:
        client = {"cert_file": pki.client_cert, "key_file": pki.client_key} if mutual else {}
        [ok] = fetch_status([endpoint], 5.0, Credentials(token=ADMIN, ca_file=pki.ca_cert, **client))
        assert ok["reachable"] and ok["node_id"] == STATUS.node_id
        [plain] = fetch_status([endpoint], 2.0, Credentials(token=ADMIN))
        assert not plain["reachable"] and plain["error"].startswith("UNAVAILABLE")
        if mutual:
            [no_cert] = fetch_status([endpoint], 2.0, Credentials(token=ADMIN, ca_file=pki.ca_cert))
            assert not no_cert["reachable"]
        other = make_dev_pki(tmp_path / "other")
        [untrusted] = fetch_status([endpoint], 2.0, Credentials(token=ADMIN, ca_file=other.ca_cert, **client))
        assert not untrusted["reachable"] and untrusted["error"].startswith("UNAVAILABLE")
    finally:
        api.stop(0.1)


def test_tls_without_a_token_is_still_unauthenticated(tmp_path: Path) -> None:
    api, pki = _server(tmp_path, mutual=False)
    try:
        [got] = fetch_status([f"127.0.0.1:{api.port}"], 5.0, Credentials(ca_file=pki.ca_cert))
        assert not got["reachable"] and got["error"].startswith(grpc.StatusCode.UNAUTHENTICATED.name)
    finally:
        api.stop(0.1)
