"""Where the tests find the shared PostgreSQL and Redis (one home for every test and bench).

``scripts/test.sh`` exports ``IWSCOPE_TEST_DATABASE_URL`` / ``IWSCOPE_TEST_REDIS_URL`` from
``iwscope services start``; run directly, pytest falls back to this checkout's local stack
(whose URLs carry the passwords generated into ``.run/services.json``).
"""

from __future__ import annotations

import os


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


def drop_database(server_libpq_url: str, name: str, timeout_s: float = 30.0) -> None:
    """``DROP DATABASE ... WITH (FORCE)`` as the application role, retried while it is refused.

    The role is not a superuser, so FORCE may not end a superuser's backend: an autovacuum worker
    that the migrations' writes woke up in that database. It leaves within seconds.
    """
    import time

    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(server_libpq_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.errors.InsufficientPrivilege:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
