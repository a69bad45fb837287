"""API tokens (enroll, admin, origin): only their SHA-256 hashes are stored."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, CheckConstraint, Identity, Index
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.types import CreatedAt, Str

TOKEN_KINDS = ("enroll", "admin", "origin")


class ApiToken(Base):
    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint("kind IN ('enroll', 'admin', 'origin')", name="kind"),
        Index("ix_api_tokens_token_hash", "token_hash", unique=True),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    kind: Mapped[Str]
    token_hash: Mapped[Str]
    label: Mapped[Str | None]
    created_at: Mapped[CreatedAt]
    revoked_at: Mapped[dt.datetime | None]
