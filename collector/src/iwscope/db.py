"""SQLAlchemy 2 declarative base, engine and session factory."""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import psycopg
import sqlalchemy.exc
from sqlalchemy import DateTime, MetaData, create_engine, event
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
    options.setdefault("pool_size", 20)
    options.setdefault("max_overflow", 0)
    ping_after_idle_s = options.pop("ping_after_idle_s", PING_AFTER_IDLE_S)
    connect_args = dict(options.pop("connect_args", None) or {})
    connect_args.setdefault("application_name", f"iwscope[{os.getpid()}]")
    engine = create_engine(database_url, connect_args=connect_args, **options)
    if not options.get("pool_pre_ping"):
        _ping_when_idle(engine, ping_after_idle_s)
    return engine


def ping(engine: Engine, connection: Any) -> None:
    """The dialect's ping (``SELECT 1``) on a DBAPI connection of ``engine``'s database, raising
    when it cannot answer; left without a transaction (the ping's snapshot would otherwise date
    from the ping, not from the caller's first statement)."""
    engine.dialect.do_ping(connection)
    connection.rollback()


def dedicated_connection(engine: Engine, application_name: str, **params: Any) -> psycopg.Connection:
    """A connection of its own to ``engine``'s database, outside its pool (a thread that holds
    one for long: the credential listener, the upload writer's lanes), named
    ``application_name`` in ``pg_stat_activity``; ``params``: libpq's, e.g. ``autocommit``."""
    args, connect_params = engine.dialect.create_connect_args(engine.url)
    autocommit = bool(params.pop("autocommit", False))
    connect_params = {**connect_params, "application_name": application_name, "connect_timeout": 5, **params}
    return psycopg.connect(*args, autocommit=autocommit, **connect_params)


#: A pooled connection idle longer than this is pinged (``SELECT 1``) before it is handed out.
PING_AFTER_IDLE_S = 1.0


def _ping_when_idle(engine: Engine, after_idle_s: float) -> None:
    """SQLAlchemy's ``pool_pre_ping``, only for connections idle over ``after_idle_s``.

    ``pool_pre_ping`` pings every checkout: under upload load one more round trip per upload
    for a connection used a millisecond earlier.  A connection that went bad while idle (the
    server restarted, a proxy cut it) is still caught before use -- a restart takes longer than
    a second -- and, failing the ping, replaced as ``pool_pre_ping`` replaces it (the pool
    retries the checkout on ``DisconnectionError``)."""

    @event.listens_for(engine, "connect")
    def _connected(dbapi_connection: Any, record: Any) -> None:
        record.info["iwscope_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info["iwscope_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        if time.monotonic() - record.info.get("iwscope_idle_since", float("-inf")) <= after_idle_s:
            return
        try:
            ping(engine, dbapi_connection)
        except Exception as error:  # a connection that cannot answer SELECT 1 is of no use
            raise sqlalchemy.exc.DisconnectionError(str(error)) from error


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
