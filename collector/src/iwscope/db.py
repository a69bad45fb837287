"""SQLAlchemy 2 declarative base, engine and session factory."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import DateTime, MetaData, create_engine
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from iwscope.config import get_settings

#: Deterministic constraint names, so Alembic migrations can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Base of every ORM model of the collector (and of the analysis roll-ups)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    #: Every ``datetime`` column is ``timestamptz``; every ``dict`` column is JSONB.
    type_annotation_map = {dt.datetime: DateTime(timezone=True), dict[str, Any]: JSONB}


def make_engine(database_url: str, **options: Any) -> Engine:
    """An engine for ``database_url`` (``postgresql+psycopg://...``).

    Connections carry ``application_name`` ``iwscope[<pid>]``, so ``pg_stat_activity`` tells
    which process holds which connection (and whether it sits idle in a transaction).
    """
    options.setdefault("pool_pre_ping", True)
    options.setdefault("pool_size", 20)
    options.setdefault("max_overflow", 0)
    connect_args = dict(options.pop("connect_args", None) or {})
    connect_args.setdefault("application_name", f"iwscope[{os.getpid()}]")
    return create_engine(database_url, connect_args=connect_args, **options)


@lru_cache(maxsize=1)
def get_engine() -> Engine:
    """The process-wide engine built from :func:`iwscope.config.get_settings`: ``pool_size``,
    ``max_overflow`` and ``pool_timeout`` from ``IWSCOPE_DB_POOL_SIZE``,
    ``IWSCOPE_DB_MAX_OVERFLOW`` and ``IWSCOPE_DB_POOL_TIMEOUT_S``."""
    settings = get_settings()
    return make_engine(
        settings.database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_s,
    )


@lru_cache(maxsize=1)
def get_sessionmaker() -> sessionmaker[Session]:
    """Session factory bound to :func:`get_engine` (expire_on_commit off: objects outlive commits)."""
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session] | None = None) -> Iterator[Session]:
    """A session of ``factory`` (default: :func:`get_sessionmaker`, the engine of the settings)
    that commits on success, rolls back on error and is closed either way.

    Programs with an engine of their own (the dashboard's, the lab's per-database one) pass
    their factory: every unit of work ends the same way."""
    session = (factory or get_sessionmaker())()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def driver_connection(session: Session) -> Any:
    """The psycopg connection under ``session`` (in its transaction), for COPY and binary fetches."""
    connection = session.connection().connection.driver_connection
    assert connection is not None  # a live session's DBAPI connection
    return connection


def driver_statement(query: str) -> str:
    """``query`` with SQLAlchemy's ``:name`` parameters spelled as psycopg's ``%(name)s`` (casts
    such as ``::int`` stay), for statements run on the driver's own cursor."""
    return re.sub(r"(?<![:\w]):(\w+)\b", r"%(\1)s", query)


def fetch_binary(session: Session, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The rows of ``query`` (``:name`` parameters) in the session's transaction, transferred in
    PostgreSQL's binary format: ``bytea`` arrives as bytes instead of hex text, about a quarter
    faster for the analysis' megabytes of histogram pieces."""
    with driver_connection(session).cursor(binary=True) as cursor:
        cursor.execute(driver_statement(query), params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows
