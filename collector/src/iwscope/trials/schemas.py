"""Wire records of trials, observations and path samples as pydantic models (``*In``/``*Out``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from iwprobe import wire
from iwscope.probes.schemas import HeartbeatIn
from iwscope.wiretypes import (
    BIGINT_MAX,
    NO_NUL,
    WIRE_MODEL_CONFIG,
    ArmLabel,
    Bytes,
    CampaignId,
    CensusUrl,
    ErrorKind,
    Family,
    FlowRole,
    Iw,
    IwBytes,
    IwReason,
    IwSegments,
    IwStatus,
    Micros,
    Port,
    Protocol,
    QuicDatagramSize,
    QuicPackets,
    SegmentationOffload,
    SegmentSize,
    SendPath,
    TcpInfo,
    TlsVersion,
    WireTimestamp,
    WireUUID,
    WireVersion,
)


class EchoStatsIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.EchoStats` (one ``rtt_us`` entry per packet sent and
    ``received`` = its non-null entries are checked with the batch, see
    :func:`iwscope.trials.validation.validate_trial_batch`)."""

    model_config = WIRE_MODEL_CONFIG

    packet_bytes: Annotated[int, Field(ge=wire.MIN_ECHO_PACKET_BYTES, le=wire.MAX_ECHO_PACKET_BYTES)]
    interval_us: Annotated[int, Field(ge=1000, le=10_000_000)]
    sent: Annotated[int, Field(ge=0, le=wire.MAX_ECHO_SAMPLES)]
    received: Annotated[int, Field(ge=0, le=wire.MAX_ECHO_SAMPLES)]
    rtt_us: Annotated[list[Micros | None], Field(max_length=wire.MAX_ECHO_SAMPLES)]


class ClientIwIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.ClientIw`."""

    model_config = WIRE_MODEL_CONFIG

    status: IwStatus
    segments: IwSegments | None
    bytes: IwBytes | None
    mss: SegmentSize | None
    reason: IwReason = ""


class TrialRecordIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.TrialRecord`."""

    model_config = WIRE_MODEL_CONFIG

    trial_id: WireUUID
    probe_id: WireUUID
    campaign_id: CampaignId | None
    origin_id: WireUUID | None
    round: Annotated[int, Field(ge=0, le=1_000_000_000)]
    arm_iw: Iw
    object_size: Bytes
    url: Annotated[str, Field(min_length=1, max_length=2048), NO_NUL]
    started_at: WireTimestamp
    dns_us: Micros | None
    connect_us: Micros | None
    ttfb_us: Micros | None
    total_us: Micros | None
    bytes_received: Bytes
    http_status: Annotated[int, Field(ge=100, le=599)] | None
    error_kind: ErrorKind | None
    error_detail: Annotated[str, Field(max_length=500), NO_NUL] | None
    syn_retrans: Annotated[int, Field(ge=0, le=255)]
    tcp_info: TcpInfo
    arm: ArmLabel = ""
    role: FlowRole = ""
    page_id: WireUUID | None = None
    echo: EchoStatsIn | None = None
    tls_version: TlsVersion = ""
    tls_handshake_us: Micros | None = None
    family: Family = ""
    client_iw: ClientIwIn | None = None
    protocol: Protocol = ""


class PathSampleIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.PathSample`."""

    model_config = WIRE_MODEL_CONFIG

    sample_id: WireUUID
    probe_id: WireUUID
    origin_id: WireUUID
    measured_at: WireTimestamp
    min_rtt_us: Micros
    bottleneck_bps: Annotated[int, Field(ge=1, le=1_000_000_000_000)] | None
    transfer_bytes: Bytes
    method: Annotated[str, Field(min_length=1, max_length=64), NO_NUL]


class CensusRecordIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.CensusRecord`."""

    model_config = WIRE_MODEL_CONFIG

    census_id: WireUUID
    probe_id: WireUUID
    campaign_id: CampaignId | None
    round: Annotated[int, Field(ge=0, le=1_000_000_000)]
    url: CensusUrl
    measured_at: WireTimestamp
    status: IwStatus
    iw_segments: IwSegments | None
    iw_bytes: IwBytes | None
    mss: SegmentSize | None
    reason: IwReason
    connections: Annotated[int, Field(ge=0, le=100)]
    connections_ok: Annotated[int, Field(ge=0, le=100)]
    announced_mss: SegmentSize | None
    rtt_us: Micros | None
    family: Family
    tls_version: TlsVersion
    http_status: Annotated[int, Field(ge=100, le=599)] | None
    error_detail: Annotated[str, Field(max_length=500), NO_NUL] | None = None
    protocol: Protocol = ""


class TrialBatchIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.TrialBatch`."""

    model_config = WIRE_MODEL_CONFIG

    wire_version: WireVersion
    batch_id: WireUUID
    probe_id: WireUUID
    sent_at: WireTimestamp
    trials: Annotated[list[TrialRecordIn], Field(max_length=wire.MAX_BATCH_RECORDS)]
    path_samples: Annotated[list[PathSampleIn], Field(max_length=wire.MAX_BATCH_RECORDS)]
    heartbeat: HeartbeatIn | None = None
    census: Annotated[list[CensusRecordIn], Field(max_length=wire.MAX_BATCH_RECORDS)] = []


class OriginObservationIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.OriginObservation`."""

    model_config = WIRE_MODEL_CONFIG

    trial_id: WireUUID
    origin_id: WireUUID
    arm_iw: Iw
    port: Port
    client_addr: Annotated[str, Field(min_length=1, max_length=64), NO_NUL]
    object_size: Bytes
    request_at: WireTimestamp
    first_byte_us: Micros
    response_latency_us: Micros | None
    snd_cwnd_at_accept: Annotated[int, Field(ge=0, le=1_000_000)]
    cwnd_mismatch: bool
    rwnd_limited: bool
    peer_rwnd: Annotated[int, Field(ge=0, le=4_294_967_296)] | None
    http_status: Annotated[int, Field(ge=100, le=599)]
    error_kind: ErrorKind | None
    tcp_info: TcpInfo
    arm: ArmLabel = ""
    tls_version: TlsVersion = ""
    tls_handshake_us: Micros | None = None
    tls_first_flight_bytes: Annotated[int, Field(ge=0, le=16_777_216)] | None = None
    tls_flight_acked_us: Micros | None = None
    family: Family = ""
    send_path: SendPath = ""
    segmentation_offload: SegmentationOffload = ""
    protocol: Protocol = ""
    quic_first_flight_packets: QuicPackets | None = None
    quic_first_flight_bytes: IwBytes | None = None
    quic_max_datagram_size: QuicDatagramSize | None = None
    quic_lost_packets: Annotated[int, Field(ge=0, le=BIGINT_MAX)] | None = None
    quic_zero_rtt: bool | None = None


class ObservationBatchIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.ObservationBatch`."""

    model_config = WIRE_MODEL_CONFIG

    wire_version: WireVersion
    batch_id: WireUUID
    origin_id: WireUUID
    sent_at: WireTimestamp
    observations: Annotated[list[OriginObservationIn], Field(max_length=wire.MAX_BATCH_RECORDS)]


class UploadResultOut(BaseModel):
    """Mirror of :class:`iwprobe.wire.UploadResult`."""

    batch_id: str
    accepted: int
    duplicates: int


class TrialUploadResultOut(UploadResultOut):
    """A trial batch's answer: also the ETag the probe's schedule has now (at the batch's wire
    version), so a probe holding that schedule skips its next poll."""

    schedule_etag: str


class RecordError(BaseModel):
    """One problem of one record of a refused batch."""

    #: ``trials``, ``path_samples``, ``census``, ``observations``, ``aggregates``, ``connections``
    #: (a passive batch's) or ``batch`` (the envelope).
    section: str
    #: Index of the record within its section (``None`` for the envelope).
    index: int | None
    #: The record's UUID when it could be read.
    record_id: str | None
    #: Dotted path of the bad field within the record.
    field: str
    message: str
