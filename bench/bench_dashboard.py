"""Dashboard benchmark: every analysis function on 10^7 generated trials, roll-ups vs raw scans.

Usage (local services running; takes several minutes, mostly generating the trials)::

    .venv/bin/python bench/bench_dashboard.py                # 10^7 trials in database iwscope_bench
    .venv/bin/python bench/bench_dashboard.py --trials 200000 --calls 10 --raw-calls 2   # quick
    .venv/bin/python bench/bench_dashboard.py --reuse         # keep the generated data, re-time only
    .venv/bin/python bench/bench_dashboard.py --reuse --read-cache shared   # the figures sharing their reads, as on a page
    .venv/bin/python bench/bench_dashboard.py --probes 10000 --days 90   # a fleet: 10^4 probes x 2 origins, 90 days

Steps: (1) create the database ``iwscope_bench`` (its own, never ``iwscope``) and migrate it;
(2) generate probes, origins, path estimates and N trials with ``INSERT ... SELECT
generate_series`` (a slow-start latency model with noise, losses and retransmissions);
(3) build the roll-ups with the same incremental refresh the worker runs (not with
``--reuse`` alone), then time ``--refresh-runs`` incremental refreshes of 10^4 new trials,
each rolled back (median reported); (4) call each public analysis function ``--calls``
times with varied filters (campaign, region, size range, time range, arm pair, metric) and
an equivalent raw-scan SQL query over ``trials`` ``--raw-calls`` times with the same filters,
in the same run; (5) print p50/p95 per function, the speed-up, and write
``artifacts/bench_dashboard.json``.

The raw-scan queries compute less than the roll-up path (no bootstrap intervals), so the
speed-up is conservative.  The trial-UUID registry ``trial_ids`` is not filled (it only
matters for ingest idempotency).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import pathlib
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from iwscope.analysis import (
    Filters,
    compare_by,
    filter_options,
    fleet,
    headline,
    latency_cdf,
    latency_vs_iw,
    loss_summary,
    pathcopy,
    percentile_table,
    readcache,
    refresh_rollups,
    region_summary,
    reset_rollups,
)
from iwscope.analysis import buckets as bk
from iwscope.analysis.filters import trial_where
from iwscope.analysis.rollups import paired_trials_sql
from iwscope.config import get_settings
from iwscope.localstack import default_stack

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import testenv  # noqa: E402 -- after the path it needs; the tests' one home for scratch databases

REGIONS = ("africa", "south-america", "europe", "asia", "north-america", "oceania")
#: Typical path RTT (ms), bottleneck (bit/s) and loss per region of the generated probes.
REGION_PATHS = {
    "africa": (350, 1_000_000, 0.03),
    "south-america": (180, 3_000_000, 0.015),
    "europe": (40, 20_000_000, 0.002),
    "asia": (120, 8_000_000, 0.008),
    "north-america": (60, 30_000_000, 0.003),
    "oceania": (200, 10_000_000, 0.005),
}
SIZES = (1_500, 4_000, 9_000, 15_000, 30_000, 60_000, 120_000, 400_000)
ARMS = (3, 10, 16)
START = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
# A span reaching past today has its receipt times squeezed into [START, an hour ago], in the
# trials' order, so the refresh (which never folds rows stamped in the future) folds them all.
#: Days the generated trials span by default (``--days``).
DAYS = 20


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- data generation -------------------------------------------------------------------------


def create_database(server: str, name: str) -> str:
    """A new, migrated database ``name`` on ``server`` (one left by an earlier run is dropped)."""
    testenv.drop_database(name, server_url=f"{server}/postgres")
    return testenv.create_database(name, migrated=True, server_url=f"{server}/postgres")


def generate(engine: Engine, trials: int, probes_per_region: int, seed: int, days: int = DAYS) -> None:
    rng = random.Random(seed)
    with engine.begin() as connection:
        connection.execute(
            text("""
            INSERT INTO campaigns (id, name, origin_ids, arms, sizes, sizes_per_round, repetitions, interval_s,
                                   starts_at, calibrate)
            VALUES (1, 'bench-a', '{}', '{3,10,16}', :sizes, 8, 1, 60, :start, false),
                   (2, 'bench-b', '{}', '{3,10,16}', :sizes, 8, 1, 60, :start, false)"""),
            {"sizes": list(SIZES), "start": START},
        )
        origins = [("bench-origin-eu", "europe"), ("bench-origin-us", "north-america")]
        origin_ids = []
        for name, region in origins:
            origin_ids.append(
                connection.execute(
                    text("""
                INSERT INTO origins (id, name, region, host, arms, version, secret_hash)
                VALUES (gen_random_uuid(), :name, :region, :name, '[]', '1.0.0', 'x') RETURNING id"""),
                    {"name": name, "region": region},
                ).scalar_one()
            )
        connection.execute(
            text("""
            CREATE TABLE bench_paths (k int PRIMARY KEY, probe_id uuid, origin_id uuid, campaign_id bigint,
                                      rtt_us bigint, bps bigint, loss float8)""")
        )
        k = 0
        for region in REGIONS:
            rtt_ms, bps, loss = REGION_PATHS[region]
            for index in range(probes_per_region):
                probe_id = connection.execute(
                    text("""
                    INSERT INTO probes (id, name, region, country, labels, version, secret_hash, last_seen_at,
                                        last_heartbeat)
                    VALUES (gen_random_uuid(), :name, :region, NULL, '{}', '1.0.0', 'x', now(),
                            jsonb_build_object('spool_backlog', :backlog)) RETURNING id"""),
                    {"name": f"bench-{region}-{index}", "region": region, "backlog": rng.randint(0, 50)},
                ).scalar_one()
                for origin_id in origin_ids:
                    path_rtt = rtt_ms * rng.uniform(0.5, 2.0) * 1000
                    path_bps = bps * rng.uniform(0.3, 3.0)
                    path_loss = loss * rng.uniform(0.0, 2.5)
                    connection.execute(
                        text("""
                        INSERT INTO bench_paths VALUES (:k, :probe, :origin, :campaign, :rtt, :bps, :loss)"""),
                        {
                            "k": k,
                            "probe": probe_id,
                            "origin": origin_id,
                            "campaign": 1 + index % 2,
                            "rtt": int(path_rtt),
                            "bps": int(path_bps),
                            "loss": path_loss,
                        },
                    )
                    connection.execute(
                        text("""
                        INSERT INTO path_estimates (probe_id, origin_id, min_rtt_us, bottleneck_bps, bdp_bytes,
                                                    loss_rate, sample_count, updated_at)
                        VALUES (:probe, :origin, :rtt, :bps, :bdp, :loss, 100, now())"""),
                        {
                            "probe": probe_id,
                            "origin": origin_id,
                            "rtt": int(path_rtt),
                            "bps": int(path_bps),
                            "bdp": int(path_bps / 8 * path_rtt / 1e6),
                            "loss": path_loss,
                        },
                    )
                    k += 1
    paths = k
    chunk = 500_000
    received_span = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1) - START
    squeeze = min(1.0, received_span / dt.timedelta(days=days))
    seconds = days * 86400
    insert = text(f"""
        INSERT INTO trials (trial_id, started_at, probe_id, campaign_id, origin_id, round, arm_iw, object_size, url,
                            total_us, bytes_received, http_status, error_kind, syn_retrans, tcp_info, received_at,
                            server_latency_us, server_total_retrans, server_bytes_retrans, server_bytes_sent,
                            joined_at)
        SELECT gen_random_uuid(), s.started_at, p.probe_id, p.campaign_id, p.origin_id, 0, s.arm, s.size, '',
               CASE WHEN s.failed THEN NULL ELSE s.server_us + p.rtt_us + 2000 END,
               CASE WHEN s.failed THEN 0 ELSE s.size END, CASE WHEN s.failed THEN NULL ELSE 200 END,
               CASE WHEN s.failed THEN 'timeout' END, 0, '{{}}'::jsonb,
               CAST(:start AS timestamptz) + (s.started_at - CAST(:start AS timestamptz)) * :squeeze
                   + interval '1 minute',
               CASE WHEN s.failed THEN NULL ELSE s.server_us END, s.retrans, s.retrans * 1448,
               s.size + s.retrans * 1448,
               CAST(:start AS timestamptz) + (s.started_at - CAST(:start AS timestamptz)) * :squeeze
                   + interval '61 seconds'
        FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) AS g(i)
        JOIN bench_paths AS p ON p.k = g.i % {paths}
        CROSS JOIN LATERAL (
            SELECT (ARRAY{list(ARMS)})[1 + (g.i / {paths}) % {len(ARMS)}] AS arm,
                   (ARRAY{list(SIZES)})[1 + (g.i / {paths * len(ARMS)}) % {len(SIZES)}] AS size,
                   CAST(:start AS timestamptz) + make_interval(secs => g.i * {seconds}.0 / :total) AS started_at,
                   random() < 0.01 AS failed, random() AS noise, random() AS lossy
        ) AS a
        CROSS JOIN LATERAL (
            SELECT ceil(a.size / 1448.0) AS segments
        ) AS seg
        CROSS JOIN LATERAL (
            SELECT a.arm, a.size, a.started_at, a.failed,
                   (CASE WHEN a.lossy < p.loss * seg.segments * (1 + a.arm / 20.0) THEN 1 + (a.noise * 2)::int
                         ELSE 0 END) AS retrans,
                   ((ceil(ln(seg.segments / a.arm + 1) / ln(2)) + 1) * p.rtt_us
                     + a.size * 8e6 / p.bps) * (0.85 + 0.3 * a.noise)
                     + CASE WHEN a.lossy < p.loss * seg.segments THEN 1.5 * p.rtt_us ELSE 0 END AS server_us
        ) AS s0
        CROSS JOIN LATERAL (SELECT s0.arm, s0.size, s0.started_at, s0.failed, s0.retrans,
                                   s0.server_us::bigint AS server_us) AS s""")
    for low in range(0, trials, chunk):
        high = min(trials, low + chunk) - 1
        started = time.perf_counter()
        with engine.begin() as connection:
            connection.execute(insert, {"low": low, "high": high, "start": START, "total": trials, "squeeze": squeeze})
        log(f"  trials {high + 1:>10,} / {trials:,}  ({time.perf_counter() - started:.1f} s per {chunk:,})")
    with engine.begin() as connection:
        connection.execute(text("ANALYZE"))


# ---- raw-scan equivalents --------------------------------------------------------------------


def raw_where(filters: Filters, arms: tuple[int, ...] | None) -> tuple[str, dict[str, Any]]:
    """The raw scan's condition: the analysis's exact filters (``trial_where``) on the trials the
    roll-ups hold (``paired_trials_sql``), successful ones, of ``arms``."""
    where, params = trial_where(filters)
    clauses = [where, paired_trials_sql("t"), "t.error_kind IS NULL"]
    if arms:
        clauses.append("t.arm_iw = ANY(:arms)")
        params["arms"] = list(arms)
    return " AND ".join(clauses), params


RAW_FROM = """trials AS t JOIN probes AS p ON p.id = t.probe_id
              LEFT JOIN path_estimates AS pe ON pe.probe_id = t.probe_id AND pe.origin_id = t.origin_id"""
BUCKET_SQL = {
    "rtt": f"width_bucket(pe.min_rtt_us / 1000.0, ARRAY{list(bk.RTT_EDGES_MS)}::float8[])",
    "bandwidth": f"width_bucket(pe.bottleneck_bps::float8, ARRAY{list(bk.BANDWIDTH_EDGES_BPS)}::float8[])",
    "bdp": f"width_bucket(pe.bdp_bytes::float8, ARRAY{list(bk.BDP_EDGES_BYTES)}::float8[])",
    "loss": f"width_bucket(pe.loss_rate, ARRAY{list(bk.LOSS_EDGES)}::float8[])",
    "region": "p.region",
    "size": "width_bucket(t.object_size, ARRAY[" + ",".join(str(2**k) for k in range(40)) + "]::bigint[])",
}


def metric_sql(filters: Filters) -> str:
    return "t.server_latency_us" if filters.metric == "server" else "t.total_us"


def raw_compare(session: Session, filters: Filters, dimension: str) -> list[Any]:
    where, params = raw_where(filters, (filters.baseline_iw, filters.treatment_iw))
    m = metric_sql(filters)
    return session.execute(
        text(f"""
        SELECT {BUCKET_SQL[dimension]} AS bucket, t.arm_iw, count({m}), avg({m}), stddev({m}),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY {m})
        FROM {RAW_FROM} WHERE {where} AND {m} IS NOT NULL GROUP BY 1, 2"""),
        params,
    ).all()


def raw_percentiles(session: Session, filters: Filters, by_region: bool) -> list[Any]:
    where, params = raw_where(filters, (filters.baseline_iw, filters.treatment_iw))
    m = metric_sql(filters)
    group = "p.region" if by_region else "'all'"
    return session.execute(
        text(f"""
        SELECT {group}, t.arm_iw, count({m}), avg({m}),
               percentile_cont(ARRAY[0.5, 0.75, 0.9, 0.99]) WITHIN GROUP (ORDER BY {m}),
               count(*) FILTER (WHERE t.server_total_retrans > 0)::float8 / NULLIF(count(t.server_total_retrans), 0),
               sum(t.server_bytes_retrans)::float8 / NULLIF(sum(t.server_bytes_sent), 0)
        FROM {RAW_FROM} WHERE {where} GROUP BY 1, 2"""),
        params,
    ).all()


def raw_latency_vs_iw(session: Session, filters: Filters) -> list[Any]:
    where, params = raw_where(filters, None)
    m = metric_sql(filters)
    return session.execute(
        text(f"""
        SELECT t.arm_iw, count({m}), avg({m}), stddev({m}), percentile_cont(0.5) WITHIN GROUP (ORDER BY {m})
        FROM {RAW_FROM} WHERE {where} GROUP BY 1"""),
        params,
    ).all()


def raw_cdf(session: Session, filters: Filters) -> list[Any]:
    where, params = raw_where(filters, None)
    m = metric_sql(filters)
    return session.execute(
        text(f"""
        SELECT t.arm_iw, {bk.hist_bin_sql(m)} AS bin, count(*) FROM {RAW_FROM}
        WHERE {where} AND {m} IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2"""),
        params,
    ).all()


def raw_headline(session: Session, filters: Filters) -> list[Any]:
    where, params = raw_where(filters, None)
    m = metric_sql(filters)
    return session.execute(
        text(f"""
        SELECT count(*), count(DISTINCT t.probe_id), count(DISTINCT p.region),
               avg({m}) FILTER (WHERE t.arm_iw = :base), avg({m}) FILTER (WHERE t.arm_iw = :treat),
               count(*) FILTER (WHERE t.arm_iw = :base AND t.server_total_retrans > 0),
               count(*) FILTER (WHERE t.arm_iw = :treat AND t.server_total_retrans > 0)
        FROM {RAW_FROM} WHERE {where}"""),
        {**params, "base": filters.baseline_iw, "treat": filters.treatment_iw},
    ).all()


def raw_regions(session: Session, filters: Filters) -> list[Any]:
    where, params = raw_where(filters, (filters.baseline_iw, filters.treatment_iw))
    m = metric_sql(filters)
    return session.execute(
        text(f"""
        SELECT p.region, t.arm_iw, count({m}), avg({m}) FROM {RAW_FROM} WHERE {where} GROUP BY 1, 2"""),
        params,
    ).all()


def raw_loss(session: Session, filters: Filters) -> list[Any]:
    where, params = raw_where(filters, (filters.baseline_iw, filters.treatment_iw))
    m = metric_sql(filters)
    return session.execute(
        text(f"""
        SELECT {BUCKET_SQL["loss"]}, t.arm_iw, count({m}), avg({m}), percentile_cont(0.5) WITHIN GROUP (ORDER BY {m}),
               count(*) FILTER (WHERE t.server_total_retrans > 0)::float8 / NULLIF(count(t.server_total_retrans), 0)
        FROM {RAW_FROM} WHERE {where} GROUP BY 1, 2"""),
        params,
    ).all()


def raw_fleet(session: Session, filters: Filters) -> list[Any]:
    return session.execute(
        text("""
        SELECT p.id, count(t.trial_id), count(t.error_kind),
               count(t.trial_id) FILTER (WHERE t.started_at > now() - interval '7 days')
        FROM probes AS p LEFT JOIN trials AS t ON t.probe_id = p.id GROUP BY p.id""")
    ).all()


def raw_options(session: Session, filters: Filters) -> list[Any]:
    return session.execute(text("SELECT array_agg(DISTINCT arm_iw), min(object_size), max(object_size) FROM trials")).all()


# ---- timing ----------------------------------------------------------------------------------


def varied_filters(count: int, seed: int, days: int = DAYS) -> list[Filters]:
    rng = random.Random(seed)
    filters = [Filters()]
    while len(filters) < count:
        since = START + dt.timedelta(days=rng.randint(0, max(0, days - 5))) if rng.random() < 0.4 else None
        size_low = rng.choice(SIZES) if rng.random() < 0.3 else None
        filters.append(
            Filters(
                campaign_ids=(rng.choice([1, 2]),) if rng.random() < 0.4 else (),
                since=since,
                until=since + dt.timedelta(days=rng.randint(1, 7)) if since and rng.random() < 0.5 else None,
                regions=tuple(rng.sample(REGIONS, rng.randint(1, 3))) if rng.random() < 0.5 else (),
                size_min=size_low,
                size_max=size_low * 4 if size_low and rng.random() < 0.5 else None,
                baseline_iw=3,
                treatment_iw=rng.choice([10, 10, 16]),
                metric=rng.choice(["server", "server", "client"]),
            )
        )
    return filters


@dataclasses.dataclass
class Case:
    name: str
    rollup: Callable[[Session, Filters], Any]
    raw: Callable[[Session, Filters], Any]


CASES = [
    *(
        Case(
            f"compare_by({dimension})",
            (lambda d: lambda s, f: compare_by(s, f, d))(dimension),
            (lambda d: lambda s, f: raw_compare(s, f, d))(dimension),
        )
        for dimension in ("rtt", "bandwidth", "bdp", "region", "loss", "size")
    ),
    Case("percentile_table()", lambda s, f: percentile_table(s, f), lambda s, f: raw_percentiles(s, f, False)),
    Case("percentile_table(region)", lambda s, f: percentile_table(s, f, "region"), lambda s, f: raw_percentiles(s, f, True)),
    Case("latency_vs_iw", latency_vs_iw, raw_latency_vs_iw),
    Case("latency_cdf", latency_cdf, raw_cdf),
    Case("headline", headline, raw_headline),
    Case("region_summary", region_summary, raw_regions),
    Case("loss_summary", loss_summary, raw_loss),
    Case("fleet", lambda s, f: fleet(s), raw_fleet),
    Case("filter_options", lambda s, f: filter_options(s), raw_options),
]


def p95(samples: list[float]) -> float:
    """The nearest-rank 95th percentile: the ceil(0.95 n)-th smallest (of 10 calls the
    largest, of 20 the 19th; until 2026-11-26 a rounding made it the largest of 20 too)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def time_calls(
    engine: Engine, function: Callable[[Session, Filters], Any], filters: list[Filters], cold: bool = True
) -> list[float]:
    """Milliseconds of each call; ``cold``: the process's copy of recent reads emptied before
    each (``analysis/readcache.py``: the figure's own cost), else kept as a dashboard process
    keeps it (the figures before it, on the same filter sets, may have read what it reads)."""
    samples = []
    for item in filters:
        if cold:
            readcache.READS.clear()
        with Session(engine) as session:
            started = time.perf_counter()
            function(session, item)
            samples.append((time.perf_counter() - started) * 1000.0)
    return samples


def loadavg() -> str:
    try:
        return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def build(engine: Engine, report: dict[str, Any]) -> None:
    """Build the roll-ups from every trial with the worker's refresh, in slices."""
    started = time.perf_counter()
    with Session(engine) as session, session.begin():
        reset_rollups(session)
        low, high = session.execute(text("SELECT min(received_at), max(received_at) FROM trials")).one()
    # in slices of received_at (~10^6 trials each), as a back-fill would: one refresh holds a
    # slice's deltas in memory
    slices = max(1, report["trials"] // 1_000_000)
    folded = 0
    for index in range(1, slices + 1):
        upto = high if index == slices else low + (high - low) * index / slices
        with Session(engine) as session, session.begin():
            result = refresh_rollups(session, upto=upto)
        folded += result.client_trials
    with Session(engine) as session, session.begin():
        result = refresh_rollups(session)  # anything stamped after the slices
    folded += result.client_trials
    report["full_refresh_s"] = time.perf_counter() - started
    log(f"roll-ups built in {report['full_refresh_s']:.1f} s ({slices} slices): {folded:,} trials folded")
    # as autovacuum would before long: only a plain VACUUM sets the visibility map, and without
    # it the covering-index scans read the heap (measured after a VACUUM FULL, which leaves the
    # map unset: the figures 1.5-2x slower)
    started = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for table in ("analysis_rollups", "analysis_bucket_rollups"):
            connection.execute(text(f"VACUUM ANALYZE {table}"))
    report["vacuum_s"] = time.perf_counter() - started
    log(f"vacuumed in {report['vacuum_s']:.1f} s")


def time_incremental_refresh(engine: Engine, report: dict[str, Any], runs: int, copy_dir: pathlib.Path | None = None) -> None:
    """Time ``runs`` incremental refreshes of 10^4 new trials stamped now (the ingest path's
    received_at), each in a transaction rolled back afterwards, so the database is unchanged.

    Each run starts with a VACUUM of ``trials``: a rolled-back run leaves 10^4 dead rows at the
    table's tail, exactly where the next run's window is, and without it the n-th run rechecks
    n x 10^4 rows its BRIN range scan cannot skip (a production tail holds only new trials,
    and autovacuum clears the few rolled-back ingest batches)."""
    seconds = []
    copy_runs: dict[str, list[float]] = {}
    for _ in range(runs):
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM trials"))
        with Session(engine) as session:
            session.execute(
                text("""
                INSERT INTO trials (trial_id, started_at, probe_id, campaign_id, origin_id, round, arm_iw, object_size,
                                    url, total_us, bytes_received, syn_retrans, tcp_info, server_latency_us,
                                    server_total_retrans, server_bytes_retrans, server_bytes_sent, joined_at)
                SELECT gen_random_uuid(), now() - interval '1 hour', p.probe_id, p.campaign_id, p.origin_id, 0,
                       (ARRAY[3, 10, 16])[1 + g % 3], 9000, '', 300000 + g, 9000, 0, '{}', 250000 + g, 0, 0, 9000, now()
                FROM generate_series(1, 10000) AS g
                JOIN bench_paths AS p ON p.k = g % (SELECT count(*) FROM bench_paths)""")
            )
            time.sleep(0.5)  # past the refresh's safety margin, which it is given below
            started = time.perf_counter()
            result = refresh_rollups(session, margin=dt.timedelta(seconds=0.2))
            seconds.append(time.perf_counter() - started)
            if copy_dir is not None:
                _time_copy_behind(session, copy_dir, copy_runs)
            session.rollback()
        log(
            f"incremental refresh of 10^4 new trials: {seconds[-1]:.2f} s: {result.client_trials} client, "
            f"{result.server_trials} server sides"
        )
    report["incremental_refresh_10k_runs_s"] = seconds
    report["incremental_refresh_10k_s"] = statistics.median(seconds) if seconds else None
    if copy_dir is not None:
        report["analysis_copy_after_10k"] = {name: statistics.median(values) for name, values in copy_runs.items()}
        report["analysis_copy_after_10k_runs"] = copy_runs


def _time_copy_behind(session: Session, copy_dir: pathlib.Path, runs: dict[str, list[float]]) -> None:
    """In the refresh's (uncommitted) transaction: the per-path sums read from the analysis copy
    while it lags 10^4 trials behind the roll-ups, then the copy's delta update, then the read
    again; on hard links of the copy, so the copy itself is left as it was."""
    with tempfile.TemporaryDirectory(dir=copy_dir.parent) as scratch:
        shadow = pathlib.Path(scratch) / "copy"
        shutil.copytree(copy_dir, shadow, copy_function=os.link, ignore=shutil.ignore_patterns(".*"))
        for name, step in (
            ("read_behind_s", lambda: pathcopy.load_path_stats(session, shadow, Filters(), False, False)),
            ("delta_update_s", lambda: pathcopy.update(session, shadow)),
            ("read_current_s", lambda: pathcopy.load_path_stats(session, shadow, Filters(), False, False)),
        ):
            started = time.perf_counter()
            outcome = step()
            runs.setdefault(name, []).append(time.perf_counter() - started)
            assert outcome is not None and getattr(outcome, "action", "delta") == "delta", (name, outcome)
        log(
            "analysis copy 10^4 trials behind: read "
            + ", then ".join(f"{name} {values[-1]:.3f} s" for name, values in runs.items())
        )


def build_copy(engine: Engine, copy_dir: pathlib.Path, report: dict[str, Any]) -> None:
    """The analysis copy of the built roll-ups (``pathcopy``), from scratch, timed; first a
    refresh moves the roll-ups' watermarks to now (nothing new to fold), as the worker's
    periodic refresh keeps them in a live collector, so the timed refreshes below leave the
    copy behind by their 10^4 trials only."""
    with Session(engine) as session, session.begin():
        refresh_rollups(session)
    shutil.rmtree(copy_dir, ignore_errors=True)
    started = time.perf_counter()
    with Session(engine) as session, session.begin():
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        result = pathcopy.update(session, copy_dir)
    report["analysis_copy_build_s"] = time.perf_counter() - started
    report["analysis_copy_day_rows"] = result.rows
    report["analysis_copy_bytes"] = sum(path.stat().st_size for path in copy_dir.glob("*.parquet"))
    log(
        f"analysis copy built in {report['analysis_copy_build_s']:.1f} s: {result.rows:,} day rows, "
        f"{report['analysis_copy_bytes'] / 2**20:.1f} MiB of Parquet"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--server",
        default=os.environ.get("IWSCOPE_BENCH_SERVER") or default_stack().database_url.rsplit("/", 1)[0],
        help="PostgreSQL server URL without database (default: local services)",
    )
    parser.add_argument("--database", default="iwscope_bench")
    parser.add_argument("--trials", type=int, default=10_000_000)
    parser.add_argument("--probes-per-region", type=int, default=8)
    parser.add_argument(
        "--probes",
        type=int,
        default=None,
        help="fleet size (overrides --probes-per-region: spread over the 6 regions, 2 origins each)",
    )
    parser.add_argument("--days", type=int, default=DAYS, help="days the generated trials span")
    parser.add_argument("--calls", type=int, default=20, help="roll-up calls per function (varied filters)")
    parser.add_argument(
        "--read-cache",
        choices=("cold", "shared"),
        default="cold",
        help="cold: the process's copy of recent reads emptied before each call (a figure's own cost); "
        "shared: kept across the functions, as a dashboard process keeps it while a page draws its figures",
    )
    parser.add_argument("--raw-calls", type=int, default=3, help="raw-scan calls per function (first filters)")
    parser.add_argument(
        "--reuse", action="store_true", help="keep an existing generated database (migrated to head; add --rebuild to rebuild)"
    )
    parser.add_argument("--rebuild", action="store_true", help="with --reuse: rebuild the roll-ups from the trials")
    parser.add_argument("--generate-only", action="store_true", help="generate the trials, build nothing, time nothing")
    parser.add_argument(
        "--refresh-runs",
        type=int,
        default=3,
        help="incremental refreshes of 10^4 new trials to time (each rolled back; median reported)",
    )
    parser.add_argument(
        "--analysis-copy",
        metavar="DIR",
        type=pathlib.Path,
        default=None,
        help="build the analysis copy (pathcopy) in DIR and time the figures reading it "
        "(IWSCOPE_ANALYSIS_COPY_DIR); without it they read PostgreSQL alone",
    )
    parser.add_argument("--output", default=str(REPO / "artifacts" / "bench_dashboard.json"))
    args = parser.parse_args(argv)
    if args.probes is not None:
        args.probes_per_region = -(-args.probes // len(REGIONS))
    if args.database == "iwscope":
        parser.error("refusing to use the shared database 'iwscope'")
    url = f"{args.server}/{args.database}"
    report: dict[str, Any] = {
        "trials": args.trials,
        "days": args.days,
        "probes": 6 * args.probes_per_region,
        "calls": args.calls,
        "raw_calls": args.raw_calls,
        "read_cache": args.read_cache,
        "loadavg_start": loadavg(),
        "cpus": os.cpu_count(),
    }
    engine = create_engine(url, pool_size=2)
    if not args.reuse:
        log(f"creating {args.database} and generating {args.trials:,} trials")
        engine.dispose()
        create_database(args.server, args.database)
        engine = create_engine(url, pool_size=2)
        started = time.perf_counter()
        generate(engine, args.trials, args.probes_per_region, seed=1, days=args.days)
        report["generate_s"] = time.perf_counter() - started
        log(f"generated in {report['generate_s']:.0f} s")
        if args.generate_only:
            return 0
    else:
        from iwscope import migrate

        migrate.upgrade("head", database_url=url)
    if not args.reuse or args.rebuild:
        build(engine, report)
    if args.analysis_copy is not None:
        build_copy(engine, args.analysis_copy.resolve(), report)
        os.environ["IWSCOPE_ANALYSIS_COPY_DIR"] = str(args.analysis_copy.resolve())
        get_settings.cache_clear()
    report["analysis_copy_dir"] = get_settings().analysis_copy_dir
    time_incremental_refresh(
        engine, report, args.refresh_runs, None if args.analysis_copy is None else args.analysis_copy.resolve()
    )
    with engine.connect() as connection:
        report["rollup_rows"] = connection.execute(text("SELECT count(*) FROM analysis_rollups")).scalar_one()
        report["trials_in_db"] = connection.execute(text("SELECT count(*) FROM trials")).scalar_one()
        report["rollup_bytes"] = connection.execute(text("SELECT pg_total_relation_size('analysis_rollups')")).scalar_one()
        report["bucket_rollup_rows"] = connection.execute(text("SELECT count(*) FROM analysis_bucket_rollups")).scalar_one()
        report["bucket_rollup_bytes"] = connection.execute(
            text("SELECT pg_total_relation_size('analysis_bucket_rollups')")
        ).scalar_one()
        report["signatures"] = connection.execute(text("SELECT count(*) FROM analysis_signatures")).scalar_one()
    log(
        f"{report['trials_in_db']:,} trials, {report['rollup_rows']:,} per-path roll-up rows "
        f"({report['rollup_bytes'] / 2**20:.1f} MiB), {report['bucket_rollup_rows']:,} bucket roll-up rows "
        f"({report['bucket_rollup_bytes'] / 2**20:.1f} MiB) over {report['signatures']:,} path signatures"
    )

    filters = varied_filters(args.calls, seed=2, days=args.days)
    rows = []
    for case in CASES:
        cold = args.read_cache == "cold"
        if cold:
            time_calls(engine, case.rollup, filters[:1])  # warm-up (imports, plans)
        rollup_ms = time_calls(engine, case.rollup, filters, cold=cold)
        raw_ms = time_calls(engine, case.raw, filters[: args.raw_calls]) if args.raw_calls else []
        row = {
            "function": case.name,
            "rollup_p50_ms": statistics.median(rollup_ms),
            "rollup_p95_ms": p95(rollup_ms),
            "rollup_max_ms": max(rollup_ms),
            "raw_p50_ms": statistics.median(raw_ms) if raw_ms else None,
            "raw_p95_ms": p95(raw_ms) if raw_ms else None,
            "raw_samples_ms": raw_ms,
        }
        # speed-up on the same filters: raw calls vs the roll-up calls of those filters
        if raw_ms:
            row["speedup_same_filters"] = statistics.median(raw_ms) / statistics.median(rollup_ms[: len(raw_ms)])
        rows.append(row)
        log(
            f"{case.name:<26} roll-up p50 {row['rollup_p50_ms']:7.1f} ms  p95 {row['rollup_p95_ms']:7.1f} ms"
            + (f" | raw p50 {row['raw_p50_ms']:8.0f} ms -> x{row['speedup_same_filters']:.0f}" if raw_ms else "")
            + f"  (load {loadavg()})"
        )
    report["functions"] = rows
    report["loadavg_end"] = loadavg()
    report["all_under_300ms_p95"] = all(row["rollup_p95_ms"] < 300 for row in rows)
    report["all_20x_faster"] = all(row.get("speedup_same_filters", 0) >= 20 for row in rows)
    output = pathlib.Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, default=str))
    log(
        f"written {output}: p95 < 300 ms everywhere: {report['all_under_300ms_p95']}, "
        f">= 20x everywhere: {report['all_20x_faster']}"
    )
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
