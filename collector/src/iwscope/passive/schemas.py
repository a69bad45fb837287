"""Wire v6 records of passive measurement as pydantic models (mirrors of ``iwprobe.wire``).

Built from :mod:`iwscope.wiretypes` with ``extra="forbid"`` and strict types, so a document is
accepted iff ``wire.schema.json`` accepts it (``tests/collector/test_collector_wire_contract.py``).
What the schema cannot say -- relations between fields, the campaign a record names -- is
checked by :mod:`iwscope.passive.validation`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from iwprobe import wire
from iwscope.wiretypes import (
    NO_NUL,
    WIRE_MODEL_CONFIG,
    ArmIw,
    CampaignId,
    ClientPrefix,
    ClientRegion,
    Cluster,
    Count,
    Country,
    Micros,
    NamedFamily,
    PassiveArmLabel,
    PassiveWireVersion,
    Phase,
    Port,
    PortKind,
    ShareBp,
    TcpInfo,
    WireTimestamp,
    WireUUID,
)

#: A latency histogram's bin (``wire.hist_bin``) and a non-empty bin's count.
HistBin = Annotated[int, Field(ge=0, le=wire.HIST_BINS - 1)]
HistCount = Annotated[int, Field(ge=1, le=2**63 - 1)]


def _bucket(edges: tuple[float, ...]) -> object:
    """A bucket index of ``edges`` (``wire.bucket_index``): -1 (unknown) to ``len(edges)``."""
    return Field(ge=-1, le=len(edges))


RttBucket = Annotated[int, _bucket(wire.PASSIVE_RTT_EDGES_MS)]
BandwidthBucket = Annotated[int, _bucket(wire.PASSIVE_BANDWIDTH_EDGES_BPS)]
BdpBucket = Annotated[int, _bucket(wire.PASSIVE_BDP_EDGES_BYTES)]
SizeOctave = Annotated[int, Field(ge=-1, le=wire.MAX_SIZE_OCTAVE)]


class PassiveArmIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.PassiveArm` (also the campaign API's ``passive_arms`` items)."""

    model_config = WIRE_MODEL_CONFIG

    arm: PassiveArmLabel
    share_bp: ShareBp


class PassiveAggregateIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.PassiveAggregate`."""

    model_config = WIRE_MODEL_CONFIG

    aggregate_id: WireUUID
    server_id: WireUUID
    campaign_id: CampaignId
    phase: Phase
    hour: WireTimestamp
    arm: PassiveArmLabel
    arm_iw: ArmIw | None
    treated_share_bp: ShareBp
    family: NamedFamily
    port_kind: PortKind
    region: ClientRegion
    cluster: Cluster
    rtt_bucket: RttBucket
    bandwidth_bucket: BandwidthBucket
    bdp_bucket: BdpBucket
    size_octave: SizeOctave
    biased: bool
    connections: Annotated[int, Field(ge=1, le=2**63 - 1)]
    responses: Count
    latency_sum_us: Count
    latency_hist: Annotated[list[tuple[HistBin, HistCount]], Field(max_length=wire.HIST_BINS)] = []
    retrans_connections: Count = 0
    data_segs_out: Count = 0
    total_retrans: Count = 0
    bytes_acked: Count = 0
    bytes_retrans: Count = 0
    syn_retrans: Count = 0
    rwnd_limited: Count = 0
    reused_after_idle: Count = 0
    tls: Count = 0


class PassiveConnectionIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.PassiveConnection`.  ``client_prefix`` takes exactly 16
    hex digits: an address does not fit."""

    model_config = WIRE_MODEL_CONFIG

    record_id: WireUUID
    server_id: WireUUID
    campaign_id: CampaignId
    phase: Phase
    closed_at: WireTimestamp
    arm: PassiveArmLabel
    arm_iw: ArmIw | None
    treated_share_bp: ShareBp
    family: NamedFamily
    port_kind: PortKind
    port: Port
    region: ClientRegion
    country: Country
    client_prefix: ClientPrefix
    cluster: Cluster
    tcp_info: TcpInfo = {}
    captured: bool = False
    tls: bool | None = None
    response_latency_us: Micros | None = None
    response_bytes: Count | None = None
    handshake_us: Micros | None = None
    first_flight_segments: Annotated[int, Field(ge=0, le=100_000)] | None = None
    first_flight_bytes: Count | None = None
    handshake_rtt_us: Micros | None = None
    client_rwnd_bytes: Annotated[int, Field(ge=0, le=2**31)] | None = None
    syn_retrans: bool = False
    rwnd_limited: bool = False
    reused_after_idle: bool = False
    exchanges: Annotated[int, Field(ge=0, le=1_000_000)] | None = None


class ServerHeartbeatIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.ServerHeartbeat`."""

    model_config = WIRE_MODEL_CONFIG

    version: Annotated[str, Field(max_length=64), NO_NUL]
    uptime_s: Annotated[float, Field(ge=0)]
    arms_state: Annotated[str, Field(max_length=500, pattern=r"^(?:on|off|error: [^\x00]*)$")]
    connections_seen: Count
    connections_captured: Count
    notifications_lost: Count
    packets_dropped: Count
    capture_share: Annotated[float, Field(ge=0, le=1)]
    spool_backlog: Count
    spool_bytes: Count
    closes_share: Annotated[float, Field(ge=0, le=1)] = 1.0


class PassiveBatchIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.PassiveBatch` (wire version 6 and later: nothing older has it)."""

    model_config = WIRE_MODEL_CONFIG

    wire_version: PassiveWireVersion
    batch_id: WireUUID
    server_id: WireUUID
    sent_at: WireTimestamp
    aggregates: Annotated[list[PassiveAggregateIn], Field(max_length=wire.MAX_BATCH_RECORDS)] = []
    connections: Annotated[list[PassiveConnectionIn], Field(max_length=wire.MAX_BATCH_RECORDS)] = []
    heartbeat: ServerHeartbeatIn | None = None
