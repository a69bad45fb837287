"""Credential caches emptied by PostgreSQL's notifications (migration 0008, ``auth.invalidation``).

The API here remembers verified credentials for 300 s whether or not it is notified, so a
refusal well within that time can only come from a notification: with the trigger disabled, a revoked
probe is still served from memory (the cache is really used); with it, or after any
notification, the revocation takes effect at once; a listener whose connection is killed
comes back and empties the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import psycopg
import pytest
from testenv import libpq_url
from testkit import Enrolled, enroll_probe, revoke_unnoticed

from iwprobe import wire
from iwscope.auth.invalidation import listener_name

HEARTBEAT = {"version": "notify-test", "spool_backlog": 0, "spool_bytes": 0, "uptime_s": 1.0, "trials_measured": 0}
#: How long the API here trusts a verified credential without asking the database again.
CACHE_S = 300
#: How long a test waits for a refusal: a fifth of the cache time, so a refusal can only have
#: come from a notification, however slowly a loaded machine delivers it.
REFUSAL_WITHIN_S = CACHE_S / 5


@pytest.fixture
def server(joinless_api_factory):
    return joinless_api_factory(IWSCOPE_CREDENTIAL_CACHE_S=str(CACHE_S), IWSCOPE_CREDENTIAL_CACHE_NOTIFIED_S=str(CACHE_S))


def _sql(database_url: str, statement: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        cursor = connection.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def _first_refusal(beat: Callable[[], int], within_s: float) -> list[int]:
    """Heartbeat statuses until the first 401 or ``within_s``."""
    statuses: list[int] = []
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        statuses.append(beat())
        if statuses[-1] == 401:
            break
        time.sleep(0.1)
    return statuses


def _listeners(database_url: str, server) -> int:
    """Listening connections of this API process (not the session's other servers')."""
    return int(
        _sql(
            database_url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", listener_name(server.process.pid)
        )[0][0]
    )


def _heartbeat(client: httpx.Client, probe: Enrolled) -> Callable[[], int]:
    path = wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)
    return lambda: client.post(path, headers=probe.headers, json=HEARTBEAT).status_code


def test_a_notified_revocation_empties_the_long_cache_at_once(server, enroll_token: str, database_url: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        probe = enroll_probe(client, enroll_token)
        beat = _heartbeat(client, probe)
        assert _listeners(database_url, server) == 1  # the API listens once it is ready
        assert beat() == 204  # verified and remembered for 300 s
        revoke_unnoticed(database_url, probe.id)
        time.sleep(1.5)
        assert beat() == 204  # nobody told the API: the cache answers (it is really used)
        # Any notification empties the cache: the revoked row is read again.
        _sql(database_url, "NOTIFY iwscope_credentials, 'probes:test'")
        statuses = _first_refusal(beat, within_s=REFUSAL_WITHIN_S)
        assert statuses[-1] == 401 and set(statuses[:-1]) <= {204}, statuses

        # A revocation with the trigger on: refused at once.
        other = enroll_probe(client, enroll_token)
        other_beat = _heartbeat(client, other)
        assert other_beat() == 204
        _sql(database_url, "UPDATE probes SET revoked_at = now() WHERE id = %s", other.id)
        statuses = _first_refusal(other_beat, within_s=REFUSAL_WITHIN_S)
        assert statuses[-1] == 401, statuses


def test_a_lost_listener_comes_back_and_empties_the_cache(server, enroll_token: str, database_url: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        probe = enroll_probe(client, enroll_token)
        beat = _heartbeat(client, probe)
        assert beat() == 204
        # Revoke unnoticed, then kill the listening connection: its return must not trust the cache.
        revoke_unnoticed(database_url, probe.id)
        assert beat() == 204
        killed = _sql(
            database_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            listener_name(server.process.pid),
        )
        assert killed == [(True,)]
        statuses = _first_refusal(beat, within_s=REFUSAL_WITHIN_S)
        assert statuses[-1] == 401, statuses
        deadline = time.monotonic() + 10
        while _listeners(database_url, server) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _listeners(database_url, server) == 1  # listening again
