"""Cost: what an initial-window policy costs the traffic sharing its bottleneck.

Built from :func:`iwscope.analysis.cost` (one :class:`~iwscope.analysis.CostReport` per filter
change).  Every cost campaign is a *phase* of an experiment on one bottleneck (a region).  The
page shows, per phase, the delay the short flows add to a voice-like interactive flow, the
short flows' and page loads' completion times per arm, and the bulk flow's throughput; then the
share sweep (treatment share 0..100 % on one bottleneck), the interference of an A/B split
(Spang et al., IMC 2021), and the bulk flow alone vs with short flows (the former Fairness page).

A number the report leaves ``None`` (too few flows or packets) is shown as "n too small" with
its n, never as 0, and never drawn.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

import dash
import plotly.graph_objects as go
from dash import Output, callback, dcc, html
from plotly.subplots import make_subplots

from iwscope.analysis import CostCampaign, CostFlows, CostInterference, CostReport, arm_order, used_arms
from iwscope_dashboard.figures import (
    ARM_PALETTE,
    PERCENT_COLOUR,
    TREATMENT_COLOUR,
    arm_name,
    empty_figure,
    interval_bars,
    style_figure,
)
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.pagedata import cost_data
from iwscope_dashboard.pagekit import Nothing, graph, page_filters, page_frame, read, status

dash.register_page(__name__, path="/cost", name="Cost", title="iwscope: cost", order=5)

PREFIX = "cost"
TOO_SMALL = "n too small"
NOT_RECORDED_SHORT = "No cost campaigns recorded yet."
NOT_RECORDED = (
    "The Cost page needs cost campaigns: phases on one bottleneck with Poisson arrivals of short "
    "flows, a bulk background flow, a voice-like interactive flow and page loads, run with one IW "
    "policy at a time and with mixes of two (the share sweep 0/25/50/75/100 %). "
    "`iwscope lab reproduce --only cost` runs them in the lab; once they are stored this page shows "
    "per phase the delay and loss the short flows add to the interactive flow, the completion "
    "times per arm with their 95 % intervals, the share sweep, the A/B interference bias and the "
    "bulk flow's throughput alone vs with the short flows."
)
INTERFERENCE_NOTE = (
    "An A/B split on one bottleneck measures treatment minus baseline while both share the queue; "
    "the total effect compares a bottleneck where everyone uses the treatment with one where nobody "
    "does (Spang et al., IMC 2021)."
)
SWEEP_TICKS = (0, 25, 50, 75, 100)
#: The legend of a figure with subplot titles: horizontal, at the bottom of the figure (plotly
#: makes room for it below the axes), never over the subplot titles where ``style_figure``'s
#: legend above the plot would sit.
LEGEND_BELOW: dict[str, Any] = {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0, "xanchor": "left"}


def layout(**url_query: Any) -> html.Div:
    def card(title: str, note: str, body_id: str) -> html.Div:
        return html.Div(
            [
                html.H3(title, className="iw-table-title"),
                html.Div(note, className="iw-table-note"),
                dcc.Loading(html.Div(id=body_id, style={"overflowX": "auto"}), delay_show=150),
            ],
            className="iw-card iw-percentiles",
        )

    return page_frame(
        PREFIX,
        "Cost to the traffic sharing the bottleneck",
        "What a larger or differently sent initial window costs everyone else on the same bottleneck: "
        "the queueing delay and loss it adds to a voice-like interactive flow, the completion time of "
        "short flows and page loads per IW policy (arm), and the throughput of a bulk flow. Each "
        "campaign is a phase on one bottleneck (region). Numbers carry their 95 % interval and n; "
        'with fewer than 6 flows or 50 packets a number shows "n too small".',
        filters_from_page_query(url_query),
        [
            card(
                "Cost per phase",
                "Completion times are medians; every number has its [95 % CI] and n. The "
                "interactive flow's delay is its round-trip time above the bottleneck's empty-queue RTT.",
                f"{PREFIX}-table",
            ),
            graph(f"{PREFIX}-delay-graph"),
            graph(f"{PREFIX}-sweep-graph"),
            card("Interference: A/B split vs total effect", INTERFERENCE_NOTE, f"{PREFIX}-interference"),
            graph(f"{PREFIX}-bulk-graph"),
        ],
    )


# ---- numbers as text --------------------------------------------------------------------------


class Cell(NamedTuple):
    """A table cell: the number (or "n too small" / a dash) with its interval and n beside it.
    (Not a dataclass: Dash runs page modules without entering them in ``sys.modules``.)"""

    value: str
    note: str = ""
    too_small: bool = False

    @property
    def text(self) -> str:
        return f"{self.value} {self.note}".strip()


def _interval(ci: tuple[float, float] | None, scale: float, digits: int) -> str:
    return f"[{ci[0] * scale:,.{digits}f}, {ci[1] * scale:,.{digits}f}]" if ci else "[no interval]"


def measure(
    value: float | None,
    ci: tuple[float, float] | None,
    n: int | str,
    unit: str,
    *,
    scale: float = 1.0,
    digits: int = 1,
    signed: bool = False,
) -> Cell:
    """``value [low, high], n=...`` or, for ``None``, "n too small" with the n it had."""
    count = f"{n:,}" if isinstance(n, int) else n
    if value is None:
        return Cell(TOO_SMALL, f"n={count} {unit}".strip(), True)
    number = f"{value * scale:+,.{digits}f}" if signed else f"{value * scale:,.{digits}f}"
    return Cell(number, f"{_interval(ci, scale, digits)}, n={count} {unit}".strip())


def phase_label(campaign: CostCampaign) -> str:
    rate = f", {campaign.arrival_rate_per_s:.3g}/s" if campaign.arrival_rate_per_s is not None else ""
    return f"#{campaign.campaign_id} {campaign.mix}{rate}"


def _colours(report: CostReport) -> dict[str, str]:
    arms = sorted({flow.arm for flow in report.flows} | {a for c in report.campaigns for a in c.arms}, key=arm_order)
    return {arm: ARM_PALETTE[index % len(ARM_PALETTE)] for index, arm in enumerate(arms)}


def _zero_range(tops: Sequence[float | None]) -> list[float]:
    """A y range from 0 (never below: completion times, delays and shares are not negative)."""
    top = max([value for value in tops if value is not None] + [0.0])
    return [0.0, top * 1.1 if top > 0 else 1.0]


# ---- a. the cost table ------------------------------------------------------------------------


def _arms_of(report: CostReport, role: str) -> list[str]:
    return sorted({flow.arm for flow in report.flows if flow.role == role}, key=arm_order)


def cost_columns(report: CostReport) -> list[tuple[str, str]]:
    """(key, header) of the cost table; arm columns for the arms the phases ran."""
    columns = [
        ("phase", "Phase"),
        ("region", "Bottleneck (region)"),
        ("mix", "Mix (short flows)"),
        ("delay_p50", "Interactive delay added p50 (ms)"),
        ("delay_p99", "Interactive delay added p99 (ms)"),
        ("loss", "Interactive loss (%)"),
    ]
    columns += [(f"short:{arm}", f"Short flows median FCT {arm_name(arm)} (ms)") for arm in _arms_of(report, "short")]
    if any(flow.role in ("background", "background-alone") for flow in report.flows):
        columns.append(("bulk", "Bulk flow throughput with / alone (Mbit/s)"))
    columns += [(f"page:{arm}", f"Page load median {arm_name(arm)} (ms)") for arm in _arms_of(report, "page-load")]
    return columns


def _bulk_cell(flows: dict[tuple[int, str, str], CostFlows], campaign_id: int) -> Cell:
    """The bulk flow's mean throughput with / alone, each with its interval and n."""
    picked = {
        role: next((f for (c, r, _), f in flows.items() if c == campaign_id and r == role), None)
        for role in ("background", "background-alone")
    }
    if picked["background"] is None and picked["background-alone"] is None:
        return Cell("—", "no bulk flow")
    cells = [
        Cell("—", "not run")
        if flow is None
        else measure(flow.throughput_bps, flow.throughput_ci_bps, flow.n, "flows", scale=1e-6, digits=2)
        for flow in (picked["background"], picked["background-alone"])
    ]
    return Cell(
        " / ".join(cell.value for cell in cells), " / ".join(cell.note for cell in cells), any(cell.too_small for cell in cells)
    )


def cost_rows(report: CostReport) -> list[dict[str, Cell]]:
    """One row per phase, keyed like :func:`cost_columns`."""
    flows = {(flow.campaign_id, flow.role, flow.arm): flow for flow in report.flows}
    interactive = {point.campaign_id: point for point in report.interactive}
    columns = [key for key, _ in cost_columns(report)]
    rows: list[dict[str, Cell]] = []
    for campaign in sorted(report.campaigns, key=lambda c: (c.region, c.campaign_id)):
        row = {
            "phase": Cell(f"#{campaign.campaign_id}", campaign.name),
            "region": Cell(campaign.region),
            "mix": Cell(
                campaign.mix, f"{campaign.arrival_rate_per_s:.3g} flows/s" if campaign.arrival_rate_per_s is not None else ""
            ),
        }
        point = interactive.get(campaign.campaign_id)
        if point is None:
            for key in ("delay_p50", "delay_p99", "loss"):
                row[key] = Cell("—", "no interactive flow")
        else:
            row["delay_p50"] = measure(point.delay_p50_ms, point.delay_p50_ci_ms, point.samples, "packets")
            row["delay_p99"] = measure(point.delay_p99_ms, point.delay_p99_ci_ms, point.samples, "packets")
            row["loss"] = measure(point.loss_share, point.loss_ci, point.sent, "packets sent", scale=100.0, digits=2)
        for key in columns:
            role, _, arm = key.partition(":")
            if role in ("short", "page"):
                flow = flows.get((campaign.campaign_id, "short" if role == "short" else "page-load", arm))
                unit = "flows" if role == "short" else "pages"
                row[key] = (
                    Cell("—", "not run")
                    if flow is None
                    else measure(
                        flow.fct_p50_ms,
                        flow.fct_p50_ci_ms,
                        flow.n,
                        unit + (f", {flow.errors:,} failed" if flow.errors else ""),
                        digits=0,
                    )
                )
        if "bulk" in columns:
            row["bulk"] = _bulk_cell(flows, campaign.campaign_id)
        rows.append(row)
    return rows


def _td(cell: Cell) -> html.Td:
    content: Any = [cell.value, html.Br(), html.Span(cell.note, className="iw-ci")] if cell.note else cell.value
    if cell.too_small:
        return html.Td(content, className="iw-too-small", style={"color": "#9a9a9a"})
    return html.Td(content)


def html_table(columns: Sequence[tuple[str, str]], rows: Sequence[dict[str, Cell]], table_id: str) -> html.Table:
    head = html.Thead(html.Tr([html.Th(header) for _, header in columns]))
    body = html.Tbody([html.Tr([_td(row.get(key, Cell("—"))) for key, _ in columns]) for row in rows])
    return html.Table([head, body], className="iw-table", id=table_id)


# ---- b. interactive delay ---------------------------------------------------------------------


def delay_figure(report: CostReport) -> go.Figure:
    """Delay the short flows add to the interactive flow, p50 and p99 per phase, grouped by region.

    Phases without a number (too few packets) get no bar; a note under the plot names them."""
    campaigns = {c.campaign_id: c for c in report.campaigns}
    points = sorted((p for p in report.interactive if p.campaign_id in campaigns), key=lambda p: (p.region, p.campaign_id))
    if not points:
        return empty_figure("No phase ran the interactive flow.", "Delay added to the interactive flow")
    fig = go.Figure()
    tops: list[float | None] = []
    for name, field, colour in (("delay p50", "delay_p50", TREATMENT_COLOUR), ("delay p99", "delay_p99", PERCENT_COLOUR)):
        shown = [p for p in points if getattr(p, f"{field}_ms") is not None]
        values = [float(getattr(p, f"{field}_ms")) for p in shown]
        cis = [getattr(p, f"{field}_ci_ms") for p in shown]
        tops += [ci[1] if ci else v for v, ci in zip(values, cis, strict=True)]
        fig.add_trace(
            go.Bar(
                x=[[p.region for p in shown], [phase_label(campaigns[p.campaign_id]) for p in shown]],
                y=values,
                name=name,
                marker_color=colour,
                error_y=interval_bars(values, cis),
                customdata=[[p.samples, _interval(ci, 1.0, 1)] for p, ci in zip(shown, cis, strict=True)],
                hovertemplate="%{x}<br>%{y:.1f} ms %{customdata[1]}<br>n=%{customdata[0]} packets<extra>" + name + "</extra>",
            )
        )
    small = [p for p in points if p.delay_p50_ms is None or p.delay_p99_ms is None]
    if small:
        names = "; ".join(f"{phase_label(campaigns[p.campaign_id])} (n={p.samples:,} packets)" for p in small)
        fig.add_annotation(
            text=f"{TOO_SMALL}, no bar: {names}",
            x=0,
            y=-0.22,
            xref="paper",
            yref="paper",
            showarrow=False,
            xanchor="left",
            font={"size": 11, "color": "#777"},
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="queueing delay added (ms)", range=_zero_range(tops))
    fig.update_xaxes(title_text="bottleneck / phase")
    return style_figure(fig, "Delay added to the interactive flow per phase (p50, p99; 95 % CI)", height=420)


# ---- c. share sweep ---------------------------------------------------------------------------


def _treatment_share(campaign: CostCampaign, baseline: str, treatment: str, flows: Sequence[CostFlows]) -> float | None:
    """The treatment's share of the phase's short flows in % (pure phases: 0 or 100), or ``None``
    when the phase ran another arm.  Taken from ``CostFlows.share`` (the baseline's share gives
    the treatment's as its complement), else from the phase's arms."""
    used = used_arms(campaign)
    if not used or not set(used) <= {baseline, treatment}:
        return None
    for flow in flows:
        if flow.arm == treatment and flow.share is not None:
            return 100.0 * flow.share
    for flow in flows:
        if flow.arm == baseline and flow.share is not None:
            return 100.0 * (1.0 - flow.share)
    if used == [treatment]:
        return 100.0
    if used == [baseline]:
        return 0.0
    # the paired design (no shares): every size fetched by both arms, so half the flows each
    return 50.0 if not campaign.shares and set(used) == {baseline, treatment} else None


def _sweep_pairs(campaigns: Sequence[CostCampaign]) -> list[tuple[str, str]]:
    """(baseline, treatment) of the phases that split the short flows between two arms."""
    mixed = {tuple(sorted(used_arms(c), key=arm_order)) for c in campaigns if len(used_arms(c)) == 2}
    return sorted((pair[0], pair[1]) for pair in mixed)


SweepPoint = tuple[float, float, tuple[float, float] | None, int]


class SweepLine(NamedTuple):
    """One line of the share sweep: ``points`` are ``(x %, mean ms, CI, n)`` sorted by x."""

    name: str
    arm: str
    design: int
    points: list[SweepPoint]


def _design(campaign: CostCampaign) -> tuple[Any, ...]:
    """What must match for phases to sit on one sweep line (not the mix): arrival rate and the
    flows beside the short ones (the bulk flow's size follows the arrivals' span: not compared)."""
    rate = None if campaign.arrival_rate_per_s is None else float(f"{campaign.arrival_rate_per_s:.3g}")
    return (rate, campaign.background_bytes is not None, campaign.page_connections, campaign.interactive)


def _design_label(design: tuple[Any, ...]) -> str:
    rate, background, pages, interactive = design
    parts = [f"{rate:g}/s" if rate is not None else "no arrivals"]
    parts += ["bulk"] if background else []
    parts += [f"pages x{pages}"] if pages else []
    parts += ["interactive"] if interactive else []
    return ", ".join(parts)


def sweep_series(report: CostReport) -> dict[str, list[SweepLine]]:
    """Per region, the lines of the share sweep: per design (load, flows), sweep pair and arm.

    Only designs with a mixed phase form a sweep; their pure phases are its 0 % and 100 % ends.
    Pure phases of other designs (bulk-flow or page-load phases, other policies) are left out
    here: the cost table shows them."""
    flows_of: dict[int, list[CostFlows]] = defaultdict(list)
    for flow in report.flows:
        if flow.role == "short":
            flows_of[flow.campaign_id].append(flow)
    by_region: dict[str, dict[tuple[Any, ...], list[CostCampaign]]] = defaultdict(lambda: defaultdict(list))
    for campaign in sorted(report.campaigns, key=lambda c: c.campaign_id):
        if flows_of.get(campaign.campaign_id):
            by_region[campaign.region][_design(campaign)].append(campaign)
    result: dict[str, list[SweepLine]] = {}
    for region, designs in sorted(by_region.items()):
        lines: list[SweepLine] = []
        sweeps = {
            design: (campaigns, pairs)
            for design, campaigns in sorted(designs.items(), key=lambda item: str(item[0]))
            if (pairs := _sweep_pairs(campaigns))
        }
        for index, (design, (campaigns, pairs)) in enumerate(sweeps.items()):
            for baseline, treatment in pairs:
                for arm in (baseline, treatment):
                    points: list[SweepPoint] = []
                    for campaign in campaigns:
                        flows = flows_of[campaign.campaign_id]
                        x = _treatment_share(campaign, baseline, treatment, flows)
                        mine = [f for f in flows if f.arm == arm]
                        if x is None or not mine or mine[0].fct_mean_ms is None:  # None: no point
                            continue
                        points.append((x, mine[0].fct_mean_ms, mine[0].fct_mean_ci_ms, mine[0].n))
                    name = arm_name(arm) + (f" ({arm_name(baseline)} vs {arm_name(treatment)})" if len(pairs) > 1 else "")
                    name += f", {_design_label(design)}" if len(sweeps) > 1 else ""
                    if points:
                        lines.append(SweepLine(name, arm, index, sorted(points, key=lambda p: p[0])))
        result[region] = lines
    return result


def sweep_figure(report: CostReport) -> go.Figure:
    """Short-flow mean completion time per arm against the treatment's share of the short flows
    (colour: arm; dash: the phases' design when a bottleneck ran several loads)."""
    series = {region: lines for region, lines in sweep_series(report).items() if lines}
    if not series:
        return empty_figure(
            "No share sweep: it needs phases splitting the short flows between two arms "
            "(e.g. 25/50/75 %) beside the pure phases, with enough flows (n too small otherwise).",
            "Share sweep",
        )
    colours = _colours(report)
    dashes = ("solid", "dash", "dot", "dashdot", "longdash")
    fig = make_subplots(rows=1, cols=len(series), subplot_titles=list(series), horizontal_spacing=0.08)
    shown: set[str] = set()
    for column, (region, lines) in enumerate(series.items(), start=1):
        tops: list[float | None] = []
        for line in lines:
            values = [p[1] for p in line.points]
            cis = [p[2] for p in line.points]
            tops += [ci[1] if ci else v for v, ci in zip(values, cis, strict=True)]
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in line.points],
                    y=values,
                    name=line.name,
                    mode="lines+markers",
                    legendgroup=line.name,
                    showlegend=line.name not in shown,
                    line={"color": colours.get(line.arm), "dash": dashes[line.design % len(dashes)]},
                    error_y=interval_bars(values, cis, colours.get(line.arm)),
                    customdata=[[p[3], _interval(p[2], 1.0, 0)] for p in line.points],
                    hovertemplate="treatment %{x:.0f} %<br>mean %{y:.0f} ms %{customdata[1]}<br>n=%{customdata[0]} flows"
                    "<extra>" + line.name + " " + region + "</extra>",
                ),
                row=1,
                col=column,
            )
            shown.add(line.name)
        fig.update_yaxes(range=_zero_range(tops), row=1, col=column)
        fig.update_xaxes(
            range=[-5, 105], tickvals=list(SWEEP_TICKS), ticktext=[f"{tick} %" for tick in SWEEP_TICKS], row=1, col=column
        )
    fig.update_yaxes(title_text="short flows: mean completion (ms)", row=1, col=1)
    # one title per panel, short enough not to run into the next panel's
    share_title = "treatment share of the short flows (pure phases: 0 % and 100 %)" if len(series) == 1 else "treatment share"
    fig.update_xaxes(title_text=share_title)
    fig = style_figure(
        fig, "Share sweep: short-flow mean completion time per arm (95 % CI; pure phases at 0 and 100 %)", height=420
    )
    return fig.update_layout(legend=LEGEND_BELOW)


# ---- d. interference --------------------------------------------------------------------------


def interference_rows(points: Sequence[CostInterference]) -> list[dict[str, Cell]]:
    rows = []
    for p in sorted(points, key=lambda p: (p.region, p.treatment_share, p.mixed_campaign_id)):
        n_text = f"{p.n[0]:,}/{p.n[1]:,}/{p.n[2]:,}/{p.n[3]:,}"
        rows.append(
            {
                "region": Cell(p.region),
                "arms": Cell(f"{arm_name(p.baseline)} vs {arm_name(p.treatment)}"),
                "share": Cell(f"{p.treatment_share * 100:.0f} %", f"phase #{p.mixed_campaign_id}"),
                "ab": measure(p.ab_ms, p.ab_ci_ms, f"{p.n[0]:,}/{p.n[1]:,}", "flows", signed=True),
                "total": measure(p.total_ms, p.total_ci_ms, f"{p.n[2]:,}/{p.n[3]:,}", "flows", signed=True),
                "bias": measure(p.bias_ms, p.bias_ci_ms, n_text, "flows", signed=True),
                "n": Cell(
                    n_text,
                    f"phases #{p.mixed_campaign_id} (mixed), #{p.all_baseline_campaign_id} (all "
                    f"{arm_name(p.baseline)}), #{p.all_treatment_campaign_id} (all {arm_name(p.treatment)})",
                ),
            }
        )
    return rows


INTERFERENCE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("region", "Bottleneck"),
    ("arms", "Baseline vs treatment"),
    ("share", "Treatment share"),
    ("ab", "A/B estimate (ms)"),
    ("total", "Total effect (ms)"),
    ("bias", "Bias A/B - total (ms)"),
    ("n", "n: mixed base/treat, all-base, all-treat"),
)


# ---- e. bulk flows (the former Fairness page) -------------------------------------------------

#: The interval of each number the bulk-flow figure draws.
_CI_FIELD = {"throughput_bps": "throughput_ci_bps", "bytes_retrans_share": "bytes_retrans_share_ci"}


def bulk_figure(report: CostReport) -> go.Figure:
    """The bulk (background) flow's throughput alone vs with the short flows per phase, and the
    share of bytes retransmitted by it and by the short flows of each arm."""
    campaigns = {c.campaign_id: c for c in report.campaigns}
    phases = sorted(
        {f.campaign_id for f in report.flows if f.role in ("background", "background-alone") and f.campaign_id in campaigns},
        key=lambda c: (campaigns[c].region, c),
    )
    if not phases:
        return empty_figure("No phase ran a bulk background flow.", "Bulk flows")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Bulk flow throughput (Mbit/s)", "Retransmitted bytes (% of sent)"))
    colours = _colours(report)
    tops: dict[int, list[float | None]] = {1: [], 2: []}

    def add(
        role: str, arm: str | None, field: str, scale: float, name: str, colour: str, column: int, legend: bool = True
    ) -> None:
        xs, ys, cis, ns = [], [], [], []
        for campaign_id in phases:
            flow = next(
                (f for f in report.flows if f.campaign_id == campaign_id and f.role == role and (arm is None or f.arm == arm)),
                None,
            )
            value = getattr(flow, field) if flow is not None else None
            if flow is not None and value is not None:  # None: no bar (n too small or not measured), never a 0
                xs.append(phase_label(campaigns[campaign_id]))
                ys.append(value * scale)
                interval = getattr(flow, _CI_FIELD[field])
                cis.append((interval[0] * scale, interval[1] * scale) if interval else None)
                ns.append(flow.n)
        if xs:
            tops[column].extend(high for _, high in filter(None, cis))
            tops[column].extend(ys)
            fig.add_trace(
                go.Bar(
                    x=xs,
                    y=ys,
                    name=name,
                    marker_color=colour,
                    showlegend=legend,
                    customdata=ns,
                    error_y=interval_bars(ys, cis),
                    hovertemplate="%{x}<br>%{y:.2f}<br>n=%{customdata} flows<extra>" + name + "</extra>",
                ),
                row=1,
                col=column,
            )

    add("background-alone", None, "throughput_bps", 1e-6, "background alone", ARM_PALETTE[4], 1)
    add("background", None, "throughput_bps", 1e-6, "background with short flows", ARM_PALETTE[5], 1)
    add("background", None, "bytes_retrans_share", 100.0, "background retrans", ARM_PALETTE[5], 2, legend=False)
    for arm in _arms_of(report, "short"):
        add("short", arm, "bytes_retrans_share", 100.0, f"short {arm_name(arm)} retrans", colours[arm], 2)
    for column in (1, 2):
        fig.update_yaxes(range=_zero_range(tops[column]), row=1, col=column)
    fig.update_layout(barmode="group")
    fig = style_figure(fig, "Bulk flows: throughput alone vs with short flows, and retransmissions per phase", height=420)
    return fig.update_layout(legend=LEGEND_BELOW)


# ---- the callback -----------------------------------------------------------------------------


@callback(
    Output(f"{PREFIX}-table", "children"),
    Output(f"{PREFIX}-delay-graph", "figure"),
    Output(f"{PREFIX}-sweep-graph", "figure"),
    Output(f"{PREFIX}-interference", "children"),
    Output(f"{PREFIX}-bulk-graph", "figure"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    report = read(cost_data, filters, cache=True, empty=lambda report: not report.campaigns, empty_message=NOT_RECORDED_SHORT)
    if isinstance(report, Nothing):
        empty = empty_figure(report.message)
        table: Any = html.P(NOT_RECORDED, className="iw-empty") if report.kind == "empty" else []
        return table, empty, empty, [], empty, report.status_line(), search
    interference: Any = (
        html_table(INTERFERENCE_COLUMNS, interference_rows(report.interference), f"{PREFIX}-interference-table")
        if report.interference
        else html.P(
            "No mixed phase with both pure phases of the same design on its bottleneck: the "
            "comparison needs e.g. a 50 % mix and the all-baseline and all-treatment phases.",
            className="iw-empty",
        )
    )
    regions = sorted({c.region for c in report.campaigns})
    short = sum(f.n for f in report.flows if f.role == "short")
    message = (
        f"{len(report.campaigns):,} phases on {len(regions)} bottleneck{'s' if len(regions) != 1 else ''} "
        f"({', '.join(regions)}): {short:,} short flows, {len(report.interactive):,} phases with an interactive flow."
    )
    return (
        html_table(cost_columns(report), cost_rows(report), f"{PREFIX}-cost-table"),
        delay_figure(report),
        sweep_figure(report),
        interference,
        bulk_figure(report),
        status(message),
        search,
    )


register_url_sync(PREFIX)
