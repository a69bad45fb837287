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
