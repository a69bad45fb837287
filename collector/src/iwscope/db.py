"""SQLAlchemy 2 declarative base, engine and session factory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
import datetime as dt
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


def make_engine(database_url: str, **options: object) -> Engine:
    """An engine for ``database_url`` (``postgresql+psycopg://...``)."""
    options.setdefault("pool_pre_ping", True)
    options.setdefault("pool_size", 10)
    options.setdefault("max_overflow", 10)
    return create_engine(database_url, **options)


@lru_cache(maxsize=1)
def get_engine() -> Engine:
    """The process-wide engine built from :func:`iwscope.config.get_settings`."""
    return make_engine(get_settings().database_url)


@lru_cache(maxsize=1)
def get_sessionmaker() -> sessionmaker[Session]:
    """Session factory bound to :func:`get_engine` (expire_on_commit off: objects outlive commits)."""
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
