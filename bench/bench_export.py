#!/usr/bin/env python3
"""Export benchmark: ``iwscope export --tables trials`` of a large database, time and peak RSS.

Runs the real CLI as a child process (``--runs`` times per format) against ``--database`` on
the local services' server (default ``iwscope_bench_fleet``, the 10^7-trial database that
``bench_dashboard.py --probes 10000 --days 90`` generates) and reports per run the wall time,
the child's CPU (user + system) and its peak resident memory (``ru_maxrss`` from ``wait4``),
the rows and the file's bytes; the box's load average before and after.  The PostgreSQL
backend's own work (the ``COPY``) is not in the child's CPU.  Writes
``bench/results/export-<date>.json`` (``--output``).

    .venv/bin/python bench/bench_export.py [--database iwscope_bench_fleet] [--runs 3] [--formats parquet,csv]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from iwscope.localstack import default_stack

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_once(database_url: str, file_format: str, out_dir: pathlib.Path) -> dict[str, Any]:
    env = {**os.environ, "DATABASE_URL": database_url}
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "iwscope.cli", "export", "--format", file_format, "--tables", "trials", "--out", str(out_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    stdout, stderr = child.stdout.read() if child.stdout else "", child.stderr.read() if child.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"export failed: {stderr[-2000:]}")
    _, rows, size, path = stdout.strip().splitlines()[-1].split("\t")
    return {
        "format": file_format,
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "rows": int(rows) if rows else None,
        "bytes": int(size),
        "path": path,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", default="iwscope_bench_fleet")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--formats", default="parquet,csv")
    parser.add_argument(
        "--output", type=pathlib.Path, default=REPO / "bench" / "results" / f"export-{dt.date.today():%Y%m%d}.json"
    )
    args = parser.parse_args()
    database_url = default_stack().database_url.rsplit("/", 1)[0] + f"/{args.database}"
    report: dict[str, Any] = {
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        "database": args.database,
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "runs": [],
    }
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="iwscope-export-", dir="/var/tmp"))
    try:
        for run in range(args.runs):
            for file_format in args.formats.split(","):
                result = run_once(database_url, file_format, scratch / f"{file_format}-{run}")
                report["runs"].append(result)
                print(json.dumps(result), flush=True)
                shutil.rmtree(scratch / f"{file_format}-{run}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report["load_average_after"] = os.getloadavg()
    for file_format in args.formats.split(","):
        runs = [run for run in report["runs"] if run["format"] == file_format]
        report[f"{file_format}_median"] = {
            key: statistics.median(run[key] for run in runs) for key in ("wall_s", "cpu_s", "peak_rss_mb", "bytes")
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
