"""API bearer tokens as the replicated state keeps them: hashed, never in plain text (making and
checking secrets is in ``controlplane/tokens.py``, outside the pure domain).

A token string is ``cp_<id>_<secret>``: ``id`` (public, 12 lower-case hex digits) finds the record,
``secret`` (32 random bytes, URL-safe base64) is checked against ``sha256`` in constant time. The
secret has 256 bits of entropy, so a fast hash is enough (a slow password hash protects low-entropy
secrets; see docs/api.md "Tokens").
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import TenantId
from controlplane.domain.tenants import check_id, check_int

TOKEN_PREFIX = "cp_"
_TOKEN_RE = re.compile(r"^cp_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TOKEN_ID = re.compile(r"^[0-9a-f]{12}$")
MAX_DESCRIPTION = 200


class Role(enum.Enum):
    ADMIN = "admin"
    """Everything, in every tenant."""
    TENANT = "tenant"
    """Read its own tenant; read and change that tenant's deployments; nothing else exists for it."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    sha256: str
    """Hex SHA-256 of the secret part."""
    role: Role
    tenant: TenantId | str = ""
    """The tenant a ``TENANT`` token is scoped to ("" for admin tokens)."""
    created_ms: int = 0
    expires_ms: int = 0
    """0 = never expires. Checked by the API server against its wall clock."""
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _TOKEN_ID.fullmatch(self.id):
            raise ValidationError("token.id", f"must be 12 lower-case hex digits, got {self.id!r}")
        if not isinstance(self.sha256, str) or not _HEX64.fullmatch(self.sha256):
            raise ValidationError("token.sha256", "must be 64 lower-case hex digits")
        if not isinstance(self.role, Role):
            raise ValidationError("token.role", f"unknown role {self.role!r}")
        if self.role is Role.TENANT:
            check_id("token.tenant", self.tenant)
        elif self.tenant != "":
            raise ValidationError("token.tenant", "must be empty for an admin token")
        check_int("token.created_ms", self.created_ms, 0)
        check_int("token.expires_ms", self.expires_ms, 0)
        if not isinstance(self.description, str) or len(self.description) > MAX_DESCRIPTION:
            raise ValidationError("token.description", f"must be a string of at most {MAX_DESCRIPTION} characters")

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms != 0 and now_ms >= self.expires_ms


def parse_token(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed token string, else None."""
    m = _TOKEN_RE.fullmatch(token) if isinstance(token, str) else None
    return None if m is None else (m.group(1), m.group(2))
