"""Incremental roll-up refresh: equals a full recomputation, idempotent, safe concurrently, run by Celery."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from iwscope.analysis import Filters, compare_by, rebuild_rollups, refresh_rollups, reset_rollups
from iwscope.analysis.rollups import rollup_snapshot

from .datasets import UTC, add_path, add_probe, add_random_trials, add_trial, delete_committed, new_campaign_id

T0 = dt.datetime(2026, 2, 1, tzinfo=UTC)


def _join_later(session: Session, trial_ids: list[uuid.UUID], joined_at: dt.datetime) -> None:
    """What the join task does: fill the server columns of trials received earlier."""
    session.execute(
        text("""
        UPDATE trials SET server_latency_us = total_us - 5000, server_total_retrans = 1, server_bytes_retrans = 1448,
                          server_bytes_sent = 20000, joined_at = :joined_at
        WHERE trial_id = ANY(:ids) AND joined_at IS NULL"""),
        {"ids": trial_ids, "joined_at": joined_at},
    )


def _snapshot(session: Session, campaign_ids: set[int | None]) -> dict:
    wanted = {0 if c is None else c for c in campaign_ids}
    return {key: value for key, value in rollup_snapshot(session).items() if key[0] in wanted}


def test_incremental_equals_full_recomputation_and_twice_changes_nothing(db_session: Session) -> None:
    rng = random.Random(6)
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    probes = [add_probe(db_session, region) for region in ("africa", "europe", "asia")]
    for probe in probes:
        add_path(db_session, probe, origin, rng.uniform(10, 400), rng.choice([500_000, 5_000_000]), 0.01)
    reset_rollups(db_session)

    # phase 1: 400 trials, 300 already joined, 100 waiting for their observation
    t1 = T0 + dt.timedelta(days=4)
    joined_first = add_random_trials(db_session, rng, campaign_id, probes, origin, 300, t1, joined=True)
    waiting = add_random_trials(db_session, rng, campaign_id, probes, origin, 100, t1, joined=False)
    first = refresh_rollups(db_session, upto=t1 + dt.timedelta(minutes=5))
    assert first.client_trials >= 400 and first.server_trials >= 300
    # phase 2: the 100 are joined, 250 new trials arrive (some joined at once)
    t2 = t1 + dt.timedelta(hours=1)
    _join_later(db_session, waiting, t2)
    add_random_trials(db_session, rng, campaign_id, probes, origin, 150, t2, joined=True)
    add_random_trials(db_session, rng, campaign_id, probes, origin, 100, t2, joined=False)
    second = refresh_rollups(db_session, upto=t2 + dt.timedelta(minutes=5))
    assert second.client_trials >= 250 and second.server_trials >= 250
    incremental = _snapshot(db_session, {campaign_id, None})
    assert sum(row["n_trials"] for row in incremental.values()) >= 650
    served = compare_by(db_session, Filters(campaign_ids=(campaign_id,)), "size")

    # refreshing again folds nothing and changes nothing
    third = refresh_rollups(db_session, upto=t2 + dt.timedelta(minutes=5))
    assert (third.client_trials, third.server_trials, third.keys_updated) == (0, 0, 0)
    assert _snapshot(db_session, {campaign_id, None}) == incremental

    rebuild_rollups(db_session, upto=t2 + dt.timedelta(minutes=5))
    full = _snapshot(db_session, {campaign_id, None})
    assert full == incremental
    assert compare_by(db_session, Filters(campaign_ids=(campaign_id,)), "size") == served
    assert len(joined_first) == 300


def test_rows_inside_the_safety_margin_wait_for_the_next_refresh(db_session: Session) -> None:
    campaign_id = new_campaign_id()
    probe = add_probe(db_session, "europe")
    reset_rollups(db_session)
    now = db_session.execute(text("SELECT clock_timestamp()")).scalar_one()
    add_trial(
        db_session,
        campaign_id=campaign_id,
        probe_id=probe,
        origin_id=None,
        iw=3,
        server_ms=100,
        received_at=now + dt.timedelta(seconds=30),
        joined_at=now + dt.timedelta(seconds=30),
    )
    db_session.flush()
    refresh_rollups(db_session)
    assert _snapshot(db_session, {campaign_id}) == {}
    refresh_rollups(db_session, margin=dt.timedelta(seconds=-60))  # as if a minute had passed
    day_row, month_row = sorted(_snapshot(db_session, {campaign_id}).values(), key=lambda row: row["grain"])
    assert (day_row["n_trials"], day_row["server_n"], day_row["client_n"]) == (1, 1, 1)
    assert {key: value for key, value in month_row.items() if key not in ("day", "grain")} == {
        key: value for key, value in day_row.items() if key not in ("day", "grain")
    }


@pytest.fixture
def committed_engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url, poolclass=pool.NullPool)
    yield engine
    engine.dispose()


def test_concurrent_refreshes_fold_each_trial_once(committed_engine: Engine) -> None:
    campaign_id = new_campaign_id()
    rng = random.Random(9)
    with Session(committed_engine) as session, session.begin():
        recent = session.execute(text("SELECT now()")).scalar_one()  # as the ingest path stamps them
        probes = [add_probe(session, "africa"), add_probe(session, "europe")]
        add_random_trials(
            session,
            rng,
            campaign_id,
            probes,
            uuid.uuid4(),
            300,
            recent,
            joined=True,
            without_campaign=0.0,
            join_delay=dt.timedelta(0),
        )
    try:
        time.sleep(1.2)  # past the refresh's safety margin
        errors: list[BaseException] = []

        def run() -> None:
            try:
                with Session(committed_engine) as session, session.begin():
                    refresh_rollups(session)
            except BaseException as error:  # reported by the assertion below
                errors.append(error)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors
        with Session(committed_engine) as session:
            totals = session.execute(
                text("""
                SELECT sum(n_trials), sum(server_n) + sum(n_errors) FROM analysis_rollups
                WHERE campaign_id = :c AND grain = 0"""),
                {"c": campaign_id},
            ).one()
            raw = session.execute(
                text("""
                SELECT count(*), count(*) FROM trials WHERE campaign_id = :c"""),
                {"c": campaign_id},
            ).one()
        assert tuple(totals) == tuple(raw) == (300, 300)
    finally:
        delete_committed(committed_engine, campaign_id, probes)


def test_refresh_task_on_a_real_celery_worker(committed_engine: Engine, celery_worker) -> None:
    """Trials stamped now are inside the safety margin: the task folds them in its follow-up run."""
    campaign_id = new_campaign_id()
    with Session(committed_engine) as session, session.begin():
        now = session.execute(text("SELECT now()")).scalar_one()  # as the ingest path and the join stamp them
        probe = add_probe(session, "africa")
        for latency in (900.0, 1000.0, 1100.0):
            add_trial(
                session,
                campaign_id=campaign_id,
                probe_id=probe,
                origin_id=None,
                iw=3,
                server_ms=latency,
                started_at=now,
                received_at=now,
                joined_at=now,
            )
        add_trial(
            session,
            campaign_id=campaign_id,
            probe_id=probe,
            origin_id=None,
            iw=10,
            server_ms=700.0,
            started_at=now,
            received_at=now,
            joined_at=now,
        )

    def rows() -> list[tuple[int, int, int, int]]:
        with Session(committed_engine) as session:
            return [
                tuple(row)
                for row in session.execute(
                    text("""
                SELECT arm_iw, n_trials, server_n, server_sum_us FROM analysis_rollups WHERE campaign_id = :c
                AND grain = 0 ORDER BY arm_iw"""),
                    {"c": campaign_id},
                )
            ]

    try:
        outcome = celery_worker.send("iwscope.analysis.tasks.refresh_rollups", timeout=120)
        assert isinstance(outcome, dict) and outcome["skipped"] is False
        deadline = time.monotonic() + 60
        while not rows() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert rows() == [(3, 3, 3, 3_000_000), (10, 1, 1, 700_000)], celery_worker.log()[-3000:]
        with Session(committed_engine) as session:
            (result,) = compare_by(session, Filters(campaign_ids=(campaign_id,)), "region")
            assert result.baseline.mean_ms == pytest.approx(1000.0) and result.treatment.mean_ms == pytest.approx(700.0)
        again = celery_worker.send("iwscope.analysis.tasks.refresh_rollups", timeout=120)
        assert isinstance(again, dict) and again["skipped"] is False
        assert rows() == [(3, 3, 3, 3_000_000), (10, 1, 1, 700_000)]
    finally:
        delete_committed(committed_engine, campaign_id, [probe])


def _by_signature(session: Session, campaign_ids: set[int]) -> dict:
    """The per-path roll-ups summed under each path's stored signature: what the bucket roll-ups'
    sums must hold, exactly (size bounds and timestamps aside); ``stored`` are the bucket rows
    with their histograms, ``stored_sums`` without them (the per-path rows keep no histograms)."""
    from iwscope.analysis.rollups import BUCKET_TABLE

    signature_of = {
        (row.probe_id, row.origin_id): int(row.signature_id)
        for row in session.execute(text("SELECT * FROM analysis_path_signatures"))
    }
    expected: dict = {}
    for key, row in rollup_snapshot(session).items():
        if key[0] not in campaign_ids:
            continue
        bucket_key = (key[0], signature_of[(key[1], key[2])], *key[3:])
        into = expected.setdefault(bucket_key, {})
        for name, value in row.items():
            if name in {"campaign_id", "probe_id", "origin_id", "arm_iw", "size_bucket", "day", "grain", "size_min", "size_max"}:
                continue
            into[name] = (
                [a + b for a, b in zip(into[name], value, strict=True)]
                if isinstance(value, list) and name in into
                else (into.get(name, 0) + value if not isinstance(value, list) else list(value))
            )
    stored = {
        key: {
            name: value
            for name, value in row.items()
            if name not in {"campaign_id", "signature_id", "arm_iw", "size_bucket", "day", "grain", "size_min", "size_max"}
        }
        for key, row in rollup_snapshot(session, BUCKET_TABLE).items()
        if key[0] in campaign_ids
    }
    sums_only = {key: {name: value for name, value in row.items() if not name.endswith("_hist")} for key, row in stored.items()}
    return {"expected": expected, "stored": stored, "stored_sums": sums_only}


def test_bucket_rollups_follow_a_path_that_changes_bucket(db_session: Session) -> None:
    """The bucket roll-ups hold exactly the per-path roll-ups summed by signature; when a path's
    estimate crosses a bucket edge, its trials (old and new) move to the new bucket, and the
    result equals a rebuild from the raw trials."""
    from iwscope.analysis.rollups import BUCKET_TABLE, rebucket

    rng = random.Random(11)
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    probes = [add_probe(db_session, region) for region in ("africa", "europe")]
    add_path(db_session, probes[0], origin, 30.0, 5_000_000, 0.0)  # RTT bucket (20, 50]
    add_path(db_session, probes[1], origin, 150.0, 5_000_000, 0.0)  # RTT bucket (100, 200]
    reset_rollups(db_session)
    upto = T0 + dt.timedelta(days=4, minutes=5)
    add_random_trials(
        db_session, rng, campaign_id, probes, origin, 300, T0 + dt.timedelta(days=4), joined=True, without_campaign=0.0
    )
    refresh_rollups(db_session, upto=upto)
    sums = _by_signature(db_session, {campaign_id})
    assert sums["stored_sums"] == sums["expected"] and sums["stored"]

    def rtt_counts() -> dict[str, int]:
        return {
            row.bucket: row.baseline.n + row.treatment.n
            for row in compare_by(db_session, Filters(campaign_ids=(campaign_id,), metric="server"), "rtt")
        }

    before = rtt_counts()
    assert set(before) == {"<=50 ms", "<=200 ms"}
    moved_trials = before["<=50 ms"]
    # the first path's estimate moves to 600 ms: its trials leave (20, 50] for (500, 1000]
    db_session.execute(
        text("UPDATE path_estimates SET min_rtt_us = 600000 WHERE probe_id = :p AND origin_id = :o"),
        {"p": probes[0], "o": origin},
    )
    assert rebucket(db_session, [(probes[0], origin), (probes[1], origin)]) == 1
    assert rebucket(db_session, [(probes[0], origin), (probes[1], origin)]) == 0  # nothing moves twice
    after = rtt_counts()
    assert after == {"<=1000 ms": moved_trials, "<=200 ms": before["<=200 ms"]}
    sums = _by_signature(db_session, {campaign_id})
    assert sums["stored_sums"] == sums["expected"]
    incremental = sums["stored"]
    rebuild_rollups(db_session, upto=upto)
    assert _by_signature(db_session, {campaign_id})["stored"] == incremental
    assert rtt_counts() == after
    assert all(row["n_trials"] > 0 for key, row in rollup_snapshot(db_session, BUCKET_TABLE).items() if key[0] == campaign_id)


def test_path_detail_from_raw_trials_equals_the_rollups(db_session: Session) -> None:
    """The per-path rows keep no histograms; a few paths' histograms are read from their raw
    trials (``frames.load_path_detail``).  They must count exactly the trials the roll-ups
    count: the per-path rows' counts and sums per (path, arm, size octave), the bucket rows'
    histograms per signature, for both metrics, the whole history or one UTC day, and nothing
    received after the watermark."""
    import numpy as np

    from iwscope.analysis.frames import load_path_detail
    from iwscope.analysis.rollups import BUCKET_TABLE
    from iwscope.analysis.stats import merge_pieces

    rng = random.Random(5)
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    probes = [add_probe(db_session, region) for region in ("africa", "europe")]
    for probe, rtt in zip(probes, (30.0, 150.0), strict=True):  # different buckets: one path per signature
        add_path(db_session, probe, origin, rtt, 5_000_000, 0.0)
    reset_rollups(db_session)
    received = T0 + dt.timedelta(days=4)
    add_random_trials(db_session, rng, campaign_id, probes, origin, 400, received, joined=True, without_campaign=0.0)
    refresh_rollups(db_session, upto=received + dt.timedelta(minutes=5))
    # received after the watermark: the roll-ups do not hold them yet, so neither may the detail
    add_random_trials(
        db_session, rng, campaign_id, probes, origin, 50, received + dt.timedelta(hours=1), joined=True, without_campaign=0.0
    )
    # trials without an origin (5 %) are counted under the nil UUID: their paths are read too
    pairs = [(probe, origin) for probe in probes] + [(probe, uuid.UUID(int=0)) for probe in probes]
    signature_of = {
        (row.probe_id, row.origin_id): int(row.signature_id)
        for row in db_session.execute(text("SELECT * FROM analysis_path_signatures"))
    }
    paths = rollup_snapshot(db_session)
    buckets = rollup_snapshot(db_session, BUCKET_TABLE)
    one_day = dt.date(2026, 2, 2)
    for metric in ("client", "server"):
        for grain, day_filter in (
            (1, {}),
            (0, {"since": dt.datetime(2026, 2, 2, 6, tzinfo=UTC), "until": dt.datetime(2026, 2, 2, 18, tzinfo=UTC)}),
        ):
            filters = Filters(campaign_ids=(campaign_id,), metric=metric, **day_filter)
            detail = load_path_detail(db_session, filters, (3, 10, 16), pairs)
            assert detail.size > 0
            hists = merge_pieces(
                np.arange(detail.size)[detail.piece_row], detail.piece_lo, detail.piece_len, detail.blob, detail.size
            )
            seen_keys = set()
            for entry in range(detail.size):
                pair = detail.path_ids[int(detail.path[entry])]
                arm, size = int(detail.arm[entry]), int(detail.size_bucket[entry])
                rows = [
                    row
                    for key, row in paths.items()
                    if key[:3] == (campaign_id, *pair)
                    and key[3:5] == (arm, size)
                    and key[6] == grain
                    and (grain == 1 or key[5] == one_day)
                ]
                assert detail.n[entry] == sum(row[f"{metric}_n"] for row in rows), (metric, grain, pair, arm, size)
                assert detail.sum_us[entry] == sum(row[f"{metric}_sum_us"] for row in rows)
                bucket_rows = [
                    row
                    for key, row in buckets.items()
                    if key[:5] == (campaign_id, signature_of[pair], arm, size, key[4])
                    and key[5] == grain
                    and (grain == 1 or key[4] == one_day)
                ]
                expected = np.sum([row[f"{metric}_hist"] for row in bucket_rows], axis=0) if bucket_rows else 0
                assert np.array_equal(hists[entry], expected) and hists[entry].sum() == detail.n[entry]
                seen_keys.add((pair, arm, size))
            expected_keys = {
                ((key[1], key[2]), key[3], key[4])
                for key, row in paths.items()
                if key[0] == campaign_id
                and key[6] == grain
                and (grain == 1 or key[5] == one_day)
                and row["n_trials"] > 0
                and (key[1], key[2]) in pairs
            }
            assert seen_keys == expected_keys
