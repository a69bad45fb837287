"""The process's copy of recent roll-up reads (analysis/readcache.py): answered again while the
roll-ups are unchanged, never across a refresh, a path's new signature or an uncommitted write."""

from __future__ import annotations

import datetime as dt
import random
import secrets
import uuid
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from testenv import temporary_database

from iwscope.analysis import Filters, headline, percentile_table, readcache, reads, rebuild_rollups, refresh_rollups
from iwscope.analysis.frames import PathFrame
from iwscope.metrics import ANALYSIS_READ_CACHE

from .datasets import RECEIVED, add_path, add_probe, add_slow_start_pairs, new_campaign_id

CAMPAIGN = new_campaign_id()
ORIGIN = uuid.uuid5(uuid.NAMESPACE_URL, "iwscope-test-readcache-origin")


def _hits() -> float:
    return ANALYSIS_READ_CACHE.labels("hit")._value.get()


def _add_trials(session: Session, probes: list[uuid.UUID], count: int, received: dt.datetime, seed: int) -> None:
    rng = random.Random(seed)
    for probe in probes:
        add_slow_start_pairs(
            session,
            rng,
            campaign_id=CAMPAIGN,
            probe_id=probe,
            origin_id=ORIGIN,
            rtt_ms=80.0,
            pairs=count,
            received_at=received,
            joined_at=received,
        )


@pytest.fixture
def engine() -> Iterator[Engine]:
    """A database of its own: the copy keys on committed roll-ups, which the suite's shared
    database's rolled-back test transactions never have."""
    with temporary_database(f"iwscope_test_readcache_{secrets.token_hex(4)}", migrated=True) as url:
        engine = create_engine(url, poolclass=pool.NullPool)
        with Session(engine) as session:
            probes = [add_probe(session, region) for region in ("africa", "europe") for _ in range(6)]
            for probe in probes:
                add_path(session, probe, ORIGIN, 80.0, 5_000_000, 0.0)
            session.flush()
            _add_trials(session, probes, 3, RECEIVED, seed=1)
            session.flush()
            rebuild_rollups(session, upto=RECEIVED + dt.timedelta(minutes=5))
            session.commit()
        readcache.READS.clear()
        yield engine
        readcache.READS.clear()
        engine.dispose()


def test_reads_are_answered_again_until_the_rollups_change(engine: Engine) -> None:
    filters = Filters(campaign_ids=(CAMPAIGN,))
    with Session(engine) as session:
        first_tables, first_headline = percentile_table(session, filters, "region"), headline(session, filters)
    hits = _hits()
    with Session(engine) as session:
        assert percentile_table(session, filters, "region") == first_tables
        assert headline(session, filters) == first_headline
    assert _hits() >= hits + 4  # both reads of both figures
    # what is kept cannot be changed by a reader, and a reader's frame is its own
    with Session(engine) as session:
        data = reads.read(session, filters)
        with pytest.raises(ValueError):
            data.buckets.n[0] = 0.0
        total = float(data.buckets.n.sum())
        data.buckets.n = np.zeros(data.buckets.size)
        assert float(reads.read(session, filters).buckets.n.sum()) == total > 0

    # a transaction that wrote sees its own roll-ups, and keeps nothing
    with Session(engine) as session:
        probes = [uuid.UUID(str(row[0])) for row in session.execute(text("SELECT id FROM probes ORDER BY id"))]
        later = RECEIVED + dt.timedelta(hours=1)
        _add_trials(session, probes, 2, later, seed=2)
        session.flush()
        refresh_rollups(session, upto=later + dt.timedelta(minutes=5))
        assert readcache.rollups_version(session) is None  # this transaction has written
        hits = _hits()
        uncommitted = headline(session, filters)
        assert _hits() == hits and uncommitted.n_trials == first_headline.n_trials + 2 * 2 * len(probes)
        # rebuilt in the same transaction to the same watermarks (same xmin and marks): still its own
        _add_trials(session, probes[:1], 1, later, seed=3)
        session.flush()
        rebuild_rollups(session, upto=later + dt.timedelta(minutes=5))
        assert headline(session, filters).n_trials == uncommitted.n_trials + 2
        session.rollback()
    with Session(engine) as session:
        assert headline(session, filters) == first_headline  # the rolled-back trials were never kept

    # committed: a new version, new numbers
    with Session(engine) as session:
        _add_trials(session, probes, 2, later, seed=2)
        session.flush()
        refresh_rollups(session, upto=later + dt.timedelta(minutes=5))
        session.commit()
    with Session(engine) as session:
        assert headline(session, filters).n_trials == uncommitted.n_trials


def test_a_paths_new_signature_is_a_new_version(engine: Engine) -> None:
    """A path estimate moves a path to another signature between refreshes (here: the other
    region's): the per-path read is not answered from before."""
    filters = Filters(campaign_ids=(CAMPAIGN,))

    def regions(frame: PathFrame) -> Counter[str]:
        return Counter(frame.region_names[int(code)] for code in frame.region)

    with Session(engine) as session:
        before = regions(reads.read(session, filters).paths)
        version = readcache.rollups_version(session)
    assert before == {"africa": 6, "europe": 6}
    with Session(engine) as session:
        session.execute(
            text("""UPDATE analysis_path_signatures SET updated_at = now(),
                           signature_id = (SELECT id FROM analysis_signatures WHERE region = 'europe' LIMIT 1)
                    WHERE (probe_id, origin_id) = (SELECT ps.probe_id, ps.origin_id FROM analysis_path_signatures AS ps
                                                   JOIN analysis_signatures AS s ON s.id = ps.signature_id
                                                   WHERE s.region = 'africa' LIMIT 1)""")
        )
        session.commit()
    with Session(engine) as session:
        assert readcache.rollups_version(session) != version
        assert regions(reads.read(session, filters).paths) == {"africa": 5, "europe": 7}


def test_the_budget_keeps_the_newest_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = readcache.ReadCache()
    version = ("v",)
    frames = [np.zeros(1000) for _ in range(5)]  # 8 KB each, not dataclasses: 1 KB each counted
    monkeypatch.setattr(readcache, "_budget_bytes", lambda: 3 * 1024)
    for index, frame in enumerate(frames):
        cache.put(version, index, frame)
    assert cache.bytes <= 3 * 1024
    assert cache.get(version, 0) is None and cache.get(version, 4) is not None
    assert cache.get(None, 4) is None and cache.get(("other",), 4) is None
