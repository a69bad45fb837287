"""The former Fairness page: it moved into the Cost page (``/cost``, section "Bulk flows").

Kept as a stub so shared ``/fairness?...`` links still lead somewhere: it says the page moved
and links to ``/cost`` with the same query string (the filters).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import dash
from dash import html

dash.register_page(__name__, path="/fairness", name="Fairness (moved)", title="iwscope: fairness moved to cost", order=99)

PREFIX = "fairness"


def cost_href(url_query: dict[str, Any]) -> str:
    """``/cost`` with the query the ``/fairness`` URL carried."""
    pairs = [
        (str(key), str(item))
        for key, value in url_query.items()
        for item in (value if isinstance(value, (list, tuple)) else [value])
        if item is not None
    ]
    return "/cost" + ("?" + urlencode(pairs, safe=",:") if pairs else "")


def layout(**url_query: Any) -> html.Div:
    href = cost_href(url_query)
    return html.Div(
        [
            html.H1("Fairness moved to Cost", className="iw-title"),
            html.P(
                [
                    "The fairness figures (the bulk flow's throughput alone vs with short flows, and "
                    'retransmissions) are now the "Bulk flows" section of the ',
                    html.A("Cost page", href=href, id=f"{PREFIX}-moved-link"),
                    ", next to the delay added to an interactive flow, the share sweep and the A/B interference bias.",
                ],
                className="iw-intro",
            ),
        ],
        className="iw-page",
        id=f"{PREFIX}-page",
    )
