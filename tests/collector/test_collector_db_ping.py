"""The pool pings a connection before handing it out only when it sat idle (``iwscope.db``):
no round trip for a connection used a moment ago, and a connection that died while idle
(its backend terminated, as by a server restart) is replaced before any statement sees it."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from iwscope import db


def test_a_connection_idle_past_the_limit_is_pinged_and_replaced_when_dead(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = db.make_engine(database_url, pool_size=1, ping_after_idle_s=0.3)
    pings: list[float] = []
    real_ping = engine.dialect.do_ping

    def counted(dbapi_connection: object) -> bool:
        pings.append(time.monotonic())
        return real_ping(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    try:
        with engine.connect() as connection:
            first_pid = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as connection:  # used a moment ago: handed out without a ping
            assert connection.execute(text("SELECT pg_backend_pid()")).scalar_one() == first_pid
        assert pings == []
        time.sleep(0.4)
        with engine.connect() as connection:  # idle past the limit: pinged, alive, kept
            assert connection.execute(text("SELECT pg_backend_pid()")).scalar_one() == first_pid
        assert len(pings) == 1
        killer = db.make_engine(database_url, pool_size=1)
        with killer.connect() as other:
            assert other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first_pid}).scalar_one()
        killer.dispose()
        time.sleep(0.4)
        with engine.connect() as connection:  # died while idle: the ping fails, a new one serves
            second_pid = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
        assert second_pid != first_pid and len(pings) >= 2
    finally:
        engine.dispose()
