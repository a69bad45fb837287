"""Sizes: improvement against response size, and the mean latency of both arms per size bucket."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, html

from iwscope_dashboard.figures import arm_means_figure, empty_figure, improvement_figure
from iwscope_dashboard.pagedata import sizes_data
from iwscope_dashboard.filterbar import arms_problem, filter_inputs, filters_from_page_query, filters_from_values, query_string, register_url_sync
from iwscope_dashboard.pagekit import NO_MATCH, DataUnavailable, graph, missing_arm, page_frame, query, status

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
    filters = filters_from_values(*values)
    search = query_string(filters)
    problem = arms_problem(filters, None)
    if problem:
        return empty_figure(problem), empty_figure(problem), status(problem, "empty"), search
    try:
        comparisons = query(sizes_data, filters, cache=True)
    except DataUnavailable as error:
        return empty_figure(str(error)), empty_figure(str(error)), status(str(error), "error"), search
    if not comparisons:
        return empty_figure(NO_MATCH), empty_figure(NO_MATCH), status(NO_MATCH, "empty"), search
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
