"""A small lab campaign end to end: real iwprobe agents in namespaces behind the link
emulator, the real API and Celery worker, checked from PostgreSQL; half of its rounds traced
(wire v7), at the probe and at the origin."""

from __future__ import annotations

import json
import secrets
import statistics
import zlib
from collections.abc import Iterator

import pytest
from campaign_kit import path_hosts, query_rows, session_stack

from iwprobe import wire
from iwprobe._trace import traced_round
from iwscope.model import predict
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.topology import Topology

#: name -> (region, RTT ms, rate bit/s): serialisation of one packet stays under 2 % of the RTT.
PATHS = {"near": ("europe", 80.0, 10e6), "far": ("africa", 200.0, 4e6)}
PLAN = CampaignPlan(name="e2e", arms=(3, 10), sizes=(3_000, 9_000), repetitions=4, trace_share=0.5)


@pytest.fixture(scope="module")
def campaign(
    database_url: str,
    redis_url: str,
    celery_worker: object,
    _api_server_process: object,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, object]]:
    api = _api_server_process
    stack = session_stack(database_url, redis_url, api, tmp_path_factory.mktemp("lab"))
    hosts = path_hosts({name: (region, rtt, rate, 0.0) for name, (region, rtt, rate) in PATHS.items()})
    with Topology(f"iwt{secrets.token_hex(3)}", hosts) as topology:
        result = LabCampaign(topology, stack, PLAN).run(timeout_s=150, show_progress=False)
    yield {"result": result, "stack": stack}
    stack.close_sessions()


def test_every_probe_and_arm_delivered_every_trial(campaign: dict[str, object]) -> None:
    result = campaign["result"]
    expected = PLAN.trials_per_probe(1)
    assert result.stored_per_probe == dict.fromkeys(PATHS, expected)
    rows = query_rows(
        campaign["stack"],
        "SELECT probe_id, arm_iw, object_size, count(*) AS n, count(error_kind) AS errors "
        "FROM trials WHERE campaign_id = :c GROUP BY 1, 2, 3",
        c=result.campaign_id,
    )
    assert len(rows) == len(PATHS) * len(PLAN.arms) * len(PLAN.sizes)
    assert all(row.n == PLAN.repetitions and row.errors == 0 for row in rows)


def test_origin_observations_joined_with_the_arms_window(campaign: dict[str, object]) -> None:
    result = campaign["result"]
    assert result.unjoined == 0
    rows = query_rows(
        campaign["stack"],
        "SELECT arm_iw, server_snd_cwnd_at_accept, server_latency_us, cwnd_mismatch FROM trials WHERE campaign_id = :c",
        c=result.campaign_id,
    )
    assert rows and all(row.server_latency_us is not None for row in rows)
    assert all(row.server_snd_cwnd_at_accept == row.arm_iw and row.cwnd_mismatch is False for row in rows)


def test_path_estimates_match_the_configured_paths(campaign: dict[str, object]) -> None:
    result = campaign["result"]
    for name, (_region, rtt_ms, rate_bps) in PATHS.items():
        (estimate,) = query_rows(
            campaign["stack"],
            "SELECT min_rtt_us, bottleneck_bps, bdp_bytes FROM path_estimates WHERE probe_id = :p",
            p=result.probe_ids[name],
        )
        assert estimate.min_rtt_us / 1000 == pytest.approx(rtt_ms, rel=0.05), name
        assert estimate.bottleneck_bps == pytest.approx(rate_bps, rel=0.05), name
        assert estimate.bdp_bytes == pytest.approx(rate_bps / 8 * rtt_ms / 1000, rel=0.10), name


@pytest.mark.parametrize("name", list(PATHS))
def test_iw10_gains_one_rtt_where_the_model_says_so(campaign: dict[str, object], name: str) -> None:
    result = campaign["result"]
    _region, rtt_ms, rate_bps = PATHS[name]
    rows = query_rows(
        campaign["stack"],
        "SELECT arm_iw, object_size, server_latency_us, total_us FROM trials WHERE campaign_id = :c AND probe_id = :p",
        c=result.campaign_id,
        p=result.probe_ids[name],
    )
    for size in PLAN.sizes:
        model_gain_ms = 1000 * (
            predict(size, 3, rtt_ms / 1000, rate_bps).server_latency_s
            - predict(size, 10, rtt_ms / 1000, rate_bps).server_latency_s
        )
        for column in ("server_latency_us", "total_us"):  # the origin's view and the probe's
            by_arm = {
                iw: statistics.median(getattr(r, column) / 1000 for r in rows if r.arm_iw == iw and r.object_size == size)
                for iw in PLAN.arms
            }
            gain_ms = by_arm[3] - by_arm[10]
            if model_gain_ms > rtt_ms / 2:  # 9 KB: two rounds at IW3, one at IW10
                assert gain_ms == pytest.approx(rtt_ms, rel=0.10), (size, column, by_arm)
            else:  # 3 KB fits in IW3: no difference
                assert abs(gain_ms) < 0.1 * rtt_ms, (size, column, by_arm)


def test_the_traced_rounds_have_both_sides_traces_and_the_others_none(campaign: dict[str, object]) -> None:
    """Each probe traces the rounds its hash picks (every trial of them, both ends of the
    connection), nothing else; the receiver's first flight is the trial's client-side IW."""
    result = campaign["result"]
    rows = query_rows(
        campaign["stack"],
        "SELECT t.trial_id, t.probe_id, t.round, t.arm_iw, t.object_size, t.client_iw_segments, "
        "r.first_flight_segments AS receiver_segments, r.body AS receiver_body, "
        "s.body AS sender_body, s.packets AS sender_packets "
        "FROM trials AS t LEFT JOIN trial_traces AS r ON r.trial_id = t.trial_id AND r.side = 'receiver' "
        "LEFT JOIN trial_traces AS s ON s.trial_id = t.trial_id AND s.side = 'sender' WHERE t.campaign_id = :c",
        c=result.campaign_id,
    )
    traced = [row for row in rows if traced_round(str(row.probe_id), result.campaign_id, row.round, PLAN.trace_share)]
    assert 0 < len(traced) < len(rows)  # 8 rounds of two probes: some of each, or the hash is broken
    assert all(row.receiver_body is None and row.sender_body is None for row in rows if row not in traced)
    for row in traced:
        assert row.receiver_body is not None and row.sender_body is not None, row
        assert row.receiver_segments == row.client_iw_segments == min(row.arm_iw, -(-row.object_size // 1448)), row
        receiver = json.loads(zlib.decompress(row.receiver_body))
        sender = json.loads(zlib.decompress(row.sender_body))
        assert wire.check_trace(receiver) > 0 and wire.check_trace(sender) == row.sender_packets
        for trace in (receiver, sender):  # the server's payload: the object and its response head
            served = sum(length for length, out in zip(trace["length"], trace["outgoing"], strict=True) if not out)
            assert row.object_size < served < row.object_size + 300, (row.trial_id, trace["length"])
        # the origin's view starts at its answer: its first packet is the answer's first byte
        first_sent = next(i for i, out in enumerate(sender["outgoing"]) if not out)
        assert sender["seq"][first_sent] == 1 and sender["first_flight"] is None
