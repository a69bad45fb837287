"""Fixtures of the passive (wire v6) tests: tokens of the kinds ``server`` and ``read`` (made with
``iwscope token create``, as an operator makes them) and an enrolled server
(``client``, ``admin_token``, ``db_engine``: tests/conftest.py; helpers: passive_kit.py)."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from passive_kit import enroll_server
from testkit import Enrolled

IWSCOPE = [sys.executable, "-m", "iwscope.cli"]


def create_token(service_env: dict[str, str], kind: str, label: str = "pytest passive") -> str:
    completed = subprocess.run(
        [*IWSCOPE, "token", "create", "--kind", kind, "--label", label],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


@pytest.fixture(scope="session")
def server_token(service_env: dict[str, str]) -> str:
    return create_token(service_env, "server")


@pytest.fixture(scope="session")
def read_token(service_env: dict[str, str]) -> str:
    return create_token(service_env, "read")


@pytest.fixture
def server(client: httpx.Client, server_token: str) -> Enrolled:
    """A server enrolled with ports 80 and 443 (each test its own: passive campaigns of one
    server must not overlap, so tests never share one)."""
    return enroll_server(client, server_token)
