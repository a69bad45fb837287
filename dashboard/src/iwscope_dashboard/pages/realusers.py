"""Real users: what operators' own web servers (``iwprobe tap``) measured of their users, split by a
keyed hash of the client prefix into IW arms at the same time (the IETF 78 design of the IW10
authors).

Needs a read (or admin) token: the page and every one of its callbacks answer 401 without one
(:mod:`iwscope_dashboard.access`; sign in at ``/real-users/login``).  Built from
:mod:`iwscope.analysis.passive`: the slides' percentile table per arm with "Impr." and "% Impr.",
retransmissions, the Figure 5 trio, per region, per day, the biased shares and the share sweep.
Every number carries n and its 95 % interval; "n too small" where an arm has too few responses or
clusters.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any
from urllib.parse import urlencode

import dash
import plotly.graph_objects as go
from dash import Input, Output, callback, dcc, html

from iwscope.analysis import (
    PassiveFilters,
    passive_buckets,
    passive_campaigns,
    passive_days,
    passive_filter_options,
    passive_load,
    passive_regions,
    passive_share_sweep,
    passive_summary,
)
from iwscope.analysis.passive_results import (
    PassiveArmBias,
    PassiveArmPercentiles,
    PassiveArmRetrans,
    PassiveCampaign,
    PassiveLoadDay,
    PassiveOptions,
    PassivePercentileTable,
    PassiveShareSweep,
    PassiveSummary,
)
from iwscope.analysis.passive_stats import LATENCY_KEYS, MIN_CLUSTERS, MIN_CONNECTIONS, MIN_RESPONSES, PASSIVE_REPLICATES, Value
from iwscope.wiretypes import NAMED_FAMILIES
from iwscope_dashboard.access import LOGOUT_PATH
from iwscope_dashboard.figures import empty_figure
from iwscope_dashboard.filterbar import register_url_sync
from iwscope_dashboard.pagekit import DataUnavailable, Nothing, graph, query, read, status
from iwscope_dashboard.realusersfigures import Centre, arm_label, buckets_figure, days_figure, sweep_figure

dash.register_page(__name__, path="/real-users", name="Real users", title="iwscope: real users", order=5.7)

PREFIX = "realusers"
DIMENSIONS = ("rtt", "bandwidth", "bdp")
TOO_SMALL = "n too small"
NO_CAMPAIGN = (
    "No passive campaign matches. Real users are measured by `iwprobe tap` on an operator's own web "
    "server: enroll it with a server token, then `iwscope campaigns create --name N --server ID "
    "--passive-arm default:9000 --passive-arm 16:500 --passive-arm 32:500 --duration S`."
)
COLUMN_LABELS = {"avg": "Avg.", "p50": "50", "p75": "75", "p90": "90", "p99": "99"}
LAST_SECOND = time(23, 59, 59)


def ids() -> dict[str, str]:
    return {name: f"{PREFIX}-filter-{name}" for name in ("campaign", "dates", "region", "family", "biased")}


def filter_inputs() -> list[Input]:
    names = ids()
    return [
        Input(names["campaign"], "value"),
        Input(names["dates"], "start_date"),
        Input(names["dates"], "end_date"),
        Input(names["region"], "value"),
        Input(names["family"], "value"),
        Input(names["biased"], "value"),
    ]


def _day(value: Any) -> date | None:
    try:
        return date.fromisoformat(str(value)[:10]) if value else None
    except ValueError:
        return None


def filters_from_values(campaign: Any, start: Any, end: Any, regions: Any, family: Any, biased: Any) -> PassiveFilters:
    """The page's filters from its controls (dates: whole UTC days, both inclusive)."""
    try:
        campaign_id = int(campaign) if campaign not in (None, "") else None
    except (TypeError, ValueError):
        campaign_id = None
    start_day, end_day = _day(start), _day(end)
    names = regions if isinstance(regions, list) else ([regions] if regions else [])
    return PassiveFilters(
        campaign_id=campaign_id if campaign_id is None or campaign_id >= 1 else None,
        regions=tuple(sorted({str(name) for name in names if str(name).strip() and "\x00" not in str(name)})),
        family=family if family in NAMED_FAMILIES else "",
        since=datetime.combine(start_day, time.min, UTC) if start_day else None,
        until=datetime.combine(end_day, LAST_SECOND, UTC) if end_day else None,
        include_biased=biased != "exclude",
    )


def query_string(filters: PassiveFilters) -> str:
    pairs = filters.to_query()
    return "?" + urlencode(pairs, safe=",:") if pairs else ""


def _labelled(label: str, control: Any, wide: bool = True) -> html.Div:
    return html.Div(
        [html.Label(label, className="iw-filter-label"), control], className="iw-filter iw-filter-wide" if wide else "iw-filter"
    )


def filter_bar(filters: PassiveFilters, campaigns: list[PassiveCampaign], options: PassiveOptions | None) -> html.Div:
    names = ids()
    campaign_options = [
        {"label": f"{c.campaign_id}: {c.name} ({c.connections:,} connections)", "value": c.campaign_id} for c in campaigns
    ]
    chosen = filters.campaign_id if filters.campaign_id is not None else (campaigns[0].campaign_id if campaigns else None)
    regions = sorted(set(options.regions if options else []) | set(filters.regions))
    return html.Div(
        [
            _labelled(
                "Passive campaign",
                dcc.Dropdown(
                    id=names["campaign"],
                    options=campaign_options,
                    value=chosen,
                    clearable=False,
                    placeholder="no passive campaign",
                ),
            ),
            _labelled(
                "Time range (UTC days)",
                dcc.DatePickerRange(
                    id=names["dates"],
                    start_date=filters.since.date().isoformat() if filters.since else None,
                    end_date=filters.until.date().isoformat() if filters.until else None,
                    display_format="YYYY-MM-DD",
                    clearable=True,
                    start_date_placeholder_text="from",
                    end_date_placeholder_text="to",
                ),
            ),
            _labelled(
                "Client region",
                dcc.Dropdown(
                    id=names["region"],
                    options=[{"label": region or "unknown", "value": region} for region in regions if region],
                    value=list(filters.regions),
                    multi=True,
                    placeholder="all regions",
                ),
            ),
            _labelled(
                "IP version",
                dcc.RadioItems(
                    id=names["family"],
                    value=filters.family,
                    inline=True,
                    options=[
                        {"label": "all", "value": ""},
                        {"label": "IPv4", "value": "ipv4"},
                        {"label": "IPv6", "value": "ipv6"},
                    ],
                ),
            ),
            _labelled(
                "Biased connections",
                dcc.RadioItems(
                    id=names["biased"],
                    value="include" if filters.include_biased else "exclude",
                    inline=True,
                    options=[{"label": "included", "value": "include"}, {"label": "left out", "value": "exclude"}],
                ),
            ),
            _labelled(
                "Figures show the",
                dcc.RadioItems(
                    id=f"{PREFIX}-centre",
                    value="mean",
                    inline=True,
                    options=[{"label": "mean", "value": "mean"}, {"label": "median", "value": "median"}],
                ),
            ),
            dcc.Store(id=f"{PREFIX}-query"),
            dcc.Store(id=f"{PREFIX}-url-synced"),
        ],
        className="iw-filterbar",
        id=f"{PREFIX}-filterbar",
    )


def _card(title: str, note: str, body_id: str) -> html.Div:
    return html.Div(
        [
            html.H3(title, className="iw-table-title"),
            html.Div(note, className="iw-table-note"),
            dcc.Loading(html.Div(id=body_id, style={"overflowX": "auto"}), delay_show=150),
        ],
        className="iw-card iw-percentiles",
    )


def layout(**url_query: Any) -> html.Div:
    filters = PassiveFilters.from_query({str(key): value for key, value in url_query.items()})
    try:
        campaigns = query(passive_campaigns)
        options = query(passive_filter_options, filters)
    except DataUnavailable:
        campaigns, options = [], None
    return html.Div(
        [
            html.H1("Real users", className="iw-title"),
            html.P(
                [
                    "What operators' own web servers measured of their users (iwprobe tap): client prefixes (/24, /48) are "
                    "split by a keyed hash into IW arms at the same time -- the IETF 78 design of the IW10 authors -- and "
                    "every connection's first-response latency (request in to last byte acknowledged) is measured where it "
                    "ends. Tables in the slides' layout: latency percentiles per arm, Impr. (baseline minus arm, ms) and % "
                    "Impr., with 95 % intervals beneath every number. ",
                    html.Span("Signed in with a read token. ", className="iw-ci"),
                    html.A("Sign out", href=LOGOUT_PATH, id=f"{PREFIX}-logout"),
                ],
                className="iw-intro",
            ),
            filter_bar(filters, campaigns, options),
            html.Div(id=f"{PREFIX}-status", className="iw-status", role="status"),
            _card(
                "First-response latency per arm (ms)",
                "n = connections with a measured first response; [95 % interval]; Impr. = baseline minus arm.",
                f"{PREFIX}-percentiles",
            ),
            html.Div(
                [
                    _card(
                        "Retransmissions",
                        "Retrans. % = retransmitted / sent data segments; conns % = connections with "
                        "any retransmission; Increase = arm minus baseline, percentage points.",
                        f"{PREFIX}-retrans",
                    ),
                    _card(
                        "Biased connections",
                        "Shares of every connection (also when biased connections are left out above).",
                        f"{PREFIX}-biased",
                    ),
                ],
                className="iw-grid-2",
            ),
            html.H2("Improvement by path (the connection's own measurements)", className="iw-subtitle"),
            html.Div([graph(f"{PREFIX}-{dimension}-graph") for dimension in DIMENSIONS], className="iw-grid-3"),
            graph(f"{PREFIX}-days-graph"),
            html.H2("Per client region", className="iw-subtitle"),
            dcc.Loading(html.Div(id=f"{PREFIX}-regions", className="iw-tables"), delay_show=150),
            html.H2("Share sweep: what the untreated users see", className="iw-subtitle"),
            graph(f"{PREFIX}-sweep-graph"),
            _card(
                "Share sweep",
                "The default arm at every treated share the campaign ran (phases pooled per share); "
                "change = this share minus the smallest, from paired cluster resamples.",
                f"{PREFIX}-sweep-table",
            ),
            html.Div(
                [
                    html.H3("How these numbers are made", className="iw-table-title"),
                    footnote(),
                    html.Div(id=f"{PREFIX}-load", className="iw-table-note"),
                ],
                className="iw-card iw-footnote",
                id=f"{PREFIX}-footnote",
            ),
        ],
        className="iw-page",
        id=f"{PREFIX}-page",
    )


def footnote() -> html.Div:
    return html.Div(
        [
            html.P(
                f"Intervals: cluster bootstrap. A client prefix's connections share a path and habits, so the unit "
                f"resampled is the cluster (the keyed prefix hash modulo 32: every connection of a prefix is in one "
                f"cluster): {PASSIVE_REPLICATES:,} seeded resamples of the clusters with data, independently per arm "
                f"(arms are different prefixes); each resample merges the drawn clusters' histograms and sums and "
                f"recomputes the statistic; the interval is the expanded percentile interval (Hesterberg 2015, for "
                f'few clusters). "n too small": fewer than {MIN_RESPONSES} measured responses or fewer than '
                f"{MIN_CLUSTERS} clusters (rates: {MIN_CONNECTIONS} connections)."
            ),
            html.P(
                "Percentiles come from merged latency histograms with 2 % wide bins, read at a bin's centre: within "
                "+-1 % of the exact value; means are exact (from sums). A rate with no event at all gets Wilson's "
                "interval (resampling cannot show the uncertainty of 0 of n)."
            ),
            html.P(
                "Biased connections: the SYN or SYN-ACK was retransmitted (the connection starts from a window of 1, "
                "not the arm's), or the client's receive window limited the first flight (the IW could not be used). "
                "They are counted unless left out above; keep-alive reuse after idle and TLS are shown for "
                "comparison. The share sweep compares phases run at different times: a difference may also be the "
                "time of day or week, not only the interference an A/B split hides (Spang et al., IMC 2021)."
            ),
        ],
        className="iw-table-note",
    )


# ---- tables -----------------------------------------------------------------------------------------


def value_cell(value: Value | None, unit: str = "", digits: int = 1, scale: float = 1.0) -> html.Td:
    """A number with its [95 % interval] beneath, or "n too small"."""
    if value is None or value.value is None:
        return html.Td(TOO_SMALL, className="iw-too-small")
    interval = (
        f"[{value.low * scale:,.{digits}f}, {value.high * scale:,.{digits}f}]"
        if value.low is not None and value.high is not None
        else "[no interval]"
    )
    return html.Td([f"{value.value * scale:,.{digits}f}{unit}", html.Br(), html.Span(interval, className="iw-ci")])


def _arm_title(arm: PassiveArmPercentiles | PassiveArmRetrans | PassiveArmBias) -> str:
    return arm_label(arm.arm, arm.iw)


def percentile_block(table: PassivePercentileTable, title: str) -> html.Div:
    """The slides' table: rows IW=... per arm (treated first, the baseline last), then Impr. and
    % Impr. of each treated arm, columns n, Avg., 50, 75, 90, 99."""
    treated = [arm for arm in table.arms if not arm.baseline]
    base = [arm for arm in table.arms if arm.baseline]
    header = html.Tr([html.Th("Percentile"), html.Th("n")] + [html.Th(COLUMN_LABELS[key]) for key in LATENCY_KEYS])
    rows = []
    for arm in treated + base:
        note = f"{arm.responses:,} ({arm.clusters} clusters)"
        rows.append(
            html.Tr(
                [html.Th(_arm_title(arm)), html.Td(note)] + [value_cell(arm.latency_ms.get(key)) for key in LATENCY_KEYS],
                className="iw-too-small-row" if arm.too_small else "",
            )
        )
    for arm in treated:
        against = f" ({arm_label(arm.arm, arm.iw)})" if len(treated) > 1 else ""
        improvement = arm.improvement_ms or {}
        percent = arm.improvement_pct or {}
        rows.append(
            html.Tr(
                [html.Th(f"Impr.{against}"), html.Td("")] + [value_cell(improvement.get(key)) for key in LATENCY_KEYS],
                className="iw-row-impr",
            )
        )
        rows.append(
            html.Tr(
                [html.Th(f"% Impr.{against}"), html.Td("")] + [value_cell(percent.get(key), "%") for key in LATENCY_KEYS],
                className="iw-row-impr",
            )
        )
    baseline = next((arm for arm in table.arms if arm.baseline), None)
    note = f"latency (ms), baseline {arm_label(baseline.arm, baseline.iw)}; [95 % interval]" if baseline else "no arm has data"
    # a wildcard data-* prop has no keyword of its own in Div's signature: it goes through **kwargs
    data_props: dict[str, Any] = {"data-group": table.group}
    return html.Div(
        [
            html.H3(title, className="iw-table-title"),
            html.Div(note, className="iw-table-note"),
            html.Table([html.Thead(header), html.Tbody(rows)], className="iw-table"),
        ],
        className="iw-card iw-percentiles",
        **data_props,
    )


def retrans_table(rows: list[PassiveArmRetrans]) -> html.Table:
    header = html.Tr(
        [
            html.Th(""),
            html.Th("n (conns)"),
            html.Th("Retrans. %"),
            html.Th("Conns with retrans. %"),
            html.Th("Increase (pp)"),
            html.Th("Increase conns (pp)"),
        ]
    )
    body = [
        html.Tr(
            [
                html.Th(_arm_title(arm)),
                html.Td(f"{arm.connections:,} ({arm.clusters} clusters)"),
                value_cell(arm.retrans_rate, " %", 2, 100.0),
                value_cell(arm.retrans_conn_share, " %", 2, 100.0),
                html.Td("baseline") if arm.baseline else value_cell(arm.rate_increase_pp, "", 2),
                html.Td("") if arm.baseline else value_cell(arm.conn_share_increase_pp, "", 2),
            ],
            className="iw-too-small-row" if arm.too_small else "",
        )
        for arm in rows
    ]
    return html.Table([html.Thead(header), html.Tbody(body)], className="iw-table")


BIAS_COLUMNS = (
    ("biased_share", "Biased %"),
    ("syn_retrans_share", "SYN/SYN-ACK retrans. (IW 1) %"),
    ("rwnd_limited_share", "Client rwnd limited %"),
    ("reused_after_idle_share", "Reused after idle %"),
    ("tls_share", "TLS %"),
)


def biased_table(rows: list[PassiveArmBias]) -> html.Table:
    header = html.Tr([html.Th(""), html.Th("n (conns)")] + [html.Th(label) for _, label in BIAS_COLUMNS])
    body = [
        html.Tr(
            [html.Th(_arm_title(arm)), html.Td(f"{arm.connections:,} ({arm.clusters} clusters)")]
            + [value_cell(getattr(arm, name), " %", 2, 100.0) for name, _ in BIAS_COLUMNS],
            className="iw-too-small-row" if arm.too_small else "",
        )
        for arm in rows
    ]
    return html.Table([html.Thead(header), html.Tbody(body)], className="iw-table")


def sweep_table(sweep: PassiveShareSweep) -> Any:
    if not sweep.points:
        return html.P("No share sweep: the campaign ran one treated share so far.", className="iw-empty")
    header = html.Tr(
        [
            html.Th(h)
            for h in (
                "Treated share",
                "Phases",
                "Hours (UTC)",
                "n",
                "Mean (ms)",
                "Median (ms)",
                "Retrans. %",
                "Mean change (ms)",
                "Median change (ms)",
                "Retrans. change (pp)",
            )
        ]
    )
    body = []
    for point in sweep.points:
        hours = (
            f"{point.first_hour:%Y-%m-%d %H:%M} .. {point.last_hour:%Y-%m-%d %H:%M}"
            if point.first_hour and point.last_hour
            else ""
        )
        reference = point.mean_change_ms is None
        body.append(
            html.Tr(
                [
                    html.Th(f"{point.treated_share_bp / 100:g} %"),
                    html.Td(", ".join(str(phase) for phase in point.phases)),
                    html.Td(hours),
                    html.Td(f"{point.responses:,} ({point.clusters} clusters)"),
                    value_cell(point.mean_ms),
                    value_cell(point.median_ms),
                    value_cell(point.retrans_rate, " %", 2, 100.0),
                    html.Td("reference") if reference else value_cell(point.mean_change_ms),
                    html.Td("") if reference else value_cell(point.median_change_ms),
                    html.Td("") if reference else value_cell(point.retrans_change_pp, "", 2),
                ],
                className="iw-too-small-row" if point.too_small else "",
            )
        )
    return html.Table([html.Thead(header), html.Tbody(body)], className="iw-table")


def load_note(days: list[PassiveLoadDay]) -> Any:
    """The footnote's collector load: aggregates against raw records over the selection."""
    if not days:
        return ""
    rows, size = sum(day.aggregate_rows for day in days), sum(day.aggregate_bytes for day in days)
    raw, raw_size = sum(day.raw_rows for day in days), sum(day.raw_bytes for day in days)
    connections = sum(day.connections for day in days)
    servers = len({day.server_id for day in days})
    per_connection = f"{size / connections:,.2f} B a connection" if connections else "no connection"
    return html.P(
        f"Collector load of this selection ({servers} server{'s' if servers != 1 else ''}, {len({d.day for d in days})} "
        f"days): {rows:,} aggregate rows, {size / 1024:,.1f} KiB for {connections:,} connections ({per_connection}); "
        f"{raw:,} raw connection records, {raw_size / 1024:,.1f} KiB"
        + (
            f" ({raw_size / raw:,.0f} B a record, {100 * raw / connections:.2f} % of connections sampled)"
            if raw and connections
            else ""
        )
        + ". Row sizes as PostgreSQL stores them, without indexes; per server and day: "
        "GET /api/v1/analysis/passive/load.",
        id=f"{PREFIX}-load-note",
    )


# ---- callbacks ---------------------------------------------------------------------------------------


def _nothing(result: Any) -> Nothing | None:
    return result if isinstance(result, Nothing) else None


@callback(
    Output(f"{PREFIX}-percentiles", "children"),
    Output(f"{PREFIX}-retrans", "children"),
    Output(f"{PREFIX}-biased", "children"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(),
)
def update_summary(*values: Any) -> tuple[Any, ...]:
    filters = filters_from_values(*values)
    search = query_string(filters)
    summary = read(passive_summary, filters, cache=True)
    if isinstance(summary, Nothing):
        return [], [], [], summary.status_line(), search
    if summary.campaign_name is None:
        return [], [], [], status(NO_CAMPAIGN, "empty"), search
    return (
        [percentile_block(summary.overall, "All clients")],
        retrans_table(summary.retransmissions),
        biased_table(summary.biased),
        status(summary_line(summary), "info" if summary_n(summary) else "empty"),
        search,
    )


def summary_n(summary: PassiveSummary) -> int:
    return sum(arm.connections for arm in summary.overall.arms)


def summary_line(summary: PassiveSummary) -> str:
    n = summary_n(summary)
    if not n:
        return f"Campaign {summary.campaign_id} ({summary.campaign_name}): no aggregates match these filters."
    responses = sum(arm.responses for arm in summary.overall.arms)
    span = (
        f" from {summary.first_hour:%Y-%m-%d %H:00} to {summary.last_hour:%Y-%m-%d %H:00} UTC"
        if summary.first_hour and summary.last_hour
        else ""
    )
    baseline = next((arm for arm in summary.overall.arms if arm.baseline), None)
    against = f"; baseline {arm_label(baseline.arm, baseline.iw)}" if baseline else ""
    small = [arm_label(arm.arm, arm.iw) for arm in summary.overall.arms if arm.too_small]
    return (
        f"Campaign {summary.campaign_id} ({summary.campaign_name}): {n:,} connections, {responses:,} with a "
        f"measured first response{span}{against}" + (f"; n too small: {', '.join(small)}." if small else ".")
    )


def _register_panel(dimension: str) -> None:
    @callback(Output(f"{PREFIX}-{dimension}-graph", "figure"), *filter_inputs(), Input(f"{PREFIX}-centre", "value"))
    def update_panel(*values: Any) -> go.Figure:
        filters = filters_from_values(*values[:-1])
        centre: Centre = "median" if values[-1] == "median" else "mean"
        buckets = read(passive_buckets, filters, dimension, cache=True)
        if isinstance(buckets, Nothing):
            return empty_figure(buckets.message)
        return buckets_figure(buckets, centre)


for _dimension in DIMENSIONS:
    _register_panel(_dimension)


@callback(Output(f"{PREFIX}-days-graph", "figure"), *filter_inputs(), Input(f"{PREFIX}-centre", "value"))
def update_days(*values: Any) -> go.Figure:
    filters = filters_from_values(*values[:-1])
    days = read(passive_days, filters, cache=True)
    if isinstance(days, Nothing):
        return empty_figure(days.message)
    return days_figure(days, "median" if values[-1] == "median" else "mean")


@callback(Output(f"{PREFIX}-regions", "children"), *filter_inputs())
def update_regions(*values: Any) -> list[Any]:
    tables = read(passive_regions, filters_from_values(*values), cache=True)
    if isinstance(tables, Nothing):
        return []
    return [percentile_block(table, table.group) for table in tables]


@callback(
    Output(f"{PREFIX}-sweep-graph", "figure"),
    Output(f"{PREFIX}-sweep-table", "children"),
    Output(f"{PREFIX}-load", "children"),
    *filter_inputs(),
)
def update_sweep(*values: Any) -> tuple[Any, ...]:
    filters = filters_from_values(*values)
    sweep = read(passive_share_sweep, filters, cache=True)
    load = read(passive_load, filters, cache=True)
    note = load_note(load) if not isinstance(load, Nothing) else ""
    if isinstance(sweep, Nothing):
        return empty_figure(sweep.message), [], note
    return sweep_figure(sweep), sweep_table(sweep), note


register_url_sync(PREFIX)
