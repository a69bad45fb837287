"""Fixtures of the collector tests: campaigns, APIs whose joins nobody runs, a locked ``trials``
(``client``, ``probe``, ``origin``: tests/conftest.py; helpers: tests/testkit.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
import redis
from testenv import libpq_url
from testkit import Enrolled, create_campaign


@pytest.fixture
def campaign(client: httpx.Client, admin_token: str, origin: Enrolled) -> dict[str, Any]:
    return create_campaign(
        client, admin_token, origin.id, name="test campaign", sizes=[10_000, 100_000], repetitions=3, interval_s=1.0
    )


@pytest.fixture
def joinless_api_factory(api_server_factory: Callable[..., Any], redis_url: str, test_id: str) -> Iterator[Callable[..., Any]]:
    """``api_server_factory`` whose APIs queue their join tasks where no worker reads (emptied after the test).

    For tests of admission, storage and credentials, not joins: their many uploads would otherwise
    leave the session's one worker minutes of backlog (about 2 s per batch), which later tests that
    wait 60 s for a task of their own run into.
    """
    queue = f"iwscope-joinless-{test_id}"

    def start(**overrides: Any) -> Any:
        return api_server_factory(IWSCOPE_CELERY_QUEUE=queue, **overrides)

    yield start
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(queue)
    finally:
        client.close()


@pytest.fixture
def trials_locked(database_url: str) -> Iterator[psycopg.Connection]:
    """``trials`` locked ACCESS EXCLUSIVE until the test commits the returned connection."""
    connection = psycopg.connect(libpq_url(database_url))
    try:
        connection.execute("LOCK TABLE trials IN ACCESS EXCLUSIVE MODE")
        yield connection
    finally:
        connection.rollback()
        connection.close()
