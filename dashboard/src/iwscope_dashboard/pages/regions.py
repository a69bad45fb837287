"""Regions: a world map coloured by percent improvement and the IETF-slides percentile tables."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, dcc, html

from iwscope.analysis import PercentileTable
from iwscope_dashboard.figures import empty_figure, region_map_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, filters_from_values, register_url_sync
from iwscope_dashboard.pagedata import regions_map, regions_tables
from iwscope_dashboard.pagekit import Nothing, graph, page_filters, page_frame, read, status

dash.register_page(__name__, path="/regions", name="Regions", title="iwscope: regions", order=3)

PREFIX = "regions"
PERCENTILE_COLUMNS: tuple[tuple[str, str], ...] = (("avg", "Avg."), ("p50", "50"), ("p75", "75"), ("p90", "90"), ("p99", "99"))


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Regions",
        "Where the larger window helps most: high-RTT, highly multiplexed regions (the IETF 78 slides "
        "asked this of Africa and South America). Tables: latency percentiles per arm (ms), the "
        "improvement rows, and the retransmission rate (share of trials with retransmissions).",
        filters_from_page_query(url_query),
        [graph(f"{PREFIX}-map-graph"), dcc.Loading(html.Div(id=f"{PREFIX}-tables", className="iw-tables"), delay_show=150)],
    )


def _cell(value: float | None, unit: str = "", digits: int = 1) -> html.Td:
    return html.Td("n/a" if value is None else f"{value:,.{digits}f}{unit}")


def _ci_cell(value: float | None, bounds: list[float | None] | None, unit: str) -> html.Td:
    """A value with its 95 % interval beneath it."""
    if value is None:
        return html.Td("n/a")
    low, high = bounds if bounds else (None, None)
    interval = f"[{low:,.1f}, {high:,.1f}]" if low is not None and high is not None else "[no interval]"
    return html.Td([f"{value:,.1f}{unit}", html.Br(), html.Span(interval, className="iw-ci")])


def percentile_block(table: PercentileTable, baseline_iw: int, treatment_iw: int) -> html.Div:
    """One region in the slides' layout: percentiles per arm, Impr., % Impr.; retransmission table."""
    arms = sorted(table.arms, key=lambda arm: (arm.iw != treatment_iw, arm.iw != baseline_iw, -arm.iw))
    header = html.Tr([html.Th("Percentile"), html.Th("n")] + [html.Th(label) for _, label in PERCENTILE_COLUMNS])
    rows = [
        html.Tr(
            [html.Th(f"IW={arm.iw}"), html.Td(f"{arm.n:,}")]
            + [_cell(getattr(arm, key), digits=0 if key != "avg" else 1) for key, _ in PERCENTILE_COLUMNS]
        )
        for arm in arms
    ]
    pairs = f"{table.n_pairs:,} pairs"
    if table.too_small:
        small = html.Td("n too small", colSpan=len(PERCENTILE_COLUMNS), title=table.note or "")
        rows.append(html.Tr([html.Th("Impr."), html.Td(pairs), small], className="iw-row-impr iw-too-small-row"))
    else:
        rows.append(
            html.Tr(
                [html.Th("Impr."), html.Td(pairs)]
                + [_ci_cell(table.improvement.get(key), table.improvement_ci.get(key), "") for key, _ in PERCENTILE_COLUMNS],
                className="iw-row-impr",
            )
        )
        rows.append(
            html.Tr(
                [html.Th("% Impr."), html.Td("")]
                + [
                    _ci_cell(table.pct_improvement.get(key), table.pct_improvement_ci.get(key), "%")
                    for key, _ in PERCENTILE_COLUMNS
                ],
                className="iw-row-impr",
            )
        )
    retrans_rows = [
        html.Tr(
            [
                html.Th(f"IW={arm.iw}"),
                _cell(None if arm.retrans_share is None else 100.0 * arm.retrans_share, "%", 2),
                _cell(None if arm.retrans_bytes_share is None else 100.0 * arm.retrans_bytes_share, "%", 2),
            ]
        )
        for arm in arms
    ]
    retrans_rows.append(
        html.Tr([html.Th("Increase"), _cell(table.retrans_increase_pp, " pp", 2), html.Td("")], className="iw-row-impr")
    )
    n_total = sum(arm.n for arm in table.arms)
    return html.Div(
        [
            html.H3(f"{table.group}", className="iw-table-title"),
            html.Div(
                f"latency (ms) and retransmission rate, {n_total:,} trials; Impr. avg is the paired "
                f"estimate ({table.n_pairs:,} pairs on {table.n_paths:,} paths), percentiles the difference "
                "of the arms' percentiles; [95 % CI]" + (f". {table.note}" if table.note else ""),
                className="iw-table-note",
            ),
            html.Div(
                [
                    html.Table([html.Thead(header), html.Tbody(rows)], className="iw-table"),
                    html.Table(
                        [
                            html.Thead(html.Tr([html.Th(""), html.Th("Retrans. %"), html.Th("Retrans. bytes %")])),
                            html.Tbody(retrans_rows),
                        ],
                        className="iw-table",
                    ),
                ],
                className="iw-table-pair",
            ),
        ],
        className="iw-card iw-percentiles",
        **{"data-group": str(table.group)},  # type: ignore[arg-type]
    )


@callback(
    Output(f"{PREFIX}-map-graph", "figure"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update_map(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    regions = read(regions_map, filters, cache=True, compare=True, empty=lambda regions: all(r.n == 0 for r in regions))
    if isinstance(regions, Nothing):
        return empty_figure(regions.message), regions.status_line(), search
    n = sum(r.n for r in regions)
    return region_map_figure(regions), status(f"{n:,} trials in {len(regions)} regions."), search


# The tables in a callback of their own, so the map does not wait for the percentiles.
@callback(Output(f"{PREFIX}-tables", "children"), *filter_inputs(PREFIX))
def update_tables(*values: Any) -> list[html.Div]:
    filters = filters_from_values(*values)
    data = read(regions_tables, filters, cache=True, compare=True)
    if isinstance(data, Nothing):
        return []  # the map's callback says why
    return [
        percentile_block(t, filters.baseline_iw, filters.treatment_iw)
        for t in data.overall + sorted(data.per_region, key=lambda t: str(t.group))
    ]


register_url_sync(PREFIX)
