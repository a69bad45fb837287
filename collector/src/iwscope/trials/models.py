"""Trials (partitioned by month), the UUID idempotency registry, origin observations, path samples.

``trials`` is range-partitioned on ``started_at`` (one partition per month plus a DEFAULT
partition so that no insert ever fails for lack of a partition).  A partitioned table's
unique key must contain the partition key, so ``(trial_id, started_at)`` is the primary
key and uniqueness of the client-generated UUID alone is enforced by ``trial_ids``.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import Boolean, CheckConstraint, Index, SmallInteger, Text, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from iwprobe import wire
from iwscope.db import Base
from iwscope.types import BigInt, CreatedAt, Int, Json, Str, UuidCol, UuidPk
from iwscope.wiretypes import FAMILY_KNOWN_SQL, PROTOCOL_KNOWN_SQL, SEGMENTATION_OFFLOAD_KNOWN_SQL, SEND_PATH_KNOWN_SQL

#: The ``status`` check of client-side IW inferences (trials' ``client_iw_status``, census records).
IW_STATUS_KNOWN_SQL = "IN (" + ", ".join(repr(status) for status in wire.IW_STATUSES) + ")"

#: Client ``TCP_INFO`` fields stored as typed ``trials.tcpi_<name>`` columns.
TRIAL_TCPI_COLUMNS = (
    "rtt",
    "rttvar",
    "min_rtt",
    "total_retrans",
    "segs_in",
    "data_segs_in",
    "rcv_space",
    "rcv_mss",
    "bytes_received",
)
#: Server ``TCP_INFO`` fields stored as typed ``origin_observations.tcpi_<name>`` columns.
OBSERVATION_TCPI_COLUMNS = (
    "total_retrans",
    "bytes_retrans",
    "rtt",
    "min_rtt",
    "delivery_rate",
    "segs_out",
    "bytes_sent",
    "snd_cwnd",
    "snd_ssthresh",
    "busy_time",
    "rwnd_limited",
    "sndbuf_limited",
)


def tcpi_column_name(field: str) -> str:
    """Typed column of a ``tcp_info`` field: times carry the ``_us`` suffix (``tcpi_rtt_us``)."""
    times = {"rtt", "rttvar", "min_rtt", "busy_time", "rwnd_limited", "sndbuf_limited"}
    return f"tcpi_{field}_us" if field in times else f"tcpi_{field}"


class TrialId(Base):
    """The idempotency registry: one row per trial UUID ever accepted."""

    __tablename__ = "trial_ids"

    trial_id: Mapped[UuidPk]
    started_at: Mapped[dt.datetime]


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (
        Index("ix_trials_started_at_brin", "started_at", postgresql_using="brin"),
        Index("ix_trials_campaign_id_arm_iw", "campaign_id", "arm_iw"),
        Index("ix_trials_probe_id_origin_id", "probe_id", "origin_id"),
        Index("ix_trials_origin_id", "origin_id"),
        Index("ix_trials_page_id", "page_id", postgresql_where=text("page_id IS NOT NULL")),
        CheckConstraint(f"role IN ({', '.join(repr(role) for role in wire.FLOW_ROLES)})", name="role_known"),
        CheckConstraint(FAMILY_KNOWN_SQL, name="family_known"),
        CheckConstraint(PROTOCOL_KNOWN_SQL, name="protocol_known"),
        {"postgresql_partition_by": "RANGE (started_at)"},
    )

    trial_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    started_at: Mapped[dt.datetime] = mapped_column(primary_key=True)
    probe_id: Mapped[UuidCol]
    campaign_id: Mapped[BigInt | None]
    origin_id: Mapped[UuidCol | None]
    round: Mapped[Int]
    arm_iw: Mapped[int] = mapped_column(SmallInteger)
    object_size: Mapped[BigInt]
    url: Mapped[Str]
    dns_us: Mapped[BigInt | None]
    connect_us: Mapped[BigInt | None]
    ttfb_us: Mapped[BigInt | None]
    total_us: Mapped[BigInt | None]
    bytes_received: Mapped[BigInt]
    http_status: Mapped[int | None] = mapped_column(SmallInteger)
    error_kind: Mapped[Str | None]
    error_detail: Mapped[Str | None]
    syn_retrans: Mapped[int] = mapped_column(SmallInteger)
    tcpi_rtt_us: Mapped[BigInt | None]
    tcpi_rttvar_us: Mapped[BigInt | None]
    tcpi_min_rtt_us: Mapped[BigInt | None]
    tcpi_total_retrans: Mapped[BigInt | None]
    tcpi_segs_in: Mapped[BigInt | None]
    tcpi_data_segs_in: Mapped[BigInt | None]
    tcpi_rcv_space: Mapped[BigInt | None]
    tcpi_rcv_mss: Mapped[BigInt | None]
    tcpi_bytes_received: Mapped[BigInt | None]
    tcp_info: Mapped[Json]
    #: The arm's label when it is not the plain arm ``arm_iw`` (``10p``, ``learned``); NULL: plain.
    arm: Mapped[Str | None]
    #: The flow's role (``wire.FLOW_ROLES``): only ``short`` trials of plain arms feed the roll-ups.
    role: Mapped[str] = mapped_column(Text, server_default="short")
    #: Role ``page-load``: the page load the connection belongs to.
    page_id: Mapped[UuidCol | None]
    #: Role ``interactive``: ``wire.EchoStats`` (packets sent, echoed, round-trip times).
    echo: Mapped[Json | None]
    #: HTTPS (wire v4): the TLS version and TCP established -> handshake complete (µs); NULL: HTTP.
    tls_version: Mapped[Str | None]
    tls_handshake_us: Mapped[BigInt | None]
    #: ``ipv4`` or ``ipv6`` (wire v4); NULL: not said.
    family: Mapped[Str | None]
    #: Wire v5: the server's IW as the probe's own capture showed it (``wire.ClientIw``):
    #: status (``ok`` / ``lower_bound`` / ``undetermined``), segments, bytes, the sender's
    #: segment size, and why not ``ok``; all NULL: not inferred.
    client_iw_status: Mapped[Str | None]
    client_iw_segments: Mapped[int | None] = mapped_column(SmallInteger)
    client_iw_bytes: Mapped[Int | None]
    client_iw_mss: Mapped[Int | None]
    client_iw_reason: Mapped[Str | None]
    #: Wire v9: ``tcp`` or ``quic`` (HTTP/3, its arm ``Nq``/``Npq``); NULL: not said, which is TCP.
    #: A QUIC trial has no TCP connection (``connect_us``, ``tcp_info`` and the ``tcpi_*`` columns
    #: empty); ``tls_handshake_us`` is the QUIC handshake, ``client_iw_*`` counts packets.
    protocol: Mapped[Str | None]
    received_at: Mapped[CreatedAt]
    # Filled by the join task from origin_observations:
    server_latency_us: Mapped[BigInt | None]
    server_first_byte_us: Mapped[BigInt | None]
    server_total_retrans: Mapped[BigInt | None]
    server_bytes_retrans: Mapped[BigInt | None]
    server_bytes_sent: Mapped[BigInt | None]
    server_snd_cwnd_at_accept: Mapped[BigInt | None]
    cwnd_mismatch: Mapped[bool | None] = mapped_column(Boolean)
    rwnd_limited: Mapped[bool | None] = mapped_column(Boolean)
    #: HTTPS: the server's handshake time, its first flight's bytes and when they were all acknowledged.
    server_tls_handshake_us: Mapped[BigInt | None]
    server_tls_first_flight_bytes: Mapped[BigInt | None]
    server_tls_flight_acked_us: Mapped[BigInt | None]
    joined_at: Mapped[dt.datetime | None]


class OriginObservation(Base):
    __tablename__ = "origin_observations"
    __table_args__ = (
        Index("ix_origin_observations_unjoined", "trial_id", postgresql_where=text("joined_at IS NULL")),
        Index("ix_origin_observations_origin_id_request_at", "origin_id", "request_at"),
        CheckConstraint(FAMILY_KNOWN_SQL, name="family_known"),
        CheckConstraint(SEND_PATH_KNOWN_SQL, name="send_path_known"),
        CheckConstraint(SEGMENTATION_OFFLOAD_KNOWN_SQL, name="segmentation_offload_known"),
        CheckConstraint(PROTOCOL_KNOWN_SQL, name="protocol_known"),
    )

    trial_id: Mapped[UuidPk]
    origin_id: Mapped[UuidCol]
    arm_iw: Mapped[int] = mapped_column(SmallInteger)
    #: The arm's label (``10``, ``10p``, ``learned``); NULL for wire-v1 origins (the plain arm).
    arm: Mapped[Str | None]
    port: Mapped[Int]
    client_addr: Mapped[Str]
    object_size: Mapped[BigInt]
    request_at: Mapped[dt.datetime]
    first_byte_us: Mapped[BigInt]
    response_latency_us: Mapped[BigInt | None]
    snd_cwnd_at_accept: Mapped[BigInt]
    cwnd_mismatch: Mapped[bool]
    rwnd_limited: Mapped[bool]
    peer_rwnd: Mapped[BigInt | None]
    http_status: Mapped[int] = mapped_column(SmallInteger)
    error_kind: Mapped[Str | None]
    tcpi_total_retrans: Mapped[BigInt | None]
    tcpi_bytes_retrans: Mapped[BigInt | None]
    tcpi_rtt_us: Mapped[BigInt | None]
    tcpi_min_rtt_us: Mapped[BigInt | None]
    tcpi_delivery_rate: Mapped[BigInt | None]
    tcpi_segs_out: Mapped[BigInt | None]
    tcpi_bytes_sent: Mapped[BigInt | None]
    tcpi_snd_cwnd: Mapped[BigInt | None]
    tcpi_snd_ssthresh: Mapped[BigInt | None]
    tcpi_busy_time_us: Mapped[BigInt | None]
    tcpi_rwnd_limited_us: Mapped[BigInt | None]
    tcpi_sndbuf_limited_us: Mapped[BigInt | None]
    tcp_info: Mapped[Json]
    #: HTTPS (wire v4): ClientHello read -> handshake complete, first flight bytes, -> flight acknowledged.
    tls_version: Mapped[Str | None]
    tls_handshake_us: Mapped[BigInt | None]
    tls_first_flight_bytes: Mapped[BigInt | None]
    tls_flight_acked_us: Mapped[BigInt | None]
    family: Mapped[Str | None]
    #: Wire v8: how the origin wrote the response (``wire.SEND_PATHS``) and what its device did
    #: with large sends (``wire.SEGMENTATION_OFFLOADS``); ``''``: not said (older origins).  Kept
    #: here, not copied onto the trial by the join: like ``arm``, ``tls_version`` and ``family``
    #: they describe how the observation was made, and the join copies only the server's numbers.
    send_path: Mapped[str] = mapped_column(Text, server_default="")
    segmentation_offload: Mapped[str] = mapped_column(Text, server_default="")
    #: Wire v9: ``tcp`` or ``quic``; NULL: not said, which is TCP.  Over QUIC ``tcp_info`` is
    #: empty and ``snd_cwnd_at_accept`` is the window in packets the connection started with; the
    #: ``quic_*`` columns (NULL on TCP) hold the response's first flight -- datagrams sent before
    #: an ACK of the response could arrive, their bytes, the datagram size the window counts --,
    #: the connection's lost packets and whether the request came as 0-RTT data.  Like ``arm`` and
    #: ``send_path`` they stay here: the join copies the server's numbers, not how they were made.
    protocol: Mapped[Str | None]
    quic_first_flight_packets: Mapped[Int | None]
    quic_first_flight_bytes: Mapped[BigInt | None]
    quic_max_datagram_size: Mapped[Int | None]
    quic_lost_packets: Mapped[BigInt | None]
    quic_zero_rtt: Mapped[bool | None] = mapped_column(Boolean)
    received_at: Mapped[CreatedAt]
    joined_at: Mapped[dt.datetime | None]


class PathSample(Base):
    __tablename__ = "path_samples"
    __table_args__ = (
        Index("ix_path_samples_probe_id_origin_id", "probe_id", "origin_id"),
        # the analysis refresh folds the samples received in its window (paths.services)
        Index("ix_path_samples_received_at_brin", "received_at", postgresql_using="brin"),
    )

    sample_id: Mapped[UuidPk]
    probe_id: Mapped[UuidCol]
    origin_id: Mapped[UuidCol]
    measured_at: Mapped[dt.datetime]
    min_rtt_us: Mapped[BigInt]
    bottleneck_bps: Mapped[BigInt | None]
    transfer_bytes: Mapped[BigInt]
    method: Mapped[Str]
    received_at: Mapped[CreatedAt]


class CensusRecord(Base):
    """Wire v5: the IW of a server iwscope does not run, as one probe measured it in one round
    of a census campaign (``wire.CensusRecord``); idempotent by ``census_id``."""

    __tablename__ = "census_records"
    __table_args__ = (
        Index("ix_census_records_campaign_id_url", "campaign_id", "url"),
        Index("ix_census_records_measured_at_brin", "measured_at", postgresql_using="brin"),
        CheckConstraint(f"status {IW_STATUS_KNOWN_SQL}", name="status_known"),
        CheckConstraint(FAMILY_KNOWN_SQL, name="family_known"),
        CheckConstraint(PROTOCOL_KNOWN_SQL, name="protocol_known"),
    )

    census_id: Mapped[UuidPk]
    probe_id: Mapped[UuidCol]
    campaign_id: Mapped[BigInt | None]
    round: Mapped[Int]
    #: The target URL as the campaign named it, and its host (lower case, no port).
    url: Mapped[Str]
    host: Mapped[Str]
    measured_at: Mapped[dt.datetime]
    status: Mapped[Str]
    iw_segments: Mapped[int | None] = mapped_column(SmallInteger)
    iw_bytes: Mapped[Int | None]
    mss: Mapped[Int | None]
    reason: Mapped[Str]
    connections: Mapped[int] = mapped_column(SmallInteger)
    connections_ok: Mapped[int] = mapped_column(SmallInteger)
    announced_mss: Mapped[Int | None]
    rtt_us: Mapped[BigInt | None]
    #: ``ipv4`` / ``ipv6``; NULL: not said.
    family: Mapped[Str | None]
    tls_version: Mapped[Str | None]
    http_status: Mapped[int | None] = mapped_column(SmallInteger)
    error_detail: Mapped[Str | None]
    #: Wire v9: ``tcp`` or ``quic``; NULL: not said, which is TCP.  A QUIC record's
    #: ``iw_segments`` counts packets and ``mss`` is the server's datagram size.
    protocol: Mapped[Str | None]
    received_at: Mapped[CreatedAt]
