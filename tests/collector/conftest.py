"""Fixtures of the collector tests: enrolled probes and origins, campaigns (helpers: collector_helpers.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from testenv import libpq_url
from collector_helpers import Enrolled, bearer, enroll_origin, enroll_probe


@pytest.fixture
def client(api_server) -> Iterator[httpx.Client]:  # noqa: ANN001
    with httpx.Client(base_url=api_server.url, timeout=60.0) as session:
        yield session


@pytest.fixture
def probe(client: httpx.Client, enroll_token: str) -> Enrolled:
    return enroll_probe(client, enroll_token)


@pytest.fixture
def origin(client: httpx.Client, origin_token: str) -> Enrolled:
    return enroll_origin(client, origin_token)


@pytest.fixture
def campaign(client: httpx.Client, admin_token: str, origin: Enrolled) -> dict[str, Any]:
    now = dt.datetime.now(dt.timezone.utc)
    response = client.post("/api/v1/campaigns", headers=bearer(admin_token), json={
        "name": "test campaign", "origin_ids": [origin.id], "arms": [3, 10], "sizes": [10_000, 100_000],
        "repetitions": 3, "interval_s": 1.0, "starts_at": (now - dt.timedelta(minutes=5)).isoformat(),
        "ends_at": (now + dt.timedelta(hours=1)).isoformat()})
    assert response.status_code == 201, response.text
    return response.json()


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
