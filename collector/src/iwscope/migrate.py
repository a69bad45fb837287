"""Alembic, driven from Python (``iwscope db ...`` and the test fixtures)."""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, create_engine, pool

from iwscope.config import get_settings

#: Monthly and default partitions of ``trials`` are created at run time, not declared as models.
PARTITION_NAME = re.compile(r"^trials_(default|p\d{6})$")


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Leave the partitions of ``trials`` out of autogenerate comparisons."""
    return not (type_ == "table" and name is not None and PARTITION_NAME.match(name))


def model_metadata() -> MetaData:
    """The metadata of every model: the core's and the analysis roll-ups'."""
    import iwscope.analysis.models  # registers the roll-up tables
    import iwscope.models  # noqa: F401  (registers the core tables)
    from iwscope.db import Base

    return Base.metadata


class MigrationsNotFound(RuntimeError):
    """Neither ``IWSCOPE_MIGRATIONS_DIR`` nor a repository checkout holds ``migrations/env.py``."""


def migrations_dir() -> pathlib.Path:
    """``$IWSCOPE_MIGRATIONS_DIR``, else ``migrations/`` of the repository this package lives in."""
    configured = os.environ.get("IWSCOPE_MIGRATIONS_DIR")
    candidates = (
        [pathlib.Path(configured)]
        if configured
        else [parent / "migrations" for parent in pathlib.Path(__file__).resolve().parents]
    )
    for candidate in candidates:
        if (candidate / "env.py").is_file():
            return candidate
    raise MigrationsNotFound("cannot find the Alembic migrations (migrations/env.py); set IWSCOPE_MIGRATIONS_DIR")


def alembic_config(database_url: str | None = None) -> Config:
    """An Alembic config for ``database_url`` (default: ``DATABASE_URL``)."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", (database_url or get_settings().database_url).replace("%", "%%"))
    return config


def upgrade(revision: str = "head", database_url: str | None = None) -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(revision: str, database_url: str | None = None) -> None:
    command.downgrade(alembic_config(database_url), revision)


def current_revisions(database_url: str | None = None) -> tuple[str, ...]:
    """Revisions the database is at (empty before the first upgrade)."""
    engine = create_engine(database_url or get_settings().database_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return tuple(MigrationContext.configure(connection).get_current_heads())
    finally:
        engine.dispose()


def head_revisions() -> tuple[str, ...]:
    return tuple(ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_heads())


def at_head(database_url: str | None = None) -> bool:
    """True iff the database's revision is the scripts' head."""
    return set(current_revisions(database_url)) == set(head_revisions())
