"""Round planning and scheduling decisions of the probe daemon (no network needed)."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from pathlib import Path

import pytest

from iwprobe import wire
from iwprobe._agent import Credentials, ProbeAgent
from iwprobe._calibrate import arrivals, estimate_bottleneck_bps
from iwprobe._fetch import FetchResult

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def _campaign(**fields: object) -> wire.CampaignSchedule:
    values = {
        "campaign_id": 7,
        "name": "c",
        "arms": [3, 10, 16],
        "sizes": None,
        "size_dist": "websearch",
        "sizes_per_round": 5,
        "repetitions": 3,
        "interval_s": 60.0,
        "starts_at": wire.utc_timestamp(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)),
        "ends_at": None,
        "calibrate": False,
        "targets": [
            wire.ScheduleTarget("o1", "192.0.2.1", [wire.ArmPort(3, 8003), wire.ArmPort(10, 8010)]),
            wire.ScheduleTarget("o2", "192.0.2.2", [wire.ArmPort(3, 8003), wire.ArmPort(10, 8010), wire.ArmPort(16, 8016)]),
        ],
    }
    values.update(fields)
    return wire.CampaignSchedule(**values)  # type: ignore[arg-type]


@pytest.fixture()
def agent(tmp_path: Path) -> ProbeAgent:
    credentials = Credentials("probe", wire.new_id(), "x.y", "http://127.0.0.1:9")
    return ProbeAgent(str(tmp_path), credentials, rng=random.Random(3))


def test_a_round_is_every_arm_and_size_in_random_order(agent: ProbeAgent) -> None:
    plan = agent._plan(_campaign())
    # o1 offers IW 3 and 10, o2 also 16: 5 sizes each.
    assert len(plan) == (2 + 3) * 5
    sizes_by_arm = {}
    for origin_id, _, iw, port, size, arm, tls in plan:
        assert tls is False  # plain HTTP targets
        assert port == 8000 + iw and arm == str(iw)
        sizes_by_arm.setdefault((origin_id, iw), Counter())[size] += 1
    # The same drawn sizes for every arm, so arms are compared on equal work.
    assert len({tuple(sorted(counter.elements())) for counter in sizes_by_arm.values()}) == 1
    assert all(1000 <= item[4] <= 30000 for item in plan)
    # Interleaved: not grouped by arm.
    arms_in_order = [item[2] for item in plan]
    assert arms_in_order != sorted(arms_in_order)
    fixed = agent._plan(_campaign(sizes=[3000, 9000], size_dist=None))
    assert sorted(item[4] for item in fixed) == [3000] * 5 + [9000] * 5


def test_rounds_are_spaced_and_resumed(agent: ProbeAgent) -> None:
    campaign = _campaign()
    now = dt.datetime.now(dt.UTC).timestamp()
    assert agent._next_round(campaign, now) == ("run", 0, 0.0)
    agent.spool.start_round(7, 0, agent._plan(campaign))
    agent.spool.add("trial", "t1", {"trial_id": "t1"}, round_key=(7, 0, 1))
    assert agent._next_round(campaign, now) == ("run", 0, 0.0)  # unfinished: resume it
    agent.spool.finish_round(7, 0)
    status, number, wait_s = agent._next_round(campaign, dt.datetime.now(dt.UTC).timestamp())
    assert status == "wait" and number == 1 and 55 < wait_s <= 60
    for number in (1, 2):
        agent.spool.start_round(7, number, [])
        agent.spool.finish_round(7, number)
    assert agent._next_round(campaign, now + 1000)[0] == "done"
    ended = _campaign(ends_at=wire.utc_timestamp(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)))
    assert agent._next_round(ended, now)[0] == "done"
    later = _campaign(starts_at=wire.utc_timestamp(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)))
    assert agent._next_round(later, now)[0] == "wait"


def test_bottleneck_is_the_best_rate_over_long_enough_spans() -> None:
    # 10 Mbit/s = 1250 bytes per ms, sampled every ms for 100 ms, after a slow 20 ms start.
    progress = [(t, 100 * t) for t in range(0, 20)] + [(t, 2000 + 1250 * (t - 20)) for t in range(20, 120)]
    progress_us = [(t * 1000, b) for t, b in progress]
    assert estimate_bottleneck_bps(progress_us, 10_000) == pytest.approx(10_000_000, rel=0.01)
    assert estimate_bottleneck_bps(progress_us[:5], 10_000) is None  # too short to say


def test_bottleneck_counts_neither_released_backlogs_nor_duplicates() -> None:
    """8 Mbit/s: one 1,000-byte segment arrives per ms.  A loss holds 30 segments in the
    out-of-order queue for 30 ms, and the read after the retransmission gets them at once;
    later a spurious RTO resends 40 segments that arrive again (counted, no new bytes).
    Either count alone overshoots over some 20 ms span; the lower of the two does not."""
    result = FetchResult(url="http://x/obj/1", started_at="2026-01-01T00:00:00Z", tcp_info={"rcv_mss": 1000})
    read = segments = 0
    for ms in range(400):
        held = 100 <= ms < 130
        read += 0 if held else (31_000 if ms == 130 else 1000)
        segments += 2 if 250 <= ms < 290 else 1
        result.progress.append((ms * 1000, read, segments))
    by_reads = estimate_bottleneck_bps([(t, b) for t, b, _ in result.progress], 20_000)
    by_segments = estimate_bottleneck_bps([(t, n * 1000) for t, _, n in result.progress], 20_000)
    assert by_reads is not None and by_reads > 1.5 * 8_000_000
    assert by_segments is not None and by_segments > 1.5 * 8_000_000
    assert estimate_bottleneck_bps(arrivals(result), 20_000) == pytest.approx(8_000_000, rel=0.01)
    result.tcp_info = {}  # no MSS: the reads are all there is
    assert arrivals(result)[-1] == (399_000, read)
