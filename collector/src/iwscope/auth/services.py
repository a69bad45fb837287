"""Secrets, their hashes and the lookups behind every authenticated request.

Tokens and probe/origin secrets are 256-bit random strings, so a fast SHA-256 is the right
hash (a slow password KDF buys nothing against brute force of 2^256 and costs every
request); comparisons are constant-time.  Unknown identities still compare against a
dummy hash so that "unknown probe" and "wrong secret" take the same path and time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.auth.models import TOKEN_KINDS, ApiToken
from iwscope.config import Settings

#: Hash compared against when the identity is unknown (keeps both failure paths alike).
_DUMMY_HASH = hashlib.sha256(b"iwscope-dummy").hexdigest()


def new_secret() -> str:
    """A fresh random secret (43 URL-safe characters, 256 bits)."""
    return secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def secret_matches(secret: str, stored_hash: str | None) -> bool:
    """Constant-time check of ``secret`` against ``stored_hash`` (``None``: unknown identity)."""
    expected = stored_hash if stored_hash is not None else _DUMMY_HASH
    return hmac.compare_digest(hash_secret(secret), expected) and stored_hash is not None


@dataclass(frozen=True)
class Credential:
    """A parsed ``<uuid>.<secret>`` credential."""

    identity: uuid.UUID
    secret: str


def parse_credential(text: str) -> Credential | None:
    """``<uuid>.<secret>`` -> :class:`Credential`, or ``None`` when malformed."""
    identity_text, separator, secret = text.partition(wire.CREDENTIAL_SEPARATOR)
    if not separator or not secret:
        return None
    try:
        return Credential(uuid.UUID(identity_text), secret)
    except ValueError:
        return None


def format_credential(identity: uuid.UUID, secret: str) -> str:
    return f"{identity}{wire.CREDENTIAL_SEPARATOR}{secret}"


def create_api_token(session: Session, kind: str, label: str | None = None) -> str:
    """Store the hash of a new token of ``kind`` and return the token (shown only once)."""
    if kind not in TOKEN_KINDS:
        raise ValueError(f"token kind must be one of {', '.join(TOKEN_KINDS)}, not {kind!r}")
    token = f"iws_{kind}_{new_secret()}"
    session.add(ApiToken(kind=kind, token_hash=hash_secret(token), label=label))
    session.flush()
    return token


def api_token_valid(session: Session, settings: Settings, kind: str, token: str) -> bool:
    """True iff ``token`` is an unrevoked token of ``kind`` (or the bootstrap token from the settings)."""
    bootstrap = {"admin": settings.admin_token, "enroll": settings.enroll_token}.get(kind)
    if bootstrap and hmac.compare_digest(token.encode("utf-8"), bootstrap.encode("utf-8")):
        return True
    stored = session.scalar(
        select(ApiToken.token_hash).where(ApiToken.token_hash == hash_secret(token),
                                          ApiToken.kind == kind, ApiToken.revoked_at.is_(None)))
    return secret_matches(token, stored)
