"""Sizes: improvement against response size, and the mean latency of both arms per size bucket."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, html

from iwscope_dashboard.figures import arm_means_figure, empty_figure, improvement_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import sizes_data
from iwscope_dashboard.pagekit import Nothing, graph, missing_arm, no_rows, page_filters, page_frame, read, status

dash.register_page(__name__, path="/sizes", name="Sizes", title="iwscope: response size", order=2)

PREFIX = "sizes"


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Improvement vs response size",
        "A larger initial window saves round trips only for responses that need more than the "
        "baseline's first flight: tiny responses gain nothing, mid-size ones the most.",
        filters_from_page_query(url_query),
        [html.Div([graph(f"{PREFIX}-improvement-graph"), graph(f"{PREFIX}-means-graph")], className="iw-grid-2")],
    )


@callback(
    Output(f"{PREFIX}-improvement-graph", "figure"),
    Output(f"{PREFIX}-means-graph", "figure"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    comparisons = read(sizes_data, filters, cache=True, compare=True, empty=no_rows)
    if isinstance(comparisons, Nothing):
        return empty_figure(comparisons.message), empty_figure(comparisons.message), comparisons.status_line(), search
    absent = missing_arm(comparisons, filters)
    if absent:
        return empty_figure(absent), arm_means_figure(comparisons, "size"), status(absent, "empty"), search
    n = sum(c.baseline.n + c.treatment.n for c in comparisons)
    return (
        improvement_figure(comparisons, "size"),
        arm_means_figure(comparisons, "size"),
        status(f"{n:,} trials of the two arms in {len(comparisons)} size buckets."),
        search,
    )


register_url_sync(PREFIX)
