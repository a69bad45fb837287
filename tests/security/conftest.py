"""Fixtures of the security tests: an HTTP client of the session API, enrolled probes and origins."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from security_helpers import Enrolled, enroll_origin, enroll_probe


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
