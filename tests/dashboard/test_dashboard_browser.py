"""The dashboard in a real browser (Debian's Chromium, headless) against a real server process.

Every page loads against the seeded PostgreSQL and shows figures with data points (the page check
of ``iwscope dashboard check-pages``, :mod:`iwscope_dashboard.pagecheck`, page by page); the
figures' numbers are the analysis module's numbers for the same filters; a filter change
updates the figure and the URL; a shared URL restores the filters; screenshots of every page
go to artifacts/screenshots/.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from iwscope.analysis import Filters, compare_by, latency_vs_iw, trials_page
from iwscope_dashboard.pagecheck import HAS_POINTS_JS, PAGES, PageSpec, check_page

REPO = pathlib.Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"

TIMEOUT_MS = 20_000

#: JavaScript: the traces of the plotly graph inside the dcc.Graph with this id (or null).
TRACES_JS = """
(id) => {
    const plot = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!plot || !plot.data) { return null; }
    const values = (a) => a ? Array.from(
        a, (v) => (v === null || v === undefined) ? null : (typeof v === 'number' ? v : String(v))) : [];
    const bars = (e) => e ? {symmetric: e.symmetric, array: values(e.array), arrayminus: values(e.arrayminus)} : null;
    return plot.data.map((t) => ({name: t.name || '', type: t.type || 'scatter',
                                   x: values(t.x || t.lon), y: values(t.y || t.lat), error_y: bars(t.error_y),
                                   text: Array.isArray(t.text) ? values(t.text) : [],
                                   marker_symbol: t.marker && t.marker.symbol ? String(t.marker.symbol) : null,
                                   marker_pattern: t.marker && t.marker.pattern ? String(t.marker.pattern.shape) : null}));
}
"""

#: The seeded study has no cost campaign and no HTTP/3 trials: the Cost and HTTP/3 pages' figures
#: are empty, as they should be (test_dashboard_http3.py adds an HTTP/3 campaign and checks that page).
SEED_EMPTY = frozenset(
    {
        "cost-delay-graph",
        "cost-sweep-graph",
        "cost-bulk-graph",
        "http3-improvement-graph",
        "http3-means-graph",
        "http3-arms-graph",
        "http3-arms-means-graph",
    }
)


def traces(page: Any, graph_id: str) -> list[dict[str, Any]]:
    page.wait_for_function(HAS_POINTS_JS, arg=graph_id, timeout=TIMEOUT_MS)
    return page.evaluate(TRACES_JS, graph_id)


def first_trace_y(page: Any, graph_id: str) -> list[float | None]:
    return traces(page, graph_id)[0]["y"]


def assert_close(actual: Sequence[float | None], expected: Sequence[float | None], tolerance: float = 1e-6) -> None:
    assert len(actual) == len(expected), (actual, expected)
    for got, want in zip(actual, expected, strict=True):
        if want is None or (isinstance(want, float) and math.isnan(want)):
            assert got is None, (actual, expected)
        else:
            assert got is not None and abs(got - want) <= tolerance * max(1.0, abs(want)), (actual, expected)


def screenshot(page: Any, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def wait_for_status(page: Any, prefix: str) -> str:
    page.wait_for_selector(f"#{prefix}-status .iw-status-line", timeout=TIMEOUT_MS)
    return page.inner_text(f"#{prefix}-status")


@pytest.mark.parametrize("spec", [spec for spec in PAGES if not spec.reader], ids=lambda spec: spec.path)
def test_page_loads_with_data(page: Any, dashboard_server: Any, dashboard_db: Any, spec: PageSpec) -> None:
    """Every page but Real users (``test_dashboard_realusers.py``): each figure and table draws data
    -- but the Cost page's, which the seed leaves empty -- then what the page says."""
    counts = {
        count.item: count
        for count in check_page(page, dashboard_server.url, spec, empty_allowed=SEED_EMPTY, timeout_s=TIMEOUT_MS / 1000)
    }
    assert all(count.ok for count in counts.values()), counts
    path = spec.path
    prefix = "overview" if path == "/" else path.strip("/")
    message = wait_for_status(page, prefix)
    if path == "/":
        headline = page.text_content("#overview-headline") or ""
        assert "IW10 vs IW3" in headline and f"{dashboard_db.summary.n_trials:,}" in headline
    elif path == "/latency":
        iw_trace = traces(page, "latency-iw-graph")[0]
        assert iw_trace["x"] == [3, 10, 16] and counts["latency-iw-graph"].points == 3
        assert {t["name"] for t in traces(page, "latency-cdf-graph")} == {"IW3", "IW10", "IW16"}
    elif path == "/regions":
        assert len(traces(page, "regions-map-graph")[0]["x"]) == 5 and counts["regions-map-graph"].points == 5
        page.wait_for_selector("#regions-tables .iw-percentiles", timeout=TIMEOUT_MS)
        groups = page.eval_on_selector_all("#regions-tables .iw-percentiles", "els => els.map(e => e.dataset.group)")
        assert {"africa", "south-america", "europe", "north-america", "asia"} <= set(groups)
        africa = page.inner_text("#regions-tables .iw-percentiles[data-group='africa']")
        for label in ("IW=10", "IW=3", "Impr.", "% Impr.", "Retrans. %", "Increase"):
            assert label in africa
    elif path == "/tls":
        # the seed's flights: 2.4 KB fits IW3 (a tie), 16.4 KB takes IW3 a round more than IW10
        assert traces(page, "tls-means-graph")[0]["x"] == ["<=3 KB", "<=20 KB"]
        assert counts["tls-means-graph"].points == 4  # two arms x two first-flight buckets
        gains = dict(
            zip(traces(page, "tls-improvement-graph")[0]["x"], first_trace_y(page, "tls-improvement-graph"), strict=True)
        )
        assert gains["<=20 KB"] is not None and gains["<=20 KB"] > 50
        assert gains["<=3 KB"] is not None and abs(gains["<=3 KB"]) < 10
        assert "HTTPS handshakes" in message
    elif path == "/http3":
        assert "No HTTP/3 trials match these filters" in message and "10q" in message
    elif path == "/cost":
        assert "No cost campaigns recorded yet" in message
        assert "iwscope lab reproduce --only cost" in page.inner_text("#cost-table")
    elif path == "/wild":
        # cdf-a: IW 10 from every region; small.example: n too small beside a lower bound
        grid = {t["name"]: t for t in traces(page, "wild-census-graph")}
        named = grid["IW named"]
        cells = {(x, y): text for x, y, text in zip(named["x"], named["y"], named["text"], strict=True)}
        assert {text for (_, y), text in cells.items() if y == "https://cdn-a.example/big.bin"} == {"10"}
        assert {text for (_, y), text in cells.items() if y == "https://cdn-b.example/big.bin"} == {"32"}
        assert len([cell for cell in cells if cell[1] == "https://cdn-a.example/big.bin"]) == 6  # 5 regions + all
        small = grid["n too small (largest window proved)"]
        assert set(small["y"]) == {"https://small.example/"} and ">=7" in small["text"]
        page.wait_for_selector("#wild-census td", timeout=TIMEOUT_MS)
        census_table = page.inner_text("#wild-census")
        assert "n too small" in census_table and "100 %" in census_table
        page.wait_for_selector("#wild-check td", timeout=TIMEOUT_MS)
        check_table = page.inner_text("#wild-check")
        assert "mumbai-1" in check_table and "proxy or cache suspected" in check_table
        assert check_table.count("windows as configured") == 7
        assert "3 census targets" in message and "1 with a proxy or cache suspected" in message
    elif path == "/model":
        # the seed's paths follow slow start with 8 % noise: the model's prediction beside each bucket,
        # drawn as a prediction (its own trace and name), and a verdict per path
        names = {t["name"] for t in traces(page, "model-bucket-graph")}
        assert names == {"measured: IW3 - IW10", "model (prediction)"}, names
        predicted = next(t for t in traces(page, "model-bucket-graph") if t["name"] == "model (prediction)")
        assert predicted["marker_symbol"] == "diamond-open" and len(predicted["x"]) >= 3
        assert all(value > 0 for value in predicted["y"])
        page.wait_for_selector("#model-paths td", timeout=TIMEOUT_MS)
        paths_table = page.inner_text("#model-paths")
        assert "model (prediction)" in paths_table and ("agrees" in paths_table or "odd" in paths_table)
        assert "paths in" in message and "simulated connections per arm and path" in message
        # the seed's lab twin of the pilot campaign (tests/study_seed.py: twin 5 % under the measured
        # fit): measured arms as plain bars, every twin number hatched and named a prediction
        twin = {t["name"]: t for t in traces(page, "model-twin-graph")}
        assert set(twin) == {
            "measured: IW3 - IW10",
            "IW10: lab twin (prediction)",
            "measured: IW3 - IW16",
            "IW16: lab twin (prediction)",
            "IW32: lab twin (prediction)",
            "IW32p: lab twin (prediction)",
        }, set(twin)
        assert all(bool(t["marker_pattern"]) == name.endswith("(prediction)") for name, t in twin.items())
        # the what-if arms told apart by their hatches (IW32 and IW32p predict the same here)
        assert twin["IW32: lab twin (prediction)"]["marker_pattern"] != twin["IW32p: lab twin (prediction)"]["marker_pattern"]
        measured_fit, twin_fit = twin["measured: IW3 - IW10"]["y"], twin["IW10: lab twin (prediction)"]["y"]
        assert len(measured_fit) >= 3
        assert_close(twin_fit, [0.95 * value for value in measured_fit])
        page.wait_for_selector("#model-twins td", timeout=TIMEOUT_MS)
        twin_table = page.inner_text("#model-twins")
        assert "IW32: lab twin (prediction)" in twin_table and "measured IW16 (held out)" in twin_table
        assert "IW32p: lab twin (prediction)" in twin_table
        twin_status = page.inner_text("#model-twin-status")
        assert "Lab twin of campaign" in twin_status and "Predictions, not measurements" in twin_status
    elif path == "/probes":
        assert len(traces(page, "probes-graph")[0]["x"]) == 8
        page.wait_for_selector("#probes-table td", timeout=TIMEOUT_MS)
        assert "kampala-1" in page.inner_text("#probes-table")
    elif path == "/trials":
        page.wait_for_selector("#trials-table td", timeout=TIMEOUT_MS)
        assert "trials match" in message
        rows = page.locator("#trials-table tbody tr").count()
        assert rows > 10
    screenshot(page, "overview" if path == "/" else path.strip("/"))
    assert page.problems == []


def test_figure_matches_analysis_and_filter_change_updates_it(page: Any, dashboard_server: Any, study_session: Any) -> None:
    page.goto(dashboard_server.url + "/latency")
    server_medians = first_trace_y(page, "latency-iw-graph")
    expected_server = [s.median_ms for s in sorted(latency_vs_iw(study_session, Filters()), key=lambda s: s.iw) if s.n]
    assert_close(server_medians, expected_server)

    page.get_by_label("client (probe total)").check()
    page.wait_for_function(
        "([id, before]) => { const p = document.querySelector('#' + id + ' .js-plotly-plot');"
        " return p && p.data && JSON.stringify(Array.from(p.data[0].y)) !== JSON.stringify(before); }",
        arg=["latency-iw-graph", server_medians],
        timeout=TIMEOUT_MS,
    )
    client_medians = first_trace_y(page, "latency-iw-graph")
    expected_client = [
        s.median_ms for s in sorted(latency_vs_iw(study_session, Filters(metric="client")), key=lambda s: s.iw) if s.n
    ]
    assert_close(client_medians, expected_client)
    assert all(c > s for c, s in zip(client_medians, server_medians, strict=False))  # the probe also waits for connect + request
    page.wait_for_url("**metric=client**", timeout=TIMEOUT_MS)
    screenshot(page, "latency-client-metric")


def lowest_drawn(trace: dict[str, Any]) -> float | None:
    """The lowest point a trace draws: each y minus its lower error bar."""
    ys = trace.get("y") or []
    error = trace.get("error_y") or {}
    minus = error.get("arrayminus") if error.get("symmetric") is False else error.get("array")
    drawn = [
        y - (minus[i] if minus and i < len(minus) and minus[i] is not None else 0.0) for i, y in enumerate(ys) if y is not None
    ]
    return min(drawn) if drawn else None


@pytest.mark.parametrize(("path", "graph_id"), [("/latency", "latency-iw-graph"), ("/sizes", "sizes-means-graph")])
def test_no_latency_is_drawn_below_zero(page: Any, dashboard_server: Any, path: str, graph_id: str) -> None:
    page.goto(dashboard_server.url + path)
    drawn = [lowest_drawn(trace) for trace in traces(page, graph_id)]
    assert any(value is not None for value in drawn), "the figure has data points"
    assert all(
        trace["error_y"] and (trace["error_y"]["arrayminus"] or trace["error_y"]["array"]) for trace in traces(page, graph_id)
    ), "every trace carries its lower whiskers (else this check could not fail)"
    assert all(value is None or value >= 0 for value in drawn), drawn


def test_shared_url_restores_filters(page: Any, dashboard_server: Any, dashboard_db: Any, study_session: Any) -> None:
    campaign = dashboard_db.summary.campaign_ids["higher-iw"]
    shared = Filters(
        campaign_ids=(campaign,),
        regions=("africa", "south-america"),
        baseline_iw=3,
        treatment_iw=16,
        metric="client",
        size_min=5000,
    )
    query = "&".join(f"{key}={value}" for key, value in shared.to_query().items())
    page.goto(f"{dashboard_server.url}/?{query}")

    expected = sorted(compare_by(study_session, shared, "rtt"), key=lambda c: c.order)
    assert expected, "the seeded data must cover the shared view"
    assert_close(first_trace_y(page, "overview-rtt-graph"), [c.abs_ms for c in expected])
    # The controls show the shared state.
    assert "IW16" in page.inner_text("#overview-filter-treatment")
    assert "IW3" in page.inner_text("#overview-filter-baseline")
    regions_shown = page.inner_text("#overview-filter-region")
    assert "africa" in regions_shown and "south-america" in regions_shown
    assert f"{campaign}: higher-iw" in page.inner_text("#overview-filter-campaign")
    assert page.get_by_label("client (probe total)").is_checked()
    assert page.input_value("#overview-filter-size-min") == "5000"
    # The address bar still holds the same filters after the page wrote them back.
    assert Filters.from_query({k: v[0] for k, v in parse_qs(urlsplit(page.url).query).items()}) == shared
    screenshot(page, "overview-shared-url")

    # Following the navigation keeps the filters.
    page.click("#app-nav >> text=Sizes")
    page.wait_for_url("**/sizes?**", timeout=TIMEOUT_MS)
    traces(page, "sizes-improvement-graph")
    assert "IW16" in page.inner_text("#sizes-filter-treatment")
    expected_sizes = sorted(compare_by(study_session, shared, "size"), key=lambda c: c.order)
    assert_close(first_trace_y(page, "sizes-improvement-graph"), [c.abs_ms for c in expected_sizes])


def test_no_match_shows_an_explanation(page: Any, dashboard_server: Any) -> None:
    page.goto(dashboard_server.url + "/sizes?region=atlantis")
    message = wait_for_status(page, "sizes")
    assert "No trials match these filters" in message
    page.wait_for_selector("#sizes-improvement-graph .js-plotly-plot", timeout=TIMEOUT_MS)
    assert "No trials match" in page.inner_text("#sizes-improvement-graph")
    screenshot(page, "sizes-empty")


def test_an_arm_the_campaign_did_not_run_is_named(page: Any, dashboard_server: Any, dashboard_db: Any) -> None:
    pilot = dashboard_db.summary.campaign_ids["pilot"]  # ran IW3 and IW10 only
    page.goto(f"{dashboard_server.url}/?campaign={pilot}&base=3&treat=16")
    page.wait_for_selector("#overview-status .iw-status-empty", timeout=TIMEOUT_MS)
    assert "No IW16 trial matches these filters" in page.inner_text("#overview-status")
    assert "IW16 vs IW3" in (page.text_content("#overview-headline") or "")


def test_csv_download_streams_the_filtered_trials(page: Any, dashboard_server: Any, study_session: Any) -> None:
    page.goto(dashboard_server.url + "/trials?region=africa")
    page.wait_for_selector("#trials-table td", timeout=TIMEOUT_MS)
    href = page.get_attribute("#trials-download", "href")
    assert href is not None and "region=africa" in href
    response = httpx.get(dashboard_server.url + href, timeout=30.0)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    lines = [line for line in response.text.splitlines() if line]
    _, africa_total = trials_page(study_session, Filters(regions=("africa",)), 1, 0)
    _, everything = trials_page(study_session, Filters(), 1, 0)
    assert 0 < africa_total < everything
    assert len(lines) - 1 == africa_total


def test_the_old_fairness_address_leads_to_the_cost_page(page: Any, dashboard_server: Any) -> None:
    page.goto(dashboard_server.url + "/fairness?region=africa")
    page.wait_for_selector("#fairness-moved-link", timeout=TIMEOUT_MS)
    assert page.get_attribute("#fairness-moved-link", "href") == "/cost?region=africa"
    page.click("#fairness-moved-link")
    page.wait_for_url("**/cost?**region=africa**", timeout=TIMEOUT_MS)
    assert "No cost campaigns recorded yet" in wait_for_status(page, "cost")
    assert "africa" in page.inner_text("#cost-filter-region")
    assert page.problems == []
