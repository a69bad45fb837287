"""The analysis copy (``pathcopy``): the per-path sums read from Parquet by DuckDB equal what
``frames.load_path_stats`` reads from the roll-ups, through a base, deltas, a compaction and a
copy that lags behind the roll-ups; and it steps aside whenever it cannot be trusted."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pathlib
import random
import time
import uuid

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, pool, text
from sqlalchemy.orm import Session

from iwscope.analysis import Filters, pathcopy, refresh_rollups, reset_rollups
from iwscope.analysis.frames import Frame, PathFrame, load_path_detail, load_path_stats, load_probe_totals

from .datasets import UTC, add_path, add_probe, add_random_trials, add_trial, delete_committed, new_campaign_id

START = dt.datetime(2026, 1, 20, tzinfo=UTC)
#: 50 days: whole months (February) and edge days on both sides of them.
SPAN_H = 50 * 24.0


def _rows(frame: PathFrame) -> dict[tuple[uuid.UUID, uuid.UUID, int], tuple[float, ...]]:
    """A frame's entries keyed by path ids (codes differ between readers only in numbering)."""
    regions = [frame.region_names[int(code)] for code in frame.region]
    out = {}
    for i in range(frame.size):
        probe_id, origin_id = frame.path_ids[int(frame.path[i])]
        key = (probe_id, origin_id, int(frame.size_bucket[i]))
        assert key not in out
        out[key] = (
            regions[i],
            int(frame.rtt_bucket[i]),
            int(frame.bandwidth_bucket[i]),
            int(frame.bdp_bucket[i]),
            int(frame.loss_bucket[i]),
            float(frame.n_trials[i]),
            float(frame.n_pairs[i]),
            float(frame.sum_diff_ms[i]),
            float(frame.sum_base_ms[i]),
        )
    return out


def _assert_same(copy: PathFrame | None, expected: PathFrame) -> None:
    assert copy is not None
    got, want = _rows(copy), _rows(expected)
    assert got.keys() == want.keys()
    for key, values in want.items():
        assert got[key][:6] == values[:6], key  # region, buckets, trials: exact
        np.testing.assert_allclose(got[key][6:], values[6:], rtol=1e-9, atol=1e-9, err_msg=str(key))
    # the probe codes group the same paths (the cluster bootstrap's second level)
    probes_of = {tuple(copy.path_ids[int(p)]): int(c) for p, c in zip(copy.path, copy.probe, strict=True)}
    assert len(set(probes_of.values())) == len({probe for probe, _ in probes_of})

    # the percentile intervals' subset order: the copy's keys (from DuckDB) are PostgreSQL's (from the ids)
    def order(frame: PathFrame) -> dict[tuple[object, ...], int]:
        codes = np.unique(frame.path)
        return {
            tuple(frame.path_ids[int(code)]): int(key) for code, key in zip(codes, frame.path_ids.order_keys(codes), strict=True)
        }

    assert order(copy) == order(expected)
    assert len(set(order(copy).values())) == len(order(copy))


def _detail(frame: Frame) -> dict[tuple[object, ...], tuple[object, ...]]:
    """A detail frame's entries by (path ids, arm, size octave): counts, sums, signature and the
    histogram as {bin: count}."""
    counts = np.frombuffer(frame.blob, dtype="<i4")
    histograms: dict[int, dict[int, int]] = {}
    offset = 0
    for row, low, length in zip(frame.piece_row.tolist(), frame.piece_lo.tolist(), frame.piece_len.tolist(), strict=True):
        for index in range(length):
            bins = histograms.setdefault(row, {})
            bins[low + index] = bins.get(low + index, 0) + int(counts[offset + index])
        offset += length
    out: dict[tuple[object, ...], tuple[object, ...]] = {}
    for i in range(frame.size):
        key = (*frame.path_ids[int(frame.path[i])], int(frame.arm[i]), int(frame.size_bucket[i]))
        out[key] = (
            frame.region_names[int(frame.region[i])],
            int(frame.rtt_bucket[i]),
            int(frame.loss_bucket[i]),
            float(frame.n_trials[i]),
            float(frame.n[i]),
            float(frame.sum_us[i]),
            float(frame.sumsq[i]),
            histograms.get(i, {}),
        )
    return out


def _filters(campaign_id: int) -> list[Filters]:
    """Every way a figure narrows the sums: all history, whole months and edge days, edges
    only, sizes, regions, the client metric, another arm pair."""
    one = Filters(campaign_ids=(campaign_id,))
    return [
        one,
        Filters(),
        dataclasses.replace(one, since=dt.datetime(2026, 1, 25, 13, tzinfo=UTC), until=dt.datetime(2026, 3, 3, 2, tzinfo=UTC)),
        dataclasses.replace(one, since=dt.datetime(2026, 2, 3, tzinfo=UTC), until=dt.datetime(2026, 2, 9, tzinfo=UTC)),
        dataclasses.replace(one, since=dt.datetime(2026, 2, 1, tzinfo=UTC)),
        dataclasses.replace(one, size_min=5_000, size_max=70_000),
        dataclasses.replace(one, regions=("europe", "asia")),
        dataclasses.replace(one, metric="client"),
        dataclasses.replace(one, baseline_iw=10, treatment_iw=16),
    ]


def _check_all(session: Session, directory: pathlib.Path, campaign_id: int) -> int:
    """Compares the copy with the roll-ups under every filter, for each read shape; returns
    the entries compared."""
    compared = 0
    for filters in _filters(campaign_id):
        for all_arms, by_size in ((False, False), (False, True), (True, False)):
            expected = load_path_stats(session, filters, all_arms, by_size)
            _assert_same(pathcopy.load_path_stats(session, directory, filters, all_arms, by_size), expected)
            compared += expected.size
    paths = [
        (row[0], row[1])
        for row in session.execute(
            text(
                "SELECT DISTINCT probe_id, COALESCE(origin_id, '00000000-0000-0000-0000-000000000000'::uuid) FROM trials "
                "WHERE campaign_id = :c ORDER BY 1, 2"
            ),
            {"c": campaign_id},
        )
    ]
    for filters in _filters(campaign_id):
        for chosen in (paths, paths[1:3]):
            arms = (filters.baseline_iw, filters.treatment_iw)
            expected_detail = load_path_detail(session, filters, arms, chosen)
            copied = pathcopy.load_path_detail(session, directory, filters, arms, chosen)
            assert copied is not None and expected_detail.size > 0
            got, want = _detail(copied), _detail(expected_detail)
            assert got.keys() == want.keys()
            for key, values in want.items():  # exact but for the sum of squares (float sums)
                assert got[key][:6] == values[:6] and got[key][7] == values[7], key
                assert got[key][6] == pytest.approx(values[6], rel=1e-9), key
    probes = {
        str(row[0])
        for row in session.execute(text("SELECT DISTINCT probe_id FROM trials WHERE campaign_id = :c"), {"c": campaign_id})
    }
    in_days = {
        day: int(count)
        for day, count in session.execute(
            text(
                "SELECT (started_at AT TIME ZONE 'UTC')::date, count(*) FROM trials "
                "WHERE probe_id IN (SELECT probe_id FROM trials WHERE campaign_id = :c) GROUP BY 1"
            ),
            {"c": campaign_id},
        )
    }
    for today in (dt.date(2026, 2, 27), dt.date(2026, 3, 12), dt.date(2030, 1, 8)):
        totals = pathcopy.probe_totals(session, directory, today)
        assert totals is not None
        expected_totals = load_probe_totals(session, today)
        assert {probe: totals.get(probe) for probe in probes} == {probe: expected_totals[probe] for probe in probes}
        # the 7 days ending with today, not the days after it (the trials span 2026-01-20 .. 2026-03-11)
        week = sum(count for day, count in in_days.items() if today - dt.timedelta(days=7) < day <= today)
        assert sum(totals[probe][2] for probe in probes) == week
        assert (week == 0) == (today.year == 2030), (today, week)
    return compared


def _marks(session: Session) -> tuple[dt.datetime, dt.datetime]:
    row = session.execute(text("SELECT received_upto, joined_upto FROM analysis_watermarks WHERE name = 'trials'")).one()
    return row[0], row[1]


@pytest.fixture
def fleet(db_session: Session) -> tuple[int, uuid.UUID, list[uuid.UUID], random.Random]:
    rng = random.Random(15)
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    probes = [add_probe(db_session, region) for region in ("africa", "europe", "asia", "europe", "oceania")]
    for probe in probes[:-1]:  # the last probe's path never gets an estimate
        add_path(db_session, probe, origin, rng.uniform(10, 400), rng.choice([500_000, 5_000_000]), 0.01)
    reset_rollups(db_session)
    return campaign_id, origin, probes, rng


def test_copy_equals_the_rollups_through_base_deltas_lag_and_compaction(
    db_session: Session, fleet: tuple[int, uuid.UUID, list[uuid.UUID], random.Random], tmp_path: pathlib.Path
) -> None:
    campaign_id, origin, probes, rng = fleet
    directory = tmp_path / "copy"
    t1 = START + dt.timedelta(days=60)

    def arrive(at: dt.datetime, count: int) -> list[uuid.UUID]:
        add_random_trials(db_session, rng, campaign_id, probes, origin, count, at, joined=True, start=START, span_hours=SPAN_H)
        waiting = add_random_trials(
            db_session, rng, campaign_id, probes, origin, count // 3, at, joined=False, start=START, span_hours=SPAN_H
        )
        refresh_rollups(db_session, upto=at + dt.timedelta(minutes=1))
        return waiting

    waiting = arrive(t1, 600)
    first = pathcopy.update(db_session, directory)
    assert first.action == "base" and first.rows > 0
    assert pathcopy.update(db_session, directory).action == "current"
    assert _check_all(db_session, directory, campaign_id) > 100

    # a delta: new trials, and the server sides of trials received before the copy was made
    t2 = t1 + dt.timedelta(minutes=3)
    db_session.execute(
        text("""UPDATE trials SET server_latency_us = total_us - 5000, server_total_retrans = 0,
                                                 server_bytes_retrans = 0, server_bytes_sent = 20000, joined_at = :at
                               WHERE trial_id = ANY(:ids)"""),
        {"ids": waiting, "at": t2},
    )
    arrive(t2, 200)
    second = pathcopy.update(db_session, directory)
    assert second.action == "delta" and second.manifest is not None
    assert pathcopy.compact(directory, compact_after=3) is None  # one delta: nothing to merge
    assert len(second.manifest.deltas) == 1
    _check_all(db_session, directory, campaign_id)

    # the copy lags: the reader adds the trials between its watermarks and the roll-ups'
    arrive(t2 + dt.timedelta(minutes=3), 150)
    manifest = pathcopy.read_manifest(directory)
    assert manifest is not None and manifest.received_upto < _marks(db_session)[0]
    _check_all(db_session, directory, campaign_id)

    # two more deltas reach compact_after: merged into one delta (small beside the base)...
    pathcopy.update(db_session, directory)
    arrive(t2 + dt.timedelta(minutes=6), 100)
    pathcopy.update(db_session, directory)
    assert pathcopy.compact(directory, compact_after=3, rebase_share=1e9) == "deltas"
    merged = pathcopy.read_manifest(directory)
    assert merged is not None and len(merged.deltas) == len(merged.hist_deltas) == 1
    _check_all(db_session, directory, campaign_id)
    # ... or, once they are large beside it, with the base into a new one: same sums
    for minutes in (9, 12):  # each arrival after the last refresh's bound, as ingest stamps them
        arrive(t2 + dt.timedelta(minutes=minutes), 50)
        pathcopy.update(db_session, directory)
    assert pathcopy.compact(directory, compact_after=3, rebase_share=0.0) == "base"
    third = pathcopy.read_manifest(directory)
    assert third is not None and third.deltas == third.hist_deltas == ()
    _check_all(db_session, directory, campaign_id)

    # the roll-ups' watermarks move over an empty window: nothing to add, still the same sums
    refresh_rollups(db_session, upto=t2 + dt.timedelta(minutes=15))
    assert pathcopy.read_manifest(directory) == third and _marks(db_session) != (third.received_upto, third.joined_upto)
    _check_all(db_session, directory, campaign_id)


def test_copy_steps_aside_when_it_cannot_be_trusted(
    db_session: Session, fleet: tuple[int, uuid.UUID, list[uuid.UUID], random.Random], tmp_path: pathlib.Path
) -> None:
    campaign_id, origin, probes, rng = fleet
    directory = tmp_path / "copy"
    filters = Filters(campaign_ids=(campaign_id,))
    at = START + dt.timedelta(days=60)
    add_random_trials(db_session, rng, campaign_id, probes, origin, 300, at, joined=True, start=START, span_hours=SPAN_H)
    assert pathcopy.load_path_stats(db_session, directory, filters, False, False) is None  # no copy yet
    refresh_rollups(db_session, upto=at + dt.timedelta(minutes=1))
    assert pathcopy.update(db_session, directory).action == "base"
    assert pathcopy.load_path_stats(db_session, directory, filters, False, False) is not None

    # far behind the roll-ups: PostgreSQL answers
    later = at + pathcopy.MAX_LAG + dt.timedelta(minutes=5)
    add_random_trials(db_session, rng, campaign_id, probes, origin, 20, later, joined=True, start=START, span_hours=SPAN_H)
    refresh_rollups(db_session, upto=later + dt.timedelta(minutes=1))
    assert pathcopy.load_path_stats(db_session, directory, filters, False, False) is None
    assert pathcopy.update(db_session, directory).action == "delta"
    assert pathcopy.load_path_stats(db_session, directory, filters, False, False) is not None

    # the roll-ups are reset (a rebuild under way): the copy is ahead of them, not read
    reset_rollups(db_session)
    assert pathcopy.load_path_stats(db_session, directory, filters, False, False) is None
    assert pathcopy.update(db_session, directory).action == "no-rollups"
    refresh_rollups(db_session, upto=at + dt.timedelta(minutes=1))
    assert pathcopy.update(db_session, directory).action == "ahead"
    assert pathcopy.load_path_stats(db_session, directory, filters, False, False) is None
    refresh_rollups(db_session, upto=later + dt.timedelta(minutes=1))  # caught up again: same trials, same sums
    _check_all(db_session, directory, campaign_id)

    # a copy of another database is never read, and the next update replaces it
    manifest_path = directory / pathcopy.MANIFEST
    raw = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**raw, "database": "elsewhere/1@127.0.0.1:5432"}))
    assert pathcopy.load_path_stats(db_session, directory, filters, False, False) is None
    assert pathcopy.update(db_session, directory).action == "base"
    _check_all(db_session, directory, campaign_id)

    # a path without a stored signature takes its probe's region in both readers
    db_session.execute(text("DELETE FROM analysis_path_signatures WHERE probe_id = :p"), {"p": probes[1]})
    unsigned = pathcopy.load_path_stats(db_session, directory, filters, False, False)
    assert unsigned is not None and "europe" in unsigned.region_names
    _check_all(db_session, directory, campaign_id)

    # a file the manifest names is gone: the reader logs it and reads PostgreSQL
    manifest = pathcopy.read_manifest(directory)
    assert manifest is not None
    (directory / manifest.base).unlink()
    assert pathcopy.load_path_stats(db_session, directory, filters, False, False) is None


def _path_reads(url: str) -> dict[str, float]:
    counts = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("iwscope_analysis_path_reads_total{"):
            counts[line.split('source="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return counts


def test_the_worker_keeps_the_copy_and_the_api_reads_it(
    database_url: str, celery_worker, api_server, service_env: dict[str, str]
) -> None:
    """End to end: committed trials, the worker's refresh task (which updates the copy after its
    commit), the API's paired figure read from the copy -- the same numbers as PostgreSQL's."""
    directory = pathlib.Path(service_env["IWSCOPE_ANALYSIS_COPY_DIR"])
    engine = create_engine(database_url, poolclass=pool.NullPool)
    campaign_id = new_campaign_id()
    with Session(engine) as session, session.begin():
        now = session.execute(text("SELECT now()")).scalar_one()  # as the ingest path stamps them
        probes = [add_probe(session, region) for region in ("africa", "europe")]
        for probe, shift in zip(probes, (0.0, 50.0), strict=True):
            for latency in (900.0, 1000.0, 1100.0):
                add_trial(
                    session,
                    campaign_id=campaign_id,
                    probe_id=probe,
                    origin_id=None,
                    iw=3,
                    server_ms=latency + shift,
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
                server_ms=700.0 + shift,
                started_at=now,
                received_at=now,
                joined_at=now,
            )
    filters = Filters(campaign_ids=(campaign_id,))
    try:
        deadline = time.monotonic() + 90
        manifest = None
        queued = []
        while time.monotonic() < deadline:
            outcome = celery_worker.send("iwscope.analysis.tasks.refresh_rollups", timeout=120)
            queued.append(outcome["analysis_copy_queued"])
            time.sleep(1.0)  # the update the refresh queued (its own task) runs after it
            manifest = pathcopy.read_manifest(directory)
            if manifest is not None and manifest.received_upto >= now and manifest.joined_upto >= now:
                break
            time.sleep(1.0)
        assert manifest is not None and manifest.received_upto >= now, (outcome, celery_worker.log()[-3000:])
        assert any(queued)  # each refresh queues the copy's update (unless one is already queued)
        with Session(engine) as session:
            from_copy = pathcopy.load_path_stats(session, directory, filters, False, False)
            _assert_same(from_copy, load_path_stats(session, filters, False, False))
            assert from_copy is not None and sorted(from_copy.n_pairs.tolist()) == [1.0, 1.0]
        before = _path_reads(api_server.url)
        answer = httpx.get(
            f"{api_server.url}/api/v1/analysis/compare", params={"campaign": str(campaign_id), "dimension": "region"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        by_region = {row["bucket"]: row for row in answer.json()["data"]}
        assert by_region["africa"]["n_pairs"] == by_region["europe"]["n_pairs"] == 1
        assert by_region["europe"]["baseline"]["mean_ms"] == pytest.approx(1050.0)
        # the per-path sums, then each one-path region's histograms (its within-path interval),
        # all from the copy
        after = _path_reads(api_server.url)
        assert after.get("copy", 0.0) == before.get("copy", 0.0) + 3
        assert after.get("postgresql", 0.0) == before.get("postgresql", 0.0)
    finally:
        delete_committed(engine, campaign_id, probes)
        engine.dispose()
