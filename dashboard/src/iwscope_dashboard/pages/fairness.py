"""Fairness: throughput and retransmissions of IW3 and IW10 flows competing for one bottleneck.

The campaigns record competing-flow runs later (the IETF slides' testbed: a 50/50 mix of IW3
and IW10 flows at 0.95 offered load); until then ``fairness`` returns nothing and the page
explains what will appear. ``FairnessPoint``'s fields are not fixed yet, so the page draws
any numeric field whose name says throughput or retransmissions, per IW, and lists all points.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import dash
import plotly.graph_objects as go
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


def _numeric_fields(rows: list[dict[str, Any]], word: str) -> list[str]:
    if not rows:
        return []
    return [k for k, v in rows[0].items() if word in k.lower() and isinstance(v, (int, float)) and not isinstance(v, bool)]


def fairness_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """Mean of each throughput / retransmission field per IW (grouped bars)."""
    fields = _numeric_fields(rows, "throughput") + _numeric_fields(rows, "retrans")
    if not fields or "iw" not in rows[0]:
        return empty_figure("Competing-flow points have no per-IW throughput fields to draw; see the table below.")
    sums: dict[tuple[int, str], list[float]] = defaultdict(list)
    for row in rows:
        for field in fields:
            if row.get(field) is not None:
                sums[(int(row["iw"]), field)].append(float(row[field]))
    fig = go.Figure()
    for index, iw in enumerate(sorted({iw for iw, _ in sums})):
        fig.add_trace(
            go.Bar(
                x=fields,
                y=[sum(sums[(iw, f)]) / len(sums[(iw, f)]) if sums[(iw, f)] else None for f in fields],
                name=f"IW{iw}",
                marker_color=ARM_PALETTE[index % len(ARM_PALETTE)],
            )
        )
    fig.update_layout(barmode="group", template=TEMPLATE, title="Competing flows: mean per initial window", height=380)
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
