"""Pieces every page shares: page frame, graphs with loading indicators, the guarded read each
data callback starts with (:func:`read`), empty states, errors."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from cachetools import TTLCache
from dash import Output, callback, dcc, get_asset_url, html
from sqlalchemy.exc import SQLAlchemyError

from iwscope.analysis import ArmStats, BucketComparison, FilterOptions, Filters, PassiveFilters, filter_options
from iwscope.analysis.filters import resolve_family
from iwscope.db import session_scope
from iwscope_dashboard import db
from iwscope_dashboard.figures import DIMENSION_SHORT, arm_means_figure, empty_figure, improvement_figure
from iwscope_dashboard.filterbar import (
    arms_problem,
    filter_bar,
    filter_inputs,
    filters_from_page_query,
    filters_from_values,
    query_string,
    register_url_sync,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

NO_MATCH = (
    "No trials match these filters -- widen the time range, clear the region or size limits, "
    "pick another campaign, or choose arms the selected campaigns ran "
    "(a cost experiment's campaign needs 'include cost-experiment trials')."
)


class DataUnavailable(Exception):
    """The database could not answer; the message is shown on the page."""


#: Results of roll-up reads by (function, arguments), kept a short while: the roll-ups change
#: only when the worker refreshes them, and going back to a view (or to the other metric)
#: should not pay for the bootstrap again. Raw reads (trials, fleet) are never cached.
_results: TTLCache[tuple[Any, ...], Any] | None = None
_results_lock = threading.Lock()
DEFAULT_CACHE_SECONDS = 30.0


def configure_cache(seconds: float, max_entries: int = 256) -> None:
    """Keep roll-up results ``seconds`` long (0 turns the cache off)."""
    global _results
    with _results_lock:
        _results = TTLCache(maxsize=max_entries, ttl=seconds) if seconds > 0 else None


def query(function: Callable[..., T], *args: Any, cache: bool = False) -> T:
    """Run an analysis function in a fresh session; database trouble becomes DataUnavailable.

    ``cache=True`` (roll-up reads only) answers from the short-lived result cache when it can.
    """
    key = (function.__module__, function.__qualname__, *args)
    if cache and _results is not None:
        with _results_lock:
            if key in _results:
                return _results[key]  # type: ignore[no-any-return]
    result = _run(function, *args)
    if cache and _results is not None:
        with _results_lock:
            _results[key] = result
    return result


def _run(function: Callable[..., T], *args: Any) -> T:
    try:
        with session_scope(db.session_factory()) as session:
            return function(session, *(resolve_family(session, arg) if isinstance(arg, Filters) else arg for arg in args))
    except (SQLAlchemyError, db.DatabaseNotConfigured) as error:
        log.exception("dashboard query %s failed", getattr(function, "__name__", function))
        raise DataUnavailable(
            f"The database did not answer ({type(error).__name__}): {str(error).splitlines()[0][:200]}"
        ) from error


@dataclass(frozen=True)
class Nothing:
    """Why a data callback has nothing to draw: ``message``, for its figures and status line, and
    the status ``kind``: ``empty`` (an arm choice that compares nothing, no match) or ``error``
    (the database did not answer)."""

    message: str
    kind: Literal["empty", "error"]

    def status_line(self) -> html.Div:
        """The page's status line saying it."""
        return status(self.message, self.kind)


def page_filters(*values: Any) -> tuple[Filters, str]:
    """The filters of a data callback's filter-bar inputs and their URL query (``?campaign=...``)."""
    filters = filters_from_values(*values)
    return filters, query_string(filters)


def no_rows(data: Sized) -> bool:
    """The ``empty`` test of :func:`read` for a list result: nothing matched."""
    return len(data) == 0


def read(
    function: Callable[..., T],
    filters: Filters | PassiveFilters | None,
    *args: Any,
    cache: bool = False,
    compare: bool = False,
    empty: Callable[[T], bool] | None = None,
    empty_message: str = NO_MATCH,
) -> T | Nothing:
    """``function(session, filters, *args)`` through :func:`query`, behind the guards every data
    callback starts with: with ``compare``, an arm choice that compares nothing is refused before
    the database is asked; database trouble, and a result ``empty`` says is empty, give a
    :class:`Nothing` (``empty_message``: what the page says then) instead of the data. The arm
    guard is for the trials' :class:`Filters`; the real-users page's :class:`PassiveFilters` name no arm pair."""
    if compare and isinstance(filters, Filters):
        problem = arms_problem(filters, None)
        if problem:
            return Nothing(problem, "empty")
    try:
        data = query(function, filters, *args, cache=cache)
    except DataUnavailable as error:
        return Nothing(str(error), "error")
    if empty is not None and empty(data):
        return Nothing(empty_message, "empty")
    return data


def options_or_none() -> FilterOptions | None:
    """The filter choices from the data, or None when the database is down (the bar still renders)."""
    try:
        return query(filter_options)
    except DataUnavailable:
        return None


def graph_config() -> dict[str, Any]:
    # topojsonURL: the world map's outlines come from the package's assets (the machine is offline).
    return {"displaylogo": False, "responsive": True, "topojsonURL": get_asset_url("topojson/")}


def graph(component_id: str, class_name: str = "iw-card") -> html.Div:
    return html.Div(
        dcc.Loading(
            dcc.Graph(id=component_id, config=graph_config()),  # type: ignore[arg-type]
            type="default",
            delay_show=150,
        ),
        className=class_name,
    )


def page_frame(prefix: str, title: str, intro: str, filters: Filters | None, body: list[Any]) -> html.Div:
    """Title, explanation, the filter bar (analysis pages), a status line and the page's content."""
    children: list[Any] = [html.H1(title, className="iw-title"), html.P(intro, className="iw-intro")]
    if filters is not None:
        children.append(filter_bar(prefix, filters, options_or_none()))
    children.append(html.Div(id=f"{prefix}-status", className="iw-status", role="status"))
    children.extend(body)
    return html.Div(children, className="iw-page", id=f"{prefix}-page")


def status(message: str, kind: str = "info") -> html.Div:
    """A status line; kind is info, empty or error (styled in assets/style.css)."""
    return html.Div(message, className=f"iw-status-line iw-status-{kind}")


def missing_arm(comparisons: Iterable[BucketComparison], filters: Filters) -> str | None:
    """A sentence when one compared arm has no trial at all under these filters, else None."""
    listed = list(comparisons)
    if not listed:
        return None
    absent = [
        iw
        for iw, side in ((filters.baseline_iw, "baseline"), (filters.treatment_iw, "treatment"))
        if all(getattr(c, side).n == 0 for c in listed)
    ]
    if not absent:
        return None
    names = " and ".join(f"IW{iw}" for iw in absent)
    return f"No {names} trial matches these filters, so there is nothing to compare: pick an arm the selected campaigns ran."


def comparison_page(
    *,
    prefix: str,
    heading: str,
    intro: str,
    data: Callable[[Any, Filters], list[BucketComparison]],
    dimension: str,
    counted: str,
    cache: bool = True,
    empty_message: str = NO_MATCH,
) -> Callable[..., html.Div]:
    """A page of bucket comparisons: the filter bar, the paired improvement and the arms'
    medians by ``dimension``; registers its data callback and URL sync and returns its
    ``layout`` (the page module registers itself: Dash pages imports only modules that call
    ``dash.register_page``)."""

    def layout(**url_query: Any) -> html.Div:
        return page_frame(
            prefix,
            heading,
            intro,
            filters_from_page_query(url_query),
            [html.Div([graph(f"{prefix}-improvement-graph"), graph(f"{prefix}-means-graph")], className="iw-grid-2")],
        )

    @callback(
        Output(f"{prefix}-improvement-graph", "figure"),
        Output(f"{prefix}-means-graph", "figure"),
        Output(f"{prefix}-status", "children"),
        Output(f"{prefix}-query", "data"),
        *filter_inputs(prefix),
    )
    def update(*values: Any) -> tuple[Any, ...]:
        filters, search = page_filters(*values)
        comparisons = read(data, filters, cache=cache, compare=True, empty=no_rows, empty_message=empty_message)
        return (*comparison_outputs(comparisons, filters, dimension, counted), search)

    register_url_sync(prefix)
    return layout


def comparison_outputs(
    comparisons: list[BucketComparison] | Nothing, filters: Filters, dimension: str, counted: str
) -> tuple[Any, Any, Any]:
    """The outputs of a page of bucket comparisons (sizes, TLS): the paired-improvement figure,
    the arms' medians and the status line (``counted`` names what the trials are)."""
    if isinstance(comparisons, Nothing):
        return empty_figure(comparisons.message), empty_figure(comparisons.message), comparisons.status_line()
    absent = missing_arm(comparisons, filters)
    if absent:
        return empty_figure(absent), arm_means_figure(comparisons, dimension), status(absent, "empty")
    n = sum(c.baseline.n + c.treatment.n for c in comparisons)
    return (
        improvement_figure(comparisons, dimension),
        arm_means_figure(comparisons, dimension),
        status(f"{n:,} {counted} of the two arms in {len(comparisons)} {DIMENSION_SHORT.get(dimension, dimension)} buckets."),
    )


def missing_arm_in_stats(stats: Iterable[ArmStats], filters: Filters) -> str | None:
    """Like :func:`missing_arm`, from the per-IW counts of ``latency_vs_iw``."""
    present = {s.iw for s in stats if s.n > 0}
    if not present:
        return None
    absent = [iw for iw in (filters.baseline_iw, filters.treatment_iw) if iw not in present]
    if not absent:
        return None
    names = " and ".join(f"IW{iw}" for iw in absent)
    return f"No {names} trial matches these filters, so there is nothing to compare: pick an arm the selected campaigns ran."


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f} ms"


def fmt_pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f} %"
