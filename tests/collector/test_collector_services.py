"""Service functions against the session database inside a rolled-back transaction (``db_session``)."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from iwscope.auth.models import ApiToken
from iwscope.auth.services import api_token_valid, create_api_token, hash_secret
from iwscope.campaigns.models import Campaign
from iwscope.config import Settings
from iwscope.origins.models import Origin
from iwscope.probes.schemas import EnrollRequestIn
from iwscope.probes.services import enroll_probe, schedule_for

SETTINGS = Settings(IWSCOPE_ENV="development", IWSCOPE_ADMIN_TOKEN=None, IWSCOPE_ENROLL_TOKEN=None)


def test_tokens_are_stored_hashed_and_checked_by_kind(db_session: Session) -> None:
    token = create_api_token(db_session, "origin", label="unit")
    stored = db_session.scalars(select(ApiToken).where(ApiToken.label == "unit")).one()
    assert stored.token_hash == hash_secret(token) and token not in stored.token_hash
    assert api_token_valid(db_session, SETTINGS, "origin", token)
    assert not api_token_valid(db_session, SETTINGS, "admin", token)
    stored.revoked_at = dt.datetime.now(dt.UTC)
    db_session.flush()
    assert not api_token_valid(db_session, SETTINGS, "origin", token)


def test_db_session_rolls_back(db_session: Session) -> None:
    """Nothing from the previous test is visible (its transaction was rolled back)."""
    assert db_session.scalar(select(func.count()).select_from(ApiToken).where(ApiToken.label == "unit")) == 0


def test_schedule_window_edges(db_session: Session) -> None:
    probe, _ = enroll_probe(db_session, EnrollRequestIn(name="edge", region="edge-region"))
    origin = Origin(id=uuid.uuid4(), name="o", region="r", host="h", arms=[{"iw": 10, "port": 8010}], version="", secret_hash="x")
    db_session.add(origin)
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    db_session.add(
        Campaign(
            name="edge",
            origin_ids=[origin.id],
            probe_regions=["edge-region"],
            arms=[10],
            sizes=[1000],
            size_dist=None,
            sizes_per_round=1,
            repetitions=1,
            interval_s=0.0,
            starts_at=start,
            ends_at=start + dt.timedelta(hours=1),
            calibrate=False,
        )
    )
    db_session.flush()

    def names(now: dt.datetime) -> list[str]:
        """This test's campaign in the schedule (other tests' open campaigns for every region aside)."""
        return [
            entry.name for entry in schedule_for(db_session, probe, poll_after_s=60, now=now).campaigns if entry.name == "edge"
        ]

    assert names(start - dt.timedelta(seconds=61)) == []  # starts after the next poll
    assert names(start - dt.timedelta(seconds=59)) == ["edge"]  # starts before the next poll
    assert names(start + dt.timedelta(minutes=59)) == ["edge"]
    assert names(start + dt.timedelta(hours=1)) == []  # ends_at is exclusive
