"""Time every page's data callback body against a database: ``python -m iwscope_dashboard.timing``.

Runs each function of :data:`iwscope_dashboard.pagedata.PAGE_DATA` (the same code the Dash
callbacks run, minus figure building) ``--repeat`` times after one warm-up call, and prints
p50 / p95 / max in milliseconds per page as JSON lines. Figure building is timed separately
(``figure_ms``) so slow plotting would show too.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from iwscope.analysis import Filters
from iwscope_dashboard import figures
from iwscope_dashboard.db import resolve_database_url
from iwscope_dashboard.pagedata import PAGE_DATA


def _figures_for(page: str, data: Any, filters: Filters) -> None:
    """Build the page's figures from its data (what the callback does after reading)."""
    if page.startswith("overview-") and page != "overview-headline" and data:
        figures.improvement_figure(data, page.removeprefix("overview-")).to_plotly_json()
    elif page == "latency-iw" and data:
        figures.latency_vs_iw_figure(data).to_plotly_json()
    elif page == "latency-cdf" and data:
        figures.cdf_figure(data, (filters.baseline_iw, filters.treatment_iw)).to_plotly_json()
    elif page == "sizes" and data:
        figures.improvement_figure(data, "size").to_plotly_json()
        figures.arm_means_figure(data, "size").to_plotly_json()
    elif page == "regions-map" and data:
        figures.region_map_figure(data).to_plotly_json()
    elif page == "loss" and data:
        figures.improvement_figure([b.comparison for b in data], "loss").to_plotly_json()
        figures.loss_retrans_figure(data).to_plotly_json()
    elif page == "probes" and data:
        figures.fleet_figure(data).to_plotly_json()


def time_page(
    session: Session, page: str, function: Callable[[Session, Filters], Any], filters: Filters, repeat: int
) -> dict[str, Any]:
    function(session, filters)  # warm-up (connection, plans, caches)
    data_ms: list[float] = []
    figure_ms: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        data = function(session, filters)
        read = time.perf_counter()
        _figures_for(page, data, filters)
        data_ms.append((read - started) * 1000.0)
        figure_ms.append((time.perf_counter() - read) * 1000.0)
        session.rollback()
    return {
        "page": page,
        "repeat": repeat,
        "data_p50_ms": round(float(np.percentile(data_ms, 50)), 2),
        "data_p95_ms": round(float(np.percentile(data_ms, 95)), 2),
        "data_max_ms": round(max(data_ms), 2),
        "figure_p95_ms": round(float(np.percentile(figure_ms, 95)), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="default: $DATABASE_URL")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--query", default="", help="filters as a URL query string, e.g. 'region=africa&treat=16'")
    parser.add_argument("--pages", default=",".join(PAGE_DATA), help="comma-separated page prefixes")
    arguments = parser.parse_args(argv)
    from urllib.parse import parse_qsl

    filters = Filters.from_query(dict(parse_qsl(arguments.query)))
    engine = create_engine(resolve_database_url(arguments.database_url), pool_pre_ping=True)
    try:
        with Session(engine) as session:
            for page in [p for p in arguments.pages.split(",") if p]:
                if page not in PAGE_DATA:
                    parser.error(f"unknown page {page!r}; pages: {', '.join(PAGE_DATA)}")
                print(json.dumps(time_page(session, page, PAGE_DATA[page], filters, arguments.repeat)), flush=True)
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
