"""The TLS experiment's part of the reproduction report: a figure and a table (``iwscope_lab.tls``)."""

from __future__ import annotations

import html
from typing import Any, Literal

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def tls_figure(tls: dict[str, Any]) -> go.Figure:
    """Handshake time (time_appconnect) against chain size, one panel per RTT, one line per IW,
    with the 95 % interval of each mean and the model beside it."""
    points = tls["points"]
    rtts = sorted({point["rtt_ms"] for point in points})
    figure = make_subplots(rows=1, cols=len(rtts), subplot_titles=[f"RTT {rtt:g} ms" for rtt in rtts], shared_yaxes=True)
    for column, rtt in enumerate(rtts, start=1):
        for iw in sorted({point["iw"] for point in points}):
            cells = sorted(
                (point for point in points if point["rtt_ms"] == rtt and point["iw"] == iw), key=lambda point: point["chain_kb"]
            )
            shown = [cell for cell in cells if cell["appconnect_mean_ms"] is not None]
            figure.add_trace(
                go.Scatter(
                    x=[cell["chain_kb"] for cell in shown],
                    y=[cell["appconnect_mean_ms"] for cell in shown],
                    error_y={
                        "type": "data",
                        "symmetric": False,
                        "array": [cell["appconnect_high_ms"] - cell["appconnect_mean_ms"] for cell in shown],
                        "arrayminus": [cell["appconnect_mean_ms"] - cell["appconnect_low_ms"] for cell in shown],
                    },
                    mode="lines+markers",
                    name=f"IW{iw}",
                    legendgroup=f"IW{iw}",
                    showlegend=column == 1,
                    customdata=[[cell["n"], cell["first_flight_bytes"]] for cell in shown],
                    hovertemplate="chain %{x} KB: %{y:.1f} ms (n=%{customdata[0]}, first flight %{customdata[1]} B)",
                ),
                row=1,
                col=column,
            )
            figure.add_trace(
                go.Scatter(
                    x=[cell["chain_kb"] for cell in cells],
                    y=[cell["model_appconnect_ms"] for cell in cells],
                    mode="markers",
                    marker={"symbol": "diamond-open", "color": "black"},
                    name="model",
                    legendgroup="model",
                    showlegend=column == 1 and iw == 3,
                ),
                row=1,
                col=column,
            )
        figure.update_xaxes(title_text="chain (KB of DER)", type="log", row=1, col=column)
    figure.update_yaxes(title_text="TLS handshake done (ms, time_appconnect)", rangemode="tozero", row=1, col=1)
    figure.update_layout(title=tls["title"], height=420)
    return figure


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _rows(tls: dict[str, Any]) -> list[list[str]]:
    rows = []
    for point in sorted(tls["points"], key=lambda p: (p["rtt_ms"], p["chain_kb"], p["iw"])):
        interval = (
            "–" if point["appconnect_low_ms"] is None else f"{point['appconnect_low_ms']:.1f} – {point['appconnect_high_ms']:.1f}"
        )
        gap = "–" if point["gap"] is None else f"{100 * point['gap']:+.1f} %"
        rows.append(
            [
                f"{point['rtt_ms']:g}",
                f"{point['chain_kb']:g}",
                str(point["iw"]),
                str(point["n"]),
                _num(point["appconnect_mean_ms"]),
                interval,
                _num(point["model_appconnect_ms"]),
                str(point["model_rounds"]),
                gap,
                str(point["first_flight_bytes"] or "–"),
                _num(point["server_handshake_median_ms"]),
                point["flag"] or "",
            ]
        )
    return rows


_HEADER = [
    "RTT (ms)",
    "chain (KB)",
    "IW",
    "n",
    "appconnect mean (ms)",
    "95 % interval",
    "model (ms)",
    "model rounds",
    "gap",
    "first flight (B)",
    "server handshake median (ms)",
    "flag",
]


def tls_html(tls: dict[str, Any], include_plotlyjs: Literal["inline"] | bool) -> str:
    table = "".join(
        f"<tr{' class=flag' if row[-1] else ''}>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
        for row in _rows(tls)
    )
    head = "".join(f"<th>{html.escape(name)}</th>" for name in _HEADER)
    figure_html: str = tls_figure(tls).to_html(full_html=False, include_plotlyjs=include_plotlyjs, div_id="iwscope-tls")
    return (
        f"<h2>{html.escape(tls['title'])}</h2>"
        + figure_html
        + f"<p>{html.escape(tls['metric'])}</p><table><tr>{head}</tr>{table}</table>"
    )


def tls_markdown(tls: dict[str, Any]) -> list[str]:
    lines = ["", f"## {tls['title']}", "", tls["metric"], "", "| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in _rows(tls)]
    return lines
