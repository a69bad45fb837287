"""Figures of the Real users page (pure functions of :mod:`iwscope.analysis.passive` results, no
database): the Figure 5 trio of the real users, the improvement per day and the share sweep.

A number the analysis leaves ``None`` ("n too small") is never drawn: its place gets a grey
"n too small" marker at zero with its n, and the hover says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from iwscope.analysis.passive_results import PassiveArmCentre, PassiveBuckets, PassiveGroupRow, PassiveShareSweep
from iwscope.analysis.passive_stats import Value
from iwscope_dashboard.figures import (
    ARM_PALETTE,
    BASELINE_COLOUR,
    DIMENSION_SHORT,
    DIMENSION_TITLES,
    PERCENT_COLOUR,
    TOO_SMALL_COLOUR,
    empty_figure,
    error_bars,
    style_figure,
)

Centre = Literal["mean", "median"]


def arm_label(arm: str, iw: int | None = None) -> str:
    """``16`` -> ``IW=16``; ``default`` -> ``default (IW=10)`` when the server said its IW."""
    if arm.isdigit():
        return f"IW={arm}"
    return f"{arm} (IW={iw})" if iw is not None else arm


def _fmt(value: Value | None, unit: str = "", digits: int = 1) -> str:
    if value is None or value.value is None:
        return "n too small"
    interval = (
        f" [{value.low:,.{digits}f}, {value.high:,.{digits}f}]"
        if value.low is not None and value.high is not None
        else " [no interval]"
    )
    return f"{value.value:,.{digits}f}{unit}{interval}"


def _treated(rows: Sequence[PassiveGroupRow]) -> list[tuple[str, int | None]]:
    seen: dict[str, int | None] = {}
    for row in rows:
        for arm in row.arms:
            if not arm.baseline:
                seen.setdefault(arm.arm, arm.iw)
    return list(seen.items())


def _baseline(rows: Sequence[PassiveGroupRow]) -> PassiveArmCentre | None:
    return next((arm for row in rows for arm in row.arms if arm.baseline), None)


def _pick(arm: PassiveArmCentre, centre: Centre) -> tuple[Value | None, Value | None]:
    if centre == "mean":
        return arm.mean_improvement_ms, arm.mean_improvement_pct
    return arm.median_improvement_ms, arm.median_improvement_pct


def _hover(row: PassiveGroupRow, arm: PassiveArmCentre, base: PassiveArmCentre | None, centre: Centre) -> str:
    absolute, percent = _pick(arm, centre)
    lines = [
        f"<b>{row.group}</b>, {arm_label(arm.arm, arm.iw)}",
        f"n = {arm.responses:,} responses of {arm.connections:,} connections in {arm.clusters} clusters",
        f"mean {_fmt(arm.mean_ms, ' ms')}, median {_fmt(arm.median_ms, ' ms')}",
    ]
    if base is not None:
        lines.append(
            f"baseline {arm_label(base.arm, base.iw)}: n = {base.responses:,} in {base.clusters} clusters, "
            f"mean {_fmt(base.mean_ms, ' ms')}, median {_fmt(base.median_ms, ' ms')}"
        )
    lines.append(f"{centre} improvement {_fmt(absolute, ' ms')}, {_fmt(percent, ' %')}")
    return "<br>".join(lines)


def _improvement_traces(fig: go.Figure, rows: Sequence[PassiveGroupRow], centre: Centre, *, bars: bool) -> list[float]:
    """One bar (or line) trace per treated arm with its percent on the right axis; "n too small"
    markers where there is no number.  Returns every drawn ms value and bound (for the range)."""
    labels = [row.group for row in rows]
    drawn: list[float] = [0.0]
    small_x: list[str] = []
    small_text: list[str] = []
    small_hover: list[str] = []
    for index, (name, iw) in enumerate(_treated(rows)):
        colour = ARM_PALETTE[(index + 1) % len(ARM_PALETTE)]
        cells = [next((arm for arm in row.arms if arm.arm == name), None) for row in rows]
        picked = [_pick(arm, centre) if arm is not None else (None, None) for arm in cells]
        values = [absolute.value if absolute is not None else None for absolute, _ in picked]
        lows = [absolute.low if absolute is not None else None for absolute, _ in picked]
        highs = [absolute.high if absolute is not None else None for absolute, _ in picked]
        hover = [
            _hover(row, arm, next((a for a in row.arms if a.baseline), None), centre) if arm is not None else ""
            for row, arm in zip(rows, cells, strict=True)
        ]
        drawn += [value for value in [*values, *lows, *highs] if value is not None]
        for row, arm, value, text in zip(rows, cells, values, hover, strict=True):
            if value is None:
                responses = arm.responses if arm is not None else 0
                clusters = arm.clusters if arm is not None else 0
                small_x.append(row.group)
                small_text.append(f"n too small ({arm_label(name, iw)})")
                small_hover.append(text or f"{arm_label(name, iw)}: n={responses}, {clusters} clusters")
        if all(value is None for value in values):
            continue  # only "n too small" markers for this arm
        common = {
            "x": labels,
            "y": values,
            "name": f"{arm_label(name, iw)} (ms)",
            "hovertext": hover,
            "hoverinfo": "text",
            "error_y": error_bars(values, lows, highs) | {"color": "#333"},
        }
        fig.add_trace(
            go.Bar(marker_color=colour, **common)
            if bars
            else go.Scatter(mode="lines+markers", line={"color": colour}, connectgaps=False, **common),
            secondary_y=False,
        )
        percents = [percent.value if percent is not None else None for _, percent in picked]
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=percents,
                name=f"{arm_label(name, iw)} (%)",
                mode="markers",
                hovertext=hover,
                hoverinfo="text",
                marker={"symbol": "diamond", "size": 9, "color": colour, "line": {"width": 1, "color": PERCENT_COLOUR}},
                error_y=error_bars(
                    percents,
                    [p.low if p is not None else None for _, p in picked],
                    [p.high if p is not None else None for _, p in picked],
                )
                | {"color": PERCENT_COLOUR},
            ),
            secondary_y=True,
        )
    if small_x:
        fig.add_trace(
            go.Scatter(
                x=small_x,
                y=[0.0] * len(small_x),
                name="n too small",
                mode="markers+text",
                text=small_text,
                textposition="top center",
                textfont={"color": TOO_SMALL_COLOUR, "size": 10},
                hovertext=small_hover,
                hoverinfo="text",
                marker={"symbol": "x-thin-open", "size": 12, "color": TOO_SMALL_COLOUR, "line": {"width": 2}},
            ),
            secondary_y=False,
        )
    return drawn


def buckets_figure(buckets: PassiveBuckets, centre: Centre = "mean") -> go.Figure:
    """One Figure 5 panel of the real users: each treated arm's improvement over the baseline per
    bucket (bars: ms; diamonds: percent, right axis; whiskers: 95 % intervals)."""
    short = DIMENSION_SHORT.get(buckets.dimension, buckets.dimension)
    rows = sorted(buckets.rows, key=lambda row: row.order)
    if not rows:
        return empty_figure(f"No connection with a known {short} bucket matches these filters.", f"Improvement by {short}")
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    _improvement_traces(fig, rows, centre, bars=True)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text=f"{DIMENSION_TITLES.get(buckets.dimension, short)} (the connection's own)", type="category")
    fig.update_yaxes(title_text=f"{centre} improvement (ms)", secondary_y=False, zeroline=True)
    fig.update_yaxes(title_text="improvement (%)", secondary_y=True, showgrid=False, zeroline=True)
    base = _baseline(rows)
    against = arm_label(base.arm, base.iw) if base else "the baseline"
    note = f"over {against}, 95 % CI"
    if buckets.unknown_connections:
        note += f"; {buckets.unknown_connections:,} conns of unknown {short} left out"
    fig = style_figure(fig, f"{centre.capitalize()} improvement by {short}", height=420)
    fig.update_layout(legend_title_text=note, legend_title_font_size=11, margin={"t": 110})
    return fig


def days_figure(days: Sequence[PassiveGroupRow], centre: Centre = "mean") -> go.Figure:
    """Each treated arm's improvement over the baseline per UTC day (ms, with 95 % intervals)."""
    if not days:
        return empty_figure("No aggregates match these filters.", "Improvement per day")
    rows = sorted(days, key=lambda row: row.order)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    _improvement_traces(fig, rows, centre, bars=False)
    fig.update_xaxes(title_text="UTC day (of the hour the connections closed in)", type="category")
    fig.update_yaxes(title_text=f"{centre} improvement (ms)", secondary_y=False, zeroline=True)
    fig.update_yaxes(title_text="improvement (%)", secondary_y=True, showgrid=False, zeroline=True)
    base = _baseline(rows)
    against = arm_label(base.arm, base.iw) if base else "the baseline"
    fig = style_figure(fig, f"{centre.capitalize()} improvement per day", height=380)
    fig.update_layout(legend_title_text=f"over {against}, 95 % CI", legend_title_font_size=11)
    return fig


def sweep_figure(sweep: PassiveShareSweep) -> go.Figure:
    """The untreated (default) arm's mean and median latency and retransmission rate per treated
    share: what a growing treated share does to everyone else (never drawn below zero)."""
    points = sorted(sweep.points, key=lambda point: point.treated_share_bp)
    if not points or sweep.arm is None:
        return empty_figure("No share sweep yet: change the campaign's shares (a new phase) to see one.", "Share sweep")
    labels = [f"{point.treated_share_bp / 100:g} %" for point in points]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    tops: list[float] = [0.0]
    for name, attribute, colour, symbol in (
        ("mean", "mean_ms", BASELINE_COLOUR, "circle"),
        ("median", "median_ms", ARM_PALETTE[1], "square"),
    ):
        values = [getattr(point, attribute) for point in points]
        ys = [value.value for value in values]
        highs = [value.high for value in values]
        tops += [value for value in [*ys, *highs] if value is not None]
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=ys,
                name=f"{arm_label(sweep.arm, sweep.iw)} {name} (ms)",
                mode="lines+markers",
                marker={"color": colour, "symbol": symbol, "size": 9},
                line={"color": colour},
                error_y=error_bars(ys, [value.low for value in values], highs) | {"color": colour},
                hovertext=[
                    f"treated {label}: n = {point.responses:,} responses in {point.clusters} clusters<br>"
                    f"{name} {_fmt(value, ' ms')}<br>change vs {points[0].treated_share_bp / 100:g} %: "
                    f"{_fmt(point.mean_change_ms if name == 'mean' else point.median_change_ms, ' ms')}"
                    for label, point, value in zip(labels, points, values, strict=True)
                ],
                hoverinfo="text",
            ),
            secondary_y=False,
        )
    rates = [point.retrans_rate for point in points]
    percent = [None if rate.value is None else 100.0 * rate.value for rate in rates]
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=percent,
            name="retransmitted segments (%)",
            mode="lines+markers",
            line={"color": PERCENT_COLOUR, "dash": "dot"},
            marker={"color": PERCENT_COLOUR},
            error_y=error_bars(
                percent,
                [None if rate.low is None else 100.0 * rate.low for rate in rates],
                [None if rate.high is None else 100.0 * rate.high for rate in rates],
            )
            | {"color": PERCENT_COLOUR},
        ),
        secondary_y=True,
    )
    small = [(label, point) for label, point in zip(labels, points, strict=True) if point.too_small]
    if small:
        fig.add_trace(
            go.Scatter(
                x=[label for label, _ in small],
                y=[0.0] * len(small),
                name="n too small",
                mode="markers+text",
                text=[f"n too small (n={point.responses}, {point.clusters} clusters)" for _, point in small],
                textposition="top center",
                textfont={"color": TOO_SMALL_COLOUR, "size": 10},
                marker={"symbol": "x-thin-open", "size": 12, "color": TOO_SMALL_COLOUR, "line": {"width": 2}},
            ),
            secondary_y=False,
        )
    fig.update_xaxes(title_text="treated share of client prefixes", type="category")
    fig.update_yaxes(
        title_text="latency of the untreated arm (ms)", secondary_y=False, range=[0, max(tops) * 1.1 if max(tops) > 0 else 1]
    )
    fig.update_yaxes(title_text="retransmitted (%)", secondary_y=True, showgrid=False, rangemode="tozero")
    return style_figure(
        fig, f"Share sweep: the {arm_label(sweep.arm, sweep.iw)} arm as the treated share grows (95 % CI)", height=380
    )
