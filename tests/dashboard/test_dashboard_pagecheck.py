"""The page check ``make demo`` ends with (``iwscope dashboard check-pages``), against the seeded
test dashboard: every page shows data where the seed has some, and a page that empties fails it."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from iwscope_dashboard.pagecheck import PAGES, check_pages, format_report

#: The seeded study has no cost campaign: the Cost page's figures are empty, as they should be.
SEED_EMPTY = ("cost-delay-graph", "cost-sweep-graph", "cost-bulk-graph")


def test_every_page_of_the_seeded_dashboard_shows_data(dashboard_server: Any) -> None:
    """The command as ``make demo`` runs it: the table on stdout, exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "iwscope.cli", "dashboard", "check-pages", "--url", dashboard_server.url]
        + [argument for graph in SEED_EMPTY for argument in ("--may-be-empty", graph)],
        capture_output=True,
        text=True,
        timeout=600,
        env={key: value for key, value in os.environ.items() if key != "DATABASE_URL"},  # it reads only the pages
    )
    print(done.stdout)  # the table, in the test's captured output
    assert done.returncode == 0, done.stdout + done.stderr
    table = {tuple(line.split()[:3]) for line in done.stdout.splitlines()}
    checked = [item for spec in PAGES if not spec.reader for item in spec.items]
    for spec in PAGES:
        for item in spec.items:
            row = next(row for row in table if row[:2] == (spec.path, item.name))
            if spec.reader:
                assert row[2] == "-"  # no token given: not checked
            elif item.name not in SEED_EMPTY:
                assert int(row[2].replace(",", "")) > 0, row
    assert f"{len(checked)} figures and tables on 10 pages" in done.stdout
    assert "every one that should show data does." in done.stdout
    # what the seed holds, counted as drawn: five regions on the map, IW3/10/16 in Figure 2, two TLS flights
    assert ("/regions", "regions-map-graph", "5") in table
    assert ("/latency", "latency-iw-graph", "3") in table
    assert ("/tls", "tls-means-graph", "4") in table  # two arms x two first-flight buckets


def test_a_page_that_shows_nothing_fails_the_check(dashboard_server: Any, browser: Any) -> None:
    """A regression that empties a page: here filters that match nothing, on two pages."""
    pages = [spec for spec in PAGES if spec.path in ("/sizes", "/regions")]
    report = check_pages(dashboard_server.url, query="region=atlantis", pages=pages, browser=browser, timeout_s=1)
    assert not report.ok
    assert {(count.page, count.item) for count in report.failures} == {
        ("/sizes", "sizes-improvement-graph"),
        ("/sizes", "sizes-means-graph"),
        ("/regions", "regions-map-graph"),
        ("/regions", "regions-tables"),
    }
    assert all(count.points == 0 for count in report.counts)
    text = format_report(report)
    assert "4 empty where data was expected: /sizes sizes-improvement-graph" in text and "EMPTY" in text
    # The same pages with the data: nothing to report.
    assert check_pages(dashboard_server.url, pages=pages, browser=browser).ok
