"""Trials: the raw trials the filters select, paged on the server, with a CSV download."""

from __future__ import annotations

import math
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import dash
from dash import Input, Output, callback, ctx, dash_table, html

from iwscope_dashboard.exports import CSV_ROUTE
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import trials_data
from iwscope_dashboard.pagekit import Nothing, page_filters, page_frame, read, status

dash.register_page(__name__, path="/trials", name="Trials", title="iwscope: trials", order=7)

PREFIX = "trials"
PAGE_SIZE = 50


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Trials",
        "The individual trials behind the figures (read from the raw table, so keep the filters "
        "narrow on large data sets). The download holds every matching trial.",
        filters_from_page_query(url_query),
        [
            html.Div(
                [
                    html.A(
                        "Download CSV",
                        id=f"{PREFIX}-download",
                        href=CSV_ROUTE,
                        className="iw-button",
                        download="iwscope-trials.csv",
                    )
                ],
                className="iw-actions",
            ),
            html.Div(
                dash_table.DataTable(  # type: ignore[attr-defined]
                    id=f"{PREFIX}-table",
                    page_action="custom",
                    page_current=0,
                    page_size=PAGE_SIZE,
                    page_count=1,
                    style_table={"overflowX": "auto"},
                    style_cell={
                        "fontFamily": "inherit",
                        "fontSize": "12px",
                        "padding": "3px 6px",
                        "textAlign": "left",
                        "maxWidth": "16em",
                        "overflow": "hidden",
                        "textOverflow": "ellipsis",
                    },
                    style_header={"fontWeight": "600", "backgroundColor": "#f3f5f7"},
                ),
                className="iw-card",
            ),
        ],
    )


def cell(value: Any) -> str | int | float | None:
    """DataTable cells hold JSON scalars."""
    if value is None or isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (UUID, Decimal)):
        return str(value)
    return str(value)


@callback(
    Output(f"{PREFIX}-table", "data"),
    Output(f"{PREFIX}-table", "columns"),
    Output(f"{PREFIX}-table", "page_count"),
    Output(f"{PREFIX}-table", "page_current"),
    Output(f"{PREFIX}-download", "href"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    Input(f"{PREFIX}-table", "page_current"),
    *filter_inputs(PREFIX),
)
def update(page_current: int | None, *values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    href = CSV_ROUTE + search
    # A filter change starts again at the first page.
    page = max(0, int(page_current or 0)) if ctx.triggered_id in (None, f"{PREFIX}-table") else 0
    found = read(trials_data, filters, PAGE_SIZE, page * PAGE_SIZE, empty=lambda found: found[1] == 0)
    if isinstance(found, Nothing):
        return [], [], 1, 0, href, found.status_line(), search
    rows, total = found
    columns = [{"name": key, "id": key} for key in (rows[0].keys() if rows else [])]
    data = [{key: cell(value) for key, value in row.items()} for row in rows]
    pages = max(1, math.ceil(total / PAGE_SIZE))
    first = page * PAGE_SIZE + 1
    return (
        data,
        columns,
        pages,
        page,
        href,
        status(f"{total:,} trials match; showing {first:,}-{first + len(rows) - 1:,}."),
        search,
    )


register_url_sync(PREFIX)
