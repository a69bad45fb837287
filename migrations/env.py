"""Alembic environment of iwscope: the URL comes from the caller or ``DATABASE_URL``."""

from __future__ import annotations

import importlib
import re
from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool

import iwscope.models  # noqa: F401  (registers every core table on Base.metadata)
from iwscope.config import get_settings
from iwscope.db import Base

# Tables of other parts register themselves when their model module imports (optional).
for _optional in ("iwscope.analysis.models",):
    try:
        importlib.import_module(_optional)
    except ModuleNotFoundError as missing:
        if missing.name is None or not _optional.startswith(missing.name):
            raise

target_metadata = Base.metadata

#: Monthly and default partitions of ``trials`` are created at run time, not declared as models.
PARTITION_NAME = re.compile(r"^trials_(default|p\d{6})$")


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Leave the partitions of ``trials`` (and their indexes) out of autogenerate comparisons."""
    if type_ == "table" and name is not None and PARTITION_NAME.match(name):
        return False
    return True


def _url() -> str:
    return context.config.get_main_option("sqlalchemy.url") or get_settings().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True,
                      include_object=include_object)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          include_object=include_object, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
