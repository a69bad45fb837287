"""The filter bar's values <-> Filters <-> URL query (no browser, no database)."""

from __future__ import annotations

import datetime as dt
from urllib.parse import parse_qsl

from iwscope.analysis import Filters
from iwscope_dashboard.filterbar import (
    SEND_PATH_PAGES,
    arms_problem,
    filter_bar,
    filters_from_page_query,
    filters_from_values,
    query_string,
)


def test_values_become_filters_with_inclusive_whole_days() -> None:
    filters = filters_from_values(
        [2, "1", 2], "2026-11-19", "2026-11-20T00:00:00", ["europe", "africa"], "5000", 60000.0, 3, 16, "client"
    )
    assert filters == Filters(
        campaign_ids=(1, 2),
        since=dt.datetime(2026, 11, 19, tzinfo=dt.UTC),
        until=dt.datetime(2026, 11, 20, 23, 59, 59, tzinfo=dt.UTC),
        regions=("africa", "europe"),
        size_min=5000,
        size_max=60000,
        baseline_iw=3,
        treatment_iw=16,
        metric="client",
    )


def test_unreadable_values_fall_back_to_defaults_and_lose_nothing_else() -> None:
    filters = filters_from_values(["x", 4], "yesterday", None, None, "-5", "lots", None, "ten", "both")
    assert filters == Filters(campaign_ids=(4,))


def test_query_string_round_trips_through_the_url() -> None:
    shared = Filters(
        campaign_ids=(3, 7),
        since=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
        until=dt.datetime(2026, 11, 2, 23, 59, 59, tzinfo=dt.UTC),
        regions=("south-america",),
        size_min=1,
        size_max=2_000_000,
        baseline_iw=10,
        treatment_iw=16,
        metric="client",
    )
    search = query_string(shared)
    assert search.startswith("?") and "campaign=3,7" in search and "treat=16" in search
    assert filters_from_page_query(dict(parse_qsl(search[1:]))) == shared
    # Defaults leave only the arms and the metric in the URL.
    assert dict(parse_qsl(query_string(Filters())[1:])) == {"base": "3", "treat": "10", "metric": "server"}


def test_arm_choice_problems_are_explained() -> None:
    assert "both IW10" in (arms_problem(Filters(baseline_iw=10, treatment_iw=10), None) or "")
    assert "IW16" in (arms_problem(Filters(treatment_iw=16), [3, 10]) or "")
    assert arms_problem(Filters(), [3, 10]) is None


def test_the_ip_version_goes_through_the_bar_and_the_url() -> None:
    chosen = filters_from_values(None, None, None, None, None, None, 3, 10, "server", "ipv6")
    assert chosen == Filters(family="ipv6")
    assert filters_from_values(None, None, None, None, None, None, 3, 10, "server", "ipv7") == Filters()
    search = query_string(chosen)
    assert "family=ipv6" in search
    assert filters_from_page_query(dict(parse_qsl(search[1:]))) == chosen


def test_the_cost_checkbox_goes_through_the_bar_and_the_url() -> None:
    """Cost-experiment trials are out unless the box is ticked; the choice travels in the URL."""
    assert filters_from_values(None, None, None, None, None, None, 3, 10, "server", "", []) == Filters()
    ticked = filters_from_values(None, None, None, None, None, None, 3, 10, "server", "", ["include"])
    assert ticked == Filters(include_cost=True)
    search = query_string(ticked)
    assert "cost=1" in search
    assert filters_from_page_query(dict(parse_qsl(search[1:]))) == ticked
    assert "cost" not in query_string(Filters())  # off by default: not in the URL
    assert filters_from_page_query({"cost": "yes"}).include_cost and not filters_from_page_query({"cost": "0"}).include_cost


def test_the_send_path_goes_through_the_bar_and_the_url_and_shows_where_it_applies() -> None:
    """Wire v8's send path: a named one travels through the bar and the URL (anything else: every
    trial); its control is shown on the raw-trial pages only, hidden but present elsewhere."""
    chosen = filters_from_values(None, None, None, None, None, None, 3, 10, "server", "", [], "sendfile")
    assert chosen == Filters(send_path="sendfile")
    assert filters_from_values(None, None, None, None, None, None, 3, 10, "server", "", [], "splice") == Filters()
    search = query_string(chosen)
    assert "send=sendfile" in search and "send" not in query_string(Filters())
    assert filters_from_page_query(dict(parse_qsl(search[1:]))) == chosen

    def control_style(prefix: str) -> object:
        """The style of the box holding the send-path control (which shows the chosen path)."""
        boxes = [
            (box, control)
            for box in filter_bar(prefix, chosen, None).children
            for control in getattr(box, "children", None) or []
            if getattr(control, "id", None) == f"{prefix}-filter-send-path"
        ]
        [(box, control)] = boxes
        assert control.value == "sendfile"
        return getattr(box, "style", None)

    assert {prefix: control_style(prefix) for prefix in sorted(SEND_PATH_PAGES)} == dict.fromkeys(sorted(SEND_PATH_PAGES))
    assert control_style("overview") == {"display": "none"}
