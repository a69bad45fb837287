"""The filter state shared by every analysis function, the HTTP API and the dashboard's URLs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis.models import NO_CAMPAIGN
from iwscope.wiretypes import BIGINT_MAX, NAMED_FAMILIES, NAMED_PROTOCOLS, NAMED_SEND_PATHS

Metric = Literal["server", "client"]
METRICS: tuple[Metric, ...] = ("server", "client")

#: Query-string keys (short, stable: they end up in shared URLs).
_KEYS = {
    "campaign_ids": "campaign",
    "since": "since",
    "until": "until",
    "regions": "region",
    "size_min": "smin",
    "size_max": "smax",
    "baseline_iw": "base",
    "treatment_iw": "treat",
    "metric": "metric",
    "family": "family",
    "include_cost": "cost",
    "send_path": "send",
    "protocol": "proto",
}
#: The IP versions a campaign may choose (``family``).
FAMILIES = NAMED_FAMILIES
#: The send paths an origin may name (``send_path``, wire v8).
SEND_PATHS = NAMED_SEND_PATHS
#: The transports a trial or census record may name (``protocol``, wire v9).
PROTOCOLS = NAMED_PROTOCOLS
#: What ``cost=`` in a query string takes for "yes" (anything else: no).
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
#: A campaign of a cost experiment (``campaigns`` aliased ``c``): any campaign with Poisson
#: arrivals, a background flow, the interactive flow, page loads, arm shares or labelled arms
#: other than QUIC's (paced, learned) -- phases on one shared bottleneck, read by ``cost`` and
#: ``fairness`` (the Cost page).  A campaign of plain TCP and QUIC arms (``10``, ``10q``, wire v9)
#: is a benefit measurement: its TCP trials are in the benefit figures, its QUIC trials on the
#: HTTP/3 page.
COST_CAMPAIGN_SQL = """(c.arrival_rate_per_s IS NOT NULL OR c.background_bytes IS NOT NULL
    OR c.interactive_interval_us IS NOT NULL OR c.page_connections IS NOT NULL OR c.arm_shares IS NOT NULL
    OR EXISTS (SELECT 1 FROM unnest(c.arm_labels) AS label WHERE label !~ '^[0-9]{1,4}q?$'))"""
#: A campaign id no trial has: ``campaign_ids=(NO_CAMPAIGN_MATCH,)`` selects nothing (0 would
#: select the roll-ups' trials of no campaign).
NO_CAMPAIGN_MATCH = -1


#: The window rule of :class:`Filters` in the words of the API's parameter descriptions.
SINCE_DESCRIPTION = "inclusive: trials started at or after this instant (ISO 8601)"
UNTIL_DESCRIPTION = "inclusive: trials started at or before this instant (ISO 8601)"


@dataclass(frozen=True)
class Filters:
    """Which trials an analysis covers and which two arms it compares.

    ``since`` and ``until`` are both inclusive, everywhere: a trial is in the window when
    ``since <= started_at <= until`` -- the analysis functions, both raw-trials CSV exports
    (``/api/v1/trials.csv``, ``/api/v1/analysis/trials.csv``) and the dashboard's download.  The
    roll-up path applies them at day granularity (UTC days of ``trials.started_at``), the raw
    path exactly.  ``size_min``/``size_max`` are bytes, inclusive; the roll-up path applies
    them at octave granularity (a size octave is included when it overlaps the range), the raw
    path exactly.
    """

    campaign_ids: tuple[int, ...] = ()
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    regions: tuple[str, ...] = ()
    size_min: int | None = None
    size_max: int | None = None
    baseline_iw: int = 3
    treatment_iw: int = 10
    metric: Metric = "server"
    #: Only campaigns measured over this IP version (``ipv4``/``ipv6``: the campaign's own
    #: ``family``; campaigns that did not choose one are in neither); empty: every campaign.
    #: Resolved to campaign ids by :func:`resolve_family` where a query runs.
    family: str = ""
    #: Include the trials of cost experiments (:data:`COST_CAMPAIGN_SQL`: competing-flow phases,
    #: whose short flows under load are no benefit measurement) in the benefit figures -- the
    #: paired comparisons, percentile tables, latency per IW and CDFs (:func:`without_cost`).
    #: Off by default; the cost analysis itself always reads them.  URL: ``cost=1``.
    include_cost: bool = False
    #: Only trials whose origin observation names this send path (wire v8, ``wire.SEND_PATHS``:
    #: ``writev``, ``sendfile``, ``mss-writes``, ``paced``); empty: every trial.  Applied exactly
    #: by the raw path alone (:func:`trial_where`: the trials page, the raw-trials CSVs, the TLS,
    #: IW-check and cost analyses): the roll-ups are not keyed by it -- a trial's client side is
    #: folded when it arrives, before its observation is joined -- so the figures read from them
    #: (paired comparisons, percentile tables, latency per IW, CDFs) cover every send path.
    #: URL: ``send=sendfile``.
    send_path: str = ""
    #: Only trials and census records over this transport (wire v9, ``tcp`` or ``quic``; a record
    #: that does not say is TCP); empty: both.  Applied exactly by the raw path (:func:`trial_where`:
    #: the trials page, the raw-trials CSVs, the TLS and IW-check analyses) and the census.  The
    #: roll-ups hold plain TCP arms only (QUIC arms are labelled arms), so the figures read from
    #: them show nothing for ``quic`` (:func:`rollup_filters`).  The HTTP/3 page compares the two
    #: protocols whatever this says.  URL: ``proto=quic``.
    protocol: str = ""

    def to_query(self) -> dict[str, str]:
        """URL query parameters; defaults and empty values are left out."""
        default = Filters()
        query: dict[str, str] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value == getattr(default, field.name) and field.name not in ("baseline_iw", "treatment_iw", "metric"):
                continue
            key = _KEYS[field.name]
            if isinstance(value, tuple):
                query[key] = ",".join(str(item) for item in value)
            elif isinstance(value, dt.datetime):
                query[key] = value.isoformat()
            elif isinstance(value, bool):  # only True gets here: False is the default
                query[key] = "1"
            else:
                query[key] = str(value)
        return query

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Filters:
        """Parse URL parameters; a missing or malformed value falls back to its default."""
        default = cls()

        def text(name: str) -> str:
            value = query.get(_KEYS[name])
            if isinstance(value, (list, tuple)):  # e.g. parse_qs output
                value = value[0] if value else None
            return str(value).strip() if value is not None else ""

        def integer(name: str, minimum: int) -> int | None:
            try:
                value = int(text(name))
            except ValueError:
                return None
            return value if minimum <= value <= BIGINT_MAX else None

        def timestamp(name: str) -> dt.datetime | None:
            raw = text(name)
            if not raw:
                return None
            try:
                parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00").replace(" ", "+", 1) if "T" in raw else raw)
            except ValueError:
                return None
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)

        campaign_ids: list[int] = []
        for item in text("campaign_ids").split(","):
            try:
                number = int(item)
            except ValueError:
                continue
            if 0 <= number <= BIGINT_MAX and number not in campaign_ids:
                campaign_ids.append(number)
        regions = tuple(dict.fromkeys(item.strip() for item in text("regions").split(",") if item.strip()))
        baseline = integer("baseline_iw", 1)
        treatment = integer("treatment_iw", 1)
        metric = text("metric")
        family = text("family")
        send_path = text("send_path")
        protocol = text("protocol")
        return cls(
            campaign_ids=tuple(campaign_ids),
            since=timestamp("since"),
            until=timestamp("until"),
            regions=regions,
            size_min=integer("size_min", 0),
            size_max=integer("size_max", 0),
            baseline_iw=baseline if baseline is not None else default.baseline_iw,
            treatment_iw=treatment if treatment is not None else default.treatment_iw,
            metric=metric if metric in METRICS else default.metric,
            family=family if family in FAMILIES else "",
            include_cost=text("include_cost").lower() in TRUE_VALUES,
            send_path=send_path if send_path in SEND_PATHS else "",
            protocol=protocol if protocol in PROTOCOLS else "",
        )


def trial_where(filters: Filters) -> tuple[str, dict[str, Any]]:
    """The filters as an exact SQL condition on ``trials t JOIN probes p`` and its parameters (the
    raw-trial readers: trials page, CSV export, fairness and cost; arms are not filtered).  The
    send path is the trial's origin observation's (a trial without one has none)."""
    conditions = (
        ("campaign_ids", "t.campaign_id = ANY(:campaign_ids)", list(filters.campaign_ids)),
        ("since", "t.started_at >= :since", filters.since),
        ("until", "t.started_at <= :until", filters.until),
        ("regions", "p.region = ANY(:regions)", list(filters.regions)),
        ("size_min", "t.object_size >= :size_min", filters.size_min),
        ("size_max", "t.object_size <= :size_max", filters.size_max),
        (
            "send_path",
            "EXISTS (SELECT 1 FROM origin_observations AS sent WHERE sent.trial_id = t.trial_id AND sent.send_path = :send_path)",
            filters.send_path or None,
        ),
        ("protocol", "COALESCE(t.protocol, 'tcp') = :protocol", filters.protocol or None),
    )
    given = [(name, clause, value) for name, clause, value in conditions if value is not None and value != []]
    return (" AND ".join(clause for _, clause, _ in given) or "TRUE"), {name: value for name, _, value in given}


def resolve_family(session: Session, filters: Filters) -> Filters:
    """``filters`` with ``campaign_ids`` narrowed to the campaigns measured over its ``family``
    (every reader then needs only the campaign ids; ``(NO_CAMPAIGN_MATCH,)``, nothing, when none
    was -- not ``(0,)``, which would select the roll-ups' trials of no campaign)."""
    if not filters.family:
        return filters
    chosen = [
        int(row[0])
        for row in session.execute(
            text("SELECT id FROM campaigns WHERE family = :family ORDER BY id"), {"family": filters.family}
        )
    ]
    if filters.campaign_ids:
        given = set(filters.campaign_ids)
        chosen = [campaign for campaign in chosen if campaign in given]
    return replace(filters, campaign_ids=tuple(chosen) or (NO_CAMPAIGN_MATCH,))


def rollup_filters(filters: Filters) -> Filters:
    """``filters`` as the roll-ups can answer them: they hold TCP's plain arms only, so ``quic``
    selects nothing (``(NO_CAMPAIGN_MATCH,)``) and ``tcp`` is every roll-up row."""
    if filters.protocol == "quic":
        return replace(filters, campaign_ids=(NO_CAMPAIGN_MATCH,))
    return filters


def without_cost(session: Session, filters: Filters) -> Filters:
    """``filters`` for a benefit figure: cost-experiment campaigns left out unless
    ``include_cost`` -- also when they are named in ``campaign_ids`` (the checkbox decides, not
    the campaign list).  Unchanged when there is no cost campaign; otherwise ``campaign_ids``
    lists what stays: the chosen campaigns that are not cost experiments, or, when none was
    chosen, every other campaign and the trials of no campaign (``NO_CAMPAIGN``, the roll-ups'
    key for them); ``(NO_CAMPAIGN_MATCH,)`` when nothing stays.  Every roll-up reader starts here,
    so the protocol's rule is applied here too (:func:`rollup_filters`)."""
    filters = rollup_filters(filters)
    if filters.include_cost:
        return filters
    campaigns = session.execute(text(f"SELECT c.id, {COST_CAMPAIGN_SQL} AS cost FROM campaigns AS c ORDER BY c.id")).all()
    cost = {int(campaign) for campaign, is_cost in campaigns if is_cost}
    if not cost:
        return filters
    if filters.campaign_ids:
        kept = tuple(campaign for campaign in filters.campaign_ids if campaign not in cost)
    else:
        kept = (NO_CAMPAIGN, *(int(campaign) for campaign, is_cost in campaigns if not is_cost))
    return replace(filters, campaign_ids=kept or (NO_CAMPAIGN_MATCH,))
