"""The IETF 78 testbed point's tables (``summary.json["testbed"]``, :mod:`iwscope_lab.testbed`)
for the reproduction's report: measured beside each model, every model value a prediction."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


def _ms(value: float | None, interval: Sequence[float] | None = None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" + (f" [{interval[0]:,.1f}, {interval[1]:,.1f}]" if interval else "")


def testbed_rows(testbed: dict[str, Any]) -> list[list[str]]:
    """One row per arm: measured, then each model (a prediction) with its gap."""
    rows = []
    for arm in testbed["arms"]:
        errors = arm.get("errors") or {}
        row = [
            f"IW{arm['iw']}",
            str(arm["n"]),
            ", ".join(f"{count} {kind}" for kind, count in sorted(errors.items())) or "0",
            _ms(arm["mean_ms"], arm["ci_ms"]),
            f"{100 * arm['retrans_share']:.0f} % / {100 * arm['bytes_retrans_share']:.1f} %",
            f"{arm['queue_delay_ms']:.0f}",
        ]
        for name in ("min RTT", "queue RTT"):
            model = arm["models"][name]
            gap = (
                "-"
                if model["gap"] is None
                else f"{100 * model['gap']:+.1f} %"
                + ("" if model["within"] else f" (beyond {100 * testbed['flag_threshold']:.0f} %)")
            )
            row += [f"{_ms(model['mean_ms'], model['ci_ms'])}, {100 * model['retrans_share']:.0f} %", gap]
        rows.append(row)
    return rows


TESTBED_HEADER = (
    "arm",
    "n",
    "failed flows (left out)",
    "measured mean (ms) [95 % CI]",
    "retransmitting flows / bytes",
    "queue delay seen (ms)",
    "model, min RTT (prediction): mean, retransmitting flows",
    "measured vs it",
    "model, queue RTT (prediction)",
    "measured vs it",
)


def testbed_summary(testbed: dict[str, Any]) -> str:
    """The point's one-sentence summary: the measured IW3 - IW10 (unpaired, 95 % interval) beside
    each model's (predictions, Monte-Carlo intervals)."""
    models = ", ".join(
        f"{name}: {_ms(value, interval)} ms" for name, (value, interval) in testbed["model_improvement_ms"].items()
    )
    return (
        f"Campaign {testbed['campaign_id']}, Poisson arrivals at {testbed['arrival_rate_per_s']:g} flows/s, IW3 and IW10 "
        f"half and half on one queue. Measured improvement of IW10 over IW3 "
        f"{_ms(testbed['improvement_ms'], testbed['improvement_ci_ms'])} ms (unpaired, 95 % CI); the models' "
        f"(predictions): {models}."
    )


def testbed_markdown(testbed: dict[str, Any]) -> list[str]:
    lines = ["", f"## {testbed['title']}", "", testbed_summary(testbed), ""]
    lines += ["| " + " | ".join(TESTBED_HEADER) + " |", "|" + "---|" * len(TESTBED_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in testbed_rows(testbed)]
    lines += [f"* IW{arm['iw']}: {arm['flag']}" for arm in testbed["arms"] if arm.get("flag")]
    return lines


def testbed_html(testbed: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in TESTBED_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in testbed_rows(testbed))
    flags = "".join(f"<li>IW{arm['iw']}: {html.escape(arm['flag'])}</li>" for arm in testbed["arms"] if arm.get("flag"))
    return (
        f"<h2>{html.escape(testbed['title'])}</h2><p>{html.escape(testbed_summary(testbed))}</p>"
        f"<table><tr>{head}</tr>{body}</table>" + (f"<ul>{flags}</ul>" if flags else "")
    )
