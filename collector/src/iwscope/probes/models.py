"""Probes: the measuring agents (``iwprobe``)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Index
from sqlalchemy.orm import Mapped

from iwscope.db import Base
from iwscope.types import BigInt, CreatedAt, Json, Str, UuidPk


class Probe(Base):
    __tablename__ = "probes"
    __table_args__ = (Index("ix_probes_region", "region"),)

    id: Mapped[UuidPk]
    name: Mapped[Str]
    region: Mapped[Str]
    country: Mapped[Str | None]
    asn: Mapped[BigInt | None]
    labels: Mapped[Json]
    version: Mapped[Str]
    secret_hash: Mapped[Str]
    enrolled_at: Mapped[CreatedAt]
    last_seen_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]
    #: The last :class:`iwprobe.wire.Heartbeat` as received (backlog, uptime, ...).
    last_heartbeat: Mapped[Json | None]
