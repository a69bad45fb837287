"""The filter bar every analysis page shows, and its link to the URL.

Each page builds the bar with its own id prefix (``overview-filter-region``, ...). The page's
``layout(**query)`` receives the URL query string, so a shared URL restores the filters
(``Filters.from_query``); after every filter change the page's data callback writes
``Filters.to_query()`` into a ``<prefix>-query`` store and a clientside callback puts it in the
address bar with ``history.replaceState`` (no page reload, no router round trip).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, time
from typing import Any
from urllib.parse import urlencode

from dash import ClientsideFunction, Input, Output, clientside_callback, dcc, html

from iwscope.analysis import FilterOptions, Filters
from iwscope.analysis.filters import FAMILIES, PROTOCOLS, SEND_PATHS

DEFAULT_ARMS: tuple[int, ...] = (3, 10)
LAST_SECOND = time(23, 59, 59)
#: The pages whose figures are benefit figures (paired comparisons, percentile tables, latency
#: per IW): they leave cost-experiment trials out unless asked (``Filters.include_cost``) and show
#: the checkbox.  Other pages keep it hidden, so the choice still travels in their URLs.
COST_TOGGLE_PAGES = frozenset({"overview", "latency", "sizes", "regions", "loss"})
#: The checkbox's one value.
INCLUDE_COST = "include"
#: The pages whose figures read the raw trials (``trial_where``), the only ones the send-path
#: filter (``Filters.send_path``) applies to: they show its control.  The roll-up pages keep it
#: hidden -- their figures cover every send path -- and carry it in their URLs, as the cost box.
SEND_PATH_PAGES = frozenset({"trials", "tls", "cost", "wild"})
#: The pages that split by protocol (``Filters.protocol``, wire v9: TCP or HTTP/3): the trials and
#: the census.  The roll-up pages are TCP's (QUIC arms are labelled arms), the HTTP/3 page shows
#: both protocols side by side; they carry the choice in their URLs only.
PROTOCOL_PAGES = frozenset({"trials", "wild"})
#: What the protocol control calls each protocol.
PROTOCOL_LABELS = {"tcp": "TCP", "quic": "HTTP/3 (QUIC)"}


def filter_ids(prefix: str) -> dict[str, str]:
    """Component ids of the bar's controls on the page with this prefix."""
    return {
        "campaign": f"{prefix}-filter-campaign",
        "dates": f"{prefix}-filter-dates",
        "region": f"{prefix}-filter-region",
        "size_min": f"{prefix}-filter-size-min",
        "size_max": f"{prefix}-filter-size-max",
        "baseline": f"{prefix}-filter-baseline",
        "treatment": f"{prefix}-filter-treatment",
        "metric": f"{prefix}-filter-metric",
        "family": f"{prefix}-filter-family",
        "cost": f"{prefix}-filter-cost",
        "send_path": f"{prefix}-filter-send-path",
        "protocol": f"{prefix}-filter-protocol",
    }


def filter_inputs(prefix: str) -> list[Input]:
    """The callback inputs, in the order :func:`filters_from_values` takes them."""
    ids = filter_ids(prefix)
    return [
        Input(ids["campaign"], "value"),
        Input(ids["dates"], "start_date"),
        Input(ids["dates"], "end_date"),
        Input(ids["region"], "value"),
        Input(ids["size_min"], "value"),
        Input(ids["size_max"], "value"),
        Input(ids["baseline"], "value"),
        Input(ids["treatment"], "value"),
        Input(ids["metric"], "value"),
        Input(ids["family"], "value"),
        Input(ids["cost"], "value"),
        Input(ids["send_path"], "value"),
        Input(ids["protocol"], "value"),
    ]


def _parse_day(value: str | None) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(str(value)[:10])
    except ValueError:
        return None


def _as_int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(float(value))
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def _as_list(value: Any) -> list[Any]:
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def filters_from_values(
    campaigns: Any,
    start_date: str | None,
    end_date: str | None,
    regions: Any,
    size_min: Any,
    size_max: Any,
    baseline: Any,
    treatment: Any,
    metric: Any,
    family: Any = "",
    cost: Any = None,
    send_path: Any = "",
    protocol: Any = "",
) -> Filters:
    """Filters from the bar's raw control values; anything unreadable falls back to the default.

    The date range covers whole UTC days; ``Filters.until`` is inclusive, so it is the last
    second of the end day.  ``cost`` is the cost checkbox's value (a list holding
    :data:`INCLUDE_COST` when ticked).
    """
    defaults = Filters()
    start_day, end_day = _parse_day(start_date), _parse_day(end_date)
    campaign_ids = tuple(sorted({n for n in (_as_int(c) for c in _as_list(campaigns)) if n is not None}))
    region_names = tuple(sorted({str(r) for r in _as_list(regions) if str(r).strip()}))
    base = _as_int(baseline)
    treat = _as_int(treatment)
    return replace(
        defaults,
        campaign_ids=campaign_ids,
        since=datetime.combine(start_day, time.min, UTC) if start_day else None,
        until=datetime.combine(end_day, LAST_SECOND, UTC) if end_day else None,
        regions=region_names,
        size_min=_as_int(size_min),
        size_max=_as_int(size_max),
        baseline_iw=base if base else defaults.baseline_iw,
        treatment_iw=treat if treat else defaults.treatment_iw,
        metric=metric if metric in ("server", "client") else defaults.metric,
        family=family if family in FAMILIES else "",
        include_cost=INCLUDE_COST in _as_list(cost),
        send_path=send_path if send_path in SEND_PATHS else "",
        protocol=protocol if protocol in PROTOCOLS else "",
    )


def query_string(filters: Filters) -> str:
    """``?campaign=1&base=3...`` without empty parameters (shorter URLs to share)."""
    pairs = {key: value for key, value in filters.to_query().items() if value not in ("", None)}
    return "?" + urlencode(pairs, safe=",:") if pairs else ""


def _day_of(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).date().isoformat()


def _labelled(label: str, control: Any, class_name: str = "iw-filter") -> html.Div:
    return html.Div([html.Label(label, className="iw-filter-label"), control], className=class_name)


def filter_bar(prefix: str, filters: Filters, options: FilterOptions | None) -> html.Div:
    """The controls, showing ``filters`` (values the database lacks are kept so nothing is lost)."""
    ids = filter_ids(prefix)
    campaign_options: list[dict[str, Any]] = []
    region_names: list[str] = []
    arms: list[int] = list(DEFAULT_ARMS)
    size_hint = ""
    if options is not None:
        campaign_options = [{"label": f"{cid}: {name}", "value": cid} for cid, name in options.campaigns]
        region_names = list(options.regions)
        arms = sorted(set(options.arms) | set(DEFAULT_ARMS)) if options.arms else list(DEFAULT_ARMS)
        if options.size_min is not None and options.size_max is not None:
            size_hint = f"the data holds {options.size_min:,} to {options.size_max:,} bytes"
    known_campaigns = {o["value"] for o in campaign_options}
    campaign_options += [
        {"label": f"{cid}: (unknown)", "value": cid} for cid in filters.campaign_ids if cid not in known_campaigns
    ]
    region_names = sorted(set(region_names) | set(filters.regions))
    arms = sorted(set(arms) | {filters.baseline_iw, filters.treatment_iw})
    arm_options = [{"label": f"IW{iw}", "value": iw} for iw in arms]
    return html.Div(
        [
            _labelled(
                "Campaign",
                dcc.Dropdown(
                    id=ids["campaign"],
                    options=campaign_options,
                    value=list(filters.campaign_ids),
                    multi=True,
                    placeholder="all campaigns",
                ),
                "iw-filter iw-filter-wide",
            ),
            _labelled(
                "Time range (UTC days)",
                dcc.DatePickerRange(
                    id=ids["dates"],
                    start_date=_day_of(filters.since),
                    end_date=_day_of(filters.until),
                    display_format="YYYY-MM-DD",
                    clearable=True,
                    start_date_placeholder_text="from",
                    end_date_placeholder_text="to",
                ),
                "iw-filter iw-filter-wide",
            ),
            _labelled(
                "Region",
                dcc.Dropdown(
                    id=ids["region"],
                    options=[{"label": r, "value": r} for r in region_names],
                    value=list(filters.regions),
                    multi=True,
                    placeholder="all regions",
                ),
                "iw-filter iw-filter-wide",
            ),
            _labelled(
                "Size min (bytes)",
                dcc.Input(
                    id=ids["size_min"], type="number", min=0, step=1, value=filters.size_min, debounce=True, placeholder="any"
                ),
                "iw-filter iw-filter-size",
            ),
            _labelled(
                "Size max (bytes)",
                dcc.Input(
                    id=ids["size_max"], type="number", min=0, step=1, value=filters.size_max, debounce=True, placeholder="any"
                ),
                "iw-filter iw-filter-size",
            ),
            _labelled(
                "Baseline",
                dcc.Dropdown(id=ids["baseline"], options=arm_options, value=filters.baseline_iw, clearable=False),
                "iw-filter iw-filter-arm",
            ),
            _labelled(
                "Treatment",
                dcc.Dropdown(id=ids["treatment"], options=arm_options, value=filters.treatment_iw, clearable=False),
                "iw-filter iw-filter-arm",
            ),
            _labelled(
                "Latency metric",
                dcc.RadioItems(
                    id=ids["metric"],
                    options=[
                        {"label": "server (origin response)", "value": "server"},
                        {"label": "client (probe total)", "value": "client"},
                    ],
                    value=filters.metric,
                    inline=True,
                ),
                "iw-filter iw-filter-wide",
            ),
            _labelled(
                "IP version",
                dcc.RadioItems(
                    id=ids["family"],
                    options=[
                        {"label": "all", "value": ""},
                        {"label": "IPv4 campaigns", "value": "ipv4"},
                        {"label": "IPv6 campaigns", "value": "ipv6"},
                    ],
                    value=filters.family,
                    inline=True,
                ),
                "iw-filter iw-filter-wide",
            ),
            html.Div(
                [
                    html.Label("Cost experiments", className="iw-filter-label"),
                    dcc.Checklist(
                        id=ids["cost"],
                        options=[{"label": "include cost-experiment trials", "value": INCLUDE_COST}],
                        value=[INCLUDE_COST] if filters.include_cost else [],
                        inline=True,
                    ),
                ],
                className="iw-filter iw-filter-wide",
                title="Campaigns of the cost experiments (competing flows on a shared bottleneck, the Cost "
                "page) measure short flows under load, not the benefit of an IW: these figures leave "
                "their trials out unless this is ticked.",
                # present on every page (the callbacks read it and the URL keeps it), shown where it applies
                style=None if prefix in COST_TOGGLE_PAGES else {"display": "none"},
            ),
            html.Div(
                [
                    html.Label("Send path (the origin's)", className="iw-filter-label"),
                    dcc.RadioItems(
                        id=ids["send_path"],
                        options=[{"label": "all", "value": ""}] + [{"label": path, "value": path} for path in SEND_PATHS],
                        value=filters.send_path,
                        inline=True,
                    ),
                ],
                className="iw-filter iw-filter-wide",
                title="How the origin wrote the response, as its observation says (wire v8): only the trials "
                "of that send path. The figures read from the roll-ups (Overview, Latency, Sizes, Regions, "
                "Loss) are not split by it.",
                style=None if prefix in SEND_PATH_PAGES else {"display": "none"},
            ),
            html.Div(
                [
                    html.Label("Protocol", className="iw-filter-label"),
                    dcc.RadioItems(
                        id=ids["protocol"],
                        options=[{"label": "all", "value": ""}] + [{"label": PROTOCOL_LABELS[p], "value": p} for p in PROTOCOLS],
                        value=filters.protocol,
                        inline=True,
                    ),
                ],
                className="iw-filter iw-filter-wide",
                title="TCP (HTTP/1.1, with or without TLS) or HTTP/3 over QUIC (wire v9): only the trials and "
                "census records of that protocol. The HTTP/3 page compares the two.",
                style=None if prefix in PROTOCOL_PAGES else {"display": "none"},
            ),
            dcc.Store(id=f"{prefix}-query"),
            dcc.Store(id=f"{prefix}-url-synced"),
        ],
        className="iw-filterbar",
        title=size_hint or None,
        id=f"{prefix}-filterbar",
    )


def register_url_sync(prefix: str) -> None:
    """Mirror the ``<prefix>-query`` store into the address bar (assets/iwscope.js)."""
    clientside_callback(
        ClientsideFunction(namespace="iwscope", function_name="syncQuery"),
        Output(f"{prefix}-url-synced", "data"),
        Input(f"{prefix}-query", "data"),
    )


def filters_from_page_query(query: dict[str, Any]) -> Filters:
    """Filters from the page's URL query (Dash pages passes it as ``layout`` keyword arguments)."""
    plain: dict[str, Any] = {}
    for key, value in query.items():
        if isinstance(value, (list, tuple)):  # a repeated parameter: from_query takes the first
            plain[str(key)] = [str(item) for item in value]
        elif isinstance(value, (str, int, float)):
            plain[str(key)] = str(value)
    return Filters.from_query(plain)


def arms_problem(filters: Filters, available_arms: Sequence[int] | None) -> str | None:
    """A sentence when the arm choice cannot give a comparison, else None."""
    if filters.baseline_iw == filters.treatment_iw:
        return f"Baseline and treatment are both IW{filters.baseline_iw}: pick two different arms to compare."
    if available_arms:
        missing = [iw for iw in (filters.baseline_iw, filters.treatment_iw) if iw not in available_arms]
        if missing:
            names = ", ".join(f"IW{iw}" for iw in missing)
            have = ", ".join(f"IW{iw}" for iw in sorted(available_arms))
            return f"No trial ran {names}; the data holds {have}."
    return None
