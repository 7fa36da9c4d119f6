"""Signed fencing tokens: an adapter accepts an epoch only if a coordinator signed it.

The epoch of a lease is the Raft log index of the entry that acquired it (``raft/lease.py``); the
coordinator that acquired it signs ``(epoch, holder)`` with an Ed25519 key that only coordinators
hold (``fence_key_file``). Adapters hold only the public key(s) (``fence_public_key_files``, a list
so that a key can be rotated) and verify every fenced call before they compare the epoch with, or
persist it into, ``<cluster>.epoch.json``. Whoever holds the adapter's bearer token, or even a
coordinator's client certificate, still cannot raise an adapter's epoch above one that a
coordinator really issued: ``Fence(epoch=2**63-1)`` is refused and never written to disk.

What is signed (:func:`signed_message`): ``b"controlplane-fence/v1\\0" || epoch (8 bytes, big-endian)
|| holder (UTF-8)``. The per-call sequence number is not signed (it is not persisted and orders
nothing across epochs). The key id is the first 16 hex digits of the SHA-256 of the raw public key,
so an adapter can say *which* key a token claims and an operator can see which keys are in use.

Library: ``cryptography`` (OpenSSL's Ed25519; ~60 us to sign, ~150 us to verify, and each holder
signs once per epoch; adapters verify a given token once and keep the last few verified).
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

DOMAIN = b"controlplane-fence/v1\x00"
MAX_EPOCH = 2**63 - 1
MAX_HOLDER_BYTES = 256
VERIFIED_CACHE = 64
"""Tokens an adapter remembers as verified (one per epoch and holder; a holder sends the same one for
its whole epoch)."""


class FenceKeyError(ValueError):
    """A fence key file that cannot be used; the message names the file and the problem."""


def signed_message(epoch: int, holder: str) -> bytes:
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch: must be between 0 and {MAX_EPOCH}, got {epoch}")
    return DOMAIN + struct.pack(">Q", epoch) + holder.encode("utf-8")


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Signature:
    key_id: str
    signature: bytes


class FenceSigner:
    """Signs ``(epoch, holder)`` with the coordinators' private key (cached per epoch)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.key_id = key_id(private_key.public_key())
        self._lock = threading.Lock()
        self._last: tuple[int, str, Signature] | None = None

    def __repr__(self) -> str:
        return f"FenceSigner(key_id={self.key_id!r})"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> FenceSigner:
        return cls(load_private_key(Path(path)))

    def sign(self, epoch: int, holder: str) -> Signature:
        with self._lock:
            last = self._last
        if last is not None and last[0] == epoch and last[1] == holder:
            return last[2]
        sig = Signature(self.key_id, self._key.sign(signed_message(epoch, holder)))
        with self._lock:
            self._last = (epoch, holder, sig)
        return sig


class FenceVerifier:
    """Checks a token against a list of public keys (thread-safe)."""

    def __init__(self, public_keys: Sequence[Ed25519PublicKey]) -> None:
        if not public_keys:
            raise ValueError("fence_public_key_files: give at least one public key")
        self._keys = {key_id(k): k for k in public_keys}
        self._lock = threading.Lock()
        self._verified: OrderedDict[tuple[int, str, str, bytes], None] = OrderedDict()

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    @classmethod
    def from_files(cls, paths: Sequence[str | os.PathLike[str]]) -> FenceVerifier:
        return cls([load_public_key(Path(p)) for p in paths])

    def problem(self, epoch: int, holder: str, kid: str, signature: bytes) -> str | None:
        """Why this token was not issued by a coordinator (a message naming the field), or None."""
        if not signature:
            return "fence.signature: missing: this adapter accepts only epochs signed by a coordinator's fence key"
        if len(holder.encode("utf-8")) > MAX_HOLDER_BYTES or not 0 <= epoch <= MAX_EPOCH:
            return "fence: epoch or holder out of range"
        cache_key = (epoch, holder, kid, bytes(signature))
        with self._lock:
            if cache_key in self._verified:
                return None
        keys = [self._keys[kid]] if kid in self._keys else list(self._keys.values())
        message = signed_message(epoch, holder)
        for k in keys:
            try:
                k.verify(bytes(signature), message)
            except InvalidSignature:
                continue
            with self._lock:
                self._verified[cache_key] = None
                if len(self._verified) > VERIFIED_CACHE:
                    self._verified.popitem(last=False)
            return None
        known = ", ".join(self.key_ids)
        if kid and kid not in self._keys:
            return f"fence.key_id: {kid[:32]!r} is not one of this adapter's fence keys ({known})"
        return f"fence.signature: not a valid signature of epoch {epoch} for holder {holder[:64]!r} by a fence key ({known})"


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FenceKeyError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise FenceKeyError(f"{str(path)!r} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise FenceKeyError(f"{str(path)!r} is not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FenceKeyError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise FenceKeyError(f"{str(path)!r} is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise FenceKeyError(f"{str(path)!r} is not an Ed25519 public key")
    return key


@dataclass(frozen=True, slots=True)
class FenceKeyFiles:
    private_key: Path
    public_key: Path


def make_fence_key(directory: str | os.PathLike[str], name: str = "fence") -> FenceKeyFiles:
    """Write a new Ed25519 key pair: ``<name>-key.pem`` (private, 0600: coordinators only) and
    ``<name>.pub.pem`` (public, 0644: for the adapters). ``controlplane fence-key`` and ``up`` use it."""
    from controlplane.tls import write_secret

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    files = FenceKeyFiles(root / f"{name}-key.pem", root / f"{name}.pub.pem")
    write_secret(files.private_key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    files.public_key.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                               serialization.PublicFormat.SubjectPublicKeyInfo))
    files.public_key.chmod(0o644)
    return files
