"""TLS: the handshake's time by the size of the server's first flight, for both arms."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, html

from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import tls_data
from iwscope_dashboard.pagekit import comparison_outputs, graph, no_rows, page_filters, page_frame, read

dash.register_page(__name__, path="/tls", name="TLS", title="iwscope: TLS handshakes", order=4.5)

PREFIX = "tls"

NO_TLS = ("No HTTPS trials match these filters: a campaign measures TLS when its origins serve HTTPS "
          "(iwprobe origin --tls-cert ... --tls-key ...).")


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "TLS handshake time vs first-flight size",
        "The server's first TLS flight (its certificate chain, mostly) is itself a short transfer: a flight "
        "larger than the initial window costs a round trip before the first byte of content. Metric "
        "'server': the origin's handshake (ClientHello read to client Finished); 'client': the probe's "
        "(TCP established to handshake done).",
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
    comparisons = read(tls_data, filters, compare=True, empty=no_rows, empty_message=NO_TLS)
    return (*comparison_outputs(comparisons, filters, "tls_flight", "HTTPS handshakes"), search)


register_url_sync(PREFIX)
