"""Origins: instrumented HTTP servers, one listener per IW arm."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Boolean, false
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.types import CreatedAt, Json, Str, UuidPk


class Origin(Base):
    __tablename__ = "origins"

    id: Mapped[UuidPk]
    name: Mapped[Str]
    region: Mapped[Str]
    #: Host name or address probes use to reach it.
    host: Mapped[Str]
    #: ``[{"iw": 10, "port": 8010}, ...]`` (wire ``ArmPort``).
    arms: Mapped[Json]
    #: UDP port of its echo service (the interactive flow); NULL: none (wire v1/v2 origins).
    echo_port: Mapped[int | None]
    #: It serves HTTPS on every arm (wire v4).
    tls: Mapped[bool] = mapped_column(Boolean, server_default=false())
    #: Its IPv6 address or name for campaigns over IPv6 (wire v4); NULL: none.
    host6: Mapped[Str | None]
    version: Mapped[Str]
    secret_hash: Mapped[Str]
    enrolled_at: Mapped[CreatedAt]
    last_seen_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]
