"""The cost experiments' section of the reproduction report: tables (Markdown, HTML) and a figure.

Rows come from ``summary["cost"]["report"]`` (:class:`iwscope.analysis.CostReport` as JSON);
a number without enough data is "n too small" with its n, never a zero.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

TOO_SMALL = "n too small"


def _ci(value: float | None, interval: Any, scale: float = 1.0, digits: int = 1, n: int | None = None) -> str:
    if value is None:
        return TOO_SMALL + (f" (n={n})" if n is not None else "")
    text = f"{value * scale:.{digits}f}"
    if interval:
        text += f" [{interval[0] * scale:.{digits}f}, {interval[1] * scale:.{digits}f}]"
    return text


def _throughput_mbps(flows: dict[str, Any]) -> str:
    """A flow set's throughput (Mbit/s) with its interval and n."""
    return _with_n(
        _ci(flows["throughput_bps"], flows["throughput_ci_bps"], 1e-6, 2, flows["n"]), flows["throughput_bps"], flows["n"]
    )


def _with_n(text: str, value: float | None, n: int) -> str:
    """A number's text with its n (an "n too small" text carries it already)."""
    return text if value is None else f"{text} (n={n})"


def cost_rows(cost: dict[str, Any]) -> list[dict[str, str]]:
    """One row per phase: its design and what it cost (interactive flow, flows, bulk, pages)."""
    report = cost["report"]
    interactive = {point["campaign_id"]: point for point in report["interactive"]}
    flows: dict[int, list[dict[str, Any]]] = {}
    for flow in report["flows"]:
        flows.setdefault(flow["campaign_id"], []).append(flow)
    kinds = {phase["campaign_id"]: phase["kind"] for phase in cost.get("phases", [])}
    rows = []
    for campaign in report["campaigns"]:
        cid = campaign["campaign_id"]
        point = interactive.get(cid)
        mine = flows.get(cid, [])
        short, pages = (
            "; ".join(
                f"{f['arm']}: {_with_n(_ci(f['fct_p50_ms'], f['fct_p50_ci_ms'], n=f['n']), f['fct_p50_ms'], f['n'])}"
                for f in mine
                if f["role"] == role
            )
            for role in ("short", "page-load")
        )
        retrans = "; ".join(
            f"{f['arm']}: {_ci(f['bytes_retrans_share'], f['bytes_retrans_share_ci'], 100, 1, f['joined_flows'])} % of bytes, "
            f"{_ci(f['retrans_flow_share'], f['retrans_flow_share_ci'], 100, 0, f['joined_flows'])} % of flows "
            f"(n={f['joined_flows']} joined)"
            for f in mine
            if f["role"] in ("short", "page-load") and f["bytes_retrans_share"] is not None
        )
        alone = next((f for f in mine if f["role"] == "background-alone"), None)
        bulk = next((f for f in mine if f["role"] == "background"), None)
        rows.append(
            {
                "bottleneck": campaign["region"].removeprefix("cost-"),
                "phase": kinds.get(cid, ""),
                "mix": campaign["mix"],
                "delay_p50": _with_n(
                    _ci(point["delay_p50_ms"], point["delay_p50_ci_ms"], n=point["samples"]),
                    point["delay_p50_ms"],
                    point["samples"],
                )
                if point
                else "",
                "delay_p99": _with_n(
                    _ci(point["delay_p99_ms"], point["delay_p99_ci_ms"], n=point["samples"]),
                    point["delay_p99_ms"],
                    point["samples"],
                )
                if point
                else "",
                "loss": (
                    _ci(point["loss_share"], point["loss_ci"], 100, 2, point["sent"])
                    + (f" % (n={point['sent']})" if point["loss_share"] is not None else "")
                )
                if point
                else "",
                "short_fct_p50": short,
                "short_retrans": retrans,
                "page_load_p50": pages,
                "bulk_mbps": (f"{_throughput_mbps(bulk)} with / {_throughput_mbps(alone)} alone" if bulk and alone else ""),
            }
        )
    return rows


COLUMNS = (
    ("bottleneck", "bottleneck"),
    ("phase", "phase"),
    ("mix", "short flows"),
    ("delay_p50", "interactive delay p50 ms [95 % CI]"),
    ("delay_p99", "interactive delay p99 ms [95 % CI]"),
    ("loss", "interactive loss"),
    ("short_fct_p50", "short-flow FCT p50 ms [95 % CI]"),
    ("short_retrans", "retransmitted [95 % CI]"),
    ("bulk_mbps", "bulk Mbit/s [95 % CI]"),
    ("page_load_p50", "page load p50 ms [95 % CI]"),
)


def interference_rows(cost: dict[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "bottleneck": item["region"].removeprefix("cost-"),
            "arms": f"{item['baseline']} vs {item['treatment']}",
            "share": f"{item['treatment_share'] * 100:.0f} %",
            "ab": _ci(item["ab_ms"], item["ab_ci_ms"]),
            "total": _ci(item["total_ms"], item["total_ci_ms"]),
            "bias": _ci(item["bias_ms"], item["bias_ci_ms"]),
            "n": "/".join(str(value) for value in item["n"]),
        }
        for item in cost["report"]["interference"]
    ]


INTERFERENCE_COLUMNS = (
    ("bottleneck", "bottleneck"),
    ("arms", "baseline vs treatment"),
    ("share", "treatment share"),
    ("ab", "A/B estimate ms [95 % CI]"),
    ("total", "total effect ms [95 % CI]"),
    ("bias", "bias ms [95 % CI]"),
    ("n", "n (A/B base, A/B treat, all base, all treat)"),
)


def cost_markdown(cost: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"## {cost['title']}",
        "",
        f"Interactive delay: round-trip time of a {1e6 / cost['interactive']['interval_us']:.0f} packets/s UDP flow of "
        f"{cost['interactive']['packet_bytes']}-byte packets above the bottleneck's empty-queue RTT (moving-block "
        "bootstrap intervals; loss: Wilson intervals shrunk by the design effect of bursty losses). FCT: flow completion time "
        "of successful short flows (pages: first connection's start to last connection's end). Retransmitted: bytes (bootstrap "
        "over flows) and flows (Wilson) the origin retransmitted.",
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row[key] for key, _ in COLUMNS) + " |" for row in cost_rows(cost)]
    lines += [
        "",
        "A/B split vs total effect (mean FCT, treatment minus baseline):",
        "",
        "| " + " | ".join(title for _, title in INTERFERENCE_COLUMNS) + " |",
        "|" + "---|" * len(INTERFERENCE_COLUMNS),
    ]
    lines += ["| " + " | ".join(row[key] for key, _ in INTERFERENCE_COLUMNS) + " |" for row in interference_rows(cost)]
    lines += [
        "",
        "Model: queue one first flight builds at the bottleneck (drop-tail, line rate in):",
        "",
        "| bottleneck | policy | dropped | peak queue (packets) | peak delay ms |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {row['bottleneck']} | {row['policy']} | {row['dropped']} | {row['peak_packets']} | {row['peak_delay_ms']:.1f} |"
        for row in cost.get("model", [])
    ]
    return lines


def _html_table(rows: list[dict[str, str]], columns: tuple[tuple[str, str], ...]) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(row[key])}</td>" for key, _ in columns) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def cost_figure(cost: dict[str, Any]) -> go.Figure:
    """Interactive-flow delay p50 / p99 per phase with 95 % intervals (phases without a number left out)."""
    report = cost["report"]
    names = {c["campaign_id"]: f"{c['region'].removeprefix('cost-')}: {c['mix']}" for c in report["campaigns"]}
    figure = go.Figure()
    for key, label in (("delay_p50", "p50"), ("delay_p99", "p99")):
        points = [p for p in report["interactive"] if p[f"{key}_ms"] is not None]
        figure.add_bar(
            x=[names[p["campaign_id"]] for p in points],
            y=[p[f"{key}_ms"] for p in points],
            name=label,
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [(p[f"{key}_ci_ms"] or [0, p[f"{key}_ms"]])[1] - p[f"{key}_ms"] for p in points],
                "arrayminus": [p[f"{key}_ms"] - (p[f"{key}_ci_ms"] or [p[f"{key}_ms"], 0])[0] for p in points],
            },
        )
    figure.update_layout(
        title="Queueing delay added to an interactive flow (ms)",
        barmode="group",
        yaxis={"rangemode": "tozero", "title": "ms above the empty-queue RTT"},
    )
    return figure


def cost_html(cost: dict[str, Any], include_plotlyjs: str | bool) -> str:
    figure_html: str = cost_figure(cost).to_html(full_html=False, include_plotlyjs=include_plotlyjs, div_id="iwscope-cost")
    return (
        f"<h2>{html.escape(cost['title'])}</h2>"
        + figure_html
        + _html_table(cost_rows(cost), COLUMNS)
        + "<h3>A/B split vs total effect</h3>"
        + _html_table(interference_rows(cost), INTERFERENCE_COLUMNS)
    )
