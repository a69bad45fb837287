"""The cost section of the reproduction report: every number with its interval and n, and
"n too small" (never a bare number or a percent sign on nothing) where the data are too few."""

from __future__ import annotations

from typing import Any

import pytest

from iwscope_lab.cost_report import cost_markdown, cost_rows, interference_rows

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def _flow(campaign_id: int, role: str, arm: str, n: int, **values: Any) -> dict[str, Any]:
    empty = dict.fromkeys(
        (
            "fct_p50_ms",
            "fct_p50_ci_ms",
            "throughput_bps",
            "throughput_ci_bps",
            "bytes_retrans_share",
            "bytes_retrans_share_ci",
            "retrans_flow_share",
            "retrans_flow_share_ci",
        )
    )
    return {"campaign_id": campaign_id, "role": role, "arm": arm, "n": n, "joined_flows": n, **empty, **values}


def _summary() -> dict[str, Any]:
    campaigns = [
        {"campaign_id": 1, "region": "cost-shallow", "mix": "32"},
        {"campaign_id": 2, "region": "cost-shallow", "mix": "10"},
    ]
    flows = [
        _flow(
            1,
            "short",
            "32",
            40,
            fct_p50_ms=711.0,
            fct_p50_ci_ms=[649.0, 734.0],
            bytes_retrans_share=0.367,
            bytes_retrans_share_ci=[0.30, 0.42],
            retrans_flow_share=1.0,
            retrans_flow_share_ci=[0.912, 1.0],
        ),
        _flow(1, "background", "10", 6, throughput_bps=4.1e6, throughput_ci_bps=[3.8e6, 4.4e6]),
        _flow(1, "background-alone", "10", 6, throughput_bps=6.0e6, throughput_ci_bps=[5.5e6, 6.5e6]),
        _flow(2, "short", "10", 4),
        _flow(2, "background", "10", 1),
        _flow(2, "background-alone", "10", 1),
    ]
    interactive = [
        {
            "campaign_id": 1,
            "samples": 480,
            "sent": 490,
            "delay_p50_ms": 0.3,
            "delay_p50_ci_ms": [0.2, 0.6],
            "delay_p99_ms": 10.4,
            "delay_p99_ci_ms": [9.9, 10.9],
            "loss_share": 0.02,
            "loss_ci": [0.01, 0.03],
        },
        {
            "campaign_id": 2,
            "samples": 120,
            "sent": 30,
            "delay_p50_ms": 0.2,
            "delay_p50_ci_ms": None,
            "delay_p99_ms": None,
            "delay_p99_ci_ms": None,
            "loss_share": None,
            "loss_ci": None,
        },
    ]
    interference = [
        {
            "region": "cost-shallow",
            "baseline": "10",
            "treatment": "32",
            "treatment_share": 0.5,
            "ab_ms": 297.2,
            "ab_ci_ms": [142.0, 437.7],
            "total_ms": None,
            "total_ci_ms": None,
            "bias_ms": None,
            "bias_ci_ms": None,
            "n": [12, 12, 24, 4],
        }
    ]
    return {
        "title": "Cost",
        "interactive": {"interval_us": 5000, "packet_bytes": 160},
        "phases": [{"campaign_id": 1, "kind": "bulk"}, {"campaign_id": 2, "kind": "bulk"}],
        "model": [],
        "report": {"campaigns": campaigns, "flows": flows, "interactive": interactive, "interference": interference},
    }


def test_numbers_carry_interval_and_n() -> None:
    measured, small = cost_rows(_summary())
    assert measured["short_fct_p50"] == "32: 711.0 [649.0, 734.0] (n=40)"
    assert measured["short_retrans"] == "32: 36.7 [30.0, 42.0] % of bytes, 100 [91, 100] % of flows (n=40 joined)"
    assert measured["bulk_mbps"] == "4.10 [3.80, 4.40] (n=6) with / 6.00 [5.50, 6.50] (n=6) alone"
    assert measured["delay_p99"] == "10.4 [9.9, 10.9] (n=480)"
    assert measured["loss"] == "2.00 [1.00, 3.00] % (n=490)"
    assert small["short_fct_p50"] == "10: n too small (n=4)"
    assert small["bulk_mbps"].startswith("n too small (n=1) with")
    assert small["delay_p99"] == "n too small (n=120)"
    assert small["loss"] == "n too small (n=30)"  # no percent sign on a missing number


def test_interference_without_a_total_says_so() -> None:
    [row] = interference_rows(_summary())
    assert row["ab"] == "297.2 [142.0, 437.7]" and row["total"].startswith("n too small") and row["n"] == "12/12/24/4"
    markdown = "\n".join(cost_markdown(_summary()))
    assert "| shallow | bulk | 32 |" in markdown and "200 packets/s UDP flow of 160-byte packets" in markdown
