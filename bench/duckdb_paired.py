"""The engine comparison in docs/analysis-benchmark.md: DuckDB over Parquet of the raw trials.

The measurement that chose the analysis copy's engine (``iwscope.analysis.pathcopy``, which
made DuckDB a dependency of the collector). Run it against a database that
``bench/bench_dashboard.py`` generated::

    .venv/bin/python bench/duckdb_paired.py [--rollups] postgresql://iwscope:PASSWORD@127.0.0.1:54329/iwscope_bench_6k

It exports the short, plain-arm trials with their path's signature to Parquet (sorted by
``started_at``), then times, 7 times each, the per-path paired sums of IW3 vs IW10 (the same
stratified (path, size octave) arithmetic as ``frames.load_path_stats``) and the histograms by
RTT bucket x arm, over the whole history and over 7 days, and prints the medians.

``--rollups`` instead exports the per-path roll-ups (``analysis_rollups``: month rows for the
whole history, day rows for 7 days) and times the same paired sums over them: what a columnar
copy of the per-path roll-ups would answer, beside ``frames.load_path_stats`` in PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

import duckdb
import psycopg

EXPORT = """COPY (SELECT t.probe_id, t.origin_id, t.arm_iw, t.object_size, t.started_at, t.server_latency_us,
                     t.error_kind IS NOT NULL AS failed, s.rtt_bucket
              FROM trials t JOIN analysis_path_signatures ps USING (probe_id, origin_id)
              JOIN analysis_signatures s ON s.id = ps.signature_id
              WHERE t.role = 'short' AND t.arm IS NULL) TO STDOUT (FORMAT csv, HEADER)"""
PAIRED = """
WITH c AS (
  SELECT probe_id, origin_id, floor(log2(greatest(object_size, 1)))::int AS size_oct,
         count(server_latency_us) FILTER (WHERE arm_iw = 3) AS nb,
         sum(server_latency_us) FILTER (WHERE arm_iw = 3) / 1000.0 AS sb,
         count(server_latency_us) FILTER (WHERE arm_iw = 10) AS nt,
         sum(server_latency_us) FILTER (WHERE arm_iw = 10) / 1000.0 AS st
  FROM t WHERE arm_iw IN (3, 10) AND NOT failed {where} GROUP BY ALL),
w AS (SELECT *, least(nb, nt) AS w FROM c WHERE nb > 0 AND nt > 0)
SELECT probe_id, origin_id, sum(w), sum(w * (sb / nb - st / nt)), sum(w * sb / nb) FROM w GROUP BY ALL"""
ROLLUP_EXPORT = """COPY (SELECT campaign_id, probe_id, origin_id, arm_iw, size_bucket, day, grain, n_trials,
                            server_n, server_sum_us FROM analysis_rollups) TO STDOUT (FORMAT csv, HEADER)"""
ROLLUP_PAIRED = """
WITH c AS (
  SELECT probe_id, origin_id, size_bucket, sum(n_trials::double) AS n_trials,
         sum(server_n::double) FILTER (WHERE arm_iw = 3) AS nb,
         sum(server_sum_us::double) FILTER (WHERE arm_iw = 3) / 1000.0 AS sb,
         sum(server_n::double) FILTER (WHERE arm_iw = 10) AS nt,
         sum(server_sum_us::double) FILTER (WHERE arm_iw = 10) / 1000.0 AS st
  FROM r WHERE {where} GROUP BY ALL),
w AS (SELECT *, CASE WHEN nb > 0 AND nt > 0 THEN least(nb, nt) ELSE 0 END AS w FROM c)
SELECT probe_id, origin_id, sum(n_trials), sum(w), coalesce(sum(w * (sb / nb - st / nt)) FILTER (WHERE w > 0), 0),
       coalesce(sum(w * sb / nb) FILTER (WHERE w > 0), 0)
FROM w GROUP BY ALL"""
HISTOGRAMS = """
SELECT rtt_bucket, arm_iw, floor(ln(greatest(server_latency_us, 10) / 10.0) / ln(1.02))::int AS bin, count(*)
FROM t WHERE arm_iw IN (3, 10) AND NOT failed {where} GROUP BY ALL"""


def _time(con: duckdb.DuckDBPyConnection, label: str, name: str, query: str) -> None:
    times = []
    for _ in range(7):
        started = time.perf_counter()
        rows = con.execute(query).fetchall()
        times.append(time.perf_counter() - started)
    print(
        f"{label:7} {name:22} median {1000 * statistics.median(times):6.0f} ms max {1000 * max(times):6.0f} ms  rows {len(rows)}"
    )


def _load(
    url: str, scratch: str, export: str, span: str, read_csv: str, order: str, view: str
) -> tuple[duckdb.DuckDBPyConnection, Any, Any]:
    """``export`` (a COPY ... TO STDOUT) as Parquet sorted by ``order``, behind the DuckDB view
    ``view``; and ``span``'s (min, max), read from PostgreSQL in the same connection."""
    csv_path, parquet_path = pathlib.Path(scratch) / f"{view}.csv", pathlib.Path(scratch) / f"{view}.parquet"
    with psycopg.connect(url) as connection, connection.cursor() as cursor, csv_path.open("wb") as out:
        with cursor.copy(export) as copy:
            for chunk in copy:
                out.write(chunk)
        first, last = cursor.execute(span).fetchone()
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * FROM {read_csv.format(path=csv_path)} ORDER BY {order}) TO '{parquet_path}' (FORMAT parquet)")
    con.execute(f"CREATE VIEW {view} AS SELECT * FROM read_parquet('{parquet_path}')")
    return con, first, last


def rollups(url: str) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        con, first, last = _load(
            url,
            scratch,
            ROLLUP_EXPORT,
            "SELECT min(day), max(day) FROM analysis_rollups",
            "read_csv('{path}', header = true, types = {{'probe_id': 'UUID', 'origin_id': 'UUID'}})",
            "grain, day",
            "r",
        )
        middle = first + (last - first) / 2
        week = f"grain = 0 AND day >= DATE '{middle.isoformat()}' AND day < DATE '{(middle + dt.timedelta(days=7)).isoformat()}'"
        for label, where in (("all", "grain = 1"), ("7 days", week)):
            _time(con, label, "paired sums per path", ROLLUP_PAIRED.format(where=where))
    return 0


def main(url: str) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        con, first, last = _load(
            url,
            scratch,
            EXPORT,
            "SELECT min(started_at), max(started_at) FROM trials",
            "read_csv_auto('{path}')",
            "started_at",
            "t",
        )
        middle = first + (last - first) / 2
        week = (
            f"AND started_at >= TIMESTAMPTZ '{middle.isoformat()}' "
            f"AND started_at < TIMESTAMPTZ '{(middle + dt.timedelta(days=7)).isoformat()}'"
        )
        for label, where in (("all", ""), ("7 days", week)):
            for name, query in (("paired sums per path", PAIRED), ("histograms rtt x arm", HISTOGRAMS)):
                _time(con, label, name, query.format(where=where))
    return 0


if __name__ == "__main__":
    sys.exit(rollups(sys.argv[2]) if sys.argv[1] == "--rollups" else main(sys.argv[1]))
