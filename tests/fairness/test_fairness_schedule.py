"""Offered-load campaign fields travel from the API model through the database into the
probe's schedule, and stay valid wire format v1 (also for old probes: defaults = today)."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import jsonschema
import pytest
from pydantic import ValidationError
from sqlalchemy.orm import Session

from iwprobe import wire
from iwprobe._collector import from_dict
from iwscope.campaigns.schemas import CampaignIn
from iwscope.campaigns.services import create_campaign
from iwscope.models import Origin, Probe
from iwscope.probes.services import schedule_for

NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)


def _fleet(session: Session) -> tuple[Probe, Origin]:
    region = f"fair-{uuid.uuid4().hex[:8]}"
    probe = Probe(
        id=uuid.uuid4(), name=f"p-{region}", region=region, country=None, asn=None, labels={}, version="t", secret_hash="x"
    )
    origin = Origin(
        id=uuid.uuid4(),
        name=f"o-{region}",
        region="lab",
        host="10.0.0.1",
        arms=[{"iw": 3, "port": 8003}, {"iw": 10, "port": 8010}, {"iw": 16, "port": 8016}],
        version="t",
        secret_hash="x",
    )
    session.add_all([probe, origin])
    session.flush()
    return probe, origin


def _campaign(origin: Origin, region: str, **fields: object) -> CampaignIn:
    return CampaignIn.model_validate(
        {
            "name": "offered",
            "origin_ids": [str(origin.id)],
            "probe_regions": [region],
            "arms": [3, 10],
            "sizes": [15000, 50000],
            "starts_at": NOW.isoformat(),
            **fields,
        }
    )


def _schedule_entry(session: Session, probe: Probe, campaign_id: int) -> dict[str, object]:
    schedule = schedule_for(session, probe, 60.0, now=NOW)
    document = json.loads(schedule.model_dump_json())
    jsonschema.Draft202012Validator({**wire.load_schema(), "$ref": "#/$defs/Schedule"}).validate(document)
    (entry,) = [c for c in document["campaigns"] if c["campaign_id"] == campaign_id]
    return entry


def test_schedule_carries_arrival_rate_and_background_flow(db_session: Session) -> None:
    probe, origin = _fleet(db_session)
    row = create_campaign(
        db_session, _campaign(origin, probe.region, arrival_rate_per_s=7.5, background_bytes=600_000, background_iw=16)
    )
    entry = _schedule_entry(db_session, probe, row.id)
    assert entry["arrival_rate_per_s"] == 7.5
    assert entry["background_bytes"] == 600_000
    assert entry["background_iw"] == 16
    # The background arm is served although it is not a short-flow arm.
    assert sorted(arm["iw"] for arm in entry["targets"][0]["arms"]) == [3, 10, 16]
    parsed = from_dict(wire.CampaignSchedule, entry)
    assert (parsed.arrival_rate_per_s, parsed.background_bytes, parsed.background_iw) == (7.5, 600_000, 16)
    assert parsed.arms == [3, 10]


def test_background_iw_defaults_to_the_largest_arm(db_session: Session) -> None:
    probe, origin = _fleet(db_session)
    row = create_campaign(db_session, _campaign(origin, probe.region, background_bytes=100_000))
    entry = _schedule_entry(db_session, probe, row.id)
    assert entry["background_iw"] == 10 and entry["arrival_rate_per_s"] is None
    assert sorted(arm["iw"] for arm in entry["targets"][0]["arms"]) == [3, 10]


def test_plain_campaign_keeps_todays_schedule(db_session: Session) -> None:
    probe, origin = _fleet(db_session)
    row = create_campaign(db_session, _campaign(origin, probe.region))
    entry = _schedule_entry(db_session, probe, row.id)
    assert (entry["arrival_rate_per_s"], entry["background_bytes"], entry["background_iw"]) == (None, None, None)
    # An old collector's answer (no offered-load keys) still parses, with today's behaviour.
    old = {key: value for key, value in entry.items() if key not in ("arrival_rate_per_s", "background_bytes", "background_iw")}
    parsed = from_dict(wire.CampaignSchedule, old)
    assert parsed.arrival_rate_per_s is None and parsed.background_bytes is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"arrival_rate_per_s": 0}, "greater than 0"),
        ({"arrival_rate_per_s": -3}, "greater than 0"),
        ({"background_iw": 10}, "background_iw needs background_bytes"),
        ({"background_bytes": 0}, "greater than or equal to 1"),
        ({"background_bytes": wire.MAX_OBJECT_BYTES + 1}, "less than or equal to"),
    ],
)
@pytest.mark.unit
def test_bad_offered_load_fields_are_refused_clearly(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CampaignIn.model_validate(
            {"name": "x", "origin_ids": [str(uuid.uuid4())], "arms": [3], "sizes": [1], "starts_at": NOW.isoformat(), **fields}
        )


@pytest.mark.unit
def test_flow_role_of_a_url() -> None:
    url = "http://10.0.0.1:8010/obj/50000"
    assert wire.flow_role(url) == "short"
    assert wire.flow_role(url + wire.FLOW_FRAGMENT_BACKGROUND) == "background"
    assert wire.flow_role(url + wire.FLOW_FRAGMENT_BACKGROUND_ALONE) == "background-alone"
    assert wire.flow_role(url + wire.FLOW_FRAGMENT_PREFIX + "nonsense") == "short"


def _alone(
    total_us: int | None, min_rtt_us: int | None, connect_us: int | None = 100_000, error: str | None = None
) -> wire.TrialRecord:
    return wire.TrialRecord(
        trial_id=wire.new_id(),
        probe_id=wire.new_id(),
        campaign_id=1,
        origin_id=None,
        round=0,
        arm_iw=3,
        object_size=1,
        url="http://h/obj/1" + wire.FLOW_FRAGMENT_BACKGROUND_ALONE,
        started_at=wire.utc_timestamp(),
        dns_us=0,
        connect_us=connect_us,
        ttfb_us=None,
        total_us=total_us,
        bytes_received=1,
        http_status=200,
        error_kind=error,
        error_detail=None,
        syn_retrans=0,
        tcp_info={} if min_rtt_us is None else {"min_rtt": min_rtt_us},
    )


@pytest.mark.unit
def test_background_warmup_is_ten_rtts_at_most_half_the_uncontended_run() -> None:
    from iwprobe._agent import background_warmup_s

    assert background_warmup_s(_alone(6_000_000, 300_000)) == pytest.approx(3.0)
    assert background_warmup_s(_alone(4_000_000, 300_000)) == pytest.approx(2.0)  # capped at half the run
    assert background_warmup_s(_alone(6_000_000, None, connect_us=100_000)) == pytest.approx(1.0)
    assert background_warmup_s(_alone(None, 300_000, error="timeout")) == 0.0
