"""A credential the cache does not hold is checked against the process's copy of the stored rows
(``auth.directory``) while the process hears credential notifications: no database lookup per
miss, and a revocation still refused at once.  In this process (``in_process``: the session's
database, a real listener), counting the statements this process's engine sends."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from fastapi import HTTPException
from sqlalchemy import event
from testenv import libpq_url
from testkit import Enrolled, enroll_probe

from iwscope.auth import dependencies
from iwscope.auth.dependencies import authenticate, bearer_credential
from iwscope.auth.directory import DIRECTORY
from iwscope.db import get_engine


@pytest.fixture
def listening(in_process: None) -> Iterator[None]:
    """This process listens to credential changes, as an API process does (its copies start empty)."""
    listener = dependencies.start_credential_listener()
    assert listener.wait_listening(30), "the listener never listened"
    try:
        yield
    finally:
        dependencies.stop_credential_listener()


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """The SQL this process's engine sends, as it sends it."""
    sent: list[str] = []

    def note(_connection: object, _cursor: object, statement: str, *_: object) -> None:
        sent.append(statement)

    engine = get_engine()
    event.listen(engine, "before_cursor_execute", note)
    yield sent
    event.remove(engine, "before_cursor_execute", note)


def _check(probe: Enrolled) -> uuid.UUID:
    """The identity ``authenticate`` finds for ``probe``'s credential (401: ``HTTPException``)."""
    found = asyncio.run(authenticate(("probe",), bearer_credential(f"Bearer {probe.credential}")))
    return found.id


def _refused(probe: Enrolled) -> bool:
    try:
        _check(probe)
    except HTTPException as error:
        assert error.status_code == 401
        return True
    return False


def _sql(database_url: str, statement: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        cursor = connection.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def _within(condition: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_missed_credential_is_checked_against_the_copy_and_a_revocation_still_refused(
    client: httpx.Client, enroll_token: str, database_url: str, listening: None, statements: list[str]
) -> None:
    first, second = enroll_probe(client, enroll_token), enroll_probe(client, enroll_token)
    assert _check(first) == uuid.UUID(first.id)
    assert len(statements) == 1 and "FROM probes" in statements[0]  # the whole kind, in one statement
    assert DIRECTORY.copies["probe"].rows is not None and uuid.UUID(second.id) in DIRECTORY.copies["probe"].rows
    del statements[:]
    assert _check(second) == uuid.UUID(second.id)
    dependencies.clear_credential_caches()  # as if its five minutes were over: a miss of the cache
    assert _check(first) == uuid.UUID(first.id)
    assert statements == []  # both answered from the copy

    # A wrong secret is refused from the copy as from the database.
    assert _refused(Enrolled(first.id, f"{first.id}.{'x' * 43}"))

    # Enrolled after the copy was read: looked up alone once, then in the copy.
    late = enroll_probe(client, enroll_token)
    assert _check(late) == uuid.UUID(late.id) and len(statements) == 1
    dependencies.clear_credential_caches()
    assert _check(late) == uuid.UUID(late.id) and len(statements) == 1

    # Revoked (the trigger notifies): refused at once, the others still answered from the copy.
    _sql(database_url, "UPDATE probes SET revoked_at = now() WHERE id = %s", second.id)
    assert _within(lambda: _refused(second)), "the revocation was never heard"
    del statements[:]
    assert _check(first) == uuid.UUID(first.id) and statements == []

    # A notification that names no row drops the whole copy: read again at the next miss.
    _sql(database_url, "NOTIFY iwscope_credentials, 'probes:not-a-uuid'")
    assert _within(lambda: DIRECTORY.copies["probe"].rows is None)
    assert _check(first) == uuid.UUID(first.id)
    assert len(statements) == 1 and "FROM probes" in statements[0]


def test_without_the_listener_every_miss_reads_the_database(
    client: httpx.Client, enroll_token: str, listening: None, statements: list[str]
) -> None:
    probe = enroll_probe(client, enroll_token)
    assert _check(probe) == uuid.UUID(probe.id)  # the copy is read
    dependencies.stop_credential_listener()  # no longer told of changes: neither cache nor copy is trusted
    assert DIRECTORY.copies["probe"].rows is None
    del statements[:]
    for _ in range(2):
        assert _check(probe) == uuid.UUID(probe.id)
    # The row alone each time (the short cache keeps it 5 s: the second check is the cache's).
    assert len(statements) == 1 and "WHERE probes.id" in statements[0], statements
    assert DIRECTORY.copies["probe"].rows is None
