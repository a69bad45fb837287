"""Campaigns: which origins, arms and sizes the probes measure, when and how often; or, for a
census campaign, which servers of others to infer the IW of; or, for a passive campaign (wire v6),
which of the operators' servers split their real users into IW arms, in what shares, until when."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Double, Identity, Integer, Text, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.types import CreatedAt, Int, Str
from iwscope.wiretypes import FAMILY_KNOWN_SQL

#: The columns only a passive campaign has (``0013_passive``, wire v6): all NULL on every other
#: campaign, all set (``passive_ports`` may stay NULL) on a passive one.  Public exports of
#: ``campaigns`` leave them out (``iwscope.exports.columnar``).
PASSIVE_COLUMNS = (
    "server_ids",
    "passive_arms",
    "passive_ports",
    "prefix_v4",
    "prefix_v6",
    "assignment_seed",
    "sample_share",
    "flush_interval_s",
    "phase",
)
#: An ordinary campaign has exactly one of sizes and size_dist; census and passive campaigns neither.
SIZES_CHECK_SQL = (
    "(census_urls IS NULL AND server_ids IS NULL AND (sizes IS NULL) <> (size_dist IS NULL)) "
    "OR ((census_urls IS NOT NULL OR server_ids IS NOT NULL) AND sizes IS NULL AND size_dist IS NULL)"
)
#: Either no passive column is set, or the passive campaign is complete, time-boxed and in range
#: (``IS NOT NULL`` spelled out: a check passes on NULL).
PASSIVE_CHECK_SQL = (
    "(server_ids IS NULL AND passive_arms IS NULL AND passive_ports IS NULL AND prefix_v4 IS NULL "
    "AND prefix_v6 IS NULL AND assignment_seed IS NULL AND sample_share IS NULL AND flush_interval_s IS NULL "
    "AND phase IS NULL) OR (server_ids IS NOT NULL AND cardinality(server_ids) > 0 AND passive_arms IS NOT NULL "
    "AND census_urls IS NULL AND ends_at IS NOT NULL "
    "AND prefix_v4 IS NOT NULL AND prefix_v4 BETWEEN 16 AND 24 AND prefix_v6 IS NOT NULL AND prefix_v6 BETWEEN 32 AND 64 "
    "AND assignment_seed IS NOT NULL AND assignment_seed BETWEEN 0 AND 4294967295 "
    "AND sample_share IS NOT NULL AND sample_share BETWEEN 0 AND 1 "
    "AND flush_interval_s IS NOT NULL AND flush_interval_s BETWEEN 1 AND 3600 AND phase IS NOT NULL AND phase >= 0)"
)


class Campaign(Base):
    __tablename__ = "campaigns"
    __table_args__ = (
        CheckConstraint(SIZES_CHECK_SQL, name="sizes_xor_size_dist"),
        CheckConstraint(PASSIVE_CHECK_SQL, name="passive_complete"),
        CheckConstraint("ends_at IS NULL OR ends_at > starts_at", name="window"),
        CheckConstraint("arrival_rate_per_s IS NULL OR arrival_rate_per_s > 0", name="arrival_rate_positive"),
        CheckConstraint(FAMILY_KNOWN_SQL, name="family_known"),
        CheckConstraint("background_iw IS NULL OR background_bytes IS NOT NULL", name="background_iw_needs_bytes"),
        CheckConstraint("target_ci_ms IS NULL OR target_ci_ms > 0", name="target_ci_positive"),
        CheckConstraint("trace_share >= 0 AND trace_share <= 1", name="trace_share_range"),
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
    #: A passive campaign (``0013_passive``, wire v6): real users of these servers (``iwprobe
    #: tap``) are split into arms by a keyed hash of their prefix; ``origin_ids`` and ``arms``
    #: are then empty, ``ends_at`` is set.  NULL: not a passive campaign (and every column below
    #: is NULL too, check ``passive_complete``).
    server_ids: Mapped[list[uuid.UUID] | None] = mapped_column(ARRAY(UUID(as_uuid=True)))
    #: ``[{"arm": "default" | "<iw>", "share_bp": n}, ...]`` (wire ``PassiveArm``), shares summing to
    #: 10,000.  ``None`` is SQL NULL (not JSON ``null``): the ``passive_complete`` check needs it.
    passive_arms: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    #: The ports whose connections are split; NULL: each server's enrolled ports.
    passive_ports: Mapped[list[int] | None] = mapped_column(ARRAY(Integer))
    #: Prefix lengths hashed (one user stays in one arm): IPv4 /16../24, IPv6 /32../64.
    prefix_v4: Mapped[int | None] = mapped_column(Integer)
    prefix_v6: Mapped[int | None] = mapped_column(Integer)
    #: Seed of the assignment hash (0..2^32-1): the same seed, the same assignment.
    assignment_seed: Mapped[int | None] = mapped_column(BigInteger)
    #: Share of connections uploaded as raw records (``passive_connections``).
    sample_share: Mapped[float | None] = mapped_column(Double)
    #: Seconds between the servers' uploads of aggregates.
    flush_interval_s: Mapped[int | None] = mapped_column(Integer)
    #: Increases with every change of ``passive_arms`` (a share sweep); records carry it.
    phase: Mapped[int | None] = mapped_column(Integer)
    #: Trial traces (``0014_trial_traces``, wire v7): the share of rounds whose trials the probes
    #: capture and upload as traces (``iwscope.traces``), every trial of a chosen round so its
    #: twins are traced together.  0: none (every campaign made before); 1: every round.
    trace_share: Mapped[float] = mapped_column(Double, server_default=text("0"))


class CampaignProbeDone(Base):
    """A probe that reached its adaptive campaign's target precision (it gets no more rounds)."""

    __tablename__ = "campaign_probe_done"

    campaign_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    probe_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    done_at: Mapped[CreatedAt]
    #: The widest half interval (ms) among the buckets the probe fed when it was marked done.
    widest_half_ci_ms: Mapped[float] = mapped_column(Double)
