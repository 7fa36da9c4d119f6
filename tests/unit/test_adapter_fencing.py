"""Fencing that cannot be poisoned (signed epochs), coordinator-only mutual TLS, and a strict epoch file.

The reproduced attack: ``Fence(epoch=2**63-1)`` with the adapter token was accepted and persisted, and
from then on no coordinator could command that cluster. Every adapter here runs on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from adapters.client import AdapterTls, RemoteAdapter
from adapters.service import EpochFileError, FencingGuard, ForgedFence, RecordingBackend, serve_adapter
from controlplane.api.channel import open_channel
from controlplane.api.v1 import adapter_pb2, adapter_pb2_grpc
from controlplane.domain.errors import StaleEpoch, Unavailable
from controlplane.fencing import FenceSigner, FenceVerifier, make_fence_key
from controlplane.ports import Fence
from controlplane.tls import issue_coordinator_cert, make_dev_pki

REPO = Path(__file__).resolve().parents[2]
TOKEN = "adapter-token-0123456789abcdef"
MAX = 2**63 - 1


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def keys(tmp_path: Path):
    files = make_fence_key(tmp_path / "fence")
    return FenceSigner.from_file(files.private_key), FenceVerifier.from_files([files.public_key])


def signed(signer: FenceSigner, epoch: int, holder: str, seq: int = 1) -> Fence:
    sig = signer.sign(epoch, holder)
    return Fence(epoch, seq, holder, sig.signature, sig.key_id)


def raw_stub(port: int) -> tuple[grpc.Channel, adapter_pb2_grpc.ClusterAdapterStub]:
    channel = open_channel(f"127.0.0.1:{port}", token=TOKEN)
    return channel, adapter_pb2_grpc.ClusterAdapterStub(channel)


# --- signed fencing tokens -----------------------------------------------------------------------------


def test_a_forged_fence_is_refused_and_never_persisted(tmp_path: Path, keys) -> None:
    signer, verifier = keys
    record = tmp_path / "record.jsonl"
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", RecordingBackend(record), observe=False,
                           auth_token=TOKEN, fence_verifier=verifier)
    channel, stub = raw_stub(server.port)
    epoch_file = tmp_path / "state" / "c1.epoch.json"
    other = FenceSigner(Ed25519PrivateKey.generate())
    try:
        # The reproduced attack: the adapter token and a huge epoch, unsigned.
        with pytest.raises(grpc.RpcError) as err:
            stub.Fence(adapter_pb2.FenceRequest(cluster_id="c1", fence=adapter_pb2.FenceToken(epoch=MAX, seq=1, holder="n1")),
                       timeout=5)
        assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert err.value.details().startswith("fence.signature: missing")
        # Signed by a key the adapter does not hold, with its key id or claiming the real one.
        for kid in (other.key_id, signer.key_id):
            sig = other.sign(MAX, "n1")
            with pytest.raises(grpc.RpcError) as err:
                stub.Fence(adapter_pb2.FenceRequest(cluster_id="c1", fence=adapter_pb2.FenceToken(
                    epoch=MAX, seq=1, holder="n1", signature=sig.signature, key_id=kid)), timeout=5)
            assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
            assert err.value.details().split(":")[0] in ("fence.key_id", "fence.signature")
        # A real token for epoch 5 does not carry epoch 6 (or another holder).
        good = signer.sign(5, "n1")
        for epoch, holder in ((6, "n1"), (5, "n2")):
            with pytest.raises(grpc.RpcError) as err:
                stub.Fence(adapter_pb2.FenceRequest(cluster_id="c1", fence=adapter_pb2.FenceToken(
                    epoch=epoch, seq=1, holder=holder, signature=good.signature, key_id=good.key_id)), timeout=5)
            assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
        # A Scale built from an epoch and holder copied from somewhere, unsigned: refused too.
        with pytest.raises(grpc.RpcError) as err:
            stub.Scale(adapter_pb2.ScaleRequest(cluster_id="c1", request_id="r1", deployment_id="chat", replicas=9,
                                                fence=adapter_pb2.FenceToken(epoch=5, seq=2, holder="n1")), timeout=5)
        assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert not epoch_file.exists() and server.servicer.forged_rejected == 6 and server.servicer.applied == 0
        # The real coordinator is not affected: its signed epoch is accepted and persisted.
        client = RemoteAdapter({"c1": f"127.0.0.1:{server.port}"}, deadline_s=5.0, token=TOKEN)
        client.fence("c1", signed(signer, 5, "n1"), 0)
        assert client.scale("c1", "r2", "chat", 2, [], signed(signer, 5, "n1", 2)) is True
        client.close()
    finally:
        channel.close()
        server.stop(0.1)
    assert json.loads(epoch_file.read_text())["epoch"] == 5
    refused = [x for x in lines(record) if not x["accepted"]]
    assert len(refused) == 6 and all("fence." in x["reason"] for x in refused)
    assert [(x["action"], x["epoch"]) for x in lines(record) if x["accepted"]] == [("fence", 5), ("scale", 5)]


def test_the_persisted_epoch_keeps_its_signature_and_is_verified_at_start(tmp_path: Path, keys) -> None:
    signer, verifier = keys
    path = tmp_path / "c1.epoch.json"
    guard = FencingGuard(path, verifier)
    token = signed(signer, 9, "n2")
    guard.admit(9, "n2", token)  # type: ignore[arg-type]
    data = json.loads(path.read_text())
    assert (data["epoch"], data["holder"], data["key_id"]) == (9, "n2", signer.key_id)
    assert bytes.fromhex(data["signature"]) == token.signature
    assert not path.with_suffix(".tmp").exists()
    again = FencingGuard(path, verifier)
    assert (again.epoch, again.holder) == (9, "n2")
    with pytest.raises(StaleEpoch):
        again.admit(8, "n1", signed(signer, 8, "n1"))  # type: ignore[arg-type]
    # A poisoned file written before fencing keys were configured (or by hand) is not trusted.
    path.write_text(json.dumps({"epoch": MAX, "holder": "n1"}))
    with pytest.raises(EpochFileError) as err:
        FencingGuard(path, verifier)
    assert str(path) in str(err.value) and "no fence key signed" in str(err.value)
    assert "Resetting an adapter's epoch file" in str(err.value)


def test_key_rotation_accepts_every_listed_key(tmp_path: Path) -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    verifier = FenceVerifier([old.public_key(), new.public_key()])
    guard = FencingGuard(tmp_path / "e.json", verifier)
    guard.admit(3, "n1", signed(FenceSigner(old), 3, "n1"))  # type: ignore[arg-type]
    guard.admit(4, "n2", signed(FenceSigner(new), 4, "n2"))  # type: ignore[arg-type]
    assert guard.epoch == 4
    retired = FencingGuard(tmp_path / "e.json", FenceVerifier([new.public_key()]))  # the old key dropped
    with pytest.raises(ForgedFence, match="fence.key_id"):
        retired.admit(5, "n1", signed(FenceSigner(old), 5, "n1"))  # type: ignore[arg-type]
    assert retired.epoch == 4


def test_a_coordinator_without_the_key_is_refused_clearly(tmp_path: Path, keys) -> None:
    _, verifier = keys
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", RecordingBackend(tmp_path / "r.jsonl"),
                           observe=False, fence_verifier=verifier)
    client = RemoteAdapter({"c1": f"127.0.0.1:{server.port}"}, deadline_s=5.0)
    try:
        with pytest.raises(Unavailable, match="PERMISSION_DENIED: fence.signature: missing"):
            client.fence("c1", Fence(3, 1, "n1"), 0)
    finally:
        client.close()
        server.stop(0.1)


# --- the epoch file ------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, problem", [
    (b"", "is empty"),
    (b"   \n", "is empty"),
    (b"{not json", "not a valid epoch record"),
    (b"[1, 2]", "not a valid epoch record"),
    (b'{"epoch": "7", "holder": "n1"}', "not a valid epoch record"),
    (b'{"epoch": -1, "holder": "n1"}', "not a valid epoch record"),
    (b'{"epoch": 7.5, "holder": "n1"}', "not a valid epoch record"),
    (b'{"epoch": 99999999999999999999999, "holder": "n1"}', "not a valid epoch record"),
    (b'{"holder": "n1"}', "not a valid epoch record"),
    (b"\xff\xfe\x00garbage", "cannot be read"),
])
def test_a_corrupt_epoch_file_stops_the_adapter_naming_the_file(tmp_path: Path, content: bytes, problem: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "c1.epoch.json").write_bytes(content)
    with pytest.raises(EpochFileError) as err:
        serve_adapter("c1", "127.0.0.1:0", state, RecordingBackend(tmp_path / "r.jsonl"), observe=False)
    assert str(state / "c1.epoch.json") in str(err.value) and problem in str(err.value)
    assert "\n" not in str(err.value)
    assert (state / "c1.epoch.json").read_bytes() == content  # never rewritten


def test_a_failed_write_leaves_the_previous_epoch_intact(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "c1.epoch.json"
    guard = FencingGuard(path)
    guard.admit(3, "n1")
    before = path.read_bytes()

    def crash(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        guard.admit(4, "n1")
    assert path.read_bytes() == before and guard.epoch == 3  # the old record, whole; the epoch not raised


def test_the_cli_refuses_a_corrupt_epoch_file_with_one_line(tmp_path: Path) -> None:
    from controlplane.cli.up import free_ports

    state = tmp_path / "state"
    state.mkdir()
    (state / "c1.epoch.json").write_text("{garbage")
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "adapter", "--cluster", "c1", "--listen",
         f"127.0.0.1:{free_ports(1)[0]}",
         "--state-dir", str(state), "--record", str(tmp_path / "r.jsonl")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    errors = [x for x in result.stderr.splitlines() if x.startswith("controlplane: error: ")]
    assert len(errors) == 1 and str(state / "c1.epoch.json") in errors[0] and "not a valid epoch record" in errors[0]
    assert "Traceback" not in result.stderr


# --- mutual TLS: coordinators only ---------------------------------------------------------------------


def test_only_coordinator_certificates_may_command(tmp_path: Path) -> None:
    pki = make_dev_pki(tmp_path / "pki", client=True)
    record = tmp_path / "record.jsonl"
    server = serve_adapter("c1", "127.0.0.1:0", tmp_path / "state", RecordingBackend(record), observe=False,
                           auth_token=TOKEN, tls=(pki.server_cert.read_bytes(), pki.server_key.read_bytes()),
                           client_ca=pki.ca_cert.read_bytes(), allowed_coordinators=["n1", "n2"])
    address = {"c1": f"127.0.0.1:{server.port}"}
    n1 = RemoteAdapter(address, deadline_s=5.0, token=TOKEN, tls=AdapterTls(pki.ca_cert, *issue_coordinator_cert(pki, "n1")))
    n9 = RemoteAdapter(address, deadline_s=5.0, token=TOKEN, tls=AdapterTls(pki.ca_cert, *issue_coordinator_cert(pki, "n9")))
    assert pki.client_cert is not None and pki.client_key is not None
    api_client = RemoteAdapter(address, deadline_s=5.0, token=TOKEN,
                               tls=AdapterTls(pki.ca_cert, pki.client_cert, pki.client_key))  # same CA, no coordinator
    no_cert = grpc.secure_channel(address["c1"], grpc.ssl_channel_credentials(pki.ca_cert.read_bytes()))
    try:
        n1.fence("c1", Fence(2, 1, "n1"), 0)
        with pytest.raises(Unavailable, match="PERMISSION_DENIED: coordinator 'n9' is not in this adapter's "
                                              "tls.allowed_coordinators"):
            n9.fence("c1", Fence(3, 1, "n9"), 0)
        with pytest.raises(Unavailable, match="PERMISSION_DENIED: the client certificate names no coordinator"):
            api_client.fence("c1", Fence(3, 1, "n1"), 0)
        with pytest.raises(grpc.RpcError) as err:  # the handshake itself fails without a client certificate
            adapter_pb2_grpc.ClusterAdapterStub(no_cert).Fence(adapter_pb2.FenceRequest(cluster_id="c1"), timeout=5)
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        for c in (n1, n9, api_client):
            c.close()
        no_cert.close()
        server.stop(0.1)
    assert server.identity is not None and server.identity.refused == 2
    assert [(x["action"], x["epoch"]) for x in lines(record)] == [("fence", 2)]
