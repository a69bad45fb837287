"""Time a few analysis functions on ``bench_dashboard.py``'s database and filters, for A/B runs.

Usage (after ``bench_dashboard.py`` built ``iwscope_bench`` and its analysis copy)::

    .venv/bin/python bench/dashboard_calls.py --copy /var/tmp/iwcopy --functions pt_region,size --rounds 1

Each round calls every function on the benchmark's 10 varied filters (the read copy emptied
before each call: a figure's own cost) and prints the milliseconds.  To compare two versions
of the code on a noisy box, alternate them, e.g.
``for i in 1 2 3 4; do for v in new base; do ...checkout v...; python bench/dashboard_calls.py ...; done; done``
and compare the medians over all calls of each (docs/analysis-benchmark.md, 2026-12-02).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import bench_dashboard as bd
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from iwscope.analysis import Filters, compare_by, headline, percentile_table
from iwscope.config import get_settings

FUNCTIONS: dict[str, Callable[[Session, Filters], Any]] = {
    "pt_region": lambda session, filters: percentile_table(session, filters, "region"),
    "pt": lambda session, filters: percentile_table(session, filters),
    "size": lambda session, filters: compare_by(session, filters, "size"),
    "rtt": lambda session, filters: compare_by(session, filters, "rtt"),
    "headline": headline,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", default="iwscope_bench")
    parser.add_argument("--copy", default=None, help="the analysis copy's directory (IWSCOPE_ANALYSIS_COPY_DIR)")
    parser.add_argument("--functions", default="pt_region,size,headline", help=f"comma-separated: {', '.join(FUNCTIONS)}")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--days", type=int, default=90)
    args = parser.parse_args()
    if args.copy:
        os.environ["IWSCOPE_ANALYSIS_COPY_DIR"] = args.copy
        get_settings.cache_clear()
    server = bd.default_stack().database_url.rsplit("/", 1)[0]
    engine = create_engine(f"{server}/{args.database}")
    filters = bd.varied_filters(10, seed=2, days=args.days)
    for name in args.functions.split(","):
        function = FUNCTIONS[name]
        bd.time_calls(engine, function, filters[:1])  # warm-up (imports, plans)
        for _ in range(args.rounds):
            samples = bd.time_calls(engine, function, filters)
            print(name, "median", round(statistics.median(samples)), "max", round(max(samples)), [round(x) for x in samples])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
