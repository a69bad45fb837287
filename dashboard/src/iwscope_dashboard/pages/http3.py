"""HTTP/3: TCP against QUIC at the same initial window, and QUIC's arms against each other."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, html

from iwscope.analysis import BucketComparison
from iwscope_dashboard.figures import arm_means_figure, empty_figure, improvement_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import protocol_data, split_protocol_comparisons
from iwscope_dashboard.pagekit import Nothing, graph, no_rows, page_filters, page_frame, read, status

PREFIX = "http3"

dash.register_page(__name__, path="/http3", name="HTTP/3", title="iwscope: HTTP/3 against TCP", order=4.6)

EMPTY_MESSAGE = (
    "No HTTP/3 trials match these filters: a campaign measures HTTP/3 when it lists QUIC arms (10q, 32q) "
    "and its origins serve them (iwprobe origin --quic, with iwprobe[quic] on origins and probes)."
)


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "HTTP/3 against TCP at the same initial window",
        "A campaign with QUIC arms (10q: IW 10 in packets of 1,200 bytes over HTTP/3, on the TCP arm's origin and "
        "port) measures both protocols in the same rounds, on the same paths, with the same sizes: a pair is a TCP "
        "and an HTTP/3 fetch of one size in one round. Metric 'client' (the probe's total, handshakes included) is "
        "what HTTP/3 saves a user: QUIC's handshake is a round trip shorter than TCP + TLS 1.3's. Metric 'server' "
        "(request read to last byte acknowledged) is the transfer alone. Below: HTTP/3 with the baseline IW against "
        "HTTP/3 with the treatment IW.",
        filters_from_page_query(url_query),
        [
            html.H2(id=f"{PREFIX}-tcp-heading", className="iw-subtitle"),
            html.Div([graph(f"{PREFIX}-improvement-graph"), graph(f"{PREFIX}-means-graph")], className="iw-grid-2"),
            html.H2(id=f"{PREFIX}-arms-heading", className="iw-subtitle"),
            html.Div([graph(f"{PREFIX}-arms-graph"), graph(f"{PREFIX}-arms-means-graph")], className="iw-grid-2"),
        ],
    )


def _panel(comparisons: list[BucketComparison], names: tuple[str, str], what: str) -> tuple[Any, Any]:
    if not comparisons:
        message = f"No {what} under these filters."
        return empty_figure(message), empty_figure(message)
    return improvement_figure(comparisons, "size", names), arm_means_figure(comparisons, "size", names)


@callback(
    Output(f"{PREFIX}-improvement-graph", "figure"),
    Output(f"{PREFIX}-means-graph", "figure"),
    Output(f"{PREFIX}-arms-graph", "figure"),
    Output(f"{PREFIX}-arms-means-graph", "figure"),
    Output(f"{PREFIX}-tcp-heading", "children"),
    Output(f"{PREFIX}-arms-heading", "children"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    base, treat = filters.baseline_iw, filters.treatment_iw
    headings = (f"TCP IW{treat} against HTTP/3 IW{treat}", f"HTTP/3: IW{base} against IW{treat}")
    comparisons = read(protocol_data, filters, empty=no_rows, empty_message=EMPTY_MESSAGE)
    if isinstance(comparisons, Nothing):
        blank = empty_figure(comparisons.message)
        return blank, blank, blank, blank, *headings, comparisons.status_line(), search
    tcp_quic, quic_arms = split_protocol_comparisons(comparisons, treat)
    first = _panel(tcp_quic, (f"TCP IW{treat}", f"HTTP/3 IW{treat}"), f"pair of TCP and HTTP/3 trials at IW{treat}")
    second = _panel(quic_arms, (f"HTTP/3 IW{base}", f"HTTP/3 IW{treat}"), f"HTTP/3 trials of IW{base} and IW{treat}")
    n_tcp = sum(c.baseline.n + c.treatment.n for c in tcp_quic)
    n_arms = sum(c.baseline.n + c.treatment.n for c in quic_arms)
    line = status(f"{n_tcp:,} TCP and HTTP/3 trials at IW{treat}; {n_arms:,} HTTP/3 trials of IW{base} and IW{treat}.")
    return (*first, *second, *headings, line, search)


register_url_sync(PREFIX)
