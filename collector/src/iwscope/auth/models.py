"""API tokens: only their SHA-256 hashes are stored.

Kinds: ``enroll`` (enrolls a probe), ``admin`` (campaigns, fleet listings), ``origin`` (enrolls
an origin), ``server`` (enrolls an ``iwprobe tap`` agent on an operator's web server, wire v6)
and ``read`` (reads the passive, real-user data; an ``admin`` token reads it too).  Each kind
opens exactly its own door, so a leaked enrollment token cannot read and a reader cannot enroll.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, CheckConstraint, Identity, Index
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.types import CreatedAt, Str

TOKEN_KINDS = ("enroll", "admin", "origin", "server", "read")
#: The ``kind`` column's check (migration ``0013_passive`` added ``server`` and ``read``).
TOKEN_KINDS_SQL = "kind IN (" + ", ".join(repr(kind) for kind in TOKEN_KINDS) + ")"


class ApiToken(Base):
    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint(TOKEN_KINDS_SQL, name="kind"),
        Index("ix_api_tokens_token_hash", "token_hash", unique=True),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    kind: Mapped[Str]
    token_hash: Mapped[Str]
    label: Mapped[Str | None]
    created_at: Mapped[CreatedAt]
    revoked_at: Mapped[dt.datetime | None]
