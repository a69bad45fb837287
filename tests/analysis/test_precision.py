"""Time-boxed, adaptive campaigns (campaigns/precision.py): who has measured enough (real PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from pydantic import ValidationError
from sqlalchemy.orm import Session

from iwscope.analysis import rebuild_rollups
from iwscope.campaigns.models import Campaign, CampaignProbeDone
from iwscope.campaigns.precision import precision_by_probe, update_done
from iwscope.campaigns.schemas import CampaignIn
from iwscope.probes.services import schedule_for

from .datasets import DAY, add_path, add_probe, add_trial, new_campaign_id

NOW = DAY + dt.timedelta(minutes=1)


@pytest.mark.unit
def test_duration_sets_the_time_box_and_adaptive_needs_one() -> None:
    base = {"name": "c", "origin_ids": [str(uuid.uuid4())], "arms": [3, 10], "sizes": [9000], "starts_at": "2026-11-24T00:00:00Z"}
    boxed = CampaignIn.model_validate({**base, "duration_s": 240, "target_ci_ms": 15})
    assert boxed.ends_at == boxed.starts_at + dt.timedelta(seconds=240) and boxed.target_ci_ms == 15
    with pytest.raises(ValidationError, match="not both"):
        CampaignIn.model_validate({**base, "duration_s": 240, "ends_at": "2026-11-25T00:00:00Z"})
    with pytest.raises(ValidationError, match="time box"):
        CampaignIn.model_validate({**base, "target_ci_ms": 15})
    for bad in ({"duration_s": 0}, {"duration_s": -5}, {"duration_s": 31 * 86_400}, {"target_ci_ms": 0, "duration_s": 60}):
        with pytest.raises(ValidationError):
            CampaignIn.model_validate({**base, **bad})


def test_a_probe_stops_once_its_buckets_are_precise(db_session: Session) -> None:
    """Probe A: 30 pairs, 100 +- 2 ms better, on a 150 ms path -> its buckets are precise.  Probe B: 6 pairs on a
    600 ms path -> "n too small", keeps measuring.  A fresh probe C of the campaign's region gets it too."""
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    db_session.add(
        Campaign(
            id=campaign_id,
            name="adaptive",
            origin_ids=[origin],
            probe_regions=None,
            arms=[3, 10],
            sizes=[9000],
            size_dist=None,
            sizes_per_round=1,
            repetitions=1000,
            interval_s=0.0,
            starts_at=DAY,
            ends_at=DAY + dt.timedelta(hours=1),
            calibrate=False,
            target_ci_ms=15.0,
        )
    )
    precise, noisy = add_probe(db_session, "europe"), add_probe(db_session, "africa")
    add_path(db_session, precise, origin, 150, 2_000_000, 0.0)
    add_path(db_session, noisy, origin, 600, 500_000, 0.0)
    for i in range(30):
        jitter = (-2.0, 0.0, 2.0)[i % 3]
        add_trial(db_session, campaign_id=campaign_id, probe_id=precise, origin_id=origin, iw=3, server_ms=400 + jitter)
        add_trial(db_session, campaign_id=campaign_id, probe_id=precise, origin_id=origin, iw=10, server_ms=300 - jitter)
    for i in range(6):
        add_trial(db_session, campaign_id=campaign_id, probe_id=noisy, origin_id=origin, iw=3, server_ms=2000 + 100 * i)
        add_trial(db_session, campaign_id=campaign_id, probe_id=noisy, origin_id=origin, iw=10, server_ms=1500)
    db_session.flush()
    rebuild_rollups(db_session)
    campaign = db_session.get(Campaign, campaign_id)
    assert campaign is not None
    widest = {p.probe_id: p.widest_half_ci_ms for p in precision_by_probe(db_session, campaign)}
    assert widest[noisy] is None  # its buckets have no interval yet
    assert widest[precise] is not None and widest[precise] <= 15.0

    assert update_done(db_session, now=NOW) == {campaign_id: 1}
    assert update_done(db_session, now=NOW) == {}  # idempotent
    done = db_session.get(CampaignProbeDone, (campaign_id, precise))
    assert done is not None and done.widest_half_ci_ms == pytest.approx(widest[precise])

    def scheduled(probe_id: uuid.UUID, region: str) -> list[int]:
        probe = type("P", (), {"id": probe_id, "region": region})()
        return [entry.campaign_id for entry in schedule_for(db_session, probe, 60.0, now=NOW).campaigns]

    assert campaign_id not in scheduled(precise, "europe")
    assert campaign_id in scheduled(noisy, "africa")
    # after the time box nobody gets it, and nothing more is marked
    late = DAY + dt.timedelta(hours=2)
    assert campaign_id not in [
        entry.campaign_id
        for entry in schedule_for(db_session, type("P", (), {"id": noisy, "region": "africa"})(), 60.0, now=late).campaigns
    ]
    assert update_done(db_session, now=late) == {}
