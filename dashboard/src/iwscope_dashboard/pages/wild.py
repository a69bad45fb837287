"""IW in the wild: the census of servers iwscope does not run, and the probes' own check of the
windows iwscope's origins applied."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, dash_table, html

from iwscope.analysis import CensusTarget, IwAnswer, PathIwCheck
from iwscope_dashboard.censusfigures import census_figure, census_series_figure
from iwscope_dashboard.figures import empty_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import WildData, wild_data
from iwscope_dashboard.pagekit import Nothing, graph, page_filters, page_frame, read, status

dash.register_page(__name__, path="/wild", name="IW in the wild", title="iwscope: IW in the wild", order=5.5)

PREFIX = "wild"
NO_CENSUS = (
    "No census records match these filters. A census campaign measures the IW of any HTTP(S) server: "
    "iwscope campaigns create --census-url https://example.org/large-object ... (probes run as root)."
)

TABLE_STYLE: dict[str, Any] = {
    "style_table": {"overflowX": "auto"},
    "style_cell": {
        "fontFamily": "inherit",
        "fontSize": "13px",
        "padding": "4px 8px",
        "textAlign": "left",
        "whiteSpace": "normal",
        "height": "auto",
    },
    "style_header": {"fontWeight": "600", "backgroundColor": "#f3f5f7"},
}


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "IW in the wild",
        "Which initial window do real servers use? Census campaigns have probes fetch the first 256 KB of "
        "any HTTP(S) URL over a few fresh connections, capture the packets and count the segments the "
        "server sent before an ACK could have released more (announcing a smaller MSS when the object or "
        "the TLS handshake ends inside the window). A target's IW is the value most of its determined "
        "records agree on, with that share's 95 % interval; under 3 determined records it is 'n too "
        "small'. Below: the same inference on iwscope's own origins, against the window the origin's "
        "TCP_INFO had at accept (the arm, or 1 after a retransmitted SYN-ACK).",
        filters_from_page_query(url_query),
        [
            graph(f"{PREFIX}-census-graph"),
            html.Div(html.Div(id=f"{PREFIX}-census-table"), className="iw-card"),
            graph(f"{PREFIX}-series-graph"),
            html.H2("Client-side check of iwscope's origins", className="iw-subtitle"),
            html.Div(html.Div(id=f"{PREFIX}-check-table"), className="iw-card"),
        ],
    )


#: What a lower bound's reason means for the reader (the inference's reasons, iwprobe._iwinfer).
BOUND_REASONS = {
    "receive_window": "cut by the probe's receive window (the server's IW may be larger)",
    "object_ended": "the object ended inside the window",
    "bottleneck": "a bottleneck spread the flight",
    "loss": "a loss inside the flight",
    "paused": "the server paused inside the flight",
    "client_data": "the probe sent data inside the flight",
}


def _iw_text(answer: IwAnswer) -> str:
    if answer.iw_segments is not None:
        return str(answer.iw_segments)
    if answer.max_lower_bound is not None:
        why = BOUND_REASONS.get(answer.max_lower_bound_reason, "")
        return f">= {answer.max_lower_bound}{', ' + why if why else ''} (n too small)"
    return "n too small"


def _share_text(share: float | None, low: float | None, high: float | None) -> str:
    if share is None:
        return "n too small"
    bounds = f" [{100 * low:.0f}, {100 * high:.0f}]" if low is not None and high is not None else ""
    return f"{100 * share:.0f} %{bounds}"


def census_rows(targets: list[CensusTarget]) -> list[dict[str, Any]]:
    return [
        {
            "url": target.url,
            "protocol": PROTOCOL_NAMES.get(target.protocol, target.protocol),
            "iw": _iw_text(target.overall),
            "share": _share_text(target.overall.share, target.overall.share_ci_low, target.overall.share_ci_high),
            "values": ", ".join(f"{iw} x{n}" for iw, n in target.overall.values.items()) or "-",
            "mss": target.overall.mss,
            "records": target.overall.records,
            "ok": target.overall.ok,
            "probes": target.probes,
            "regions": "; ".join(f"{region}: {_iw_text(answer)}" for region, answer in target.by_region.items()),
            "reasons": ", ".join(f"{reason} x{n}" for reason, n in target.overall.reasons.items()) or "-",
            "last": target.last_measured_at.strftime("%Y-%m-%d %H:%M"),
        }
        for target in targets
    ]


#: The census table's protocol column (wire v9: HTTP/3's window counts packets, its MSS column
#: is the datagram size).
PROTOCOL_NAMES = {"tcp": "TCP", "quic": "HTTP/3"}

CENSUS_COLUMNS = [
    ("url", "target"),
    ("protocol", "protocol"),
    ("iw", "IW (segments; HTTP/3: packets)"),
    ("share", "agree % [95 % CI]"),
    ("values", "values seen"),
    ("mss", "MSS (HTTP/3: datagram)"),
    ("records", "records"),
    ("ok", "determined"),
    ("probes", "probes"),
    ("regions", "per region"),
    ("reasons", "not determined because"),
    ("last", "last measured (UTC)"),
]


def check_rows(checks: list[PathIwCheck]) -> list[dict[str, Any]]:
    return [
        {
            "probe": check.probe_name,
            "region": check.region,
            "origin": (check.origin_id or "-")[:8],
            "inferred": check.inferred,
            "agree": check.agree,
            "disagree": check.disagree,
            "share": _share_text(check.disagree_share, check.disagree_ci_low, check.disagree_ci_high),
            "instead": "-" if check.seen_instead is None else check.seen_instead,
            "origin_had_arm": check.disagree_origin_had_arm,
            "origin_not_arm": check.origin_not_arm,
            "verdict": (
                "n too small"
                if check.suspect is None
                else "proxy or cache suspected"
                if check.suspect
                else "windows as configured"
            ),
            "arms": ", ".join(f"IW{arm}: {decided - wrong}/{decided}" for arm, (decided, wrong) in check.by_arm.items()),
            "receive_window": ", ".join(
                f"IW{arm}: {limited}/{inferred}" for arm, (inferred, limited) in check.receive_window_by_arm.items()
            ),
        }
        for check in checks
    ]


CHECK_COLUMNS = [
    ("probe", "probe"),
    ("region", "region"),
    ("origin", "origin"),
    ("inferred", "trials inferred"),
    ("agree", "agree"),
    ("disagree", "disagree"),
    ("share", "disagree % [95 % CI]"),
    ("instead", "IW seen instead"),
    ("origin_had_arm", "...while the origin had the arm"),
    ("origin_not_arm", "origin's own window not the arm"),
    ("arms", "agree per arm"),
    ("receive_window", "cut by the probe's receive window, per arm"),
    ("verdict", "verdict"),
]


def data_table(component_id: str, columns: list[tuple[str, str]], rows: list[dict[str, Any]], empty: str, **extra: Any) -> Any:
    """A sortable table of ``rows`` (``columns``: key, heading), or ``empty`` when there are none;
    ``extra`` goes to the DataTable (e.g. ``style_data_conditional``)."""
    if not rows:
        return html.P(empty, className="iw-empty")
    return dash_table.DataTable(  # type: ignore[attr-defined]
        id=component_id,
        columns=[{"name": label, "id": key} for key, label in columns],
        data=rows,
        sort_action="native",
        page_size=50,
        **TABLE_STYLE,
        **extra,
    )


def _empty(data: WildData) -> bool:
    return not data.targets and not data.checks


@callback(
    Output(f"{PREFIX}-census-graph", "figure"),
    Output(f"{PREFIX}-census-table", "children"),
    Output(f"{PREFIX}-series-graph", "figure"),
    Output(f"{PREFIX}-check-table", "children"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    data = read(wild_data, filters, empty=_empty, empty_message=NO_CENSUS)
    if isinstance(data, Nothing):
        return (empty_figure(data.message), [], empty_figure(data.message), [], data.status_line(), search)
    targets, days, checks = data.targets, data.days, data.checks
    census = census_figure(targets) if targets else empty_figure(NO_CENSUS)
    series = census_series_figure(days) if days else empty_figure(NO_CENSUS)
    suspects = sum(1 for check in checks if check.suspect)
    records = sum(target.overall.records for target in targets)
    named = sum(1 for target in targets if target.overall.iw_segments is not None)
    line = (
        f"{len(targets)} census targets ({named} with an IW named) from {records:,} records; "
        f"{len(checks)} probe-origin paths checked client-side"
        + (f", {suspects} with a proxy or cache suspected." if suspects else ".")
    )
    return (
        census,
        data_table(f"{PREFIX}-census", CENSUS_COLUMNS, census_rows(targets), NO_CENSUS),
        series,
        data_table(
            f"{PREFIX}-check",
            CHECK_COLUMNS,
            check_rows(checks),
            "No trial carries a client-side inference yet (probes infer when they run as root, wire v5).",
        ),
        status(line, "info" if targets or checks else "empty"),
        search,
    )


register_url_sync(PREFIX)
