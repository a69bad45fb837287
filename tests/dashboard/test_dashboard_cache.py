"""The short-lived cache of roll-up results (in process, against the seeded database)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.orm import Session

from iwscope.analysis import Filters, Headline, headline
from iwscope_dashboard import db
from iwscope_dashboard.pagekit import configure_cache, query

calls: list[Filters] = []


def counted_headline(session: Session, filters: Filters) -> Headline:
    calls.append(filters)
    return headline(session, filters)


@pytest.fixture
def configured(dashboard_db: Any) -> Iterator[None]:
    db.configure(dashboard_db.url)
    calls.clear()
    yield
    configure_cache(0)
    db.engine().dispose()


def test_roll_up_results_are_reused_per_filters_until_they_expire(configured: None) -> None:
    configure_cache(0.5)
    first = query(counted_headline, Filters(), cache=True)
    assert query(counted_headline, Filters(), cache=True) == first
    assert len(calls) == 1
    client = query(counted_headline, Filters(metric="client"), cache=True)
    assert len(calls) == 2 and client.abs_ms != first.abs_ms
    query(counted_headline, Filters(), cache=False)  # raw reads bypass it
    assert len(calls) == 3
    time.sleep(0.6)
    assert query(counted_headline, Filters(), cache=True) == first
    assert len(calls) == 4


def test_zero_seconds_turns_the_cache_off(configured: None) -> None:
    configure_cache(0)
    query(counted_headline, Filters(), cache=True)
    query(counted_headline, Filters(), cache=True)
    assert len(calls) == 2
