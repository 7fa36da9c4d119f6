"""Development TLS material: a self-signed CA and certificates it signs, as PEM files.

``controlplane up`` and the tests use :func:`make_dev_pki` to run the API and the adapters over
TLS on 127.0.0.1 without an operator-provided PKI. Production deployments bring their own
certificates (cert-manager, a corporate CA); nothing here is meant for them.

Keys are ECDSA P-256 (fast to generate, accepted by gRPC's BoringSSL). Private keys are written
with mode 0600 (created that way: never readable by others, not even for a moment); certificates
with 0644.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("127.0.0.1", "localhost", "::1")
VALID_DAYS = 365
CLOCK_SKEW = dt.timedelta(minutes=5)
"""Certificates are valid from a little before now, so a peer whose clock is behind accepts them."""


@dataclass(frozen=True, slots=True)
class DevPki:
    """Paths of the files :func:`make_dev_pki` wrote."""

    dir: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path | None = None
    client_key: Path | None = None


def make_dev_pki(directory: str | os.PathLike[str], *, hosts: Sequence[str] = DEFAULT_HOSTS, client: bool = False,
                 valid_days: int = VALID_DAYS, now: dt.datetime | None = None) -> DevPki:
    """Write ``ca.pem``/``ca-key.pem``, ``server.pem``/``server-key.pem`` (SANs: ``hosts``, IP
    addresses as IP SANs) and, with ``client``, ``client.pem``/``client-key.pem`` (for mutual TLS)
    into ``directory`` (created 0700 if missing). Existing files are replaced."""
    if not hosts:
        raise ValueError("hosts: give at least one host name or IP address")
    if valid_days < 1:
        raise ValueError(f"valid_days: must be >= 1, got {valid_days}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    start = (now or dt.datetime.now(dt.UTC)) - CLOCK_SKEW
    end = start + CLOCK_SKEW + dt.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "controlplane dev CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = DevPki(root, root / "ca.pem", root / "ca-key.pem", root / "server.pem", root / "server-key.pem")
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    server_key = ec.generate_private_key(ec.SECP256R1())
    # serverAuth and clientAuth: a coordinator presents its server certificate when it forwards a call
    # (Explain, DryRun) to the lease holder, which under mutual TLS verifies it as a client certificate.
    server_cert = _leaf(ca_cert, ca_key, server_key, hosts[0], _sans(hosts),
                        (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH), start, end)
    _write_key(pki.server_key, server_key)
    _write_cert(pki.server_cert, server_cert)
    if not client:
        return pki

    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _leaf(ca_cert, ca_key, client_key, "controlplane client", [x509.DNSName("controlplane-client")],
                        (ExtendedKeyUsageOID.CLIENT_AUTH,), start, end)
    pki = DevPki(root, pki.ca_cert, pki.ca_key, pki.server_cert, pki.server_key, root / "client.pem", root / "client-key.pem")
    assert pki.client_cert is not None and pki.client_key is not None
    _write_key(pki.client_key, client_key)
    _write_cert(pki.client_cert, client_cert)
    return pki


def _sans(hosts: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _leaf(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, key: ec.EllipticCurvePrivateKey, common_name: str,
          sans: list[x509.GeneralName], usage: Sequence[x509.ObjectIdentifier], start: dt.datetime,
          end: dt.datetime) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_secret(path, data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.chmod(0o644)


def write_secret(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` with mode 0600 (the file is created with that mode; an existing
    file is replaced by a new one, so a looser old mode does not survive)."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


# --- coordinator identities (Raft members, adapter channels) -----------------------------------------

COORDINATOR_URI_PREFIX = "controlplane://coordinator/"
"""A coordinator certificate names its node id as the URI SAN ``controlplane://coordinator/<node_id>``:
Raft members accept only such peers (``raft/peer_auth.py``) and adapters accept commands only from
them (``adapters/identity.py``). See docs/security.md."""


def coordinator_uri(node_id: str) -> str:
    return COORDINATOR_URI_PREFIX + node_id


@dataclass(frozen=True, slots=True)
class RaftPki:
    """A CA for the Raft transport (``raft-ca.pem``/``raft-ca-key.pem``) and member certificates
    ``coordinator-<node_id>.pem``/``coordinator-<node_id>-key.pem`` beside it."""

    dir: Path
    ca_cert: Path
    ca_key: Path

    def cert(self, node_id: str) -> Path:
        return self.dir / f"coordinator-{node_id}.pem"

    def key(self, node_id: str) -> Path:
        return self.dir / f"coordinator-{node_id}-key.pem"

    def tls_fields(self, node_id: str) -> dict[str, str]:
        """The ``raft_tls`` block of that member's configuration."""
        return {"ca_file": str(self.ca_cert), "cert_file": str(self.cert(node_id)), "key_file": str(self.key(node_id))}


def make_raft_pki(directory: str | os.PathLike[str], node_ids: Sequence[str], *, valid_days: int = VALID_DAYS,
                  now: dt.datetime | None = None) -> RaftPki:
    """Write a Raft CA into ``directory`` (reused when both its files exist) and a certificate for
    each of ``node_ids`` (replaced if present)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    pki = RaftPki(root, root / "raft-ca.pem", root / "raft-ca-key.pem")
    if not (pki.ca_cert.is_file() and pki.ca_key.is_file()):
        start = (now or dt.datetime.now(dt.UTC)) - CLOCK_SKEW
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "controlplane dev Raft CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + CLOCK_SKEW + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write_key(pki.ca_key, key)
        _write_cert(pki.ca_cert, ca)
    for node_id in node_ids:
        issue_coordinator_cert(pki, node_id, valid_days=valid_days, now=now)
    return pki


def issue_coordinator_cert(pki: RaftPki | DevPki, node_id: str, *, hosts: Sequence[str] = DEFAULT_HOSTS,
                           valid_days: int = VALID_DAYS, now: dt.datetime | None = None,
                           uri: str | None = None) -> tuple[Path, Path]:
    """Sign a coordinator certificate (URI SAN :func:`coordinator_uri`, plus ``hosts`` as DNS/IP SANs;
    serverAuth and clientAuth: a member is both on its Raft links, a client towards the adapters)
    with the CA of ``pki`` (the Raft CA, or the dev PKI's CA for adapter channels) and write it as
    ``coordinator-<node_id>.pem`` / ``coordinator-<node_id>-key.pem`` (0600) next to the CA; returns
    (cert, key) paths. ``uri`` replaces the identity URI (tests use it for a non-coordinator cert)."""
    if not node_id or "/" in node_id or any(ch.isspace() for ch in node_id):
        raise ValueError(f"node_id: must be a non-empty id without '/' or spaces, got {node_id!r}")
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pki.ca_key}: expected an EC private key")
    start = (now or dt.datetime.now(dt.UTC)) - CLOCK_SKEW
    end = start + CLOCK_SKEW + dt.timedelta(days=valid_days)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri or coordinator_uri(node_id)), *_sans(hosts)]
    cert = _leaf(ca_cert, ca_key, key, node_id, sans,
                 (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH), start, end)
    cert_path, key_path = pki.dir / f"coordinator-{node_id}.pem", pki.dir / f"coordinator-{node_id}-key.pem"
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert_path, key_path
