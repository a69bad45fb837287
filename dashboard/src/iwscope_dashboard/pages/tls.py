"""TLS: the handshake's time by the size of the server's first flight, for both arms."""

from __future__ import annotations

import dash

from iwscope_dashboard.pagedata import tls_data
from iwscope_dashboard.pagekit import comparison_page

dash.register_page(__name__, path="/tls", name="TLS", title="iwscope: TLS handshakes", order=4.5)

layout = comparison_page(
    prefix="tls",
    heading="TLS handshake time vs first-flight size",
    intro="The server's first TLS flight (its certificate chain, mostly) is itself a short transfer: a flight "
    "larger than the initial window costs a round trip before the first byte of content. Metric "
    "'server': the origin's handshake (ClientHello read to client Finished); 'client': the probe's "
    "(TCP established to handshake done).",
    data=tls_data,
    dimension="tls_flight",
    counted="HTTPS handshakes",
    cache=False,
    empty_message="No HTTPS trials match these filters: a campaign measures TLS when its origins serve HTTPS "
    "(iwprobe origin --tls-cert ... --tls-key ...).",
)
