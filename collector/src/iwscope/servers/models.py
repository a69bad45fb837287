"""Servers: operators' own web servers running ``iwprobe tap`` (wire v6, passive measurement).

A server is enrolled like an origin (a token of kind ``server``, then its own ``<uuid>.<secret>``
credential) but serves real users, not probes: the collector never learns its clients'
addresses, only the aggregates and keyed prefix hashes it uploads (``iwscope.passive``).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Integer
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.types import CreatedAt, Json, Str, UuidPk


class Server(Base):
    __tablename__ = "servers"

    id: Mapped[UuidPk]
    name: Mapped[Str]
    #: Where the server is (its data centre or region), as the operator named it.
    region: Mapped[Str]
    #: The web server's TCP ports (80, 443, ...): a passive campaign without ports of its own
    #: splits these.
    ports: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    version: Mapped[Str]
    #: Kernel release (``uname -r``) the arms rely on.
    kernel: Mapped[Str]
    secret_hash: Mapped[Str]
    enrolled_at: Mapped[CreatedAt]
    last_seen_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]
    #: The last :class:`iwprobe.wire.ServerHeartbeat` as received (folded into its uploads).
    last_heartbeat: Mapped[Json | None]
