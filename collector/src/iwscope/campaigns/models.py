"""Campaigns: which origins, arms and sizes the probes measure, when and how often."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import BigInteger, CheckConstraint, Double, Identity, Integer, Text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.types import CreatedAt, Int, Str
from iwscope.wiretypes import FAMILY_KNOWN_SQL


class Campaign(Base):
    __tablename__ = "campaigns"
    __table_args__ = (
        # An ordinary campaign has exactly one of sizes and size_dist, a census campaign neither.
        CheckConstraint("(census_urls IS NULL AND (sizes IS NULL) <> (size_dist IS NULL)) "
                        "OR (census_urls IS NOT NULL AND sizes IS NULL AND size_dist IS NULL)",
                        name="sizes_xor_size_dist"),
        CheckConstraint("ends_at IS NULL OR ends_at > starts_at", name="window"),
        CheckConstraint("arrival_rate_per_s IS NULL OR arrival_rate_per_s > 0", name="arrival_rate_positive"),
        CheckConstraint(FAMILY_KNOWN_SQL, name="family_known"),
        CheckConstraint("background_iw IS NULL OR background_bytes IS NOT NULL", name="background_iw_needs_bytes"),
        CheckConstraint("target_ci_ms IS NULL OR target_ci_ms > 0", name="target_ci_positive"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[Str]
    origin_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    #: Regions whose probes take part; ``NULL`` means every probe.
    probe_regions: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    arms: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    #: Fixed object sizes in bytes (bigint: objects may exceed 2 GiB), or ``NULL`` with ``size_dist``.
    sizes: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    size_dist: Mapped[Str | None]
    sizes_per_round: Mapped[Int]
    repetitions: Mapped[Int]
    interval_s: Mapped[float] = mapped_column(Double)
    starts_at: Mapped[dt.datetime]
    ends_at: Mapped[dt.datetime | None]
    calibrate: Mapped[bool]
    created_at: Mapped[CreatedAt]
    #: Offered-load mode (``0003_offered_load``): mean Poisson arrival rate of trials per
    #: second; ``NULL`` runs trials one after another.
    arrival_rate_per_s: Mapped[float | None] = mapped_column(Double)
    #: Fairness mode: bytes of the long-lived flow competing with the round's trials.
    background_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: IW arm of the background flow; ``NULL``: the campaign's largest arm.
    background_iw: Mapped[int | None] = mapped_column(Integer)
    #: Adaptive campaigns (``0004_adaptive_campaigns``): a probe stops once every RTT and
    #: bandwidth bucket its paths feed has a 95 % interval no wider than +- this (ms) for each
    #: arm against the smallest; ``NULL`` runs ``repetitions`` rounds (or until ``ends_at``).
    target_ci_ms: Mapped[float | None] = mapped_column(Double)
    #: Cost experiments (``0006_cost_flows``): the arms by label (``10``, ``10p``, ``learned``);
    #: ``arms`` then holds their IWs.  NULL: the plain arms ``arms``.
    arm_labels: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    #: Share of the short flows per arm (same order); NULL: paired (every arm, every size).
    arm_shares: Mapped[list[float] | None] = mapped_column(ARRAY(Double))
    #: The interactive flow: a UDP packet every this many microseconds; NULL: none.
    interactive_interval_us: Mapped[int | None] = mapped_column(Integer)
    interactive_packet_bytes: Mapped[int | None] = mapped_column(Integer)
    #: Page loads: parallel connections per short flow; NULL: one connection.
    page_connections: Mapped[int | None] = mapped_column(Integer)
    #: The IP version to measure over (``ipv4``/``ipv6``, wire v4); NULL: whatever the origin's host is.
    family: Mapped[str | None] = mapped_column(Text)
    #: A census campaign (``0012_client_iw_and_census``, wire v5): the URLs of servers iwscope
    #: does not run whose IW each round measures; ``origin_ids`` and ``arms`` are then empty.
    #: NULL: an ordinary campaign.
    census_urls: Mapped[list[str] | None] = mapped_column(ARRAY(Text))


class CampaignProbeDone(Base):
    """A probe that reached its adaptive campaign's target precision (it gets no more rounds)."""

    __tablename__ = "campaign_probe_done"

    campaign_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    probe_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    done_at: Mapped[CreatedAt]
    #: The widest half interval (ms) among the buckets the probe fed when it was marked done.
    widest_half_ci_ms: Mapped[float] = mapped_column(Double)
