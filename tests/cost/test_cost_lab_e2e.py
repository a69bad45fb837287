"""A short cost experiment in the lab, end to end (origin, probe, API, worker, ``cost()``): the
physics of bursts at a shallow buffer and the interference of an A/B split.

One 10 Mbit/s, 100 ms bottleneck with a 10-packet drop-tail buffer, CUBIC at the origin; phases
through the product: all short flows IW32 (unpaced), all IW32 paced, all IW10, and a 50/50 mix
of IW10 and IW32; the interactive flow runs in each.  About a minute.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest
from testkit import SchedulingNoise

from iwscope.analysis import CostReport, Filters, cost
from iwscope.analysis.cost import DELAY_BLOCK_S, MIN_BLOCKS, MIN_DELAY_SAMPLES, MIN_P99_SAMPLES
from iwscope_lab.cost import INTERACTIVE_INTERVAL_US, CostBottleneck, CostPhase, run_cost
from iwscope_lab.stack import Stack

# A minute-long lab run of the cost experiment through the product: make test-slow.  make test keeps
# the lab check of the same physics (tests/cost/test_cost_arms_lab.py), the cost analysis on
# hand-made data (tests/cost/test_cost_report.py) and make demo's cost phases.
pytestmark = pytest.mark.slow

SHALLOW = CostBottleneck("shallow", 10e6, 100.0, 10)
PHASES = [
    ("policy", ("32",), None),
    ("policy", ("32p",), None),
    ("policy", ("10",), None),
    ("share", ("10", "32"), (0.5, 0.5)),
    ("page", ("32",), None),
]
FLOWS = 40


@pytest.fixture(scope="module")
def experiment(
    database_url: str,
    redis_url: str,
    celery_worker: object,
    _api_server_process: object,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Stack, list[CostPhase], CostReport, SchedulingNoise]]:
    stack = Stack(
        database_url=database_url,
        redis_url=redis_url,
        api_port=_api_server_process.port,  # type: ignore[attr-defined]
        dashboard_port=None,
        run_dir=tmp_path_factory.mktemp("costlab"),
    )
    try:
        with SchedulingNoise() as noise:
            phases = run_cost(
                stack, flows=FLOWS, pages=8, conditions=[SHALLOW], phases=PHASES, timeout_s=180, show_progress=False, prefix="iwt"
            )
        with stack.session() as session:
            report = cost(session, Filters(campaign_ids=tuple(phase.campaign.campaign_id for phase in phases)))
        yield stack, phases, report, noise
    finally:
        stack.close_sessions()


def _phase(phases: list[CostPhase], kind: str, arms: tuple[str, ...]) -> int:
    return next(phase.campaign.campaign_id for phase in phases if phase.kind == kind and phase.arms == arms)


def test_every_record_arrives_with_its_role(experiment: tuple[Stack, list[CostPhase], CostReport, SchedulingNoise]) -> None:
    _, phases, report, _ = experiment
    for phase in phases:
        assert phase.campaign.stored_per_probe == {"client": phase.campaign.expected_per_probe}, phase.to_dict()
        assert phase.campaign.unjoined == 0
    roles = {(flow.campaign_id, flow.role, flow.arm) for flow in report.flows}
    assert (_phase(phases, "policy", ("32p",)), "short", "32p") in roles
    assert (_phase(phases, "page", ("32",)), "page-load", "32") in roles
    # One interactive flow per phase that asked for it, each with packets echoed.
    interactive = {point.campaign_id: point for point in report.interactive}
    assert set(interactive) == {phase.campaign.campaign_id for phase in phases if phase.kind != "page"}
    assert all(point.received > 0.8 * point.sent > 0 for point in interactive.values())


def test_unpaced_iw32_bursts_lose_packets_where_paced_iw32_does_not(
    experiment: tuple[Stack, list[CostPhase], CostReport, SchedulingNoise],
) -> None:
    _, phases, report, noise = experiment
    short = {(flow.campaign_id, flow.arm): flow for flow in report.flows if flow.role == "short"}
    burst = short[(_phase(phases, "policy", ("32",)), "32")]
    paced = short[(_phase(phases, "policy", ("32p",)), "32p")]
    # 32 back-to-back segments into 10 packets of buffer: the origin retransmits in (nearly) every
    # flow and a large share of the bytes; paced, far fewer.  Compared by their 95 % intervals,
    # which do not overlap (a loaded box makes the paced flows lose more, not as much).
    assert burst.retrans_flow_share_ci is not None and paced.retrans_flow_share_ci is not None
    assert paced.retrans_flow_share_ci[1] < burst.retrans_flow_share_ci[0], (paced, burst)
    assert burst.bytes_retrans_share_ci is not None and paced.bytes_retrans_share is not None
    # (nothing retransmitted at all has no bootstrap interval: the share itself, 0, is the bound)
    paced_high = paced.bytes_retrans_share_ci[1] if paced.bytes_retrans_share_ci else paced.bytes_retrans_share
    assert paced_high < burst.bytes_retrans_share_ci[0], (paced, burst)
    # The interactive flow's queueing delay is bounded by the buffer: 10 full-size packets
    # ahead of it drain in 10 x 1514 x 8 bit / 10 Mbit/s = 12.1 ms, plus 2 ms for scheduling on
    # a quiet box.  Every hop of the path is a userspace process (the emulator, the origin's
    # echo, the probe's threads), so on a starved box a round trip also waits for the CPU: the
    # bound adds twice the p99 lateness of a 5 ms sleep measured during the run (well under a
    # millisecond when the box is quiet; tens of ms beside another suite).
    drain_ms = SHALLOW.buffer_packets * 1514 * 8 / SHALLOW.rate_bps * 1000
    bound_ms = drain_ms + 2 + 2 * noise.quantile_ms(0.99)
    # A phase lasts as long as its Poisson arrivals (random: 40 flows give 2-4 s, 400-800
    # packets at 200/s), so a quantile is shown exactly when its phase gave enough packets for
    # it and MIN_BLOCKS blocks for its interval; every median shown respects the bound, and no
    # p99 shown contradicts it (its 95 % interval reaches below the bound: a p99 of a few hundred
    # packets moves with the two or three that met a stall, as in a CI run: p99 36.0 ms
    # [25.7, 44.5] against a bound of 26.4 ms).  A deeper buffer still fails both.
    shown = 0
    for point in report.interactive:
        assert point.samples >= MIN_DELAY_SAMPLES, point
        blocks = point.samples // round(DELAY_BLOCK_S * 1e6 / INTERACTIVE_INTERVAL_US)
        assert (point.delay_p50_ms is not None) == (blocks >= MIN_BLOCKS), point
        assert (point.delay_p99_ms is not None) == (blocks >= MIN_BLOCKS and point.samples >= MIN_P99_SAMPLES), point
        for value, interval, bounded in (
            (point.delay_p50_ms, point.delay_p50_ci_ms, point.delay_p50_ms),
            (point.delay_p99_ms, point.delay_p99_ci_ms, point.delay_p99_ci_ms and point.delay_p99_ci_ms[0]),
        ):
            if value is not None:
                assert interval is not None and 0 <= interval[0] <= value <= interval[1], point
                assert bounded is not None and bounded <= bound_ms, (point, bound_ms)
                shown += 1
    assert shown, report.interactive  # (all four phases under 2 s: a 1-in-10^5 draw)


def test_the_ab_split_is_compared_with_the_total_effect(
    experiment: tuple[Stack, list[CostPhase], CostReport, SchedulingNoise],
) -> None:
    _, phases, report, _ = experiment
    [interference] = report.interference
    assert (interference.baseline, interference.treatment, interference.treatment_share) == ("10", "32", 0.5)
    assert interference.mixed_campaign_id == _phase(phases, "share", ("10", "32"))
    assert interference.all_baseline_campaign_id == _phase(phases, "policy", ("10",))
    assert interference.all_treatment_campaign_id == _phase(phases, "policy", ("32",))
    assert interference.ab_ms is not None and interference.total_ms is not None and interference.bias_ms is not None
    assert interference.bias_ms == pytest.approx(interference.ab_ms - interference.total_ms)
    for value, interval in (
        (interference.ab_ms, interference.ab_ci_ms),
        (interference.total_ms, interference.total_ci_ms),
        (interference.bias_ms, interference.bias_ci_ms),
    ):
        assert interval is not None and interval[0] <= value <= interval[1]
    assert min(interference.n) >= 6


def test_public_api_serves_the_cost_report(
    experiment: tuple[Stack, list[CostPhase], CostReport, SchedulingNoise], _api_server_process: object
) -> None:
    _, phases, report, _ = experiment
    ids = ",".join(str(phase.campaign.campaign_id) for phase in phases)
    url = f"http://127.0.0.1:{_api_server_process.port}/api/v1/analysis/cost?campaign={ids}"  # type: ignore[attr-defined]
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = json.load(answer)["data"]
    assert len(body["campaigns"]) == len(phases) and len(body["flows"]) == len(report.flows)
    assert body["interference"][0]["bias_ms"] == pytest.approx(report.interference[0].bias_ms)
