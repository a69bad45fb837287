"""The dashboard's database access: one engine per process, sessions from :func:`iwscope.db.session_scope`.

Dash callbacks are module-level functions (``dash.callback``), so the engine the app factory
creates is kept here rather than passed around. A process serves one dashboard app.
"""

from __future__ import annotations

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from iwscope.config import get_settings

_engine: Engine | None = None
_session_factory: sessionmaker[Session] | None = None

#: What the dashboard says when it has no database to read.
NO_DATABASE = (
    "no database: pass database_url or set DATABASE_URL "
    "(e.g. postgresql+psycopg://iwscope:PASSWORD@127.0.0.1:54329/iwscope; "
    "`iwscope services env` prints it for the local stack)"
)


class DatabaseNotConfigured(RuntimeError):
    """Raised when the dashboard is asked for data before :func:`configure` ran."""


def resolve_database_url(database_url: str | None) -> str:
    """The URL given, else ``DATABASE_URL`` as the collector's settings read it; a clear error when neither."""
    url = database_url or get_settings().database_url.strip()
    if not url:
        raise DatabaseNotConfigured(NO_DATABASE)
    if url.startswith("postgresql://"):
        # The collector uses psycopg 3; a bare postgresql:// URL would pick psycopg2.
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def configure(database_url: str | None) -> str:
    """Create the process-wide engine (replacing an earlier one); returns the URL used."""
    global _engine, _session_factory
    url = resolve_database_url(database_url)
    if _engine is not None:
        _engine.dispose()
    _engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
    _session_factory = sessionmaker(bind=_engine, expire_on_commit=False)
    return url


def engine() -> Engine:
    if _engine is None:
        raise DatabaseNotConfigured("the dashboard's database is not configured (create_app first)")
    return _engine


def session_factory() -> sessionmaker[Session]:
    """The factory of the engine :func:`configure` made, for :func:`iwscope.db.session_scope`."""
    if _session_factory is None:
        raise DatabaseNotConfigured("the dashboard's database is not configured (create_app first)")
    return _session_factory
