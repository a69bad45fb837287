"""``fairness()`` on hand-made rows returns hand-computed values (real PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import random
import uuid

import pytest
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.analysis import FairnessPoint, Filters, fairness
from iwscope.models import Campaign, PathEstimate, Probe, Trial, TrialId

UTC = dt.UTC
DAY = dt.datetime(2026, 2, 3, 10, 0, tzinfo=UTC)


def _campaign(session: Session, **fields: object) -> int:
    campaign_id = random.randint(10**9, 2 * 10**9)
    session.add(
        Campaign(
            id=campaign_id,
            name=f"fair-{campaign_id}",
            origin_ids=[],
            probe_regions=None,
            arms=[10, 3],
            sizes=[15000, 50000],
            size_dist=None,
            sizes_per_round=1,
            repetitions=1,
            interval_s=0.0,
            starts_at=DAY,
            ends_at=None,
            calibrate=True,
            **fields,
        )
    )
    session.flush()
    return campaign_id


def _trial(
    session: Session,
    campaign_id: int,
    probe_id: uuid.UUID,
    origin_id: uuid.UUID,
    iw: int,
    size: int,
    total_ms: float | None,
    retrans: int | None,
    bytes_retrans: int | None,
    bytes_sent: int | None,
    fragment: str = "",
) -> None:
    trial_id = uuid.uuid4()
    error = "timeout" if total_ms is None else None
    session.add(TrialId(trial_id=trial_id, started_at=DAY))
    session.add(
        Trial(
            trial_id=trial_id,
            started_at=DAY,
            probe_id=probe_id,
            campaign_id=campaign_id,
            origin_id=origin_id,
            round=0,
            arm_iw=iw,
            object_size=size,
            url=f"http://10.0.0.1:80{iw:02d}/obj/{size}{fragment}",
            dns_us=0,
            connect_us=100_000,
            ttfb_us=None,
            total_us=None if total_ms is None else int(total_ms * 1000),
            bytes_received=0 if error else size,
            http_status=None if error else 200,
            error_kind=error,
            error_detail=None,
            syn_retrans=0,
            tcp_info={},
            received_at=DAY,
            role=wire.flow_role(fragment),
            server_total_retrans=retrans,
            server_bytes_retrans=bytes_retrans,
            server_bytes_sent=bytes_sent,
            joined_at=DAY if retrans is not None else None,
        )
    )


@pytest.fixture
def data(db_session: Session) -> dict[str, object]:
    region = f"fair-{uuid.uuid4().hex[:6]}"
    probe_id, origin_id = uuid.uuid4(), uuid.uuid4()
    db_session.add(
        Probe(id=probe_id, name=region, region=region, country=None, asn=None, labels={}, version="t", secret_hash="x")
    )
    db_session.flush()
    db_session.add(
        PathEstimate(
            probe_id=probe_id,
            origin_id=origin_id,
            min_rtt_us=100_000,
            bottleneck_bps=4_000_000,
            bdp_bytes=50_000,
            loss_rate=0.0,
            sample_count=1,
            updated_at=DAY,
        )
    )
    fair = _campaign(db_session, arrival_rate_per_s=10.0, background_bytes=1_000_000, background_iw=3)
    plain = _campaign(db_session)
    short = [
        (3, 15000, 300, 0, 0, 15500),
        (3, 50000, 500, 2, 2896, 52896),
        (3, 15000, None, None, None, None),
        (10, 15000, 100, 0, 0, 15500),
        (10, 50000, 300, 1, 1448, 51448),
    ]
    for iw, size, total_ms, retrans, bytes_retrans, sent in short:
        _trial(db_session, fair, probe_id, origin_id, iw, size, total_ms, retrans, bytes_retrans, sent)
    _trial(db_session, fair, probe_id, origin_id, 3, 1_000_000, 4000, 5, 7240, 1_007_240, wire.FLOW_FRAGMENT_BACKGROUND)
    _trial(db_session, fair, probe_id, origin_id, 3, 1_000_000, 2500, 0, 0, 1_000_000, wire.FLOW_FRAGMENT_BACKGROUND_ALONE)
    _trial(db_session, plain, probe_id, origin_id, 3, 15000, 300, 0, 0, 15500)
    db_session.flush()
    return {"fair": fair, "plain": plain, "region": region}


def _by_key(points: list[FairnessPoint]) -> dict[tuple[str, int], FairnessPoint]:
    return {(point.flow, point.iw): point for point in points}


def test_fairness_points_are_the_hand_computed_values(db_session: Session, data: dict[str, object]) -> None:
    points = _by_key(fairness(db_session, Filters(campaign_ids=(data["fair"], data["plain"]))))  # type: ignore[arg-type]
    assert sorted(points) == [("background", 3), ("background-alone", 3), ("short", 3), ("short", 10)]
    iw3 = points[("short", 3)]
    assert (iw3.n, iw3.errors, iw3.mix, iw3.arrival_rate_per_s) == (3, 1, "3+10", 10.0)
    assert iw3.mean_bytes == pytest.approx(32_500)
    assert iw3.throughput_bps == pytest.approx((400_000 + 800_000) / 2)
    assert (iw3.fct_mean_ms, iw3.fct_p50_ms, iw3.fct_p90_ms) == pytest.approx((400.0, 400.0, 480.0))
    assert iw3.retrans_flow_share == pytest.approx(0.5)  # the failed, unjoined trial does not count
    assert (iw3.retrans_flows, iw3.joined_flows) == (1, 2)
    assert iw3.retrans_flow_share_ci == pytest.approx((0.0945, 0.9055), abs=1e-4)  # Wilson, 1 of 2
    assert iw3.fct_p50_ci_ms is None  # 2 completed flows: no 95 % order-statistic interval
    assert iw3.bytes_retrans_share == pytest.approx(2896 / (15500 + 52896))
    # offered load = 10/s x 32,500 B (mean of the successful short flows) x 8 / 4 Mbit/s
    assert iw3.offered_load == pytest.approx(0.65)
    iw10 = points[("short", 10)]
    assert iw10.throughput_bps == pytest.approx((1_200_000 + 50000 * 8 / 0.3) / 2)
    assert (iw10.fct_mean_ms, iw10.retrans_flow_share) == pytest.approx((200.0, 0.5))
    background, alone = points[("background", 3)], points[("background-alone", 3)]
    assert (background.throughput_bps, alone.throughput_bps) == pytest.approx((2_000_000, 3_200_000))
    assert (background.retrans_flow_share, alone.retrans_flow_share) == (1.0, 0.0)
    assert background.bytes_retrans_share == pytest.approx(7240 / 1_007_240)
    assert background.fct_mean_ms == pytest.approx(4000.0)


def test_fairness_filters_by_region_and_ignores_size_filters(db_session: Session, data: dict[str, object]) -> None:
    fair = data["fair"]
    assert fairness(db_session, Filters(campaign_ids=(fair,), regions=("nowhere",))) == []  # type: ignore[arg-type]
    sized = fairness(
        db_session,
        Filters(
            campaign_ids=(fair,),
            regions=(data["region"],),  # type: ignore[arg-type]
            size_min=1,
            size_max=20_000,
        ),
    )
    assert {(point.flow, point.iw) for point in sized} == {
        ("background", 3),
        ("background-alone", 3),
        ("short", 3),
        ("short", 10),
    }


def test_plain_campaigns_have_no_fairness_points(db_session: Session, data: dict[str, object]) -> None:
    assert fairness(db_session, Filters(campaign_ids=(data["plain"],))) == []  # type: ignore[arg-type]
