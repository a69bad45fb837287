"""The reproduction report's fairness section is built from ``summary["fairness"]`` alone."""

from __future__ import annotations

import pathlib

import pytest

from iwscope_lab.fairness import Bottleneck, phase_plan
from iwscope_lab.report import write_report

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def _row(mix: str, flow: str, iw: int, throughput_bps: float, fct_ms: float | None) -> dict[str, object]:
    return {
        "load": 0.5,
        "mix": mix,
        "campaign_id": 1 if mix == "3" else 2,
        "offered_load": 0.52,
        "flow": flow,
        "iw": iw,
        "n": 1,
        "errors": 0,
        "throughput_bps": throughput_bps,
        "fct_mean_ms": fct_ms,
        "fct_p50_ms": fct_ms,
        "fct_p90_ms": fct_ms,
        "retrans_flow_share": 0.25,
        "bytes_retrans_share": 0.0123,
    }


def test_report_has_the_fairness_figure_and_table(tmp_path: pathlib.Path) -> None:
    rows = [
        _row("3", "background-alone", 3, 3.35e6, 3729.7),
        _row("3", "background", 3, 2.49e6, 5004.8),
        _row("3", "short", 3, 0.16e6, 2416.6),
        _row("10", "short", 10, 0.16e6, 2243.2),
    ]
    summary = {
        "generated_at": "2026-11-22T06:00:00+00:00",
        "quick": True,
        "flag_threshold": 0.1,
        "metric": "server",
        "experiments": {},
        "fairness": {
            "title": "Offered load and fairness (IETF 78 testbed)",
            "flows_per_phase": 24,
            "bottleneck": {"rate_bps": 4e6, "rtt_ms": 100.0, "buffer_bdp": 1.0},
            "rows": rows,
        },
    }
    path = tmp_path / "report.html"
    write_report(summary, path)
    page = path.read_text(encoding="utf-8")
    assert "Offered load and fairness (IETF 78 testbed)" in page
    assert "<td>background-alone</td><td>3</td><td>1</td><td>0</td><td>3.35</td><td>3729.7</td>" in page
    assert "<td>25.0</td><td>1.23</td>" in page  # retransmitting flows %, retransmitted bytes %
    assert "background flow with the short flows" in page and "short flows IW10" in page  # figure traces
    assert "plotly" in page.lower()


def test_phase_plan_offers_the_requested_load() -> None:
    bottleneck = Bottleneck(rate_bps=20e6, rtt_ms=300.0)
    plan = phase_plan("p", (3, 10), 0.9, bottleneck, flows=120)
    sizes = plan.sizes or ()
    assert len(sizes) * len(plan.arms) == 120 and plan.arms == (3, 10)
    mean_bytes = sum(sizes) / len(sizes)
    assert plan.arrival_rate_per_s * mean_bytes * 8 / bottleneck.rate_bps == pytest.approx(0.9, rel=1e-3)
    span_s = 120 / plan.arrival_rate_per_s
    # busy through warm-up (10 RTTs) and every arrival at the link rate
    assert plan.background_bytes == pytest.approx(20e6 / 8 * (span_s + 3.0), rel=1e-5)
    assert plan.trials_per_probe(1) == 122
