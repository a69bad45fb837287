"""Store and read lab-twin predictions (:mod:`iwscope.predictions.models`)."""

from __future__ import annotations

import hashlib
import json
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from iwscope.predictions.models import TwinPrediction
from iwscope.predictions.schemas import TwinPredictionOut, TwinResultIn

#: Most predictions one read returns.
MAX_LISTED = 20


class Stored(NamedTuple):
    id: int
    duplicate: bool


def _canonical(result: TwinResultIn) -> tuple[dict[str, object], str]:
    body = result.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return body, digest


def store_twin_result(session: Session, result: TwinResultIn) -> Stored:
    """Store ``result`` for its campaign (which must exist: the foreign key refuses it otherwise);
    the same result stored again is a duplicate and changes nothing."""
    body, digest = _canonical(result)
    values = {
        "campaign_id": result.campaign_id,
        "baseline_iw": result.baseline_iw,
        "treatment_iw": result.treatment_iw,
        "what_if": list(result.what_if),
        "compare_arm": result.compare_arm,
        "twin_campaign_id": result.twin_campaign_id,
        "paths": len(result.paths),
        "fit_judged": result.fit_judged,
        "fit_overlapping": result.fit_overlapping,
        "body": body,
        "body_sha256": digest,
    }
    statement = insert(TwinPrediction).values(values)
    statement = statement.on_conflict_do_nothing(index_elements=["campaign_id", "body_sha256"])
    inserted = session.execute(statement.returning(TwinPrediction.id)).scalar_one_or_none()
    if inserted is not None:
        return Stored(inserted, False)
    existing = session.execute(
        select(TwinPrediction.id).where(TwinPrediction.campaign_id == result.campaign_id, TwinPrediction.body_sha256 == digest)
    ).scalar_one()
    return Stored(existing, True)


def _out(row: TwinPrediction) -> TwinPredictionOut:
    return TwinPredictionOut(
        id=row.id,
        campaign_id=row.campaign_id,
        created_at=row.created_at,
        paths=row.paths,
        fit_judged=row.fit_judged,
        fit_overlapping=row.fit_overlapping,
        result=TwinResultIn.model_validate(row.body),
    )


def read_twin_predictions(session: Session, campaign_id: int | None = None, limit: int = MAX_LISTED) -> list[TwinPredictionOut]:
    """A campaign's predictions (``None``: every campaign's), newest first."""
    query = select(TwinPrediction).order_by(TwinPrediction.created_at.desc(), TwinPrediction.id.desc()).limit(limit)
    if campaign_id is not None:
        query = query.where(TwinPrediction.campaign_id == campaign_id)
    return [_out(row) for row in session.scalars(query)]
