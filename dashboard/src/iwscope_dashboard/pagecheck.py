"""Does every page show data?  Opens each page of a running dashboard in headless Chromium, counts
the data points each figure draws (and the rows of the tables that stand for a page's data), and
says which figures are empty where data was expected (or not on their page at all).

``iwscope dashboard check-pages --url URL`` prints the table page -> figure -> points and exits
non-zero when an expected figure is empty or a figure is missing; ``make demo`` runs
:func:`check_pages` as its last step, and the test suite runs it against the seeded test
dashboard.  In code::

    report = check_pages("http://127.0.0.1:8750/", read_token=token)
    print(format_report(report)); assert report.ok

A figure's points are the points its traces draw: per trace, the x (or longitude) values whose y
(or latitude) is not missing -- an empty figure (:func:`~iwscope_dashboard.figures.empty_figure`,
"No trials match ...") has none.  The browser is Debian's Chromium driven by Playwright (the
``test`` extra), as in the suite; never a downloaded one.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from iwscope_dashboard.access import protected_path

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


@dataclass(frozen=True)
class Item:
    """One thing on a page that holds data: a figure (``dcc.Graph`` id) or a table (CSS selector of
    its data rows or blocks)."""

    name: str
    kind: Literal["figure", "table"] = "figure"
    #: A table's rows (``kind="table"``); a figure is found by its id.
    selector: str = ""


@dataclass(frozen=True)
class PageSpec:
    path: str
    items: tuple[Item, ...]

    @property
    def reader(self) -> bool:
        """Needs a read token (a page behind :func:`~iwscope_dashboard.access.protected_path`: the
        Real users page); skipped without one."""
        return protected_path(self.path)


def _figures(*names: str) -> tuple[Item, ...]:
    return tuple(Item(name) for name in names)


#: Every page of the navigation (``app.NAVIGATION``) and what it draws.
PAGES: tuple[PageSpec, ...] = (
    PageSpec("/", _figures("overview-rtt-graph", "overview-bandwidth-graph", "overview-bdp-graph")),
    PageSpec("/latency", _figures("latency-iw-graph", "latency-cdf-graph")),
    PageSpec("/sizes", _figures("sizes-improvement-graph", "sizes-means-graph")),
    PageSpec(
        "/regions",
        (
            Item("regions-map-graph"),
            # the percentile tables per region (the "all" table is there, empty, even when nothing matches)
            Item("regions-tables", "table", "#regions-tables .iw-percentiles:not([data-group='all'])"),
        ),
    ),
    PageSpec("/loss", _figures("loss-improvement-graph", "loss-retrans-graph")),
    PageSpec("/tls", _figures("tls-improvement-graph", "tls-means-graph")),
    PageSpec("/http3", _figures("http3-improvement-graph", "http3-means-graph", "http3-arms-graph", "http3-arms-means-graph")),
    PageSpec("/cost", _figures("cost-delay-graph", "cost-sweep-graph", "cost-bulk-graph")),
    PageSpec("/wild", _figures("wild-census-graph", "wild-series-graph")),
    PageSpec("/model", _figures("model-bucket-graph", "model-path-graph", "model-twin-graph")),
    PageSpec(
        "/real-users",
        _figures(
            "realusers-rtt-graph",
            "realusers-bandwidth-graph",
            "realusers-bdp-graph",
            "realusers-days-graph",
            "realusers-sweep-graph",
        ),
    ),
    PageSpec("/probes", _figures("probes-graph")),
    PageSpec("/trials", (Item("trials-table", "table", "#trials-table tbody tr:has(td)"),)),
)

#: The Trials page's inspector of one traced trial (``/trials?trial=<id>``): its time-sequence
#: plot, points per packet drawn.  Checked when :func:`check_pages` is given a trial.
INSPECTOR = PageSpec("/trials", (Item("trials-inspector-graph"),))

#: What ``make demo`` does not fill, by design: its competing-flow phases run no interactive flow
#: and no share sweep (the full cost experiment, ``iwscope lab reproduce --only cost``, does), and
#: it runs no lab twin (``iwscope lab twin --campaign N`` after it does: 5 minutes more).
DEMO_EMPTY: frozenset[str] = frozenset({"cost-delay-graph", "cost-sweep-graph", "model-twin-graph"})

#: JavaScript: the figure's data points, or -1 while it is not drawn yet (or not on the page).
_POINTS_JS = """
(id) => {
    const plot = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!plot || !plot.data) { return -1; }
    const present = (v) => v !== null && v !== undefined && !(typeof v === 'number' && isNaN(v));
    let points = 0;
    for (const trace of plot.data) {
        let xs = trace.x || trace.lon || trace.labels || null;
        const ys = trace.y || trace.lat || trace.values || null;
        if (!xs && ys) { xs = ys; }
        if (!xs) { continue; }
        xs = Array.from(xs);
        if (xs.length && Array.isArray(xs[0])) { xs = Array.from(xs[xs.length - 1]); }  // multi-category axis
        const yv = ys ? Array.from(ys) : null;
        for (let i = 0; i < xs.length; i++) {
            if (present(xs[i]) && (!yv || present(yv[i]))) { points++; }
        }
    }
    return points;
}
"""
#: JavaScript: whether the figure draws a data point yet (``page.wait_for_function(HAS_POINTS_JS, arg=id)``).
HAS_POINTS_JS = f"(id) => ({_POINTS_JS.strip()})(id) > 0"
_HAS_ROWS_JS = "(selector) => document.querySelectorAll(selector).length > 0"
#: JavaScript: true once every figure of the page is drawn and no callback is running.
_SETTLED_JS = """
(ids) => ids.every((id) => { const p = document.querySelector('#' + id + ' .js-plotly-plot'); return p && p.data; })
    && !document.querySelector('[data-dash-is-loading="true"]')
"""


class BrowserUnavailable(RuntimeError):
    """:func:`check_pages` could not start headless Chromium (:data:`CHROMIUM` missing or broken)."""


@dataclass(frozen=True)
class Count:
    """What one item showed."""

    page: str
    item: str
    kind: str
    #: Data points (a figure) or rows (a table); ``None``: not checked (a page needing a token).
    points: int | None
    #: Whether data is expected here.
    expected: bool
    note: str = ""
    #: ``False``: no figure of this id was drawn on the page (a stale id, or a page that broke):
    #: a failure whether or not data is expected.
    found: bool = True

    @property
    def ok(self) -> bool:
        return self.found and (not self.expected or (self.points or 0) > 0)


@dataclass
class PageReport:
    """Every item's count, in page order, and what went wrong."""

    url: str
    counts: list[Count] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[Count]:
        """Items that should show data and show none, and figures not found."""
        return [count for count in self.counts if not count.ok]

    @property
    def ok(self) -> bool:
        return not self.failures


def _count(page: Page, item: Item) -> int:
    if item.kind == "table":
        return int(page.locator(item.selector).count())
    return int(page.evaluate(_POINTS_JS, item.name))


def check_page(
    page: Page, url: str, spec: PageSpec, *, query: str = "", empty_allowed: Collection[str] = DEMO_EMPTY, timeout_s: float = 60.0
) -> list[Count]:
    """One page of :func:`check_pages` in the Playwright tab ``page`` (whose context carries any
    credentials the page needs): open it, wait until its callbacks are done, count what each item
    shows.  The tab stays on the page, for checks of the caller's own."""
    expected = {item.name for item in spec.items if item.name not in empty_allowed}
    deadline = time.monotonic() + timeout_s  # ``timeout_s`` is the page's, not each wait's
    timeout_ms = timeout_s * 1000
    search = query if not query or query.startswith("?") else f"?{query}"
    page.goto(url.rstrip("/") + spec.path + search, wait_until="load")
    figures = [item.name for item in spec.items if item.kind == "figure"]
    notes: dict[str, str] = {}
    settled = True
    try:
        page.wait_for_function(_SETTLED_JS, arg=figures, timeout=timeout_ms)
        page.wait_for_load_state("networkidle", timeout=timeout_ms)
    except Exception as error:  # a page that never settles: count what is there, say so
        settled = False
        notes = {name: f"page did not settle: {type(error).__name__}" for name in figures}
    counts: list[Count] = []
    for item in spec.items:
        points = _count(page, item)
        # A figure drawn on a settled page (no callback running, no request for 500 ms) is final;
        # a table may still be filled after the figures, and an unsettled page may catch up.
        late = item.kind == "table" or not settled or points < 0
        if points <= 0 and item.name in expected and late:
            # a late callback (or a table filled after the figures): give it the rest of the time
            test = _HAS_ROWS_JS if item.kind == "table" else HAS_POINTS_JS
            try:
                rest_ms = max(1.0, (deadline - time.monotonic()) * 1000)
                page.wait_for_function(test, arg=item.selector or item.name, timeout=rest_ms)
                points = _count(page, item)
            except Exception:
                pass
        found = points >= 0
        counts.append(
            Count(spec.path, item.name, item.kind, points if found else 0, item.name in expected, notes.get(item.name, ""), found)
        )
    return counts


def check_pages(
    url: str,
    *,
    query: str = "",
    read_token: str | None = None,
    empty_allowed: Collection[str] = DEMO_EMPTY,
    pages: Sequence[PageSpec] = PAGES,
    timeout_s: float = 60.0,
    browser: Browser | None = None,
    trial: str | None = None,
) -> PageReport:
    """Open every page of the dashboard at ``url`` (with the URL ``query``, e.g. ``?campaign=3``)
    and count what each item shows.  Every item is expected to show data except those named in
    ``empty_allowed``; the Real users page is checked with ``read_token`` (a read or admin
    token, sent as ``Authorization: Bearer``) and skipped without one.  ``browser``: a Playwright
    browser to use (default: Debian's Chromium, launched headless for the check).  ``trial``: a
    traced trial's id, whose inspector (:data:`INSPECTOR`) must draw its packets too."""
    inspected = [(spec, "") for spec in pages] + ([(INSPECTOR, f"trial={trial}")] if trial else [])
    if browser is not None:
        return _check_all(browser, url, query, read_token, empty_allowed, inspected, timeout_s)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True)
        except Exception as error:  # Playwright's own Error: its first line says why
            reason = (str(error).strip() or type(error).__name__).splitlines()[0]
            raise BrowserUnavailable(f"headless Chromium ({CHROMIUM}) did not start: {reason}") from error
        try:
            return _check_all(launched, url, query, read_token, empty_allowed, inspected, timeout_s)
        finally:
            launched.close()


def _check_all(
    browser: Browser,
    url: str,
    query: str,
    read_token: str | None,
    empty_allowed: Collection[str],
    pages: Sequence[tuple[PageSpec, str]],
    timeout_s: float,
) -> PageReport:
    """Every (page, its own query) in turn; a page without a query of its own takes ``query``."""
    started = time.monotonic()
    report = PageReport(url.rstrip("/") + "/")
    for spec, own_query in pages:
        if spec.reader and read_token is None:
            report.counts += [
                Count(spec.path, item.name, item.kind, None, False, "skipped: needs a read token") for item in spec.items
            ]
            continue
        headers = {"Authorization": f"Bearer {read_token}"} if spec.reader and read_token else {}
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, extra_http_headers=headers)
        try:
            report.counts += check_page(
                context.new_page(), url, spec, query=own_query or query, empty_allowed=empty_allowed, timeout_s=timeout_s
            )
        finally:
            context.close()
    report.seconds = time.monotonic() - started
    return report


def format_report(report: PageReport) -> str:
    """The table page -> figure -> points, and a verdict line."""
    header = ("page", "figure / table", "points", "expected")  # points: a table's rows
    rows = [
        (
            count.page,
            count.item,
            "-" if count.points is None or not count.found else f"{count.points:,}",
            (count.note if count.points is None else ("data" if count.expected else "may be empty"))
            + ("" if count.ok else "  EMPTY" if count.found else "  NOT FOUND")
            + (f"  ({count.note})" if count.note and count.points is not None else ""),
        )
        for count in report.counts
    ]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(3)]
    lines = [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}".rstrip() for row in [header, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    checked = [count for count in report.counts if count.points is not None]
    pages = len({count.page for count in checked})
    failures = report.failures
    empty = [count for count in failures if count.found]
    missing = [count for count in failures if not count.found]
    problems = [
        f"{len(listed)} {what}: " + ", ".join(f"{count.page} {count.item}" for count in listed)
        for listed, what in ((empty, "empty where data was expected"), (missing, "not found on their page"))
        if listed
    ]
    verdict = f"{len(checked)} figures and tables on {pages} pages of {report.url} in {report.seconds:.0f} s: " + (
        "; ".join(problems) or "every one that should show data does."
    )
    return "\n".join([*lines, verdict])
