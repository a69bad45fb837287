"""Fairness: what a larger initial window costs the *other* traffic at a shared bottleneck.

Offered-load campaigns (``arrival_rate_per_s``: short flows at Poisson arrivals) with a
background flow (``background_bytes``: one long-lived flow measured alone, then alongside the
short flows) produce :class:`~iwscope.analysis.FairnessPoint` rows per campaign (a phase:
IW mix x offered load) x flow role x IW.  The page draws the background flow's throughput
alone vs competing, the short flows' completion time per IW, and retransmissions of both;
every point is listed below.  Without such campaigns the page explains what will appear.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import dash
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from dash import Output, callback, dash_table, html

from iwscope_dashboard.figures import ARM_PALETTE, TEMPLATE, empty_figure
from iwscope_dashboard.pagedata import fairness_data
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, filters_from_values, query_string, register_url_sync
from iwscope_dashboard.pagekit import DataUnavailable, graph, page_frame, query, status

dash.register_page(__name__, path="/fairness", name="Fairness", title="iwscope: fairness", order=5)

PREFIX = "fairness"
NOT_RECORDED_SHORT = "No competing-flow runs recorded yet."
NOT_RECORDED = (
    "Fairness needs campaigns that run IW3 and IW10 flows at "
    "the same time through one bottleneck (the IETF 78 testbed: 50/50 mix, BDP buffer, offered "
    "load 0.95, 15 KB and 50 KB responses); once such campaigns exist this page shows each arm's "
    "throughput and retransmissions side by side."
)


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Fairness between initial windows",
        "Does a larger initial window take bandwidth from flows that start with a smaller one? "
        "Throughput and retransmissions of competing flows, per initial window.",
        filters_from_page_query(url_query),
        [graph(f"{PREFIX}-graph"), html.Div(id=f"{PREFIX}-points", className="iw-card")],
    )


def _phase_label(row: dict[str, Any]) -> str:
    load = f", load {row['offered_load']:.2f}" if row.get("offered_load") is not None else ""
    return f"#{row['campaign_id']} IW{row['mix']}{load}"


def fairness_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """Background throughput alone vs competing; short-flow FCT per IW; retransmitted bytes."""
    phases: dict[int, str] = {}
    for row in rows:
        phases.setdefault(int(row["campaign_id"]), _phase_label(row))
    order = sorted(phases)
    labels = [phases[c] for c in order]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Background flow throughput (Mbit/s)",
                                                        "Short flows: median completion (ms), 95 % CI",
                                                        "Retransmitted bytes (% of sent)"))

    def raw(flow: str, iw: int | None, field: str) -> list[Any]:
        values = {int(r["campaign_id"]): r[field] for r in rows if r["flow"] == flow and (iw is None or r["iw"] == iw)}
        return [values.get(c) for c in order]

    def series(flow: str, iw: int | None, field: str, scale: float) -> list[float | None]:
        return [None if value is None else value * scale for value in raw(flow, iw, field)]

    for index, (flow, name) in enumerate((("background-alone", "background alone"),
                                          ("background", "background with short flows"))):
        fig.add_trace(go.Bar(x=labels, y=series(flow, None, "throughput_bps", 1e-6), name=name,
                             marker_color=ARM_PALETTE[(index + 4) % len(ARM_PALETTE)], legendgroup="bg"), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=series("background", None, "bytes_retrans_share", 100), name="background retrans",
                         marker_color=ARM_PALETTE[5 % len(ARM_PALETTE)], legendgroup="bg", showlegend=False),
                  row=1, col=3)
    for index, iw in enumerate(sorted({int(r["iw"]) for r in rows if r["flow"] == "short"})):
        color = ARM_PALETTE[index % len(ARM_PALETTE)]
        bounds = raw("short", iw, "fct_p50_ci_ms")  # (low, high) or None below 6 flows
        # no bar without an interval: a median of a handful of flows is not shown as a number
        median = [m if b else None for m, b in zip(series("short", iw, "fct_p50_ms", 1.0), bounds, strict=True)]
        flows = raw("short", iw, "n")
        fig.add_trace(go.Bar(
            x=labels, y=median, name=f"short IW{iw}", marker_color=color, legendgroup=f"iw{iw}",
            error_y={"type": "data", "symmetric": False,
                     "array": [b[1] - m if b and m is not None else 0.0 for m, b in zip(median, bounds)],
                     "arrayminus": [m - b[0] if b and m is not None else 0.0 for m, b in zip(median, bounds)]},
            customdata=[[n or 0, f"[{b[0]:.0f}, {b[1]:.0f}] ms" if b else "no interval (< 6 flows)"]
                        for n, b in zip(flows, bounds)],
            hovertemplate="%{x}<br>median %{y:.0f} ms %{customdata[1]}<br>n=%{customdata[0]} flows<extra>IW"
                          + str(iw) + "</extra>"), row=1, col=2)
        fig.add_trace(go.Bar(x=labels, y=series("short", iw, "bytes_retrans_share", 100), name=f"short IW{iw} retrans",
                             marker_color=color, legendgroup=f"iw{iw}", showlegend=False), row=1, col=3)
    fig.update_layout(barmode="group", template=TEMPLATE, title="Competing flows per phase (campaign)", height=420)
    return fig


@callback(
    Output(f"{PREFIX}-graph", "figure"),
    Output(f"{PREFIX}-points", "children"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update(*values: Any) -> tuple[Any, ...]:
    filters = filters_from_values(*values)
    search = query_string(filters)
    try:
        points = query(fairness_data, filters)
    except DataUnavailable as error:
        return empty_figure(str(error)), [], status(str(error), "error"), search
    if not points:
        return empty_figure(NOT_RECORDED_SHORT), html.P(NOT_RECORDED, className="iw-empty"), status(NOT_RECORDED_SHORT, "empty"), search
    rows = [dataclasses.asdict(point) for point in points]
    table = dash_table.DataTable(  # type: ignore[attr-defined]
        id=f"{PREFIX}-table",
        columns=[{"name": key, "id": key} for key in rows[0]],
        data=[{k: (v if isinstance(v, (int, float, str)) or v is None else str(v)) for k, v in row.items()} for row in rows],
        page_size=25,
        sort_action="native",
        style_table={"overflowX": "auto"},
    )
    return fairness_figure(rows), table, status(f"{len(rows):,} competing-flow points."), search


register_url_sync(PREFIX)
