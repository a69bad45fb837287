"""Fixtures of the collector tests: campaigns, APIs whose joins nobody runs, a locked ``trials``,
this process configured like the API (``in_process``) (``client``, ``probe``, ``origin``:
tests/conftest.py; helpers: tests/testkit.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
import redis
from testenv import libpq_url
from testkit import Enrolled, close_celery_client, create_campaign

from iwscope import config, db, worker_client
from iwscope.worker import make_celery


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


@pytest.fixture
def in_process(service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process configured like the session's API processes (settings, engine, slots, and
    the broker its uploads' join requests go to).

    The Celery app is made at import, from the settings of that moment (this process's: the
    local stack's Redis, database 0); left so, an upload here marked a drain as queued in the
    session's Redis database and sent the drain to database 0, where no worker reads -- and the
    mark held every other process's drain back for its 10 s (a later test's joins never came)."""
    for name, value in service_env.items():
        monkeypatch.setenv(name, value)

    def reset() -> None:
        if db.get_engine.cache_info().currsize:
            db.get_engine().dispose()
        if worker_client._redis.cache_info().currsize:
            worker_client._redis().close()
        for cached in (config.get_settings, db.get_engine, db.get_sessionmaker, worker_client._redis):
            cached.cache_clear()

    reset()
    monkeypatch.setattr(worker_client, "celery_app", make_celery())
    yield
    close_celery_client(worker_client.celery_app)
    reset()
