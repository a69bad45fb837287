"""Lab-twin predictions stored beside the campaign they predict for (``iwscope lab twin``).

A twin's result is a prediction, never a measurement: it lives in its own table, not among the
trials or roll-ups, so no figure or export of measurements can take it for one, and every read
of it says ``prediction``.  The result is kept whole as ``body`` (JSONB, checked by
:class:`iwscope.predictions.schemas.TwinResultIn` before it is stored) -- it is read whole, to
draw a campaign's predictions or to answer the API -- with the few numbers a listing shows as
typed columns beside it.  ``body_sha256`` (of the canonical JSON) makes a repeated upload of
the same result a duplicate that changes nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Identity, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.types import CreatedAt, Int


class TwinPrediction(Base):
    """One lab twin's result for one measured campaign."""

    __tablename__ = "twin_predictions"
    __table_args__ = (UniqueConstraint("campaign_id", "body_sha256"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    #: The measured campaign the twins were fitted to.
    campaign_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("campaigns.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[CreatedAt]
    baseline_iw: Mapped[Int]
    #: The arm of the fit check (the twins ran it and the campaign measured it).
    treatment_iw: Mapped[Int]
    #: Arms predicted by label (``32``, ``32p``, ``learned``; the twins ran them, the campaign may not have).
    what_if: Mapped[list[str]] = mapped_column(ARRAY(Text))
    #: An arm both measured and predicted (the held-out check); NULL: none.
    compare_arm: Mapped[str | None] = mapped_column(Text)
    #: The twins' own campaign, in the twins' database (not this one's).
    twin_campaign_id: Mapped[int | None] = mapped_column(BigInteger)
    #: Paths with a twin; of them, those whose fit check could be judged and those that overlap.
    paths: Mapped[Int]
    fit_judged: Mapped[Int]
    fit_overlapping: Mapped[Int]
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    body_sha256: Mapped[str] = mapped_column(Text)
