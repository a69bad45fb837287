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
        row = [
            f"IW{arm['iw']}",
            str(arm["n"]),
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
    "measured mean (ms) [95 % CI]",
    "retransmitting flows / bytes",
    "queue delay seen (ms)",
    "model, min RTT (prediction): mean, retransmitting flows",
    "measured vs it",
    "model, queue RTT (prediction)",
    "measured vs it",
)


def testbed_markdown(testbed: dict[str, Any]) -> list[str]:
    lines = ["", f"## {testbed['title']}", ""]
    lines += [
        f"Campaign {testbed['campaign_id']}, Poisson arrivals at {testbed['arrival_rate_per_s']:g} flows/s, IW3 and IW10 "
        f"half and half on one queue. Measured improvement {_ms(testbed['improvement_ms'])} ms; the model's "
        + ", ".join(f"{name}: {_ms(value)} ms" for name, value in testbed["model_improvement_ms"].items())
        + " (predictions).",
        "",
        "| " + " | ".join(TESTBED_HEADER) + " |",
        "|" + "---|" * len(TESTBED_HEADER),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in testbed_rows(testbed)]
    lines += [f"* IW{arm['iw']}: {arm['flag']}" for arm in testbed["arms"] if arm.get("flag")]
    return lines


def testbed_html(testbed: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in TESTBED_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in testbed_rows(testbed))
    flags = "".join(f"<li>IW{arm['iw']}: {html.escape(arm['flag'])}</li>" for arm in testbed["arms"] if arm.get("flag"))
    return (
        f"<h2>{html.escape(testbed['title'])}</h2><p>Measured improvement {_ms(testbed['improvement_ms'])} ms "
        f"(model predictions: "
        + ", ".join(f"{html.escape(name)} {_ms(value)} ms" for name, value in testbed["model_improvement_ms"].items())
        + f")</p><table><tr>{head}</tr>{body}</table>"
        + (f"<ul>{flags}</ul>" if flags else "")
    )
