"""Cost-experiment trials stay out of the benefit pages (Overview, Latency, Sizes, Regions) unless
the filter bar's "include cost-experiment trials" is ticked, and the choice travels in the URL.

The pages' own callbacks run in process against the analysis tests' hand-made data set plus a
competing-flow phase (``datasets.insert_cost_phase``: a campaign with Poisson arrivals and a bulk
flow, its bottleneck a region of its own), in the test's rolled-back transaction: the dashboard's
sessions are bound to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from analysis.datasets import CostPhase, Fixed, insert_cost_phase, insert_fixed
from sqlalchemy.orm import Session, sessionmaker

from iwscope.analysis import Filters, rebuild_rollups
from iwscope_dashboard import db, pagedata
from iwscope_dashboard.filterbar import filter_bar, filters_from_page_query
from iwscope_dashboard.pagekit import configure_cache, query


@pytest.fixture
def study(db_session: Session, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Fixed, CostPhase]]:
    """The fixed data set and a cost phase on its origin; the dashboard reads this transaction."""
    fixed = insert_fixed(db_session)
    phase = insert_cost_phase(db_session, fixed.origin_id)
    rebuild_rollups(db_session)
    factory = sessionmaker(bind=db_session.connection(), join_transaction_mode="create_savepoint")
    monkeypatch.setattr(db, "session_factory", lambda: factory)
    configure_cache(0)
    yield fixed, phase


def bar_values(campaigns: list[int], ticked: bool) -> list[Any]:
    """The filter bar's values in ``filter_inputs`` order (IW10 vs IW3, server metric)."""
    return [campaigns, None, None, None, None, None, 3, 10, "server", "", ["include"] if ticked else []]


def groups(tables: list[Any]) -> list[str]:
    return [block.to_plotly_json()["props"]["data-group"] for block in tables]


def test_the_benefit_pages_leave_cost_trials_out_by_default(pages: dict[str, ModuleType], study: tuple[Fixed, CostPhase]) -> None:
    fixed, phase = study
    campaigns = [fixed.campaign_id, phase.campaign_id]
    regions, overview, latency = pages["regions"], pages["overview"], pages["latency"]

    # Regions: the bottleneck's region is neither a table nor counted; the "all" table has the benefit trials only.
    _, status, search = regions.update_map(*bar_values(campaigns, ticked=False))
    assert status.children == "10 trials in 3 regions." and "cost" not in search
    tables = regions.update_tables(*bar_values(campaigns, ticked=False))
    assert groups(tables) == ["all", "africa", "europe", "south-america"]
    assert "10 trials" in str(tables[0].children[1].children)
    # Overview and Latency: the headline and Figure 2 count the benefit campaign alone.
    _, status, _ = overview.update_headline(*bar_values(campaigns, ticked=False))
    assert status.children == "12 trials match."
    _, status, _ = latency.update_means(*bar_values(campaigns, ticked=False))
    assert status.children == "11 trials match: IW3 (n=5), IW10 (n=5), IW16 (n=1)."

    # Ticked: the phase is in, and the URL says so.
    _, status, search = regions.update_map(*bar_values(campaigns, ticked=True))
    assert status.children == f"{10 + phase.n_trials} trials in 4 regions." and "cost=1" in search
    tables = regions.update_tables(*bar_values(campaigns, ticked=True))
    assert groups(tables) == ["all", "africa", "europe", phase.region, "south-america"]
    _, status, search = overview.update_headline(*bar_values(campaigns, ticked=True))
    assert status.children == f"{12 + phase.n_trials} trials match." and "cost=1" in search
    _, status, _ = latency.update_means(*bar_values(campaigns, ticked=True))
    assert status.children == "27 trials match: IW3 (n=13), IW10 (n=13), IW16 (n=1)."


def test_a_shared_url_carries_the_choice_to_the_sizes_page(study: tuple[Fixed, CostPhase]) -> None:
    fixed, phase = study
    shared = f"{fixed.campaign_id},{phase.campaign_id}"
    out = filters_from_page_query({"campaign": shared})
    included = filters_from_page_query({"campaign": shared, "cost": "1"})
    assert included == Filters(campaign_ids=(fixed.campaign_id, phase.campaign_id), include_cost=True)
    sizes_out = query(pagedata.sizes_data, out)
    sizes_in = query(pagedata.sizes_data, included)
    n = {c.bucket: c.baseline.n + c.treatment.n for c in sizes_out}
    n_in = {c.bucket: c.baseline.n + c.treatment.n for c in sizes_in}
    assert sum(n.values()) == 10 and sum(n_in.values()) == 10 + phase.n_trials
    assert set(n) < set(n_in)  # the 50 KB flows: an octave of their own


def test_the_checkbox_shows_where_it_applies_and_keeps_the_choice(pages: dict[str, ModuleType]) -> None:
    def checkbox(prefix: str, filters: Filters) -> dict[str, Any]:
        bar = filter_bar(prefix, filters, None).to_plotly_json()
        found = [child for child in bar["props"]["children"] if f"{prefix}-filter-cost" in str(child)]
        (wrapper,) = found
        return {"style": getattr(wrapper, "style", None), "value": wrapper.children[1].value}

    assert checkbox("regions", Filters()) == {"style": None, "value": []}
    assert checkbox("overview", Filters(include_cost=True)) == {"style": None, "value": ["include"]}
    # The Cost and Trials pages read every campaign: the box is hidden there, its value kept for the URL.
    assert checkbox("cost", Filters(include_cost=True)) == {"style": {"display": "none"}, "value": ["include"]}
    assert checkbox("trials", Filters())["style"] == {"display": "none"}
