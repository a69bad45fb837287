"""Figures of the "IW in the wild" page: the census of servers iwscope does not run (pure
functions of :mod:`iwscope.analysis.iwcheck` results, no database)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from iwscope.analysis import CensusDay, CensusTarget
from iwscope_dashboard.figures import ARM_PALETTE, TOO_SMALL_COLOUR, style_figure

#: Ticks of the IW axis (log 2): the values servers are known to use.
IW_TICKS = (1, 2, 3, 4, 10, 16, 32, 64, 128)


#: How a census row names a protocol other than TCP (the windows differ: docs/quic.md).
PROTOCOL_SUFFIX = {"quic": " (HTTP/3)"}


def _label(target: CensusTarget) -> str:
    return (target.host if len(target.url) > 60 else target.url) + PROTOCOL_SUFFIX.get(target.protocol, "")


def census_figure(targets: Sequence[CensusTarget]) -> go.Figure:
    """A grid of targets (rows) by probe region (columns): each cell the IW its probes
    determined, coloured on a log 2 scale and sized by the determined records; ">= N" in grey
    where too few records named one (the largest window proved)."""
    regions = sorted({region for target in targets for region in target.by_region})
    columns = [*regions, "all regions"]
    named_x: list[str] = []
    named_y: list[str] = []
    named_iw: list[int] = []
    named_size: list[float] = []
    named_hover: list[str] = []
    small_x: list[str] = []
    small_y: list[str] = []
    small_text: list[str] = []
    small_hover: list[str] = []
    for target in targets:
        cells = [*target.by_region.items(), ("all regions", target.overall)]
        for region, answer in cells:
            label = _label(target)
            detail = (
                f"{target.url}<br>{region}: {answer.ok} determined of {answer.records} records"
                f"<br>values seen: {', '.join(f'{iw} x{n}' for iw, n in answer.values.items()) or '-'}"
            )
            if answer.iw_segments is not None:
                named_x.append(region)
                named_y.append(label)
                named_iw.append(answer.iw_segments)
                named_size.append(14 + 4 * math.log2(1 + answer.ok))
                named_hover.append(
                    f"{detail}<br>IW {answer.iw_segments}: "
                    f"{_share(answer.share, answer.share_ci_low, answer.share_ci_high)} agree"
                )
            else:
                small_x.append(region)
                small_y.append(label)
                small_text.append(f">={answer.max_lower_bound}" if answer.max_lower_bound is not None else "?")
                small_hover.append(
                    f"{detail}<br>n too small"
                    + (f": IW >= {answer.max_lower_bound}" if answer.max_lower_bound is not None else "")
                )
    fig = go.Figure()
    if named_x:
        fig.add_trace(
            go.Scatter(
                x=named_x,
                y=named_y,
                mode="markers+text",
                name="IW named",
                text=[str(iw) for iw in named_iw],
                textposition="middle center",
                textfont={"color": "white", "size": 11},
                hovertext=named_hover,
                hoverinfo="text",
                marker={
                    "size": named_size,
                    "color": [math.log2(iw) for iw in named_iw],
                    "colorscale": "Viridis",
                    "cmin": 0,
                    "cmax": 7,
                    "line": {"width": 0},
                    "colorbar": {
                        "title": "IW",
                        "tickvals": [math.log2(t) for t in IW_TICKS],
                        "ticktext": [str(t) for t in IW_TICKS],
                    },
                },
            )
        )
    if small_x:
        fig.add_trace(
            go.Scatter(
                x=small_x,
                y=small_y,
                mode="markers+text",
                name="n too small (largest window proved)",
                text=small_text,
                textposition="middle center",
                textfont={"color": TOO_SMALL_COLOUR, "size": 10},
                hovertext=small_hover,
                hoverinfo="text",
                marker={"size": 30, "color": "white", "line": {"width": 1.2, "color": TOO_SMALL_COLOUR}},
            )
        )
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=columns, title="Probe region")
    fig.update_yaxes(type="category", autorange="reversed", title="")
    return style_figure(fig, "Initial window (segments) per target and probe region", height=max(300, 140 + 46 * len(targets)))


def _share(share: float | None, low: float | None, high: float | None) -> str:
    if share is None:
        return "n too small"
    if low is None or high is None:
        return f"{100 * share:.0f} %"
    return f"{100 * share:.0f} % [{100 * low:.0f}, {100 * high:.0f}]"


def census_series_figure(days: Sequence[CensusDay]) -> go.Figure:
    """Per target, the day's modal IW over time (grey where the day had too few records)."""
    fig = go.Figure()
    keys = sorted({(day.url, day.protocol) for day in days})
    for index, (target, protocol) in enumerate(keys):
        mine = [day for day in days if (day.url, day.protocol) == (target, protocol)]
        url = target + PROTOCOL_SUFFIX.get(protocol, "")
        named = [day for day in mine if day.answer.iw_segments is not None]
        if named:
            fig.add_trace(
                go.Scatter(
                    x=[day.day.isoformat() for day in named],
                    y=[day.answer.iw_segments for day in named],
                    mode="lines+markers",
                    name=url if len(url) <= 60 else url[:57] + "...",
                    line={"color": ARM_PALETTE[index % len(ARM_PALETTE)]},
                    customdata=[[day.answer.ok, day.answer.records] for day in named],
                    hovertemplate=f"{url}<br>%{{x}}: IW %{{y}}<br>%{{customdata[0]}} determined of "
                    "%{customdata[1]} records<extra></extra>",
                )
            )
        small = [day for day in mine if day.answer.iw_segments is None]
        if small:
            fig.add_trace(
                go.Scatter(
                    x=[day.day.isoformat() for day in small],
                    y=[day.answer.max_lower_bound or 1 for day in small],
                    mode="markers",
                    showlegend=False,
                    marker={"color": TOO_SMALL_COLOUR, "symbol": "x"},
                    customdata=[[day.answer.ok, day.answer.records] for day in small],
                    hovertemplate=f"{url}<br>%{{x}}: n too small (%{{customdata[0]}} determined of "
                    "%{customdata[1]} records)<extra></extra>",
                )
            )
    fig.update_yaxes(type="log", tickvals=list(IW_TICKS), ticktext=[str(tick) for tick in IW_TICKS], title="IW (segments)")
    fig.update_xaxes(title="UTC day", tickformat="%b %d", dtick=86_400_000)
    return style_figure(fig, "Initial window over time (per target, modal per day)")
