"""The QUIC section of the reproduction report (``iwscope_lab.quic_compare.reproduce_quic``): the
paired saving of HTTP/3 over HTTPS beside the model, and the QUIC census of the lab's servers."""

from __future__ import annotations

import html
from typing import Any, Literal

import plotly.graph_objects as go

_COMPARE_HEADER = [
    "RTT (ms)",
    "size (B)",
    "n pairs",
    "TCP median (ms)",
    "QUIC median (ms)",
    "saving median (ms)",
    "95 % CI (ms)",
    "zero-delay saving (ms)",
    "model saving (ms)",
    "predicted (ms)",
    "error",
    "flag",
]
_CENSUS_HEADER = ["server", "given window (packets)", "census", "packets", "bytes", "datagram (B)", "connections agreeing"]


def quic_figure(quic: dict[str, Any]) -> go.Figure:
    """Measured saving (median of the pairs, 95 % interval) against size, one line per RTT, and
    the prediction (the model's saving plus the zero-delay saving) dashed beside it."""
    figure = go.Figure()
    points = quic["points"]
    for rtt in sorted({point["rtt_ms"] for point in points}):
        cells = sorted((p for p in points if p["rtt_ms"] == rtt and p["interval_ms"]), key=lambda p: p["size"])
        low = [c["saving_ms"] - c["interval_ms"][0] for c in cells]
        high = [c["interval_ms"][1] - c["saving_ms"] for c in cells]
        figure.add_trace(
            go.Scatter(
                x=[c["size"] for c in cells],
                y=[c["saving_ms"] for c in cells],
                error_y={"type": "data", "symmetric": False, "array": high, "arrayminus": low},
                mode="lines+markers",
                name=f"measured, RTT {rtt:g} ms",
                customdata=[len(c["pairs"]) for c in cells],
                hovertemplate="%{x} B: %{y:.1f} ms (n=%{customdata} pairs)",
            )
        )
        figure.add_trace(
            go.Scatter(
                x=[c["size"] for c in cells],
                y=[c["predicted_ms"] for c in cells],
                mode="lines",
                line={"dash": "dash"},
                name=f"predicted, RTT {rtt:g} ms",
            )
        )
    figure.update_layout(
        title="HTTP/3's saving over HTTPS at the same IW (prediction: model + the stacks' zero-delay difference)",
        xaxis={"title": "object size (bytes)", "type": "log"},
        yaxis={"title": "TCP total - QUIC total (ms)", "rangemode": "tozero"},
    )
    return figure


def _compare_rows(quic: dict[str, Any]) -> list[list[str]]:
    rows = []
    for p in quic["points"]:
        tcp = sorted(t for t, _ in p["pairs"])[len(p["pairs"]) // 2]
        quic_total = sorted(q for _, q in p["pairs"])[len(p["pairs"]) // 2]
        head = [f"{p['rtt_ms']:g}", str(p["size"]), str(len(p["pairs"]))]
        model = f"{p['model_ms']:.1f}"
        if not p["interval_ms"]:  # fewer than 6 pairs: no 95 % interval of a median, so no claim
            rows.append([*head, *["n too small"] * 6, model, "n too small", "n too small", ""])
            continue
        ci = f"[{p['interval_ms'][0]:.1f}, {p['interval_ms'][1]:.1f}]"
        flagged = abs(p["error"]) > quic["tolerance"]
        rows.append(
            [
                *head,
                f"{tcp:.1f}",
                f"{quic_total:.1f}",
                f"{p['saving_ms']:.1f}",
                ci,
                f"{p['processing_ms']:.1f}",
                model,
                f"{p['predicted_ms']:.1f}",
                f"{100 * p['error']:+.1f} %",
                "beyond 10 %" if flagged else "",
            ]
        )
    return rows


def _census_rows(quic: dict[str, Any]) -> list[list[str]]:
    return [
        [
            row["server"],
            str(row["given_packets"]),
            row["status"],
            str(row["iw_packets"]),
            str(row["iw_bytes"]),
            str(row["max_datagram_size"]),
            f"{row['connections_ok']} of {row['connections']}",
        ]
        for row in quic["census"]
    ]


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(name)}</th>" for name in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def quic_html(quic: dict[str, Any], include_plotlyjs: Literal["inline"] | bool) -> str:
    figure_html: str = quic_figure(quic).to_html(full_html=False, include_plotlyjs=include_plotlyjs, div_id="iwscope-quic")
    return (
        f"<h2>{html.escape(quic['title'])}</h2>"
        + figure_html
        + f"<p>{html.escape(quic['metric'])}</p>"
        + _html_table(_COMPARE_HEADER, _compare_rows(quic))
        + "<h3>QUIC census</h3>"
        + _html_table(_CENSUS_HEADER, _census_rows(quic))
    )


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def quic_markdown(quic: dict[str, Any]) -> list[str]:
    lines = ["", f"## {quic['title']}", "", quic["metric"], ""]
    lines += _markdown_table(_COMPARE_HEADER, _compare_rows(quic))
    lines += ["", "### QUIC census", ""] + _markdown_table(_CENSUS_HEADER, _census_rows(quic))
    return lines
