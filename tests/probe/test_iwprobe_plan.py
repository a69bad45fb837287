"""Round plans of cost campaigns: arms by label, arm shares (share sweeps), page loads."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from iwprobe import wire
from iwprobe._fetch import object_url
from iwprobe._plan import PlanEntry, page_parts, round_plan, share_counts, target_host

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def _campaign(**fields: object) -> wire.CampaignSchedule:
    values = {
        "campaign_id": 1,
        "name": "c",
        "arms": [10, 32],
        "sizes": [15000, 50000],
        "size_dist": None,
        "sizes_per_round": 1,
        "repetitions": 1,
        "interval_s": 0.0,
        "starts_at": wire.utc_timestamp(),
        "ends_at": None,
        "calibrate": False,
        "targets": [
            wire.ScheduleTarget(
                "o1",
                "192.0.2.1",
                [
                    wire.ArmPort(10, 8010, "10"),
                    wire.ArmPort(32, 8032, "32"),
                    wire.ArmPort(10, 9010, "10p", True),
                    wire.ArmPort(32, 9032, "32p", True),
                    wire.ArmPort(10, 10000, "learned"),
                ],
            )
        ],
    }
    values.update(fields)
    return wire.CampaignSchedule(**values)  # type: ignore[arg-type]


def test_labelled_arms_pick_their_own_listeners() -> None:
    plan = [
        PlanEntry.from_json(entry)
        for entry in round_plan(_campaign(arm_labels=["10", "10p", "learned"]), [15000, 50000], random.Random(1))
    ]
    assert Counter((entry.arm, entry.port) for entry in plan) == {("10", 8010): 2, ("10p", 9010): 2, ("learned", 10000): 2}
    # The paced arm has the plain arm's IW but is another listener.
    assert {entry.iw for entry in plan if entry.arm == "10p"} == {10}


def test_shares_split_the_short_flows_and_keep_sizes_balanced() -> None:
    sizes = [15000, 50000] * 20
    for shares, expected in (([0.75, 0.25], (60, 20)), ([0.5, 0.5], (40, 40)), ([1.0, 0.0], (80, 0))):
        plan = [PlanEntry.from_json(entry) for entry in round_plan(_campaign(arm_shares=shares), sizes, random.Random(2))]
        counts = Counter(entry.arm for entry in plan)
        assert (counts["10"], counts["32"]) == expected
        assert Counter(entry.size for entry in plan) == {15000: 40, 50000: 40}


def test_share_counts_sum_to_the_total() -> None:
    assert share_counts([0.25, 0.75], 10) == [3, 7] or share_counts([0.25, 0.75], 10) == [2, 8]
    assert sum(share_counts([1 / 3, 1 / 3, 1 / 3], 10)) == 10
    with pytest.raises(ValueError):
        share_counts([0.0, 0.0], 4)


def test_a_plan_spooled_by_an_older_probe_still_reads() -> None:
    assert PlanEntry.from_json(["o1", "h", 10, 8010, 5000]).arm == "10"


def test_page_parts_split_a_page_over_connections() -> None:
    assert page_parts(50_000, 6) == [8334, 8334, 8333, 8333, 8333, 8333]
    assert sum(page_parts(15_001, 6)) == 15_001
    assert page_parts(3, 6) == [1, 1, 1]


def test_the_family_picks_the_host_and_https_targets_are_fetched_over_https() -> None:
    target = wire.ScheduleTarget("o2", "192.0.2.2", [wire.ArmPort(10, 8010, "10")], tls=True, host6="2001:db8::2")
    for family, host in (("ipv6", "2001:db8::2"), ("ipv4", "192.0.2.2"), ("", "192.0.2.2")):
        plan = [
            PlanEntry.from_json(entry)
            for entry in round_plan(_campaign(arms=[10], targets=[target], family=family), [9000], random.Random(3))
        ]
        assert [(entry.host, entry.tls) for entry in plan] == [(host, True)], family
    assert object_url("2001:db8::2", 8010, 9000, tls=True) == "https://[2001:db8::2]:8010/obj/9000"
    # an IPv6 campaign whose target has no IPv6 host resolves its host (the fetch asks for IPv6 only)
    plain = wire.ScheduleTarget("o3", "origin.example", [wire.ArmPort(10, 8010, "10")])
    assert target_host(plain, "ipv6") == "origin.example"
    # plans spooled before wire v4 carry no scheme: plain HTTP
    assert PlanEntry.from_json(["o1", "192.0.2.1", 10, 8010, 9000, "10"]).tls is False


def test_quic_arms_pair_with_their_tcp_arms_and_are_skipped_without_the_extra() -> None:
    """A QUIC arm (wire v9) is its own listener on the TCP arm's port number (UDP); a probe
    without ``iwprobe[quic]`` leaves the QUIC arms out and keeps the rest (shares included)."""
    target = wire.ScheduleTarget(
        "o1", "192.0.2.1", [wire.ArmPort(10, 8010, "10"), wire.ArmPort(10, 8010, "10q"), wire.ArmPort(32, 8032, "32q")], tls=True
    )
    campaign = _campaign(arm_labels=["10", "10q", "32q"], targets=[target])
    plan = [PlanEntry.from_json(entry) for entry in round_plan(campaign, [15000, 50000], random.Random(1))]
    assert Counter((entry.arm, entry.port, entry.iw) for entry in plan) == {
        ("10", 8010, 10): 2,
        ("10q", 8010, 10): 2,
        ("32q", 8032, 32): 2,
    }
    without = [PlanEntry.from_json(entry) for entry in round_plan(campaign, [15000, 50000], random.Random(1), quic=False)]
    assert {entry.arm for entry in without} == {"10"} and len(without) == 2
    shared = _campaign(arm_labels=["10", "10q"], arm_shares=[0.25, 0.75], targets=[target])
    kept = [PlanEntry.from_json(entry) for entry in round_plan(shared, [15000] * 4, random.Random(1), quic=False)]
    assert {entry.arm for entry in kept} == {"10"}, kept


@pytest.mark.parametrize(
    "label, iw, protocol, tcp",
    [("10", 10, "tcp", "10"), ("10p", 10, "tcp", "10p"), ("10q", 10, "quic", "10"), ("32pq", 32, "quic", "32p")],
)
def test_quic_arm_labels(label: str, iw: int, protocol: str, tcp: str) -> None:
    assert wire.arm_label_iw(label) == iw and wire.arm_label_protocol(label) == protocol and wire.tcp_arm_label(label) == tcp
    assert not wire.is_plain_arm(label, iw) or protocol == "tcp"


@pytest.mark.parametrize("label", ["q10", "10qp", "learnedq", "10qq", ""])
def test_labels_that_are_not_quic_arms_are_refused(label: str) -> None:
    with pytest.raises(ValueError):
        wire.arm_label_iw(label)


def test_the_quic_census_answer_is_a_record_of_its_own() -> None:
    """Wire v9: the HTTP/3 answer of a census keeps the target's fields and says its own window
    (packets, the datagram size as MSS, no announced MSS); no HTTP/3 answer, no record."""
    from iwprobe._census import CensusResult, quic_to_record, to_record
    from iwprobe._census_quic import QuicCensus

    result = CensusResult(url="https://caddy.example/big", measured_at=wire.utc_timestamp(), status="ok", family="ipv4")
    result.iw_segments, result.mss, result.announced_mss, result.tls_version = 10, 1448, 1460, "TLSv1.3"
    assert quic_to_record(result, "p", 7, 2) is None
    result.quic = QuicCensus(url=result.url, status="ok", iw_packets=32, iw_bytes=40_822, max_datagram_size=1252, rtt_ms=40.5)
    tcp, quic = to_record(result, "p", 7, 2), quic_to_record(result, "p", 7, 2)
    assert quic is not None and quic.census_id != tcp.census_id
    assert (quic.protocol, quic.iw_segments, quic.mss, quic.announced_mss, quic.rtt_us) == ("quic", 32, 1252, None, 40_500)
    assert (quic.url, quic.campaign_id, quic.round, quic.family) == (tcp.url, 7, 2, "ipv4") and tcp.protocol == ""
