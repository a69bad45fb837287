"""Loss: improvement and retransmission increase on lossy paths, by loss bucket."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, html

from iwscope_dashboard.figures import empty_figure, improvement_figure, loss_retrans_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import loss_data
from iwscope_dashboard.pagekit import Nothing, graph, missing_arm, no_rows, page_filters, page_frame, read, status

dash.register_page(__name__, path="/loss", name="Loss", title="iwscope: loss", order=4)

PREFIX = "loss"


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Lossy paths",
        "Paths bucketed by their loss rate (retransmitted bytes / bytes sent at the origin). The IETF "
        "slides found IW10 still improves latency on lossy paths while retransmitting a little more: "
        "left, the latency improvement; right, the share of trials with retransmissions per arm.",
        filters_from_page_query(url_query),
        [html.Div([graph(f"{PREFIX}-improvement-graph"), graph(f"{PREFIX}-retrans-graph")], className="iw-grid-2")],
    )


@callback(
    Output(f"{PREFIX}-improvement-graph", "figure"),
    Output(f"{PREFIX}-retrans-graph", "figure"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    buckets = read(loss_data, filters, cache=True, compare=True, empty=no_rows)
    if isinstance(buckets, Nothing):
        return empty_figure(buckets.message), empty_figure(buckets.message), buckets.status_line(), search
    absent = missing_arm([b.comparison for b in buckets], filters)
    if absent:
        return empty_figure(absent), loss_retrans_figure(buckets), status(absent, "empty"), search
    n = sum(b.comparison.baseline.n + b.comparison.treatment.n for b in buckets)
    return (
        improvement_figure([b.comparison for b in buckets], "loss"),
        loss_retrans_figure(buckets),
        status(f"{n:,} trials of the two arms in {len(buckets)} loss buckets."),
        search,
    )


register_url_sync(PREFIX)
