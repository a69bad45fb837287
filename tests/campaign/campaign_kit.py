"""Helpers of the lab campaign tests: the session's API as a lab stack, and SQL reads of it."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from sqlalchemy import text

from iwscope_lab.links import LinkSpec
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host


def session_stack(database_url: str, redis_url: str, api: Any, run_dir: pathlib.Path) -> Stack:
    """A :class:`Stack` over the test session's database, Redis and API process (no dashboard)."""
    return Stack(database_url=database_url, redis_url=redis_url, api_port=api.port, dashboard_port=None, run_dir=run_dir)


def origin_host() -> Host:
    return Host("origin", role="origin", region="lab", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0))


def path_hosts(paths: Mapping[str, tuple[str, float, float, float]]) -> list[Host]:
    """The origin and one probe per ``name -> (region, RTT ms, rate bit/s, loss)``, symmetric links."""
    return [origin_host()] + [
        Host(name, role="probe", region=region, link=LinkSpec.symmetric(rate_bps=rate, rtt_ms=rtt, loss=loss))
        for name, (region, rtt, rate, loss) in paths.items()
    ]


def query_rows(stack: Stack, sql: str, **params: object) -> list[Any]:
    with stack.session() as session:
        return list(session.execute(text(sql), params).all())
