"""The guarded read every data callback starts with, and the region map's centroids (no database, no browser)."""

from __future__ import annotations

from typing import Any

import pytest

from iwscope.analysis import Filters, RegionSummary
from iwscope_dashboard import pagekit
from iwscope_dashboard.centroids import region_centroid
from iwscope_dashboard.figures import region_map_figure


def _read_nothing(session: Any, filters: Filters) -> list[int]:
    raise AssertionError("not called")


def test_read_refuses_identical_arms_before_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pagekit, "query", lambda *args, **kwargs: pytest.fail("the database was asked"))
    outcome = pagekit.read(_read_nothing, Filters(baseline_iw=10, treatment_iw=10), compare=True)
    assert isinstance(outcome, pagekit.Nothing) and outcome.kind == "empty" and "both IW10" in outcome.message


def test_read_turns_trouble_and_empty_results_into_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(*args: Any, **kwargs: Any) -> list[int]:
        raise pagekit.DataUnavailable("The database did not answer (OperationalError): gone")

    monkeypatch.setattr(pagekit, "query", unavailable)
    failed = pagekit.read(_read_nothing, Filters(), compare=True)
    assert failed == pagekit.Nothing("The database did not answer (OperationalError): gone", "error")

    calls: list[tuple[Any, ...]] = []

    def answer(function: Any, *args: Any, cache: bool = False) -> list[int]:
        calls.append((function, *args, cache))
        return [] if args[-1] == "none" else [1]

    monkeypatch.setattr(pagekit, "query", answer)
    empty = pagekit.read(_read_nothing, Filters(), "none", cache=True, empty=pagekit.no_rows, empty_message="nothing")
    assert empty == pagekit.Nothing("nothing", "empty")
    assert pagekit.read(_read_nothing, Filters(), "some", empty=pagekit.no_rows) == [1]
    assert calls == [(_read_nothing, Filters(), "none", True), (_read_nothing, Filters(), "some", False)]
    assert pagekit.Nothing(pagekit.NO_MATCH, "empty").status_line().className == "iw-status-line iw-status-empty"


def test_region_map_places_regions_at_their_centroids() -> None:
    def region(name: str, n: int) -> RegionSummary:
        return RegionSummary(
            region=name, n=n, abs_ms=100.0, pct=10.0, baseline_mean_ms=1000.0, treatment_mean_ms=900.0, too_small=False
        )

    assert region_centroid("Africa") == region_centroid("africa") == (2.0, 21.0)
    assert region_centroid("us_east") == (38.0, -78.0) and region_centroid("atlantis") == (None, None)
    trace = region_map_figure([region("africa", 10), region("atlantis", 5), region("eu-west", 3)]).data[0]
    assert list(trace.text) == ["africa", "eu-west"]  # a region without a centroid is not drawn
    assert list(trace.lat) == [2.0, 51.0] and list(trace.lon) == [21.0, -2.0]
