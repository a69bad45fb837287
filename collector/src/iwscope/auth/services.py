"""Secrets, their hashes and the lookups behind every authenticated request.

Tokens and probe/origin/server secrets are 256-bit random strings, so a fast SHA-256 is the right
hash (a slow password KDF buys nothing against brute force of 2^256 and costs every
request); comparisons are constant-time.  Unknown identities still compare against a
dummy hash so that "unknown probe" and "wrong secret" take the same path and time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

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
        select(ApiToken.token_hash).where(
            ApiToken.token_hash == hash_secret(token), ApiToken.kind == kind, ApiToken.revoked_at.is_(None)
        )
    )
    return secret_matches(token, stored)


def api_token_kind(session: Session, settings: Settings, kinds: tuple[str, ...], token: str) -> str | None:
    """The kind of ``token`` if it is an unrevoked token of one of ``kinds`` (or the bootstrap
    admin token when ``admin`` is one of them), else ``None``: one lookup for a door that
    several kinds open (the passive data's readers: ``read`` and ``admin``)."""
    for kind in kinds:
        bootstrap = {"admin": settings.admin_token, "enroll": settings.enroll_token}.get(kind)
        if bootstrap and hmac.compare_digest(token.encode("utf-8"), bootstrap.encode("utf-8")):
            return kind
    row = session.execute(
        select(ApiToken.kind, ApiToken.token_hash).where(
            ApiToken.token_hash == hash_secret(token), ApiToken.kind.in_(kinds), ApiToken.revoked_at.is_(None)
        )
    ).first()
    if not secret_matches(token, row.token_hash if row is not None else None) or row is None:
        return None
    kind_found: str = row.kind
    return kind_found


# ----------------------------------------------------------------------------- rotation, revocation
@dataclass(frozen=True)
class TokenListing:
    """One stored token as ``iwscope token list`` shows it (never the token itself)."""

    id: int
    kind: str
    label: str | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None


def list_api_tokens(session: Session, include_revoked: bool = False) -> list[TokenListing]:
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return [TokenListing(row.id, row.kind, row.label, row.created_at, row.revoked_at) for row in session.scalars(query)]


def revoke_api_token(session: Session, token_id: int | None = None, token: str | None = None) -> TokenListing:
    """Revoke one token, named by its id or by its value; refused at once from the next request.

    Raises ``LookupError`` when no such (unrevoked) token exists."""
    if (token_id is None) == (token is None):
        raise ValueError("name the token by exactly one of its id or its value")
    query = select(ApiToken).where(ApiToken.revoked_at.is_(None))
    query = (
        query.where(ApiToken.id == token_id)
        if token_id is not None
        else query.where(ApiToken.token_hash == hash_secret(token or ""))
    )
    row = session.scalar(query.with_for_update())
    if row is None:
        raise LookupError("no such unrevoked token")
    row.revoked_at = dt.datetime.now(dt.UTC)
    session.flush()
    return TokenListing(row.id, row.kind, row.label, row.created_at, row.revoked_at)


def rotate_api_token(session: Session, token_id: int) -> tuple[str, TokenListing]:
    """Revoke token ``token_id`` and create its successor (same kind and label) in one transaction."""
    old = revoke_api_token(session, token_id=token_id)
    return create_api_token(session, old.kind, old.label), old


def revoke_identity(session: Session, model: type[Any], identity: str) -> bool:
    """Set ``revoked_at`` on a probe, origin or server (``model``); False when unknown or already revoked."""
    try:
        key = uuid.UUID(identity)
    except ValueError:
        return False
    row = session.get(model, key, with_for_update=True)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = dt.datetime.now(dt.UTC)
    session.flush()
    return True
