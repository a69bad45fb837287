"""The reproduction report: one self-contained HTML page of plotly figures and tables.

Built from ``summary.json`` alone (see :mod:`iwscope_lab.reproduce`), so a report can be
re-rendered without re-running the campaigns: ``iwscope lab report DIR``.
"""

from __future__ import annotations

import html
import pathlib
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

_COLOURS = {3: "#d62728", 10: "#1f77b4", 16: "#2ca02c"}


def _arm(point: dict[str, Any], iw: int) -> dict[str, Any] | None:
    return next((arm for arm in point["arms"] if arm["iw"] == iw), None)


def _x_label(name: str) -> str:
    return {
        "rtt_ms": "path RTT (ms)",
        "rate_bps": "bottleneck bandwidth (bit/s)",
        "iw": "initial window (segments)",
        "size": "response size (bytes)",
        "loss": "random loss rate",
    }.get(name, name)


def improvement_figure(experiment: dict[str, Any]) -> go.Figure:
    """Figure 5 style: absolute (ms) and percent improvement of IW10 over IW3, measured and modelled."""
    points = experiment["points"]
    labels = [_point_label(experiment["x"], p["x"]) for p in points]
    figure = make_subplots(rows=1, cols=2, subplot_titles=("absolute improvement (ms)", "improvement (%)"))
    figure.add_bar(x=labels, y=[p["abs_improvement_ms"] for p in points], name="measured", marker_color="#1f77b4", row=1, col=1)
    figure.add_scatter(
        x=labels,
        y=[p["model_abs_improvement_ms"] for p in points],
        name="slow-start model",
        mode="markers",
        marker={"symbol": "diamond", "size": 11, "color": "black"},
        row=1,
        col=1,
    )
    model_pct: list[float | None] = []
    for p in points:
        base = _arm(p, 3)
        if base and base["model_ms"] and p["model_abs_improvement_ms"] is not None:
            model_pct.append(100 * p["model_abs_improvement_ms"] / base["model_ms"])
        else:
            model_pct.append(None)
    figure.add_bar(
        x=labels,
        y=[p["pct_improvement"] for p in points],
        name="measured %",
        marker_color="#2ca02c",
        row=1,
        col=2,
        showlegend=False,
    )
    figure.add_scatter(
        x=labels,
        y=model_pct,
        name="model %",
        mode="markers",
        showlegend=False,
        marker={"symbol": "diamond", "size": 11, "color": "black"},
        row=1,
        col=2,
    )
    figure.update_xaxes(title_text=_x_label(experiment["x"]), type="category")
    figure.update_layout(title=experiment["title"], height=420, margin={"t": 70})
    return figure


def latency_vs_iw_figure(experiment: dict[str, Any]) -> go.Figure:
    """Figure 2 style: mean latency per IW with one standard deviation, beside the model."""
    point = experiment["points"][0]
    arms = point["arms"]
    figure = go.Figure()
    figure.add_bar(
        x=[str(a["iw"]) for a in arms],
        y=[a["mean_ms"] for a in arms],
        name="measured mean",
        error_y={"type": "data", "array": [a["std_ms"] or 0 for a in arms], "visible": True},
    )
    figure.add_scatter(
        x=[str(a["iw"]) for a in arms],
        y=[a["model_ms"] for a in arms],
        name="slow-start model",
        mode="lines+markers",
        line={"color": "black", "dash": "dot"},
    )
    figure.update_layout(
        title=experiment["title"], xaxis_title="initial window (segments)", yaxis_title="response latency (ms)", height=420
    )
    return figure


def size_figure(experiment: dict[str, Any]) -> go.Figure:
    """Latency per arm against response size (a single sweep point fetching many sizes)."""
    point = experiment["points"][0]
    figure = go.Figure()
    for arm in point["arms"]:
        colour = _COLOURS.get(arm["iw"])
        figure.add_scatter(
            x=[str(s) for s in arm["by_size"]],
            y=list(arm["by_size"].values()),
            name=f"IW{arm['iw']} measured",
            mode="lines+markers",
            line={"color": colour},
        )
        figure.add_scatter(
            x=[str(s) for s in arm["by_size_model"]],
            y=list(arm["by_size_model"].values()),
            name=f"IW{arm['iw']} model",
            mode="lines",
            line={"color": colour, "dash": "dot"},
        )
    figure.update_xaxes(type="category")
    figure.update_layout(
        title=experiment["title"], xaxis_title="response size (bytes)", yaxis_title="mean response latency (ms)", height=420
    )
    return figure


def lossy_figure(experiment: dict[str, Any]) -> go.Figure:
    """Latency and retransmission share per arm against the loss rate."""
    points = experiment["points"]
    labels = [f"{p['loss']:.0%}" for p in points]
    figure = make_subplots(rows=1, cols=2, subplot_titles=("mean latency (ms)", "trials with retransmissions (%)"))
    present = sorted({arm["iw"] for point in points for arm in point["arms"]})
    for iw in present:
        arms = [_arm(p, iw) for p in points]
        means = [a["mean_ms"] if a else None for a in arms]
        figure.add_bar(
            x=labels,
            y=means,
            name=f"IW{iw}",
            marker_color=_COLOURS.get(iw, "#7f7f7f"),
            error_y=_ci_bars(means, [a.get("ci_ms") if a else None for a in arms]),
            offsetgroup=str(iw),
            row=1,
            col=1,
        )
        with_loss = any(a and a.get("model_kind") == "with loss" for a in arms)
        figure.add_scatter(
            x=labels,
            y=[a["model_ms"] if a else None for a in arms],
            mode="markers",
            name=f"IW{iw} model{' with loss' if with_loss else ''} (prediction)",
            marker={"symbol": "diamond-open", "size": 11, "color": "black", "line": {"width": 2}},
            offsetgroup=str(iw),
            row=1,
            col=1,
        )
        figure.add_bar(
            x=labels,
            y=[100 * a["retrans_share"] if a else None for a in arms],
            name=f"IW{iw} retrans",
            marker_color=_COLOURS.get(iw, "#7f7f7f"),
            opacity=0.6,
            row=1,
            col=2,
            showlegend=False,
        )
    figure.update_xaxes(title_text="random loss rate", type="category")
    figure.update_layout(title=experiment["title"], height=420, barmode="group")
    return figure


def _ci_bars(values: list[float | None], intervals: list[Any]) -> dict[str, Any]:
    """Error bars from ``[low, high]`` intervals (none where a value or its interval is missing)."""
    plus = [(ci[1] - v) if ci and v is not None else 0.0 for v, ci in zip(values, intervals, strict=True)]
    minus = [(v - ci[0]) if ci and v is not None else 0.0 for v, ci in zip(values, intervals, strict=True)]
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus}


def _point_label(x_name: str, x: float) -> str:
    if x_name == "rate_bps":
        return f"{x / 1e6:g} Mbit/s" if x >= 1e6 else f"{x / 1e3:g} kbit/s"
    if x_name == "rtt_ms":
        return f"{x:g} ms"
    return f"{x:g}"


def model_table(summary: dict[str, Any]) -> str:
    """Every measured point beside the model, with the >10 % flags and SYN retransmissions."""
    head = (
        "<tr><th>experiment</th><th>point</th><th>IW</th><th>n</th><th>errors</th><th>measured mean (ms)</th>"
        "<th>std</th><th>model (ms)</th><th>gap</th><th>client total (ms)</th><th>model client (ms)</th>"
        "<th>SYN retrans</th><th>retrans</th><th>flag</th></tr>"
    )
    rows = []
    for key, experiment in summary["experiments"].items():
        for point in experiment["points"]:
            for arm in point["arms"]:
                flag = html.escape(arm["flag"] or "")
                gap = "" if arm["gap"] is None else f"{100 * arm['gap']:+.1f}%"
                rows.append(
                    f"<tr class='{'flag' if arm['flag'] else ''}'><td>{key}</td><td>{html.escape(point['label'])}</td>"
                    f"<td>{arm['iw']}</td><td>{arm['n']}</td><td>{arm['errors']}</td><td>{_num(arm['mean_ms'])}</td>"
                    f"<td>{_num(arm['std_ms'])}</td><td>{_num(arm['model_ms'])}</td>"
                    f"<td>{gap}</td>"
                    f"<td>{_num(arm['client_mean_ms'])}</td><td>{_num(arm['model_client_ms'])}</td>"
                    f"<td>{100 * arm['syn_retrans_share']:.0f}%</td><td>{100 * arm['retrans_share']:.0f}%</td>"
                    f"<td>{flag}</td></tr>"
                )
    return f"<table>{head}{''.join(rows)}</table>"


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def write_report(summary: dict[str, Any], path: pathlib.Path) -> None:
    """Render ``summary`` as one HTML file with plotly.js inlined once (works offline)."""
    sections = []
    first = True
    for key, experiment in summary["experiments"].items():
        if key.startswith("fig5"):
            figure = improvement_figure(experiment)
        elif key == "fig2_iw":
            figure = latency_vs_iw_figure(experiment)
        elif key == "size":
            figure = size_figure(experiment)
        elif key == "lossy":
            figure = lossy_figure(experiment)
        else:
            continue
        # a fixed div id (plotly's default is random): the same summary renders the same bytes
        sections.append(figure.to_html(full_html=False, include_plotlyjs="inline" if first else False, div_id=f"iwscope-{key}"))
        first = False
    fairness_section = ""
    if summary.get("fairness"):
        from iwscope_lab.fairness_report import fairness_figure, fairness_table

        fairness_section = fairness_figure(summary["fairness"]).to_html(
            full_html=False, include_plotlyjs="inline" if first else False, div_id="iwscope-fairness"
        ) + fairness_table(summary["fairness"])
        first = False
    if summary.get("testbed"):
        from iwscope_lab.testbed_report import testbed_html

        fairness_section += testbed_html(summary["testbed"])
    if summary.get("cost"):
        from iwscope_lab.cost_report import cost_html

        fairness_section += cost_html(summary["cost"], "inline" if first else False)
        first = False
    if summary.get("tls"):
        from iwscope_lab.tls_report import tls_html

        fairness_section += tls_html(summary["tls"], "inline" if first else False)
        first = False
    if summary.get("quic"):
        from iwscope_lab.quic_report import quic_html

        fairness_section += quic_html(summary["quic"], "inline" if first else False)
    if summary.get("seed002"):
        from iwscope_lab.seedtraces import seed_traces_html

        fairness_section += seed_traces_html(summary["seed002"])
    if summary.get("seed002-send"):
        from iwscope_lab.sendpaths import send_paths_html

        fairness_section += send_paths_html(summary["seed002-send"])
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;"
        "font-size:13px} td,th{border:1px solid #ccc;padding:3px 6px;text-align:right} tr.flag{background:#fff3cd}"
    )
    body = "\n".join(sections)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>iwscope reproduction</title>"
        f"<style>{style}</style></head><body><h1>IW10 reproduction{' (quick)' if summary.get('quick') else ''}</h1>"
        f"<p>Generated {html.escape(summary['generated_at'])}. Metric: {html.escape(summary['metric'])}. "
        f"Black diamonds: the slow-start model (rounds, bottleneck serialisation, handshake); on the lossy "
        f"points the model with loss (predictions, not measurements). Rows over "
        f"{100 * summary['flag_threshold']:.0f}% from the model "
        f"({100 * summary.get('loss_flag_threshold', summary['flag_threshold']):.0f}% from the model with loss) are "
        "highlighted with a reason where one is known.</p>"
        f"{body}<h2>Measured vs model</h2>{model_table(summary)}{fairness_section}</body></html>"
    )
    path.write_text(page, encoding="utf-8")


def _md_num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _md_scaled(value: float | None, factor: float, digits: int = 1) -> str:
    return _md_num(None if value is None else value * factor, digits)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _improvement_rows(experiment: dict[str, Any]) -> list[str]:
    """IW3 against IW10 per sweep point: measured and modelled latency and improvement."""
    rows = [
        "| point | n (IW3/IW10) | IW3 measured (ms) | IW3 model | IW10 measured (ms) | IW10 model "
        "| improvement measured (ms, %) | improvement model (ms) | flags |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point in experiment["points"]:
        base, treat = _arm(point, 3), _arm(point, 10)
        if base is None or treat is None:
            continue
        pct = point.get("pct_improvement")
        flags = "; ".join(f"IW{arm['iw']}: {arm['flag']}" for arm in (base, treat) if arm.get("flag"))
        rows.append(
            f"| {_point_label(experiment['x'], point['x'])} | {base['n']}/{treat['n']} | {_md_num(base['mean_ms'])} "
            f"| {_md_num(base['model_ms'])} | {_md_num(treat['mean_ms'])} | {_md_num(treat['model_ms'])} "
            f"| {_md_num(point.get('abs_improvement_ms'))} ({_md_num(pct)} %) "
            f"| {_md_num(point.get('model_abs_improvement_ms'))} | {_md_escape(flags)} |"
        )
    return rows


def _arm_rows(experiment: dict[str, Any]) -> list[str]:
    """Every arm of every point (Figure 2, sizes, loss): mean ± std beside the model."""
    rows = [
        "| point | IW | n | errors | measured mean ± std (ms) [95 % CI] | model (ms) | gap | retransmitting trials | flag |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point in experiment["points"]:
        for arm in point["arms"]:
            gap = "–" if arm["gap"] is None else f"{100 * arm['gap']:+.1f} %"
            ci = arm.get("ci_ms")
            model_ci = arm.get("model_ci_ms")
            with_loss = arm.get("model_kind") == "with loss"
            model = _md_num(arm["model_ms"]) + (
                f" [{model_ci[0]:.1f}, {model_ci[1]:.1f}] with loss" if with_loss and model_ci else ""
            )
            retrans = f"{100 * arm['retrans_share']:.0f} %" + (
                f" (model {100 * arm['model_retrans_share']:.0f} %)" if arm.get("model_retrans_share") is not None else ""
            )
            rows.append(
                f"| {_md_escape(point['label'])} | {arm['iw']} | {arm['n']} | {arm['errors']} "
                f"| {_md_num(arm['mean_ms'])} ± {_md_num(arm['std_ms'])}{f' [{ci[0]:.1f}, {ci[1]:.1f}]' if ci else ''} "
                f"| {model} | {gap} | {retrans} | {_md_escape(arm['flag'] or '')} |"
            )
    return rows


def markdown_report(summary: dict[str, Any]) -> str:
    """The report's numbers as Markdown tables (for issues, notes and pull requests):
    Figure 5 experiments as IW3-vs-IW10 improvement rows, the others arm by arm."""
    lines = [
        f"# IW10 reproduction{' (quick)' if summary.get('quick') else ''}",
        "",
        f"Generated {summary['generated_at']}. Metric: {summary['metric']}. Model: slow-start rounds, "
        f"bottleneck serialisation, handshake; on the lossy points the model with loss (a Monte-Carlo of "
        f"Linux's recovery over each arm's own sizes). Flags: more than {100 * summary['flag_threshold']:.0f} % "
        f"from the model ({100 * summary.get('loss_flag_threshold', summary['flag_threshold']):.0f} % from the model "
        "with loss).",
    ]
    for key, experiment in summary["experiments"].items():
        lines += ["", f"## {_md_escape(experiment['title'])} (`{key}`)", ""]
        lines += _improvement_rows(experiment) if key.startswith("fig5") else _arm_rows(experiment)
    fairness = summary.get("fairness")
    if fairness:
        lines += [
            "",
            f"## {_md_escape(fairness['title'])}",
            "",
            "| load | mix | flow | IW | n | throughput (Mbit/s) | FCT mean (ms) | retransmitting flows | retransmitted bytes |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in fairness["rows"]:
            lines.append(
                f"| {row['load']:g} | IW{row['mix']} | {row['flow']} | {row['iw']} | {row['n']} "
                f"| {_md_scaled(row['throughput_bps'], 1e-6, 2)} | {_md_num(row['fct_mean_ms'])} "
                f"| {_md_scaled(row['retrans_flow_share'], 100)} % | {_md_scaled(row['bytes_retrans_share'], 100, 2)} % |"
            )
    if summary.get("testbed"):
        from iwscope_lab.testbed_report import testbed_markdown

        lines += testbed_markdown(summary["testbed"])
    if summary.get("cost"):
        from iwscope_lab.cost_report import cost_markdown

        lines += cost_markdown(summary["cost"])
    if summary.get("tls"):
        from iwscope_lab.tls_report import tls_markdown

        lines += tls_markdown(summary["tls"])
    if summary.get("quic"):
        from iwscope_lab.quic_report import quic_markdown

        lines += quic_markdown(summary["quic"])
    if summary.get("seed002"):
        from iwscope_lab.seedtraces import seed_traces_markdown

        lines += seed_traces_markdown(summary["seed002"])
    if summary.get("seed002-send"):
        from iwscope_lab.sendpaths import send_paths_markdown

        lines += send_paths_markdown(summary["seed002-send"])
    return "\n".join(lines) + "\n"


def write_reports(summary: dict[str, Any], out_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """``out_dir/report.html`` and ``out_dir/report.md`` from ``summary``; their paths."""
    html_path, markdown_path = out_dir / "report.html", out_dir / "report.md"
    write_report(summary, html_path)
    markdown_path.write_text(markdown_report(summary), encoding="utf-8")
    return html_path, markdown_path
