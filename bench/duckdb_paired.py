"""The engine comparison in docs/analysis-benchmark.md: DuckDB over Parquet of the raw trials.

DuckDB is not a dependency of iwscope; run this with an interpreter that has both ``duckdb`` and
``psycopg`` (e.g. ``python -m venv /tmp/duckenv && /tmp/duckenv/bin/pip install duckdb numpy
'psycopg[binary]'``) against a database that ``bench/bench_dashboard.py`` generated::

    /tmp/duckenv/bin/python bench/duckdb_paired.py postgresql://iwscope:PASSWORD@127.0.0.1:54329/iwscope_bench_6k

It exports the short, plain-arm trials with their path's signature to Parquet (sorted by
``started_at``), then times, 7 times each, the per-path paired sums of IW3 vs IW10 (the same
stratified (path, size octave) arithmetic as ``frames.load_path_stats``) and the histograms by
RTT bucket x arm, over the whole history and over 7 days, and prints the medians.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import statistics
import sys
import tempfile
import time

import duckdb  # type: ignore[import-not-found]
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
HISTOGRAMS = """
SELECT rtt_bucket, arm_iw, floor(ln(greatest(server_latency_us, 10) / 10.0) / ln(1.02))::int AS bin, count(*)
FROM t WHERE arm_iw IN (3, 10) AND NOT failed {where} GROUP BY ALL"""


def main(url: str) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        csv_path, parquet_path = pathlib.Path(scratch) / "trials.csv", pathlib.Path(scratch) / "trials.parquet"
        with psycopg.connect(url) as connection, connection.cursor() as cursor, csv_path.open("wb") as out:
            with cursor.copy(EXPORT) as copy:
                for chunk in copy:
                    out.write(chunk)
            first, last = cursor.execute("SELECT min(started_at), max(started_at) FROM trials").fetchone()
        con = duckdb.connect()
        con.execute(f"COPY (SELECT * FROM read_csv_auto('{csv_path}') ORDER BY started_at) TO '{parquet_path}' "
                    "(FORMAT parquet)")
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{parquet_path}')")
        middle = first + (last - first) / 2
        week = (f"AND started_at >= TIMESTAMPTZ '{middle.isoformat()}' "
                f"AND started_at < TIMESTAMPTZ '{(middle + dt.timedelta(days=7)).isoformat()}'")
        for label, where in (("all", ""), ("7 days", week)):
            for name, query in (("paired sums per path", PAIRED), ("histograms rtt x arm", HISTOGRAMS)):
                times = []
                for _ in range(7):
                    started = time.perf_counter()
                    rows = con.execute(query.format(where=where)).fetchall()
                    times.append(time.perf_counter() - started)
                print(f"{label:7} {name:22} median {1000 * statistics.median(times):6.0f} ms "
                      f"max {1000 * max(times):6.0f} ms  rows {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
