"""Sizes: improvement against response size, and the mean latency of both arms per size bucket."""

from __future__ import annotations

import dash

from iwscope_dashboard.pagedata import sizes_data
from iwscope_dashboard.pagekit import comparison_page

dash.register_page(__name__, path="/sizes", name="Sizes", title="iwscope: response size", order=2)

layout = comparison_page(
    prefix="sizes",
    heading="Improvement vs response size",
    intro="A larger initial window saves round trips only for responses that need more than the "
    "baseline's first flight: tiny responses gain nothing, mid-size ones the most.",
    data=sizes_data,
    dimension="size",
    counted="trials",
)
