"""The fairness section of the reproduction report (built from ``summary["fairness"]``)."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

ROLE_NAMES = {"background-alone": "background flow alone", "background": "background flow with the short flows"}


def fairness_figure(section: dict[str, Any]) -> go.Figure:
    """Left: the background flow's throughput alone vs alongside each phase's short flows.
    Right: mean short-flow completion time per IW and phase."""
    rows = section["rows"]
    phases = sorted({(row["load"], row["mix"]) for row in rows}, key=lambda item: (item[0], len(item[1]), item[1]))
    labels = [f"load {load:g}, IW{mix}" for load, mix in phases]
    figure = make_subplots(
        rows=1, cols=2, subplot_titles=("Background flow throughput (Mbit/s)", "Short-flow completion time, mean (ms)")
    )
    for role, name in ROLE_NAMES.items():
        values = {(row["load"], row["mix"]): row["throughput_bps"] for row in rows if row["flow"] == role}
        figure.add_trace(go.Bar(x=labels, y=[(values.get(phase) or 0) / 1e6 for phase in phases], name=name), row=1, col=1)
    for iw in sorted({row["iw"] for row in rows if row["flow"] == "short"}):
        values = {(row["load"], row["mix"]): row["fct_mean_ms"] for row in rows if row["flow"] == "short" and row["iw"] == iw}
        figure.add_trace(go.Bar(x=labels, y=[values.get(phase) for phase in phases], name=f"short flows IW{iw}"), row=1, col=2)
    figure.update_layout(title=section["title"], barmode="group", height=460)
    return figure


def _cell(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value * scale:.{digits}f}"
    return html.escape(str(value))


def fairness_table(section: dict[str, Any]) -> str:
    head = (
        "<tr><th>load</th><th>mix</th><th>measured load</th><th>flow</th><th>IW</th><th>n</th><th>errors</th>"
        "<th>throughput Mbit/s</th><th>FCT mean ms</th><th>FCT p50 ms</th><th>FCT p90 ms</th>"
        "<th>flows with retrans %</th><th>bytes retrans %</th></tr>"
    )
    body = "".join(
        f"<tr><td>{row['load']:g}</td><td>IW{html.escape(row['mix'])}</td><td>{_cell(row['offered_load'], 1, 2)}</td>"
        f"<td>{html.escape(row['flow'])}</td><td>{row['iw']}</td><td>{row['n']}</td><td>{row['errors']}</td>"
        f"<td>{_cell(row['throughput_bps'], 1e-6, 2)}</td><td>{_cell(row['fct_mean_ms'])}</td>"
        f"<td>{_cell(row['fct_p50_ms'])}</td><td>{_cell(row['fct_p90_ms'])}</td>"
        f"<td>{_cell(row['retrans_flow_share'], 100)}</td><td>{_cell(row['bytes_retrans_share'], 100, 2)}</td></tr>"
        for row in section["rows"]
    )
    bottleneck = section["bottleneck"]
    return (
        f"<h2>{html.escape(section['title'])}</h2><p>Bottleneck {bottleneck['rate_bps'] / 1e6:g} Mbit/s, "
        f"{bottleneck['rtt_ms']:g} ms RTT, drop-tail buffer {bottleneck['buffer_bdp']:g} BDP; "
        f"{section['flows_per_phase']} short flows (15 KB / 50 KB) per phase at Poisson arrivals; one background "
        f"flow (IW3) measured alone, then alongside. Retransmissions are the origin's (TCP_INFO).</p>"
        f"<table>{head}{body}</table>"
    )
