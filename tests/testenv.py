"""Where the tests find the shared PostgreSQL and Redis (one home for every test and bench).

``scripts/test.sh`` exports ``IWSCOPE_TEST_DATABASE_URL`` / ``IWSCOPE_TEST_REDIS_URL`` from
``iwscope services start``; run directly, pytest falls back to this checkout's local stack
(whose URLs carry the passwords generated into ``.run/services.json``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit


def server_database_url() -> str:
    """URL of the test PostgreSQL's ``iwscope`` database (an application role, not a superuser)."""
    configured = os.environ.get("IWSCOPE_TEST_DATABASE_URL")
    if configured:
        return configured
    from iwscope.localstack import default_stack

    return default_stack().database_url


def server_redis_url() -> str:
    """URL of the test Redis, database 0 (tests pick another index)."""
    configured = os.environ.get("IWSCOPE_TEST_REDIS_URL")
    if configured:
        return configured
    from iwscope.localstack import default_stack

    return default_stack().redis_url


def libpq_url(url: str) -> str:
    """A SQLAlchemy ``postgresql+psycopg://`` URL as libpq (psycopg) takes it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def named_database_url(name: str, server_url: str | None = None) -> str:
    """The SQLAlchemy URL of database ``name`` on the test server (same role, same password)."""
    parts = urlsplit(server_url or server_database_url())
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def create_database(name: str, *, migrated: bool = False, server_url: str | None = None) -> str:
    """Create database ``name`` on the test server (migrated to head if asked); return its URL."""
    import psycopg

    server = server_url or server_database_url()
    with psycopg.connect(libpq_url(server), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = named_database_url(name, server)
    if migrated:
        from iwscope import migrate

        try:
            migrate.upgrade("head", database_url=url)
        except BaseException:
            drop_database(name, server_url=server)
            raise
    return url


@contextmanager
def temporary_database(name: str, *, migrated: bool = False) -> Iterator[str]:
    """Database ``name`` (created, migrated to head if asked) for the ``with`` block, dropped after it."""
    url = create_database(name, migrated=migrated)
    try:
        yield url
    finally:
        drop_database(name)


def drop_database(name: str, *, server_url: str | None = None, timeout_s: float = 30.0) -> None:
    """``DROP DATABASE ... WITH (FORCE)`` as the application role, retried while it is refused.

    The role is not a superuser, so FORCE may not end a backend it does not own: an autovacuum
    worker that the migrations' writes woke up in that database.  It leaves within seconds.
    """
    import time

    import psycopg

    server = libpq_url(server_url or server_database_url())
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.errors.InsufficientPrivilege:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
