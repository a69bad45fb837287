"""Probes: the fleet (last seen, trials per day, error share, upload backlog)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import dash
from dash import Input, Output, callback, dash_table, dcc, html

from iwscope.analysis import ProbeRow
from iwscope_dashboard.figures import empty_figure, fleet_figure
from iwscope_dashboard.pagedata import probes_data
from iwscope_dashboard.pagekit import Nothing, graph, no_rows, page_frame, read, status

dash.register_page(__name__, path="/probes", name="Probes", title="iwscope: probes", order=6)

PREFIX = "probes"
REFRESH_MS = 60_000
NO_PROBES = "No probes enrolled yet: create an enrollment token (`iwscope token create --kind enroll`) and start a probe with it."


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Probe fleet",
        "Every enrolled probe: when it last reported, how many trials it uploads a day, the share "
        "of its trials that failed, and how many results wait in its spool. Refreshes every minute.",
        None,
        [
            dcc.Interval(id=f"{PREFIX}-refresh", interval=REFRESH_MS),
            graph(f"{PREFIX}-graph"),
            html.Div(html.Div(id=f"{PREFIX}-table-holder"), className="iw-card"),
        ],
    )


def _ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = max(0, int((now - moment).total_seconds()))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def fleet_rows(probes: list[ProbeRow], now: datetime) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "region": p.region,
            "country": p.country,
            "version": p.version,
            "last_seen": _ago(p.last_seen_at, now),
            "last_seen_at": p.last_seen_at.isoformat() if p.last_seen_at else "",
            "trials_total": p.trials_total,
            "trials_per_day": None if p.trials_per_day is None else round(p.trials_per_day, 1),
            "error_pct": None if p.error_share is None else round(100.0 * p.error_share, 2),
            "spool_backlog": p.spool_backlog,
            "probe_id": str(p.probe_id),
        }
        for p in sorted(probes, key=lambda p: (p.region or "", p.name or ""))
    ]


COLUMNS = [
    ("name", "probe"),
    ("region", "region"),
    ("country", "country"),
    ("version", "version"),
    ("last_seen", "last seen"),
    ("trials_total", "trials"),
    ("trials_per_day", "trials/day"),
    ("error_pct", "errors %"),
    ("spool_backlog", "backlog"),
    ("probe_id", "id"),
]


@callback(
    Output(f"{PREFIX}-graph", "figure"),
    Output(f"{PREFIX}-table-holder", "children"),
    Output(f"{PREFIX}-status", "children"),
    Input(f"{PREFIX}-refresh", "n_intervals"),
)
def update(_ticks: int | None) -> tuple[Any, ...]:
    probes = read(probes_data, None, empty=no_rows, empty_message=NO_PROBES)  # the fleet ignores the filters
    if isinstance(probes, Nothing):
        holder: Any = html.P(probes.message, className="iw-empty") if probes.kind == "empty" else []
        return empty_figure(probes.message), holder, probes.status_line()
    now = datetime.now(UTC)
    rows = fleet_rows(probes, now)
    table = dash_table.DataTable(  # type: ignore[attr-defined]
        id=f"{PREFIX}-table",
        columns=[{"name": label, "id": key} for key, label in COLUMNS],
        data=rows,
        sort_action="native",
        page_size=50,
        style_table={"overflowX": "auto"},
        style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "4px 8px", "textAlign": "left"},
        style_header={"fontWeight": "600", "backgroundColor": "#f3f5f7"},
    )
    stale = sum(
        1
        for p in probes
        if p.last_seen_at is None
        or (now - (p.last_seen_at if p.last_seen_at.tzinfo else p.last_seen_at.replace(tzinfo=UTC))).total_seconds() > 3600
    )
    return fleet_figure(probes), table, status(f"{len(probes)} probes, {stale} not seen in the last hour.")
