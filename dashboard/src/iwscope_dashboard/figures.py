"""Plotly figures built from the analysis module's results (pure functions, no database)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from iwscope.analysis import ArmStats, BucketComparison, LossBucket, ProbeRow, RegionSummary
from iwscope_dashboard.centroids import region_centroid

BASELINE_COLOUR = "#8c8c8c"
TREATMENT_COLOUR = "#1f6fb2"
TOO_SMALL_COLOUR = "#9a9a9a"
IMPROVEMENT_COLOUR = "#1f6fb2"
PERCENT_COLOUR = "#d9731a"
ARM_PALETTE = ("#8c8c8c", "#1f6fb2", "#d9731a", "#2a9d55", "#8e44ad", "#c0392b", "#16a085", "#7f6000")

#: Short names for figure titles (the axis carries the long one).
DIMENSION_SHORT: dict[str, str] = {
    "rtt": "RTT",
    "bandwidth": "bandwidth",
    "bdp": "BDP",
    "size": "size",
    "loss": "loss",
    "region": "region",
    "tls_flight": "TLS first flight",
}

DIMENSION_TITLES: dict[str, str] = {
    "rtt": "Path RTT",
    "bandwidth": "Bottleneck bandwidth",
    "bdp": "Bandwidth-delay product",
    "size": "Response size",
    "loss": "Path loss (retransmitted bytes share)",
    "region": "Region",
    "tls_flight": "Server's first TLS flight (ServerHello .. Finished; mostly the certificate chain)",
}


_GRID = "#e6ebf2"
#: A small white template: plotly's "plotly_white" carries defaults for every trace type and is
#: deep-copied into each figure (about a third of the time a figure takes to build).
TEMPLATE = go.layout.Template(
    layout={
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "xaxis": {"gridcolor": _GRID, "linecolor": _GRID, "zerolinecolor": "#c9d2dd", "automargin": True},
        "yaxis": {"gridcolor": _GRID, "linecolor": _GRID, "zerolinecolor": "#c9d2dd", "automargin": True},
        "geo": {"bgcolor": "white"},
        "hoverlabel": {"align": "left"},
    }
)


def style_figure(fig: go.Figure, title: str, *, height: int = 360) -> go.Figure:
    """The dashboard's look: title, margins, template, a horizontal legend above the plot."""
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "y": 0.98, "yanchor": "top", "font": {"size": 15}},
        height=height,
        margin={"l": 60, "r": 60, "t": 78, "b": 60},
        template=TEMPLATE,
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.01, "xanchor": "left", "x": 0},
        font={"family": "system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif", "size": 12},
    )
    return fig


def empty_figure(message: str, title: str = "") -> go.Figure:
    """A figure with no traces and the reason in the middle, so the space never looks broken."""
    fig = go.Figure()
    fig.add_annotation(
        text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 13, "color": "#555"}
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return style_figure(fig, title, height=260)


def error_bars(values: Sequence[float | None], low: Sequence[float | None], high: Sequence[float | None]) -> dict[str, Any]:
    """Asymmetric error bars from CI bounds (zero-length where a bound is undefined)."""
    plus = [(h - v) if (h is not None and v is not None) else 0.0 for v, h in zip(values, high, strict=True)]
    minus = [(v - lo) if (lo is not None and v is not None) else 0.0 for v, lo in zip(values, low, strict=True)]
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "thickness": 1.2, "width": 4}


def interval_bars(
    values: Sequence[float], intervals: Sequence[tuple[float, float] | None], colour: str | None = None
) -> dict[str, Any]:
    """:func:`error_bars` from ``(low, high)`` intervals (``None``: no interval, a zero-length bar)."""
    bars = error_bars(values, [ci[0] if ci else None for ci in intervals], [ci[1] if ci else None for ci in intervals])
    return bars | ({"color": colour} if colour else {})


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}{unit}"


def _pair_note(c: BucketComparison) -> str:
    text = f"{c.n_pairs} pairs on {c.n_paths} path{'s' if c.n_paths != 1 else ''}"
    return text + (f"<br>{c.note}" if c.note else "")


def _axis_range(
    values: Sequence[float | None], lows: Sequence[float | None], highs: Sequence[float | None]
) -> list[float] | None:
    """A y range holding 0, every shown value and its interval (not more), padded 8 %."""
    points = [v for v in [*values, *lows, *highs] if v is not None] + [0.0]
    low, high = min(points), max(points)
    if high - low <= 0:
        return None
    pad = 0.08 * (high - low)
    return [low - pad, high + pad]


def _zero_aligned(left: list[float] | None, right: list[float] | None) -> tuple[list[float] | None, list[float] | None]:
    """Widen one of two ranges (both holding 0) so that 0 sits at the same height on both axes."""
    if left is None or right is None:
        return left, right
    (a0, a1), (b0, b1) = left, right
    low_share_left, low_share_right = -a0 / (a1 - a0), -b0 / (b1 - b0)
    if low_share_left > low_share_right:  # more room below zero on the left: extend the right downwards
        b0 = -low_share_left * b1 / (1 - low_share_left) if low_share_left < 1 else b0
    elif low_share_right > low_share_left:
        a0 = -low_share_right * a1 / (1 - low_share_right) if low_share_right < 1 else a0
    return [a0, a1], [b0, b1]


def arm_names(comparison: BucketComparison | None, names: tuple[str, str] | None = None) -> tuple[str, str]:
    """What the baseline and treatment arms are called: ``names`` (e.g. TCP and HTTP/3 at one IW),
    else ``IW<n>``."""
    if names is not None:
        return names
    if comparison is None:
        return "", ""
    return f"IW{comparison.baseline.iw}", f"IW{comparison.treatment.iw}"


def improvement_figure(
    comparisons: Sequence[BucketComparison], dimension: str, names: tuple[str, str] | None = None
) -> go.Figure:
    """The paper's Figure 5 panel: paired improvement (bars, ms) and percent (line, right axis).

    Both with their 95 % intervals as error bars.  A bucket with too few pairs gets no number:
    a grey "n too small" marker with its counts; hover shows n, pairs, paths and means per arm.
    ``names``: the arms' names when their IWs do not tell them apart (:func:`arm_names`).
    """
    ordered = sorted(comparisons, key=lambda c: c.order)
    labels = [str(c.bucket) for c in ordered]
    base_name, treat_name = arm_names(ordered[0] if ordered else None, names)
    abs_ms = [None if c.too_small else c.abs_ms for c in ordered]
    pct = [None if c.too_small else c.pct for c in ordered]
    hover = [
        (
            f"{c.bucket}<br>{base_name}: n={c.baseline.n}, median {_fmt(c.baseline.median_ms, ' ms')}"
            f"<br>{treat_name}: n={c.treatment.n}, median {_fmt(c.treatment.median_ms, ' ms')}"
            + (
                f"<br><b>n too small</b>: {_pair_note(c)}"
                if c.too_small
                else f"<br>improvement {_fmt(c.abs_ms, ' ms')} [{_fmt(c.abs_ci_low)}, {_fmt(c.abs_ci_high)}]"
                f"<br>{_fmt(c.pct, ' %')} [{_fmt(c.pct_ci_low)}, {_fmt(c.pct_ci_high)}]<br>{_pair_note(c)}"
            )
        )
        for c in ordered
    ]
    abs_low = [None if c.too_small else c.abs_ci_low for c in ordered]
    abs_high = [None if c.too_small else c.abs_ci_high for c in ordered]
    pct_low = [None if c.too_small else c.pct_ci_low for c in ordered]
    pct_high = [None if c.too_small else c.pct_ci_high for c in ordered]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Bar(
            x=labels,
            y=abs_ms,
            name="absolute (ms)",
            marker_color=IMPROVEMENT_COLOUR,
            error_y=error_bars(abs_ms, abs_low, abs_high),
            hovertext=hover,
            hoverinfo="text",
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=pct,
            name="percent",
            mode="lines+markers",
            line={"color": PERCENT_COLOUR},
            error_y=error_bars(pct, pct_low, pct_high) | {"color": PERCENT_COLOUR},
            hovertext=hover,
            hoverinfo="text",
            connectgaps=False,
        ),
        secondary_y=True,
    )
    small = [(label, c) for label, c in zip(labels, ordered, strict=True) if c.too_small]
    if small:
        fig.add_trace(
            go.Scatter(
                x=[label for label, _ in small],
                y=[0.0 for _ in small],
                name="n too small",
                mode="markers+text",
                marker={"symbol": "x-thin-open", "size": 12, "color": TOO_SMALL_COLOUR, "line": {"width": 2}},
                text=[f"n too small ({c.n_pairs} pairs)" for _, c in small],
                textposition="top center",
                textfont={"color": TOO_SMALL_COLOUR, "size": 11},
                hovertext=[hover[labels.index(label)] for label, _ in small],
                hoverinfo="text",
            ),
            secondary_y=False,
        )
    ms_range, pct_range = _zero_aligned(_axis_range(abs_ms, abs_low, abs_high), _axis_range(pct, pct_low, pct_high))
    fig.update_yaxes(title_text="improvement (ms)", secondary_y=False, zeroline=True, tickmode="auto", range=ms_range)
    fig.update_yaxes(
        title_text="improvement (%)", secondary_y=True, showgrid=False, zeroline=True, tickmode="auto", range=pct_range
    )
    fig.update_xaxes(title_text=DIMENSION_TITLES.get(dimension, dimension), type="category")
    arms = f"{treat_name} vs {base_name}" if ordered else ""
    return style_figure(fig, f"Paired improvement by {DIMENSION_SHORT.get(dimension, dimension)}, {arms} (95 % CI)")


def _iqr_bars(stats: Sequence[ArmStats]) -> dict[str, Any]:
    """Error bars from the median to the quartiles (never below zero, unlike mean +- std)."""
    return {
        "type": "data",
        "symmetric": False,
        "thickness": 1.2,
        "width": 4,
        "array": [(s.p75_ms - s.median_ms) if s.p75_ms is not None and s.median_ms is not None else 0.0 for s in stats],
        "arrayminus": [(s.median_ms - s.p25_ms) if s.p25_ms is not None and s.median_ms is not None else 0.0 for s in stats],
    }


def arm_means_figure(comparisons: Sequence[BucketComparison], dimension: str, names: tuple[str, str] | None = None) -> go.Figure:
    """Median latency per bucket for both arms with their quartiles (what the improvement compares);
    ``names`` as :func:`improvement_figure`'s."""
    ordered = sorted(comparisons, key=lambda c: c.order)
    labels = [str(c.bucket) for c in ordered]
    fig = go.Figure()
    named = arm_names(ordered[0] if ordered else None, names)
    for (side, colour), name in zip((("baseline", BASELINE_COLOUR), ("treatment", TREATMENT_COLOUR)), named, strict=True):
        stats: list[ArmStats] = [getattr(c, side) for c in ordered]
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[s.median_ms for s in stats],
                name=f"{name} median",
                marker_color=colour,
                error_y=_iqr_bars(stats),
                customdata=[[s.n, s.mean_ms, s.p25_ms, s.p75_ms] for s in stats],
                hovertemplate=(
                    "%{x}<br>median %{y:.1f} ms (quartiles %{customdata[2]:.1f}-%{customdata[3]:.1f})"
                    "<br>n=%{customdata[0]}, mean %{customdata[1]:.1f} ms<extra>" + name + "</extra>"
                ),
            )
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text=DIMENSION_TITLES.get(dimension, dimension), type="category")
    fig.update_yaxes(title_text="latency (ms): median, bar = quartiles", rangemode="tozero")
    return style_figure(fig, f"Median latency per arm by {DIMENSION_SHORT.get(dimension, dimension)}")


def latency_vs_iw_figure(stats: Sequence[ArmStats]) -> go.Figure:
    """Figure 2: median latency with its quartiles for every IW present (log axis: latencies are skewed)."""
    present = sorted((s for s in stats if s.n > 0 and s.median_ms is not None), key=lambda s: s.iw)
    fig = go.Figure(
        go.Scatter(
            x=[s.iw for s in present],
            y=[s.median_ms for s in present],
            mode="lines+markers",
            name="median",
            marker={"size": 9, "color": TREATMENT_COLOUR},
            error_y=_iqr_bars(present),
            customdata=[[s.n, s.mean_ms, s.p25_ms, s.p75_ms] for s in present],
            hovertemplate=(
                "IW%{x}<br>median %{y:.1f} ms<br>quartiles %{customdata[2]:.1f}-%{customdata[3]:.1f} ms"
                "<br>mean %{customdata[1]:.1f} ms<br>n=%{customdata[0]}<extra></extra>"
            ),
        )
    )
    fig.update_xaxes(title_text="initial congestion window (segments)", tickmode="array", tickvals=[s.iw for s in present])
    fig.update_yaxes(title_text="latency (ms): median, bar = quartiles", rangemode="tozero")
    return style_figure(fig, "Latency vs initial window (median and quartiles)", height=400)


def cdf_figure(cdfs: Mapping[int, Sequence[tuple[float, float]]], highlight: Sequence[int] = ()) -> go.Figure:
    """Latency CDF per arm; the compared arms drawn thicker."""
    fig = go.Figure()
    for index, iw in enumerate(sorted(cdfs)):
        points = list(cdfs[iw])
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="lines",
                name=f"IW{iw}",
                line={"color": ARM_PALETTE[index % len(ARM_PALETTE)], "width": 3 if iw in highlight else 1.5, "shape": "hv"},
                hovertemplate="%{x:.1f} ms: %{y:.3f}<extra>IW" + str(iw) + "</extra>",
                customdata=[iw] * len(points),  # a click opens a trial of this arm (pages/latency.py)
            )
        )
    fig.update_xaxes(title_text="latency (ms), log scale", type="log")
    fig.update_yaxes(title_text="fraction of trials", range=[0, 1.02])
    return style_figure(fig, "Latency CDF per arm", height=400)


def _region_hover(r: RegionSummary) -> str:
    head = (
        f"<b>{r.region}</b><br>n = {r.n_baseline:,} baseline, {r.n_treatment:,} treatment trials"
        f"<br>{r.n_pairs:,} pairs on {r.n_paths:,} paths"
    )
    if r.too_small:
        return head + "<br><b>n too small</b> for an improvement"
    return (
        head + f"<br>improvement {_fmt(r.abs_ms, ' ms')} [{_fmt(r.abs_ci_low)}, {_fmt(r.abs_ci_high)}]"
        f"<br>{_fmt(r.pct, ' %')} [{_fmt(r.pct_ci_low)}, {_fmt(r.pct_ci_high)}]" + (f"<br>{r.note}" if r.note else "")
    )


def region_map_figure(regions: Sequence[RegionSummary], topojson_url: str | None = None) -> go.Figure:
    """A world map, one marker per region centroid, coloured by percent improvement."""
    placed = [(r, region_centroid(r.region)) for r in regions]
    located = [(r, lat, lon) for r, (lat, lon) in placed if lat is not None and lon is not None]
    shown = [r for r, _, _ in located]
    pct = [None if r.too_small else r.pct for r in shown]
    finite = [p for p in pct if p is not None]
    bound = max([abs(p) for p in finite] + [1.0])
    largest = max([r.n for r in shown] + [1])
    fig = go.Figure(
        go.Scattergeo(
            lat=[lat for _, lat, _ in located],
            lon=[lon for _, _, lon in located],
            text=[r.region + (" (n too small)" if r.too_small else "") for r in shown],
            mode="markers+text",
            textposition="top center",
            marker={
                "size": [12 + 26 * (r.n / largest) ** 0.5 for r in shown],
                "color": [p if p is not None else 0.0 for p in pct],  # too small: neutral, and said so below
                "colorscale": "RdBu",
                "cmin": -bound,
                "cmax": bound,
                "colorbar": {"title": {"text": "% impr."}},
                "line": {"width": 1, "color": "#333"},
            },
            hovertext=[_region_hover(r) for r in shown],
            hoverinfo="text",
        )
    )
    fig.update_geos(
        projection_type="natural earth",
        showcountries=True,
        countrycolor="#bbb",
        showland=True,
        landcolor="#f2f2ee",
        showocean=True,
        oceancolor="#e8f1f8",
        resolution=110,
        lataxis_range=[-58, 84],
        lonaxis_range=[-180, 180],
        fitbounds=False,
    )
    fig = style_figure(fig, "Percent improvement by region", height=460)
    fig.update_layout(margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def loss_retrans_figure(buckets: Sequence[LossBucket]) -> go.Figure:
    """Share of trials with retransmissions per arm, by loss bucket, and the increase in points."""
    ordered = sorted(buckets, key=lambda b: b.order)
    labels = [str(b.bucket) for b in ordered]
    base_iw = ordered[0].comparison.baseline.iw if ordered else "?"
    treat_iw = ordered[0].comparison.treatment.iw if ordered else "?"

    def as_pct(values: Sequence[float | None]) -> list[float | None]:
        return [None if v is None else 100.0 * v for v in values]

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Bar(
            x=labels,
            y=as_pct([b.retrans_share_baseline for b in ordered]),
            name=f"IW{base_iw} retrans %",
            marker_color=BASELINE_COLOUR,
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Bar(
            x=labels,
            y=as_pct([b.retrans_share_treatment for b in ordered]),
            name=f"IW{treat_iw} retrans %",
            marker_color=TREATMENT_COLOUR,
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=[b.retrans_increase_pp for b in ordered],
            name="increase (pp)",
            mode="lines+markers",
            line={"color": PERCENT_COLOUR},
        ),
        secondary_y=True,
    )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text=DIMENSION_TITLES["loss"], type="category")
    fig.update_yaxes(title_text="trials with retransmissions (%)", secondary_y=False)
    fig.update_yaxes(title_text="increase (percentage points)", secondary_y=True, showgrid=False, tickmode="auto", zeroline=True)
    return style_figure(fig, "Retransmissions by loss bucket")


def fleet_figure(probes: Sequence[ProbeRow]) -> go.Figure:
    """Trials per day per probe, coloured by error share."""
    ordered = sorted(probes, key=lambda p: (p.region or "", p.name or ""))
    fig = go.Figure(
        go.Bar(
            x=[p.name or str(p.probe_id)[:8] for p in ordered],
            y=[p.trials_per_day or 0.0 for p in ordered],
            marker={
                "color": [100.0 * (p.error_share or 0.0) for p in ordered],
                "colorscale": "OrRd",
                "cmin": 0,
                "colorbar": {"title": {"text": "errors %"}},
            },
            customdata=[[p.region, p.trials_total, p.spool_backlog] for p in ordered],
            hovertemplate=(
                "%{x}<br>%{y:.1f} trials/day<br>region %{customdata[0]}<br>total %{customdata[1]}"
                "<br>backlog %{customdata[2]}<extra></extra>"
            ),
        )
    )
    fig.update_xaxes(title_text="probe", type="category")
    fig.update_yaxes(title_text="trials per day")
    return style_figure(fig, "Probe fleet: trials per day (colour: error share)")


def arm_name(arm: str | int) -> str:
    """An arm as figures name it: ``10`` -> ``IW10``, ``"10p"`` -> ``IW10p`` (paced), ``learned`` stays."""
    text = str(arm)
    return f"IW{text}" if text.rstrip("p").isdigit() else text
