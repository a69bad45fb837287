"""Helpers of the lab campaign tests: the session's API as a lab stack, and SQL reads of it."""

from __future__ import annotations

import pathlib
from typing import Any

from sqlalchemy import text

from iwscope_lab.links import LinkSpec
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host


def session_stack(database_url: str, redis_url: str, api: Any, run_dir: pathlib.Path) -> Stack:
    """A :class:`Stack` over the test session's database, Redis and API process (no dashboard)."""
    return Stack(database_url=database_url, redis_url=redis_url, api_port=api.port, dashboard_port=None,
                 run_dir=run_dir)


def origin_host() -> Host:
    return Host("origin", role="origin", region="lab", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0))


def query_rows(stack: Stack, sql: str, **params: object) -> list[Any]:
    with stack.session() as session:
        return list(session.execute(text(sql), params).all())
