"""Roll-up tables of the analysis module (Alembic revisions ``0002``, ``0009``, ``0010``).

``analysis_rollups`` holds one row per campaign x probe x origin x arm x size octave x UTC day
(of ``trials.started_at``), and the same per calendar month (``grain``), with mergeable
aggregates: counts, sums and sums of squares per metric, and the server-side retransmission
counters -- the sufficient statistics of the paired estimate.  ``analysis_bucket_rollups``
holds the same aggregates plus a packed log-spaced latency histogram per metric, keyed by the
path's signature (region and RTT / bandwidth / BDP / loss bucket) instead of the path: what the
figures' histograms read.  Adding two rows' aggregates gives the aggregate of the union, so new
trials fold in without rescanning old ones.

``analysis_watermarks`` records how far ``trials.received_at`` (client side of a trial) and
``trials.joined_at`` (server side, filled later by the join task) have been folded in.

Two BRIN indexes on ``trials`` (``received_at``, ``joined_at``) let a refresh find new rows
without a full scan; they are declared here (on the collector's table) so that the models and
the migrations agree.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

from sqlalchemy import BigInteger, Date, Identity, Index, Integer, LargeBinary, Numeric, SmallInteger, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.trials.models import Trial
from iwscope.types import CreatedAt

#: Roll-up key value for trials without a campaign / origin.
NO_CAMPAIGN = 0
NO_ORIGIN = uuid.UUID(int=0)


class _RollupMeasures:
    """The mergeable aggregates both roll-up tables hold per key (adding two rows' measures gives
    the measures of the union)."""

    #: Every trial (successful or not) and the failed ones (error_kind set or no latency).
    n_trials: Mapped[int] = mapped_column(BigInteger, default=0)
    n_errors: Mapped[int] = mapped_column(BigInteger, default=0)
    size_min: Mapped[int] = mapped_column(BigInteger)
    size_max: Mapped[int] = mapped_column(BigInteger)

    #: Probe-side total time (trials.total_us) of successful trials.
    client_n: Mapped[int] = mapped_column(BigInteger, default=0)
    client_sum_us: Mapped[int] = mapped_column(BigInteger, default=0)
    client_sumsq_us2: Mapped[Decimal] = mapped_column(Numeric, default=0)

    #: Origin-side response latency (trials.server_latency_us) of joined successful trials.
    server_n: Mapped[int] = mapped_column(BigInteger, default=0)
    server_sum_us: Mapped[int] = mapped_column(BigInteger, default=0)
    server_sumsq_us2: Mapped[Decimal] = mapped_column(Numeric, default=0)

    #: Joined trials with server TCP_INFO; of those, with any retransmission; and the bytes.
    retrans_n: Mapped[int] = mapped_column(BigInteger, default=0)
    retrans_trials: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_retrans: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_sent: Mapped[int] = mapped_column(BigInteger, default=0)

    updated_at: Mapped[CreatedAt]


class _RollupHistograms:
    """Packed log-spaced latency histograms per metric (``stats.pack_histogram``): kept per
    signature only; per path, the sums are what the paired estimate needs (migration 0010)."""

    client_hist_lo: Mapped[int] = mapped_column(Integer, default=0)
    client_hist: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    server_hist_lo: Mapped[int] = mapped_column(Integer, default=0)
    server_hist: Mapped[bytes] = mapped_column(LargeBinary, default=b"")


class Rollup(_RollupMeasures, Base):
    __tablename__ = "analysis_rollups"
    __table_args__ = (
        Index(
            "ix_analysis_rollups_cells",
            "grain",
            "day",
            "arm_iw",
            postgresql_include=[
                "campaign_id",
                "probe_id",
                "origin_id",
                "size_bucket",
                "n_trials",
                "n_errors",
                "client_n",
                "client_sum_us",
                "server_n",
                "server_sum_us",
            ],
        ),
    )

    campaign_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    probe_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    origin_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    arm_iw: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    #: Octave of the object size: 2**size_bucket <= object_size < 2**(size_bucket+1).
    size_bucket: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    #: The UTC day of ``started_at`` (grain 0) or the first day of its month (grain 1).
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    #: 0 = one day, 1 = one calendar month (every trial is in one row of each grain).
    grain: Mapped[int] = mapped_column(SmallInteger, primary_key=True)


class Signature(Base):
    """One combination of the figures' path buckets (indexes into ``buckets``' lists; -1 =
    unknown, e.g. no path estimate yet)."""

    __tablename__ = "analysis_signatures"
    __table_args__ = (
        UniqueConstraint(
            "region", "rtt_bucket", "bandwidth_bucket", "bdp_bucket", "loss_bucket", name="uq_analysis_signatures_region"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, Identity(), primary_key=True)
    region: Mapped[str] = mapped_column(Text)
    rtt_bucket: Mapped[int] = mapped_column(SmallInteger)
    bandwidth_bucket: Mapped[int] = mapped_column(SmallInteger)
    bdp_bucket: Mapped[int] = mapped_column(SmallInteger)
    loss_bucket: Mapped[int] = mapped_column(SmallInteger)


class PathSignature(Base):
    """The signature a path's trials are counted under in ``analysis_bucket_rollups``: every
    per-path roll-up row of the path is in the bucket rows of this signature, exactly."""

    __tablename__ = "analysis_path_signatures"
    __table_args__ = (Index("ix_analysis_path_signatures_signature_id", "signature_id"),)

    probe_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    origin_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    signature_id: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[CreatedAt]


class BucketRollup(_RollupMeasures, _RollupHistograms, Base):
    """``analysis_rollups``' measures keyed by the path's signature instead of the path: what the
    figures' histograms and arm statistics read (rows grow with buckets x days, not paths)."""

    __tablename__ = "analysis_bucket_rollups"
    __table_args__ = (Index("ix_analysis_bucket_rollups_grain_day", "grain", "day"),)

    campaign_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    signature_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    arm_iw: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    size_bucket: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    grain: Mapped[int] = mapped_column(SmallInteger, primary_key=True)


class Watermark(Base):
    __tablename__ = "analysis_watermarks"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    #: Trials with received_at <= received_upto have their client side folded in.
    received_upto: Mapped[dt.datetime]
    #: Trials with joined_at <= joined_upto have their server side folded in.
    joined_upto: Mapped[dt.datetime]
    refreshed_at: Mapped[dt.datetime | None]
    #: Trial contributions folded in so far (client sides + server sides).
    folded_total: Mapped[int] = mapped_column(BigInteger, default=0)


# Watermark scans on the collector's (partitioned) trials table.
Index("ix_trials_received_at_brin", Trial.__table__.c.received_at, postgresql_using="brin")
Index("ix_trials_joined_at_brin", Trial.__table__.c.joined_at, postgresql_using="brin")
