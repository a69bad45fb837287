"""Latency vs IW (the paper's Figure 2: mean with one standard deviation) and CDFs per arm."""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Output, callback, html

from iwscope_dashboard.figures import cdf_figure, empty_figure, latency_vs_iw_figure
from iwscope_dashboard.pagedata import latency_cdfs, latency_means
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, filters_from_values, query_string, register_url_sync
from iwscope_dashboard.pagekit import NO_MATCH, DataUnavailable, graph, page_frame, query, status

dash.register_page(__name__, path="/latency", name="Latency vs IW", title="iwscope: latency vs IW", order=1)

PREFIX = "latency"


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Latency vs initial window",
        "Mean latency of every initial window the selected trials ran, with one standard deviation "
        "(Figure 2 of the paper: returns diminish beyond IW10), and the latency distribution per arm. "
        "The baseline and treatment arms are drawn thicker in the CDF.",
        filters_from_page_query(url_query),
        [html.Div([graph(f"{PREFIX}-iw-graph"), graph(f"{PREFIX}-cdf-graph")], className="iw-grid-2")],
    )


@callback(
    Output(f"{PREFIX}-iw-graph", "figure"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update_means(*values: Any) -> tuple[Any, ...]:
    filters = filters_from_values(*values)
    search = query_string(filters)
    try:
        stats = query(latency_means, filters, cache=True)
    except DataUnavailable as error:
        return empty_figure(str(error)), status(str(error), "error"), search
    total = sum(s.n for s in stats)
    if total == 0:
        return empty_figure(NO_MATCH), status(NO_MATCH, "empty"), search
    arms = ", ".join(f"IW{s.iw} (n={s.n:,})" for s in sorted(stats, key=lambda s: s.iw) if s.n)
    return latency_vs_iw_figure(stats), status(f"{total:,} trials match: {arms}."), search


# A callback per figure: each shows as soon as its own query answers.
@callback(Output(f"{PREFIX}-cdf-graph", "figure"), *filter_inputs(PREFIX))
def update_cdf(*values: Any) -> go.Figure:
    filters = filters_from_values(*values)
    try:
        cdfs = query(latency_cdfs, filters, cache=True)
    except DataUnavailable as error:
        return empty_figure(str(error))
    cdfs = {iw: points for iw, points in cdfs.items() if points}
    return cdf_figure(cdfs, (filters.baseline_iw, filters.treatment_iw)) if cdfs else empty_figure(NO_MATCH)


register_url_sync(PREFIX)
