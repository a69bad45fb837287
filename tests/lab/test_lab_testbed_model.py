"""The IETF 78 testbed point beside the model with loss (``iwscope_lab.testbed``): pure code on
hand-made trial rows (the lab runs are in docs/reproduction.md)."""

from __future__ import annotations

import pytest

from iwscope_lab import testbed_report
from iwscope_lab.reproduce import LOSS_FLAG_THRESHOLD
from iwscope_lab.testbed import BOTTLENECK, arm_point

pytestmark = pytest.mark.unit

#: The least the module simulates (ten per trial: 1,000 for these 100 rows) -- not the
#: reproduction's 4,000, which only narrows the Monte-Carlo interval these checks do not need
MODEL = {"flag_threshold": LOSS_FLAG_THRESHOLD, "samples": 0}


def _rows(iw: int, latency_ms: float, *, srtt_ms: float, retrans_every: int = 0) -> list[tuple[int, int, int, int, int, int]]:
    """(arm_iw, server_latency_us, bytes_retrans, bytes_sent, total_retrans, origin srtt_us) x 100."""
    rows = []
    for i in range(100):
        lost = retrans_every and i % retrans_every == 0
        rows.append((iw, int((latency_ms + i % 7) * 1000), 2896 if lost else 0, 52_000, 2 if lost else 0, int(srtt_ms * 1000)))
    return rows


def test_a_queue_the_model_was_not_told_of_is_the_measured_reason_for_a_gap() -> None:
    # IW10 at 50 KB: 3 round trips of slow start; measured as if every round trip had 100 ms of queue
    point = arm_point(10, _rows(10, 1290.0, srtt_ms=BOTTLENECK.rtt_ms + 100), **MODEL)
    assert point["n"] == 100 and point["queue_delay_ms"] == pytest.approx(100.0)
    at_min, with_queue = point["models"]["min RTT"], point["models"]["queue RTT"]
    assert at_min["prediction"] and with_queue["prediction"]
    assert not at_min["within"] and at_min["gap"] > 0.15  # the 300 ms model is too fast
    assert with_queue["within"] and with_queue["rtt_ms"] == pytest.approx(400.0)
    assert "100 ms above the propagation delay" in point["flag"]
    lines = testbed_report.testbed_markdown(  # (imported as the module's: pytest would collect test*)
        {
            "title": "testbed",
            "flag_threshold": LOSS_FLAG_THRESHOLD,
            "campaign_id": 1,
            "arrival_rate_per_s": 47.5,
            "arms": [point],
            "improvement_ms": 480.0,
            "improvement_ci_ms": (430.0, 530.0),
            "model_improvement_ms": {"min RTT": (326.0, (320.0, 332.0)), "queue RTT": (92.0, None)},
        }
    )
    assert any(line.startswith("| IW10 | 100 | 0 |") and "(beyond 15 %)" in line for line in lines)
    assert "Measured improvement of IW10 over IW3 480.0 [430.0, 530.0] ms" in lines[3]
    assert "min RTT: 326.0 [320.0, 332.0] ms, queue RTT: 92.0 ms" in lines[3]


def test_losses_become_the_models_random_loss_and_their_spread_is_compared() -> None:
    point = arm_point(3, _rows(3, 1300.0, srtt_ms=BOTTLENECK.rtt_ms, retrans_every=5), **MODEL)
    assert point["bytes_retrans_share"] == pytest.approx(20 * 2896 / (100 * 52_000))
    assert point["retrans_share"] == pytest.approx(0.2)
    assert point["models"]["min RTT"]["loss"] == point["bytes_retrans_share"]
    assert point["models"]["min RTT"]["retrans_share"] > 0.2  # random loss reaches more of 36-segment flows
