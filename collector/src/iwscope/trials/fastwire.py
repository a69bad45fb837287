"""The hot path's decoders of a ``TrialBatch`` and an ``ObservationBatch``: msgspec Structs
mirroring the pydantic ``*In`` models.

The pydantic models in :mod:`iwscope.trials.schemas` stay the documented schema (OpenAPI, the
wire-contract test against ``wire.schema.json``) and the reference for error reports.  This
module decodes and checks a batch faster (one C pass over the bytes, no model objects, no
per-field Python validators: 1.5 times as fast for 200 trials or observations with msgspec 0.22),
and checks the two patterns every record carries once per batch instead of once per string
(msgspec calls :mod:`re` per patterned string): the UUIDs of a batch in one match over them
all (:func:`_check_uuids`), and "no NUL in any string" as "no ``\\u0000`` in the body" (JSON
can carry a NUL in a string no other way; a body with that text for another reason, e.g. an
escaped backslash before ``u0000``, is merely refused here and decided by pydantic).  Whatever it accepts,
pydantic accepts with the same values; when it refuses a body, :func:`decode_or_refuse`
(:func:`decode_or_refuse_observations`) runs pydantic on it, which names every bad record and
field (the 422 body is pydantic's) or, in the rare case the fast decoder is stricter (duplicate
keys in a JSON object), reads the batch as pydantic does.  So the verdict is always pydantic's;
``tests/collector/test_collector_fastwire.py`` and ``test_collector_fastwire_observations.py``
check that on thousands of generated good and bad documents.

Details that make both agree:

* patterns end in ``\\Z``: msgspec matches with Python's :mod:`re`, where ``$`` also matches
  before a final newline; pydantic-core's Rust regex does not;
* timestamps are decoded as strings and checked by the very function pydantic's model uses
  (:func:`iwscope.wiretypes.parse_rfc3339`), in :func:`decode_trial_batch` and
  :func:`decode_observation_batch`;
* ``wire_version`` is compared by equality with ``wire.ACCEPTED_WIRE_VERSIONS``, as pydantic's
  ``Literal`` of those versions (:data:`iwscope.wiretypes.WireVersion`) does;
* the same defaults as the pydantic models (only the fields later wire versions added have
  one); unknown fields are errors.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal, TypeAlias, TypeVar

import msgspec
from msgspec import Meta

from iwprobe import wire
from iwscope.trials.schemas import ObservationBatchIn, TrialBatchIn
from iwscope.wiretypes import (
    BIGINT_MAX,
    CENSUS_URL_PATTERN,
    IW_REASON_PATTERN,
    QUIC_MAX_DATAGRAM_BYTES,
    QUIC_MAX_FLIGHT_PACKETS,
    SIZE_MAX,
    US_MAX,
    UUID_PATTERN,
    ErrorKind,
    Family,
    IwStatus,
    Protocol,
    SegmentationOffload,
    SendPath,
    parse_rfc3339,
)

log = logging.getLogger(__name__)

#: A batch as the fast decoder reads it, and the pydantic model that decides when it refuses.
_Fast = TypeVar("_Fast")
_Reference = TypeVar("_Reference", TrialBatchIn, ObservationBatchIn)

#: A UUID: its pattern is checked per batch (:func:`_check_uuids`), its length here.
FastUUID = Annotated[str, Meta(min_length=36, max_length=36)]
#: One or more UUIDs (the pattern's body), each followed by a newline: :func:`_check_uuids`.
_UUIDS = re.compile("(?:" + UUID_PATTERN.removeprefix("^").removesuffix("$") + "\n)+")
#: How a NUL in a JSON string looks in the body (see the module docstring).
_NUL_ESCAPE = "\\u0000"
FastMicros = Annotated[int, Meta(ge=0, le=US_MAX)]
FastBytes = Annotated[int, Meta(ge=0, le=SIZE_MAX)]
FastIw = Annotated[int, Meta(ge=1, le=1000)]
FastPort = Annotated[int, Meta(ge=1, le=65535)]
FastHttpStatus = Annotated[int, Meta(ge=100, le=599)]
FastTlsVersion = Annotated[str, Meta(max_length=wire.MAX_TLS_VERSION_CHARS)]
FastTcpInfoField = Literal[wire.TCP_INFO_FIELDS]  # type: ignore[valid-type]
FastTcpInfo = Annotated[dict[FastTcpInfoField, Annotated[int, Meta(ge=0, le=BIGINT_MAX)]], Meta(max_length=128)]


FastArmLabel = Annotated[str, Meta(max_length=16, pattern=wire.ARM_LABEL_PATTERN.removesuffix("$") + r"\Z")]
FastFlowRole: TypeAlias = Literal[("",) + wire.FLOW_ROLES]  # type: ignore[valid-type]


class FastEcho(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Mirror of :class:`iwscope.trials.schemas.EchoStatsIn`."""

    packet_bytes: Annotated[int, Meta(ge=wire.MIN_ECHO_PACKET_BYTES, le=wire.MAX_ECHO_PACKET_BYTES)]
    interval_us: Annotated[int, Meta(ge=1000, le=10_000_000)]
    sent: Annotated[int, Meta(ge=0, le=wire.MAX_ECHO_SAMPLES)]
    received: Annotated[int, Meta(ge=0, le=wire.MAX_ECHO_SAMPLES)]
    rtt_us: Annotated[list[FastMicros | None], Meta(max_length=wire.MAX_ECHO_SAMPLES)]


FastIwSegments = Annotated[int, Meta(ge=0, le=wire.MAX_IW_SEGMENTS)]
FastIwBytes = Annotated[int, Meta(ge=0, le=16_777_216)]
FastSegmentSize = Annotated[int, Meta(ge=1, le=65535)]
FastIwReason = Annotated[str, Meta(max_length=wire.MAX_IW_REASON_CHARS, pattern=IW_REASON_PATTERN.removesuffix("$") + r"\Z")]


class FastClientIw(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Mirror of :class:`iwscope.trials.schemas.ClientIwIn`."""

    status: IwStatus
    segments: FastIwSegments | None
    bytes: FastIwBytes | None
    mss: FastSegmentSize | None
    reason: FastIwReason = ""


class FastTrial(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Mirror of :class:`iwscope.trials.schemas.TrialRecordIn` (``started_at`` still a string)."""

    trial_id: FastUUID
    probe_id: FastUUID
    campaign_id: Annotated[int, Meta(ge=1, le=BIGINT_MAX)] | None
    origin_id: FastUUID | None
    round: Annotated[int, Meta(ge=0, le=1_000_000_000)]
    arm_iw: FastIw
    object_size: FastBytes
    url: Annotated[str, Meta(min_length=1, max_length=2048)]
    started_at: str
    dns_us: FastMicros | None
    connect_us: FastMicros | None
    ttfb_us: FastMicros | None
    total_us: FastMicros | None
    bytes_received: FastBytes
    http_status: FastHttpStatus | None
    error_kind: ErrorKind | None
    error_detail: Annotated[str, Meta(max_length=500)] | None
    syn_retrans: Annotated[int, Meta(ge=0, le=255)]
    tcp_info: FastTcpInfo
    arm: FastArmLabel = ""
    role: FastFlowRole = ""
    page_id: FastUUID | None = None
    echo: FastEcho | None = None
    tls_version: FastTlsVersion = ""
    tls_handshake_us: FastMicros | None = None
    family: Family = ""
    client_iw: FastClientIw | None = None
    protocol: Protocol = ""


class FastPathSample(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Mirror of :class:`iwscope.trials.schemas.PathSampleIn` (``measured_at`` still a string)."""

    sample_id: FastUUID
    probe_id: FastUUID
    origin_id: FastUUID
    measured_at: str
    min_rtt_us: FastMicros
    bottleneck_bps: Annotated[int, Meta(ge=1, le=1_000_000_000_000)] | None
    transfer_bytes: FastBytes
    method: Annotated[str, Meta(min_length=1, max_length=64)]


class FastCensus(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Mirror of :class:`iwscope.trials.schemas.CensusRecordIn` (``measured_at`` still a string)."""

    census_id: FastUUID
    probe_id: FastUUID
    campaign_id: Annotated[int, Meta(ge=1, le=BIGINT_MAX)] | None
    round: Annotated[int, Meta(ge=0, le=1_000_000_000)]
    url: Annotated[
        str, Meta(min_length=1, max_length=wire.MAX_CENSUS_URL_CHARS, pattern=CENSUS_URL_PATTERN.removesuffix("$") + r"\Z")
    ]
    measured_at: str
    status: IwStatus
    iw_segments: FastIwSegments | None
    iw_bytes: FastIwBytes | None
    mss: FastSegmentSize | None
    reason: FastIwReason
    connections: Annotated[int, Meta(ge=0, le=100)]
    connections_ok: Annotated[int, Meta(ge=0, le=100)]
    announced_mss: FastSegmentSize | None
    rtt_us: FastMicros | None
    family: Family
    tls_version: FastTlsVersion
    http_status: FastHttpStatus | None
    error_detail: Annotated[str, Meta(max_length=500)] | None = None
    protocol: Protocol = ""


class FastHeartbeat(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Mirror of :class:`iwscope.probes.schemas.HeartbeatIn`."""

    version: Annotated[str, Meta(max_length=64)]
    spool_backlog: Annotated[int, Meta(ge=0)]
    spool_bytes: Annotated[int, Meta(ge=0)]
    uptime_s: Annotated[float, Meta(ge=0)]
    trials_measured: Annotated[int, Meta(ge=0)]
    iw_capture: Annotated[str, Meta(max_length=200)] = ""


class FastTrialBatchEnvelope(msgspec.Struct, forbid_unknown_fields=True):
    """Mirror of :class:`iwscope.trials.schemas.TrialBatchIn`."""

    #: pydantic's ``Literal`` of the accepted versions (``WireVersion``) compares by equality: it
    #: takes ``1.0`` and ``true`` too; :func:`decode_trial_batch` checks membership by ``==``.
    wire_version: bool | int | float
    batch_id: FastUUID
    probe_id: FastUUID
    sent_at: str
    trials: Annotated[list[FastTrial], Meta(max_length=wire.MAX_BATCH_RECORDS)]
    path_samples: Annotated[list[FastPathSample], Meta(max_length=wire.MAX_BATCH_RECORDS)]
    heartbeat: FastHeartbeat | None = None
    census: Annotated[list[FastCensus], Meta(max_length=wire.MAX_BATCH_RECORDS)] = []


@dataclass(slots=True)
class FastTrialBatch:
    """A decoded, schema-valid batch with its timestamps parsed (aware datetimes)."""

    envelope: FastTrialBatchEnvelope
    sent_at: dt.datetime
    #: ``started_at`` of ``envelope.trials[i]``.
    started_at: list[dt.datetime]
    #: ``measured_at`` of ``envelope.path_samples[i]``.
    measured_at: list[dt.datetime]
    #: ``measured_at`` of ``envelope.census[i]``.
    census_measured_at: list[dt.datetime]

    @property
    def batch_id(self) -> str:
        return self.envelope.batch_id

    @property
    def probe_id(self) -> str:
        return self.envelope.probe_id

    @property
    def trials(self) -> list[FastTrial]:
        return self.envelope.trials

    @property
    def path_samples(self) -> list[FastPathSample]:
        return self.envelope.path_samples

    @property
    def census(self) -> list[FastCensus]:
        return self.envelope.census


def _check_wire_version(version: bool | int | float) -> None:
    """Raise ``ValueError`` unless pydantic's ``WireVersion`` takes ``version`` (by equality)."""
    if version not in wire.ACCEPTED_WIRE_VERSIONS:
        raise ValueError("unknown wire_version")


def _check_uuids(uuids: list[str]) -> None:
    """Raise ``ValueError`` unless every string of ``uuids`` matches ``UUID_PATTERN`` (one
    :mod:`re` call for the batch; their lengths were checked while decoding)."""
    if uuids and _UUIDS.fullmatch("\n".join(uuids) + "\n") is None:
        raise ValueError("a UUID does not match its pattern")


def _check_no_nul(body: bytes | str) -> None:
    """Raise ``ValueError`` when a string of the body may hold a NUL (see the module docstring)."""
    if (_NUL_ESCAPE.encode() in body) if isinstance(body, bytes) else (_NUL_ESCAPE in body):
        raise ValueError("a string may hold a NUL")


def _trial_batch_uuids(envelope: FastTrialBatchEnvelope) -> list[str]:
    uuids = [envelope.batch_id, envelope.probe_id]
    for trial in envelope.trials:
        uuids.append(trial.trial_id)
        uuids.append(trial.probe_id)
        if trial.origin_id is not None:
            uuids.append(trial.origin_id)
        if trial.page_id is not None:
            uuids.append(trial.page_id)
    for sample in envelope.path_samples:
        uuids.extend((sample.sample_id, sample.probe_id, sample.origin_id))
    for record in envelope.census:
        uuids.extend((record.census_id, record.probe_id))
    return uuids


def _parsed(envelope: FastTrialBatchEnvelope) -> FastTrialBatch:
    """The batch with its timestamps parsed (raises ``ValueError`` for a bad one)."""
    _check_wire_version(envelope.wire_version)
    _check_uuids(_trial_batch_uuids(envelope))
    return FastTrialBatch(
        envelope=envelope,
        sent_at=parse_rfc3339(envelope.sent_at),
        started_at=[parse_rfc3339(trial.started_at) for trial in envelope.trials],
        measured_at=[parse_rfc3339(sample.measured_at) for sample in envelope.path_samples],
        census_measured_at=[parse_rfc3339(record.measured_at) for record in envelope.census],
    )


class FastDecodeRefused(ValueError):
    """The fast decoder refused the body; pydantic decides and names the errors."""


_DECODER = msgspec.json.Decoder(FastTrialBatchEnvelope)


def decode_trial_batch(body: bytes | str) -> FastTrialBatch:
    """Decode and schema-check a ``TrialBatch`` body, or raise :class:`FastDecodeRefused`."""
    try:
        _check_no_nul(body)
        return _parsed(_DECODER.decode(body))
    except (msgspec.DecodeError, ValueError) as refused:  # msgspec.ValidationError is a DecodeError
        raise FastDecodeRefused(str(refused)) from None


def decode_or_refuse(body: bytes) -> FastTrialBatch:
    """The batch, decoded by the fast path when it can; pydantic has the last word.

    Raises pydantic's :class:`~pydantic.ValidationError` (naming every bad record and field)
    for a body the pydantic model refuses.  A body the fast decoder refuses but pydantic
    accepts (JSON objects with duplicate keys: pydantic keeps the last value, msgspec
    validates each) is stored as pydantic read it.
    """
    return _fast_or_reference(body, decode_trial_batch, TrialBatchIn, from_reference, "trial")


def _fast_or_reference(
    body: bytes,
    decode: Callable[[bytes], _Fast],
    model: type[_Reference],
    from_model: Callable[[_Reference], _Fast],
    kind: str,
) -> _Fast:
    """``decode(body)``, or when it refuses, ``model`` decides: its ``ValidationError`` (naming
    every bad field) propagates, and a body it accepts is read as it read it (logged)."""
    try:
        return decode(body)
    except FastDecodeRefused:
        reference = model.model_validate_json(body)  # raises the named errors
    log.info("%s batch %s decoded by pydantic (the fast decoder refused it)", kind, reference.batch_id)
    return from_model(reference)


def from_reference(reference: TrialBatchIn) -> FastTrialBatch:
    """The batch as the pydantic model read it."""
    document = reference.model_dump()
    document["sent_at"] = reference.sent_at.isoformat()
    for record, trial in zip(document["trials"], reference.trials, strict=True):
        record["started_at"] = trial.started_at.isoformat()
    for record, sample in zip(document["path_samples"], reference.path_samples, strict=True):
        record["measured_at"] = sample.measured_at.isoformat()
    for record, census in zip(document["census"], reference.census, strict=True):
        record["measured_at"] = census.measured_at.isoformat()
    return _parsed(msgspec.convert(document, FastTrialBatchEnvelope, strict=True))


# ----------------------------------------------------------------------------- origin observations
class FastObservation(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Mirror of :class:`iwscope.trials.schemas.OriginObservationIn` (``request_at`` still a string)."""

    trial_id: FastUUID
    origin_id: FastUUID
    arm_iw: FastIw
    port: FastPort
    client_addr: Annotated[str, Meta(min_length=1, max_length=64)]
    object_size: FastBytes
    request_at: str
    first_byte_us: FastMicros
    response_latency_us: FastMicros | None
    snd_cwnd_at_accept: Annotated[int, Meta(ge=0, le=1_000_000)]
    cwnd_mismatch: bool
    rwnd_limited: bool
    peer_rwnd: Annotated[int, Meta(ge=0, le=4_294_967_296)] | None
    http_status: FastHttpStatus
    error_kind: ErrorKind | None
    tcp_info: FastTcpInfo
    arm: FastArmLabel = ""
    tls_version: FastTlsVersion = ""
    tls_handshake_us: FastMicros | None = None
    tls_first_flight_bytes: Annotated[int, Meta(ge=0, le=16_777_216)] | None = None
    tls_flight_acked_us: FastMicros | None = None
    family: Family = ""
    send_path: SendPath = ""
    segmentation_offload: SegmentationOffload = ""
    protocol: Protocol = ""
    quic_first_flight_packets: Annotated[int, Meta(ge=0, le=QUIC_MAX_FLIGHT_PACKETS)] | None = None
    quic_first_flight_bytes: FastIwBytes | None = None
    quic_max_datagram_size: Annotated[int, Meta(ge=wire.QUIC_MIN_DATAGRAM_BYTES, le=QUIC_MAX_DATAGRAM_BYTES)] | None = None
    quic_lost_packets: Annotated[int, Meta(ge=0, le=BIGINT_MAX)] | None = None
    quic_zero_rtt: bool | None = None


class FastObservationBatchEnvelope(msgspec.Struct, forbid_unknown_fields=True):
    """Mirror of :class:`iwscope.trials.schemas.ObservationBatchIn`."""

    #: As :attr:`FastTrialBatchEnvelope.wire_version` (checked by ``==`` in :func:`decode_observation_batch`).
    wire_version: bool | int | float
    batch_id: FastUUID
    origin_id: FastUUID
    sent_at: str
    observations: Annotated[list[FastObservation], Meta(max_length=wire.MAX_BATCH_RECORDS)]


@dataclass(slots=True)
class FastObservationBatch:
    """A decoded, schema-valid observation batch with its timestamps parsed (aware datetimes)."""

    envelope: FastObservationBatchEnvelope
    sent_at: dt.datetime
    #: ``request_at`` of ``envelope.observations[i]``.
    request_at: list[dt.datetime]

    @property
    def batch_id(self) -> str:
        return self.envelope.batch_id

    @property
    def origin_id(self) -> str:
        return self.envelope.origin_id

    @property
    def observations(self) -> list[FastObservation]:
        return self.envelope.observations


def _parsed_observations(envelope: FastObservationBatchEnvelope) -> FastObservationBatch:
    """The observation batch with its timestamps parsed (raises ``ValueError`` for a bad one)."""
    _check_wire_version(envelope.wire_version)
    uuids = [envelope.batch_id, envelope.origin_id]
    for observation in envelope.observations:
        uuids.append(observation.trial_id)
        uuids.append(observation.origin_id)
    _check_uuids(uuids)
    return FastObservationBatch(
        envelope=envelope,
        sent_at=parse_rfc3339(envelope.sent_at),
        request_at=[parse_rfc3339(observation.request_at) for observation in envelope.observations],
    )


_OBSERVATION_DECODER = msgspec.json.Decoder(FastObservationBatchEnvelope)


def decode_observation_batch(body: bytes | str) -> FastObservationBatch:
    """Decode and schema-check an ``ObservationBatch`` body, or raise :class:`FastDecodeRefused`."""
    try:
        _check_no_nul(body)
        return _parsed_observations(_OBSERVATION_DECODER.decode(body))
    except (msgspec.DecodeError, ValueError) as refused:  # msgspec.ValidationError is a DecodeError
        raise FastDecodeRefused(str(refused)) from None


def decode_or_refuse_observations(body: bytes) -> FastObservationBatch:
    """The observation batch, decoded by the fast path when it can; pydantic has the last word.

    As :func:`decode_or_refuse`: raises pydantic's :class:`~pydantic.ValidationError` for a body
    :class:`~iwscope.trials.schemas.ObservationBatchIn` refuses; a body only the fast decoder
    refuses (duplicate keys) is stored as pydantic read it.
    """
    return _fast_or_reference(body, decode_observation_batch, ObservationBatchIn, observations_from_reference, "observation")


def observations_from_reference(reference: ObservationBatchIn) -> FastObservationBatch:
    """The observation batch as the pydantic model read it."""
    document = reference.model_dump()
    document["sent_at"] = reference.sent_at.isoformat()
    for record, observation in zip(document["observations"], reference.observations, strict=True):
        record["request_at"] = observation.request_at.isoformat()
    return _parsed_observations(msgspec.convert(document, FastObservationBatchEnvelope, strict=True))
