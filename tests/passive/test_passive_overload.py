"""An overloaded collector answers a passive batch as it answers the others: 503 + ``Retry-After``,
nothing of the refused batch stored, the same batch accepted once the database is free; and the
front door counts the servers' traffic as agent traffic."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from passive_kit import count_rows, enroll_server, make_aggregate, make_passive_batch, running_campaign
from sqlalchemy.engine import Engine
from testenv import libpq_url

from iwprobe import wire
from iwscope.admission import is_probe_traffic

#: One database connection, turned away after 0.4 s (as tests/collector/test_collector_db_overload.py).
TINY_POOL = {
    "IWSCOPE_DB_POOL_SIZE": "1",
    "IWSCOPE_DB_MAX_OVERFLOW": "0",
    "IWSCOPE_DB_POOL_TIMEOUT_S": "0.4",
    "IWSCOPE_RETRY_AFTER_S": "1",
}


def test_a_busy_database_is_a_503_and_nothing_of_the_batch_is_stored(
    api_server_factory: Callable[..., Any], server_token: str, admin_token: str, database_url: str, db_engine: Engine
) -> None:
    api = api_server_factory(**TINY_POOL)
    with httpx.Client(base_url=api.url, timeout=60) as client:
        server = enroll_server(client, server_token)
        campaign = running_campaign(client, admin_token, [server.id])
        first = make_passive_batch(server.id, [make_aggregate(server.id, campaign["id"])])
        second = make_passive_batch(server.id, [make_aggregate(server.id, campaign["id"])])
        assert client.get(wire.SERVER_CONFIG_PATH.format(server_id=server.id), headers=server.headers).status_code == 200
        locker = psycopg.connect(libpq_url(database_url))
        try:
            locker.execute("LOCK TABLE passive_aggregates IN ACCESS EXCLUSIVE MODE")
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                # The first upload takes the only slot and waits on the lock ...
                held = pool.submit(client.post, wire.PASSIVE_BATCH_PATH, json=first, headers=server.headers)
                time.sleep(1.0)
                # ... so the second finds no connection free within 0.4 s.
                busy = client.post(wire.PASSIVE_BATCH_PATH, json=second, headers=server.headers)
                assert busy.status_code == 503, busy.text
                assert busy.headers["Retry-After"] == "1" and busy.json()["retry_after_s"] == 1
                assert busy.json()["detail"].startswith("collector overloaded")
                locker.rollback()
                assert held.result(timeout=30).status_code == 200
        finally:
            locker.close()
        assert count_rows(db_engine, server.id) == (1, 0)
        again = client.post(wire.PASSIVE_BATCH_PATH, json=second, headers=server.headers)
        assert (again.status_code, again.json()["accepted"]) == (200, 1)
        assert count_rows(db_engine, server.id) == (2, 0)


def test_the_servers_traffic_is_agent_traffic_at_the_front_door() -> None:
    """Uploads, configurations and enrollment of servers may use every place of the admission
    limit, as probes' do; listings and the read API only the others' share."""
    assert is_probe_traffic("POST", wire.PASSIVE_BATCH_PATH)
    assert is_probe_traffic("GET", wire.SERVER_CONFIG_PATH.format(server_id="x"))
    assert is_probe_traffic("POST", wire.SERVER_ENROLL_PATH)
    for method, path in (
        ("GET", "/api/v1/servers"),
        ("GET", "/api/v1/passive/aggregates.parquet"),
        ("GET", wire.PASSIVE_BATCH_PATH),
    ):
        assert not is_probe_traffic(method, path), (method, path)
