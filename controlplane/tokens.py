"""Making and checking API token secrets (the records are ``controlplane.domain.tokens``)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from controlplane.domain.tokens import TOKEN_PREFIX, TokenRecord


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_token() -> tuple[str, str, str]:
    """A fresh ``(token, id, sha256-of-secret)``. Only ``token`` must be shown, once."""
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return f"{TOKEN_PREFIX}{token_id}_{secret}", token_id, hash_secret(secret)


def matches(record: TokenRecord, secret: str) -> bool:
    return hmac.compare_digest(record.sha256, hash_secret(secret))
