"""``report.md``: the reproduction's numbers as Markdown tables, built from ``summary.json`` alone."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from iwscope_lab.cli import lab
from iwscope_lab.report import markdown_report

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def _arm(
    iw: int, mean_ms: float | None, model_ms: float | None, n: int = 4, flag: str | None = None, retrans_share: float = 0.0
) -> dict[str, object]:
    gap = None if mean_ms is None or not model_ms else (mean_ms - model_ms) / model_ms
    return {
        "iw": iw,
        "n": n,
        "errors": 0,
        "mean_ms": mean_ms,
        "std_ms": None if mean_ms is None else 1.5,
        "median_ms": mean_ms,
        "client_mean_ms": mean_ms,
        "model_ms": model_ms,
        "model_client_ms": model_ms,
        "syn_retrans_share": 0.0,
        "retrans_share": retrans_share,
        "gap": gap,
        "flag": flag,
        "by_size": {},
        "by_size_model": {},
    }


def _summary() -> dict[str, object]:
    fig5 = {
        "title": "Figure 5: improvement vs RTT (1.2 Mbit/s, 9 KB)",
        "x": "rtt_ms",
        "plan": {},
        "points": [
            {
                "experiment": "fig5_rtt_9k",
                "label": "rtt200",
                "x": 200.0,
                "rtt_ms": 200.0,
                "rate_bps": 1.2e6,
                "loss": 0.0,
                "arms": [_arm(3, 683.0, 680.0), _arm(10, 483.0, 480.0)],
                "abs_improvement_ms": 200.0,
                "pct_improvement": 29.28,
                "model_abs_improvement_ms": 200.0,
            },
            {
                "experiment": "fig5_rtt_9k",
                "label": "rtt1000",
                "x": 1000.0,
                "rtt_ms": 1000.0,
                "rate_bps": 1.2e6,
                "loss": 0.0,
                "arms": [
                    _arm(3, 4300.0, 3080.0, flag="SYN retransmitted in 100% of trials"),
                    _arm(10, 3300.0, 2080.0, flag="SYN retransmitted in 100% of trials"),
                ],
                "abs_improvement_ms": 1000.0,
                "pct_improvement": 23.26,
                "model_abs_improvement_ms": 1000.0,
            },
            {
                "experiment": "fig5_rtt_9k",
                "label": "rtt20",
                "x": 20.0,
                "rtt_ms": 20.0,
                "rate_bps": 1.2e6,
                "loss": 0.0,
                "arms": [_arm(3, None, 100.0, n=0)],
                "abs_improvement_ms": None,
                "pct_improvement": None,
                "model_abs_improvement_ms": None,
            },
        ],
    }
    fig2 = {
        "title": "Figure 2: latency vs IW",
        "x": "iw",
        "plan": {},
        "points": [
            {
                "experiment": "fig2_iw",
                "label": "avgdc",
                "x": 70.0,
                "rtt_ms": 70.0,
                "rate_bps": 1.2e6,
                "loss": 0.0,
                "arms": [_arm(3, 173.0, 172.0), _arm(42, 150.0, 132.0, flag="burst | queue", retrans_share=0.25)],
                "abs_improvement_ms": None,
                "pct_improvement": None,
                "model_abs_improvement_ms": None,
            }
        ],
    }
    return {
        "generated_at": "2026-11-23T10:00:00+00:00",
        "quick": True,
        "flag_threshold": 0.1,
        "metric": "server",
        "experiments": {"fig5_rtt_9k": fig5, "fig2_iw": fig2},
    }


def test_figure5_rows_set_measured_beside_model_and_flags() -> None:
    text = markdown_report(_summary())
    assert text.startswith("# IW10 reproduction (quick)\n")
    assert "## Figure 5: improvement vs RTT (1.2 Mbit/s, 9 KB) (`fig5_rtt_9k`)" in text
    assert "| 200 ms | 4/4 | 683.0 | 680.0 | 483.0 | 480.0 | 200.0 (29.3 %) | 200.0 |  |" in text
    assert (
        "| 1000 ms | 4/4 | 4300.0 | 3080.0 | 3300.0 | 2080.0 | 1000.0 (23.3 %) | 1000.0 "
        "| IW3: SYN retransmitted in 100% of trials; IW10: SYN retransmitted in 100% of trials |"
    ) in text
    assert "| 20 ms |" not in text  # a point without both arms has no improvement row


def test_other_experiments_list_every_arm_with_gap_and_escaped_flag() -> None:
    text = markdown_report(_summary())
    assert "| avgdc | 3 | 4 | 0 | 173.0 ± 1.5 | 172.0 | +0.6 % | 0 % |  |" in text
    assert "| avgdc | 42 | 4 | 0 | 150.0 ± 1.5 | 132.0 | +13.6 % | 25 % | burst \\| queue |" in text
    # every table row has as many cells as its header
    for table in text.split("\n\n"):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        if rows:
            widths = {len(line.replace("\\|", "").split("|")) for line in rows}
            assert len(widths) == 1, table


def test_lab_report_re_renders_html_and_markdown(tmp_path: pathlib.Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(_summary()))
    result = CliRunner().invoke(lab, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == markdown_report(_summary())
    first = (tmp_path / "report.html").read_bytes()
    assert b"683.0" in first
    # re-rendering the same summary gives the same bytes (a bundle's report can be checked)
    assert CliRunner().invoke(lab, ["report", str(tmp_path)]).exit_code == 0
    assert (tmp_path / "report.html").read_bytes() == first
