"""Passive, real-user measurement (wire v6): what ``iwprobe tap`` agents upload.

``passive_aggregates`` holds the mergeable sums (one row per uploaded
:class:`iwprobe.wire.PassiveAggregate`; a key -- campaign x phase x hour x arm x family x port
kind x region x cluster x buckets x size octave x bias -- may arrive in several rows, one per
upload interval, and analyses add them up), ``passive_connections`` the sampled raw connections
(:class:`iwprobe.wire.PassiveConnection`).  Both are idempotent by the record's own UUID.

Nothing here names a client by address: a connection carries only ``client_prefix`` (the
server's keyed hash of its /24 or /48), ``cluster``, ``region`` and ``country``.

The latency histogram is kept as two parallel arrays (``latency_bins``, ``latency_counts``)
rather than JSON, so an analysis merges any set of rows in SQL with one
``unnest(latency_bins, latency_counts)`` and a ``GROUP BY`` on the bin, without parsing JSON.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Boolean, CheckConstraint, Index, Integer, SmallInteger
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from iwprobe import wire
from iwscope.db import Base
from iwscope.types import BigInt, CreatedAt, Int, Json, Str, UuidCol, UuidPk
from iwscope.wiretypes import FAMILY_KNOWN_SQL

#: The ``port_kind`` check (``wire.PASSIVE_PORT_KINDS``).
PORT_KIND_KNOWN_SQL = "port_kind IN (" + ", ".join(repr(kind) for kind in wire.PASSIVE_PORT_KINDS) + ")"
#: Final ``TCP_INFO`` fields of a sampled connection kept as typed ``tcpi_*`` columns (the ones
#: analyses filter and sum on); every field stays in ``tcp_info`` too.
CONNECTION_TCPI_COLUMNS = (
    "min_rtt",
    "rtt",
    "delivery_rate",
    "bytes_acked",
    "data_segs_out",
    "total_retrans",
    "bytes_retrans",
    "snd_cwnd",
)


class PassiveAggregate(Base):
    """Mergeable sums over the connections of one key that closed in one hour (one upload's share)."""

    __tablename__ = "passive_aggregates"
    __table_args__ = (
        Index("ix_passive_aggregates_hour_brin", "hour", postgresql_using="brin"),
        Index("ix_passive_aggregates_campaign_id_hour", "campaign_id", "hour"),
        CheckConstraint(FAMILY_KNOWN_SQL, name="family_known"),
        CheckConstraint(PORT_KIND_KNOWN_SQL, name="port_kind_known"),
        CheckConstraint("cardinality(latency_bins) = cardinality(latency_counts)", name="hist_pairs"),
    )

    aggregate_id: Mapped[UuidPk]
    server_id: Mapped[UuidCol]
    campaign_id: Mapped[BigInt]
    phase: Mapped[Int]
    #: Start of the UTC hour the connections closed in.
    hour: Mapped[dt.datetime]
    #: ``default`` or the IW (as text) of the arm the client prefixes were assigned to.
    arm: Mapped[Str]
    #: The IW the arm gave; NULL: unknown (the default arm when the server's routes do not say).
    arm_iw: Mapped[Int | None]
    #: The treated arms' total share when these connections were assigned (basis points).
    treated_share_bp: Mapped[int] = mapped_column(SmallInteger)
    family: Mapped[Str]
    port_kind: Mapped[Str]
    #: The clients' region (``""``: unknown).
    region: Mapped[Str]
    #: Cluster of client prefixes (the unit intervals resample).
    cluster: Mapped[int] = mapped_column(SmallInteger)
    rtt_bucket: Mapped[int] = mapped_column(SmallInteger)
    bandwidth_bucket: Mapped[int] = mapped_column(SmallInteger)
    bdp_bucket: Mapped[int] = mapped_column(SmallInteger)
    size_octave: Mapped[int] = mapped_column(SmallInteger)
    biased: Mapped[bool] = mapped_column(Boolean)
    connections: Mapped[BigInt]
    responses: Mapped[BigInt]
    latency_sum_us: Mapped[BigInt]
    #: The latency histogram (``wire.hist_bin`` layout) as parallel arrays: bin, count.
    latency_bins: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    latency_counts: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    retrans_connections: Mapped[BigInt]
    data_segs_out: Mapped[BigInt]
    total_retrans: Mapped[BigInt]
    bytes_acked: Mapped[BigInt]
    bytes_retrans: Mapped[BigInt]
    syn_retrans: Mapped[BigInt]
    rwnd_limited: Mapped[BigInt]
    reused_after_idle: Mapped[BigInt]
    tls: Mapped[BigInt]
    received_at: Mapped[CreatedAt]


class PassiveConnection(Base):
    """One sampled connection: its final ``TCP_INFO`` and what its headers showed."""

    __tablename__ = "passive_connections"
    __table_args__ = (
        Index("ix_passive_connections_closed_at_brin", "closed_at", postgresql_using="brin"),
        Index("ix_passive_connections_campaign_id_closed_at", "campaign_id", "closed_at"),
        CheckConstraint(FAMILY_KNOWN_SQL, name="family_known"),
        CheckConstraint(PORT_KIND_KNOWN_SQL, name="port_kind_known"),
        # The keyed hash and nothing else: an address cannot be stored here even by SQL.
        CheckConstraint("client_prefix ~ '^[0-9a-f]{16}$'", name="client_prefix_hash"),
    )

    record_id: Mapped[UuidPk]
    server_id: Mapped[UuidCol]
    campaign_id: Mapped[BigInt]
    phase: Mapped[Int]
    closed_at: Mapped[dt.datetime]
    arm: Mapped[Str]
    arm_iw: Mapped[Int | None]
    treated_share_bp: Mapped[int] = mapped_column(SmallInteger)
    family: Mapped[Str]
    port_kind: Mapped[Str]
    #: The server's port the connection came in on.
    port: Mapped[Int]
    region: Mapped[Str]
    #: ISO country code, ``""``: unknown.
    country: Mapped[Str]
    #: Keyed hash of the client's prefix (16 hex digits), never the prefix.
    client_prefix: Mapped[Str]
    cluster: Mapped[int] = mapped_column(SmallInteger)
    tcpi_min_rtt_us: Mapped[BigInt | None]
    tcpi_rtt_us: Mapped[BigInt | None]
    tcpi_delivery_rate: Mapped[BigInt | None]
    tcpi_bytes_acked: Mapped[BigInt | None]
    tcpi_data_segs_out: Mapped[BigInt | None]
    tcpi_total_retrans: Mapped[BigInt | None]
    tcpi_bytes_retrans: Mapped[BigInt | None]
    tcpi_snd_cwnd: Mapped[BigInt | None]
    tcp_info: Mapped[Json]
    captured: Mapped[bool] = mapped_column(Boolean)
    tls: Mapped[bool | None] = mapped_column(Boolean)
    response_latency_us: Mapped[BigInt | None]
    response_bytes: Mapped[BigInt | None]
    handshake_us: Mapped[BigInt | None]
    first_flight_segments: Mapped[Int | None]
    first_flight_bytes: Mapped[BigInt | None]
    handshake_rtt_us: Mapped[BigInt | None]
    client_rwnd_bytes: Mapped[BigInt | None]
    syn_retrans: Mapped[bool] = mapped_column(Boolean)
    rwnd_limited: Mapped[bool] = mapped_column(Boolean)
    reused_after_idle: Mapped[bool] = mapped_column(Boolean)
    exchanges: Mapped[Int | None]
    received_at: Mapped[CreatedAt]
