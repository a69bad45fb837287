"""Overview: headline numbers and the paper's Figure 5 trio (improvement vs RTT, bandwidth, BDP)."""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Output, callback, html

from iwscope.analysis import Filters, Headline
from iwscope_dashboard.figures import empty_figure, improvement_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, filters_from_values, register_url_sync
from iwscope_dashboard.pagedata import OVERVIEW_DIMENSIONS, overview_dimension, overview_headline
from iwscope_dashboard.pagekit import (
    Nothing,
    fmt_ms,
    fmt_pct,
    graph,
    missing_arm,
    missing_arm_in_stats,
    no_rows,
    page_filters,
    page_frame,
    read,
    status,
)

dash.register_page(__name__, path="/", name="Overview", title="iwscope: overview", order=0)

PREFIX = "overview"
DIMENSIONS = OVERVIEW_DIMENSIONS


def layout(**url_query: Any) -> html.Div:
    filters = filters_from_page_query(url_query)
    return page_frame(
        PREFIX,
        "Overview",
        "How much a larger initial congestion window (treatment) shortens short web transfers against "
        "the baseline, bucketed like Figure 5 of Dukkipati et al. 2010: bars are the paired absolute "
        "improvement (baseline minus treatment on the same path and object size, ms), the line the percent "
        "improvement (ratio of sums over the same pairs); whiskers are 95% confidence intervals (paths "
        "resampled; with fewer than 5 paths in a bucket, each path's trials). A bucket with fewer than 20 "
        'pairs shows "n too small" instead of a number.',
        filters,
        [
            html.Div(id=f"{PREFIX}-headline", className="iw-headline"),
            html.Div([graph(f"{PREFIX}-{dimension}-graph") for dimension in DIMENSIONS], className="iw-grid-3"),
        ],
    )


def headline_cards(numbers: Headline) -> list[html.Div]:
    pairs = f"{numbers.n_pairs:,} pairs on {numbers.n_paths:,} paths"
    if numbers.too_small:
        headline = ("n too small", f"{pairs}: too few paired trials for a number")
        absolute = ("n too small", pairs)
    else:
        ci = (
            f"95% CI {fmt_pct(numbers.pct_ci_low)} .. {fmt_pct(numbers.pct_ci_high)}; {pairs}"
            if numbers.pct_ci_low is not None and numbers.pct_ci_high is not None
            else f"no interval; {pairs}"
        )
        abs_ci = (
            f"95% CI {fmt_ms(numbers.abs_ci_low)} .. {fmt_ms(numbers.abs_ci_high)}, paired"
            if numbers.abs_ci_low is not None and numbers.abs_ci_high is not None
            else "paired, no interval"
        )
        headline = (fmt_pct(numbers.pct), ci)
        absolute = (fmt_ms(numbers.abs_ms), abs_ci)
    increase = "n/a" if numbers.retrans_increase_pp is None else f"{numbers.retrans_increase_pp:+.2f} pp"
    cards = [
        (f"IW{numbers.treatment_iw} vs IW{numbers.baseline_iw}", *headline),
        ("absolute improvement", *absolute),
        ("retransmission rate", increase, "change in share of trials with retransmissions"),
        ("trials", f"{numbers.n_trials:,}", f"{numbers.n_probes:,} probes, {numbers.n_regions:,} regions"),
    ]
    return [
        html.Div(
            [
                html.Div(label, className="iw-kpi-label"),
                html.Div(value, className="iw-kpi-value" + (" iw-too-small" if value == "n too small" else "")),
                html.Div(note, className="iw-kpi-note"),
            ],
            className="iw-kpi",
        )
        for label, value, note in cards
    ]


@callback(
    Output(f"{PREFIX}-headline", "children"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update_headline(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    data = read(overview_headline, filters, cache=True, compare=True, empty=lambda data: data.headline.n_trials == 0)
    if isinstance(data, Nothing):
        return [], data.status_line(), search
    absent = missing_arm_in_stats(data.arms, filters)
    if absent:
        return headline_cards(data.headline), status(absent, "empty"), search
    return headline_cards(data.headline), status(f"{data.headline.n_trials:,} trials match."), search


def panel_figure(filters: Filters, dimension: str) -> go.Figure:
    """One Figure 5 panel, or the reason it is empty."""
    comparisons = read(
        overview_dimension,
        filters,
        dimension,
        cache=True,
        compare=True,
        empty=no_rows,
        empty_message=f"No trial with a path estimate matches these filters: {dimension} buckets come "
        "from the worker's path estimates (min RTT, bottleneck bandwidth) of each probe-origin pair.",
    )
    if isinstance(comparisons, Nothing):
        return empty_figure(comparisons.message)
    absent = missing_arm(comparisons, filters)
    if absent:
        return empty_figure(absent)
    return improvement_figure(comparisons, dimension)


def _register_panel(dimension: str) -> None:
    # One callback per panel: the three run in parallel and each figure shows when ready.
    @callback(Output(f"{PREFIX}-{dimension}-graph", "figure"), *filter_inputs(PREFIX))
    def update_panel(*values: Any) -> go.Figure:
        return panel_figure(filters_from_values(*values), dimension)


for _dimension in DIMENSIONS:
    _register_panel(_dimension)

register_url_sync(PREFIX)
