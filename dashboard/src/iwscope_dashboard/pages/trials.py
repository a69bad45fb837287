"""Trials: the raw trials the filters select, paged on the server, with a CSV download, and the
trial inspector: a selected trial's packet trace with its twins' (:mod:`iwscope_dashboard.trialfigures`),
its ``TCP_INFO`` and latencies, and how the origin sent it (its observation's send path and
segmentation offload, wire v8).

The selected trial travels in the URL as ``trial=<uuid>``, a key of this page alone (the filter
bar's :class:`~iwscope.analysis.Filters` do not know it): the page writes its URL query itself,
the filters' query with ``trial`` after it (:func:`page_query`), so a shared link opens the
inspector on the same trial.
"""

from __future__ import annotations

import math
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import dash
from dash import ClientsideFunction, Input, Output, callback, clientside_callback, ctx, dash_table, dcc, html

from iwscope.traces.schemas import TracedTrialOut, TrialTracesOut
from iwscope_dashboard.exports import CSV_ROUTE
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import trial_traces_data, trials_data
from iwscope_dashboard.pagekit import Nothing, graph_config, page_filters, page_frame, read, status
from iwscope_dashboard.trialfigures import (
    NO_TRACE,
    RECEIVER,
    SENDER,
    tcp_info_rows,
    trace_of,
    trial_figure,
    trial_summary,
    twins_summary,
)

dash.register_page(__name__, path="/trials", name="Trials", title="iwscope: trials", order=7)

PREFIX = "trials"
PAGE_SIZE = 50
#: The URL key of the inspected trial (page-local: not one of the filters).
TRIAL_KEY = "trial"
_HIDDEN = {"display": "none"}
#: The selected row's background (the table's data rows carry their trial id as ``id``).
_SELECTED_BACKGROUND = "#fff4e0"


def trial_param(value: Any) -> str | None:
    """The ``trial`` URL value as a canonical trial id, or None when it is not one."""
    if isinstance(value, (list, tuple)):  # a repeated parameter: the first one
        value = value[0] if value else None
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return str(UUID(value.strip()))
    except ValueError:
        return None


def page_query(search: str, trial: str | None) -> str:
    """The page's URL query: the filters' (``?campaign=...``, or empty) and the inspected trial."""
    selected = trial_param(trial)
    if selected is None:
        return search
    return f"{search}&{TRIAL_KEY}={selected}" if search else f"?{TRIAL_KEY}={selected}"


def inspector() -> html.Div:
    """The inspector's frame, hidden until a trial is selected: a note (which trial; why there
    is no figure), the figure, and beside it the summary, the twins, how the origin sent the
    response and ``TCP_INFO``."""
    return html.Div(
        [
            html.H2("Trial inspector", className="iw-subtitle"),
            html.Div(id=f"{PREFIX}-inspector-note", className="iw-intro"),
            dcc.RadioItems(
                id=f"{PREFIX}-inspector-side",
                options=[
                    {"label": "receiver (the probe's capture)", "value": RECEIVER},
                    {"label": "sender (the origin's capture)", "value": SENDER},
                ],
                value=RECEIVER,
                inline=True,
                className="iw-inspector-side",
            ),
            html.Div(
                [
                    # The figure's card comes with its figure (a graph first drawn in a hidden
                    # container keeps a collapsed card for a while).
                    html.Div(id=f"{PREFIX}-inspector-figure", style=_HIDDEN),
                    html.Div(id=f"{PREFIX}-inspector-details", className="iw-card iw-inspector-details"),
                ],
                className="iw-inspector",
            ),
        ],
        id=f"{PREFIX}-inspector",
        style=_HIDDEN,
    )


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Trials",
        "The individual trials behind the figures (read from the raw table, so keep the filters "
        "narrow on large data sets). The download holds every matching trial. Click a trial to "
        "inspect it below: its packet trace with its twins' (the other arms of its round), its "
        "TCP_INFO and latencies, and how the origin sent it; the URL keeps it (trial=<id>).",
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
            inspector(),
            # The raw value, checked by the inspector (which says when it is not a trial id).
            dcc.Store(id=f"{PREFIX}-selected", data=url_query.get(TRIAL_KEY)),
            dcc.Store(id=f"{PREFIX}-filter-query"),
            dcc.Store(id=f"{PREFIX}-inspector-shown"),
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
    Output(f"{PREFIX}-filter-query", "data"),
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
    # ``id``: the row's id in the table's active_cell (not a column), the trial the inspector reads.
    data = [{**{key: cell(value) for key, value in row.items()}, "id": str(row["trial_id"])} for row in rows]
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


@callback(Output(f"{PREFIX}-selected", "data"), Input(f"{PREFIX}-table", "active_cell"), prevent_initial_call=True)
def select(active_cell: dict[str, Any] | None) -> Any:
    """A click on a row selects its trial (the row's ``id``)."""
    row_id = (active_cell or {}).get("row_id")
    return str(row_id) if row_id else dash.no_update


@callback(
    Output(f"{PREFIX}-query", "data"),
    Input(f"{PREFIX}-filter-query", "data"),
    Input(f"{PREFIX}-selected", "data"),
)
def update_query(search: str | None, trial: str | None) -> Any:
    """The address bar's query (:func:`register_url_sync`): the filters' and the trial."""
    if search is None:  # the table's callback has not run yet: keep the URL as it was opened
        return dash.no_update
    return page_query(search, trial)


#: What the inspector says of a send path or offload the origin's observation left empty.
NOT_SAID = "not said (an origin older than wire v8)"


def sending_rows(trial: TracedTrialOut) -> list[tuple[str, str]]:
    """How the origin sent the response, as its observation says (wire v8): (field, value) rows
    of the send path and the segmentation offload; none when the trial has no observation."""
    if trial.send_path is None:
        return []
    return [
        ("send path", trial.send_path or NOT_SAID),
        ("segmentation offload", trial.segmentation_offload or NOT_SAID),
    ]


def _table(rows: list[tuple[str, str]], class_name: str) -> html.Table:
    return html.Table(html.Tbody([html.Tr([html.Th(name), html.Td(value)]) for name, value in rows]), className=class_name)


def _details(traced: TrialTracesOut, side: str) -> list[Any]:
    """Beside the figure: the summary line, the twins' latencies, how the origin sent the
    response (beside ``TCP_INFO``: a TSO or GSO sender's segments are not what left its stack),
    ``TCP_INFO`` as a table."""
    trial = traced.trial
    rows = tcp_info_rows(trial.tcp_info)
    info: Any = (
        _table(rows, "iw-table iw-tcp-info")
        if rows
        else html.P("No TCP_INFO recorded for this trial.", className="iw-table-note")
    )
    sending = sending_rows(trial)
    sent: Any = (
        _table(sending, "iw-table iw-send-path")
        if sending
        else html.P("No origin observation of this trial: how it was sent is unknown.", className="iw-table-note")
    )
    return [
        html.P(trial_summary(traced, side), className="iw-inspector-summary"),
        html.P(twins_summary(traced), className="iw-table-note"),
        html.H3("Send path (the origin's)", className="iw-table-title"),
        sent,
        html.H3("TCP_INFO (the probe's, after the fetch)", className="iw-table-title"),
        info,
    ]


def _heading(trial: TracedTrialOut) -> str:
    where = ", ".join(
        part
        for part in (
            f"campaign {trial.campaign_id}" if trial.campaign_id is not None else "",
            f"round {trial.round}" if trial.round is not None else "",
            f"probe {trial.probe_id}",
        )
        if part
    )
    return f"Trial {trial.trial_id} ({where})."


@callback(
    Output(f"{PREFIX}-inspector", "style"),
    Output(f"{PREFIX}-inspector-figure", "style"),
    Output(f"{PREFIX}-inspector-figure", "children"),
    Output(f"{PREFIX}-inspector-note", "children"),
    Output(f"{PREFIX}-inspector-details", "children"),
    Output(f"{PREFIX}-table", "style_data_conditional"),
    Input(f"{PREFIX}-selected", "data"),
    Input(f"{PREFIX}-inspector-side", "value"),
)
def inspect(selected: Any, wanted_side: Any = RECEIVER) -> tuple[Any, ...]:
    """The inspector of the selected trial, drawn at the side asked for (the receiver's or the
    sender's capture; the other when the trial has only that one, and the note says so): hidden
    without one; a sentence instead of the figure when the trial is unknown or has no trace (an
    untraced round), or the database is down."""
    if not selected:
        return _HIDDEN, _HIDDEN, [], "", [], []
    trial = trial_param(selected)
    if trial is None:
        return None, _HIDDEN, [], f"{str(selected)[:80]!r} is not a trial id: click a trial in the table.", [], []
    highlight = [{"if": {"filter_query": f'{{trial_id}} = "{trial}"'}, "backgroundColor": _SELECTED_BACKGROUND}]
    found = read(trial_traces_data, None, UUID(trial))
    if isinstance(found, Nothing):
        return None, _HIDDEN, [], found.message, [], highlight
    if found is None:
        unknown = f"No trial {trial} in the database (a link to a deleted trial, or a mistyped id)."
        return None, _HIDDEN, [], unknown, [], highlight
    wanted = wanted_side if wanted_side in (RECEIVER, SENDER) else RECEIVER
    preference = (wanted, SENDER if wanted == RECEIVER else RECEIVER)
    side = next((side for side in preference if trace_of(found.trial, side) is not None), None)
    heading = _heading(found.trial)
    if side is None:
        note = f"{heading} It has no packet trace to draw: {NO_TRACE}."
        return None, _HIDDEN, [], note, _details(found, RECEIVER), highlight
    try:
        figure = trial_figure(found, side=side)
    except ValueError as error:  # a stored trace the collector took; not expected
        return None, _HIDDEN, [], f"{heading} Its {side} trace cannot be drawn: {error}", _details(found, side), highlight
    note = f"{heading} Drawn from the {'probe' if side == RECEIVER else 'origin'}'s capture ({side} side)."
    if side != wanted:
        note += f" It has no {wanted} trace ({'the origin kept none' if wanted == SENDER else 'the probe kept none'})."
    graph = dcc.Graph(id=f"{PREFIX}-inspector-graph", figure=figure, config=graph_config())  # type: ignore[arg-type]
    card = html.Div(graph, className="iw-card")
    return None, None, card, note, _details(found, side), highlight


clientside_callback(
    ClientsideFunction(namespace="iwscope", function_name="revealInspector"),
    Output(f"{PREFIX}-inspector-shown", "data"),
    Input(f"{PREFIX}-inspector-note", "children"),
)
register_url_sync(PREFIX)
