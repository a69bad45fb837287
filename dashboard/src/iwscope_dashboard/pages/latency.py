"""Latency vs IW (the paper's Figure 2: mean with one standard deviation) and CDFs per arm."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, callback, dcc, html

from iwscope_dashboard.figures import cdf_figure, empty_figure, latency_vs_iw_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, filters_from_values, register_url_sync
from iwscope_dashboard.pagedata import latency_cdfs, latency_means, trial_near_data
from iwscope_dashboard.pagekit import Nothing, graph, page_filters, page_frame, read, status

dash.register_page(__name__, path="/latency", name="Latency vs IW", title="iwscope: latency vs IW", order=1)

PREFIX = "latency"


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Latency vs initial window",
        "Mean latency of every initial window the selected trials ran, with one standard deviation "
        "(Figure 2 of the paper: returns diminish beyond IW10), and the latency distribution per arm. "
        "The baseline and treatment arms are drawn thicker in the CDF; a click on a CDF point opens a "
        "trial of that arm near that latency (a traced one when one is within 10 %) in the Trials "
        "page's inspector.",
        filters_from_page_query(url_query),
        [
            html.Div([graph(f"{PREFIX}-iw-graph"), graph(f"{PREFIX}-cdf-graph")], className="iw-grid-2"),
            html.Div(id=f"{PREFIX}-goto-note", className="iw-table-note"),
            dcc.Location(id=f"{PREFIX}-goto", refresh=True),
        ],
    )


@callback(
    Output(f"{PREFIX}-iw-graph", "figure"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update_means(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    stats = read(latency_means, filters, cache=True, empty=lambda stats: sum(s.n for s in stats) == 0)
    if isinstance(stats, Nothing):
        return empty_figure(stats.message), stats.status_line(), search
    total = sum(s.n for s in stats)
    arms = ", ".join(f"IW{s.iw} (n={s.n:,})" for s in sorted(stats, key=lambda s: s.iw) if s.n)
    return latency_vs_iw_figure(stats), status(f"{total:,} trials match: {arms}."), search


# A callback per figure: each shows as soon as its own query answers.
@callback(Output(f"{PREFIX}-cdf-graph", "figure"), *filter_inputs(PREFIX))
def update_cdf(*values: Any) -> go.Figure:
    filters = filters_from_values(*values)
    cdfs = read(latency_cdfs, filters, cache=True, empty=lambda cdfs: not any(cdfs.values()))
    if isinstance(cdfs, Nothing):
        return empty_figure(cdfs.message)
    drawn = {iw: points for iw, points in cdfs.items() if points}
    return cdf_figure(drawn, (filters.baseline_iw, filters.treatment_iw))


def trial_link(click: Any, search: str | None) -> tuple[str | None, str]:
    """The Trials page's URL for a click on the CDF (the arm of the clicked curve, the latency
    of its point, the page's filters), or ``None`` and why."""
    points = (click or {}).get("points") or []
    if not points or points[0].get("customdata") is None or points[0].get("x") is None:
        return None, ""
    iw, latency_ms = int(points[0]["customdata"]), float(points[0]["x"])
    query = (search or "").lstrip("?")
    filters = filters_from_page_query(dict(parse_qsl(query)))
    found = read(trial_near_data, filters, iw, latency_ms)
    if isinstance(found, Nothing):
        return None, found.message
    if found is None:
        return None, f"No IW{iw} trial matches the filters."
    return f"/trials?{query + '&' if query else ''}trial={found}", ""


@callback(
    Output(f"{PREFIX}-goto", "href"),
    Output(f"{PREFIX}-goto-note", "children"),
    Input(f"{PREFIX}-cdf-graph", "clickData"),
    State(f"{PREFIX}-query", "data"),
    prevent_initial_call=True,
)
def open_trial(click: Any, search: str | None) -> tuple[Any, str]:
    """A click on a CDF point: to the inspector of a trial like it (a sentence when there is none)."""
    href, why = trial_link(click, search)
    return (href if href is not None else dash.no_update), why


register_url_sync(PREFIX)
