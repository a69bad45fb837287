"""Sizes: improvement against response size, and the mean latency of both arms per size bucket."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, html

from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import sizes_data
from iwscope_dashboard.pagekit import comparison_outputs, graph, no_rows, page_filters, page_frame, read

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
    return (*comparison_outputs(comparisons, filters, "size", "trials"), search)


register_url_sync(PREFIX)
