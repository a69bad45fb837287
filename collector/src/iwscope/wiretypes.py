"""Pydantic building blocks that mirror the constraints of ``iwprobe/wire.schema.json``.

Every ``*In`` model of a wire record is built from these, with ``extra="forbid"`` and strict
types (JSON strings are not coerced to numbers), so that a document is accepted by the
pydantic model iff the JSON Schema accepts it; ``tests/collector/test_collector_wire_contract.py``
checks that on sample documents.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Literal, TypeAlias

from pydantic import ConfigDict, Field, PlainValidator, StringConstraints

from iwprobe import wire

#: Configuration of every wire model: unknown fields are errors, no type coercion.
WIRE_MODEL_CONFIG = ConfigDict(extra="forbid", strict=True, frozen=False)

#: Free text holds no NUL: PostgreSQL ``text`` and ``jsonb`` cannot store U+0000, so a NUL
#: must be a 422 naming the field, not a database error (schema: ``"^[^\\u0000]*$"``).
NO_NUL_PATTERN = r"^[^\x00]*$"
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
TIMESTAMP_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$")

#: Largest value a PostgreSQL ``bigint`` holds (typed ``tcpi_*`` columns).
BIGINT_MAX = 2**63 - 1
US_MAX = 86_400_000_000
SIZE_MAX = 17_179_869_184


def parse_rfc3339(value: object) -> dt.datetime:
    """Only RFC 3339 strings with an offset (as the schema's pattern) become (aware) datetimes.

    A plain validator (one Python call per value, no second pass through pydantic's datetime
    validator): this runs for every record of every batch.  The fast decoder
    (:mod:`iwscope.trials.fastwire`) checks timestamps with it too, so both agree.
    """
    if isinstance(value, str) and TIMESTAMP_PATTERN.match(value):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            pass  # e.g. month 13: matches the pattern, is no date-time
    elif isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value
    raise ValueError("must be an RFC 3339 UTC timestamp like 2026-11-22T10:00:00.123456Z")


WireUUID = Annotated[str, StringConstraints(pattern=UUID_PATTERN)]
#: Constraint of every free-text field: ``Annotated[str, Field(max_length=...), NO_NUL]``.
NO_NUL = StringConstraints(pattern=NO_NUL_PATTERN)


CampaignId = Annotated[int, Field(ge=1, le=BIGINT_MAX)]
WireTimestamp = Annotated[dt.datetime, PlainValidator(parse_rfc3339, json_schema_input_type=str)]
Micros = Annotated[int, Field(ge=0, le=US_MAX)]
Bytes = Annotated[int, Field(ge=0, le=SIZE_MAX)]
Iw = Annotated[int, Field(ge=1, le=1000)]
Port = Annotated[int, Field(ge=1, le=65535)]
#: ``wire.ERROR_KINDS`` spelled out (a type checker cannot read a tuple as a ``Literal``); the
#: pydantic models and the fast decoder both use it; a test checks that it equals the probe's tuple.
ErrorKind = Literal["dns", "refused", "reset", "timeout", "short_body", "http_status", "protocol", "other", "tls"]
TcpInfoField = Literal[wire.TCP_INFO_FIELDS]  # type: ignore[valid-type]
TcpInfo = Annotated[dict[TcpInfoField, Annotated[int, Field(ge=0, le=BIGINT_MAX)]], Field(max_length=128)]
#: Wire versions the collector accepts: ``wire.ACCEPTED_WIRE_VERSIONS``, every version since 1 (older
#: probes and origins keep working; what each version added: ``WIRE_VERSION``'s comment in wire.py).
WireVersion = Literal[wire.ACCEPTED_WIRE_VERSIONS]  # type: ignore[valid-type]
#: The versions an envelope introduced later is accepted at: its first and every one after, so
#: a bump of ``wire.WIRE_VERSION`` cannot leave it behind (the passive batch refused v7 once).
PassiveWireVersion: TypeAlias = Literal[tuple(v for v in wire.ACCEPTED_WIRE_VERSIONS if v >= 6)]  # type: ignore[valid-type]
TraceWireVersion: TypeAlias = Literal[tuple(v for v in wire.ACCEPTED_WIRE_VERSIONS if v >= 7)]  # type: ignore[valid-type]
#: An arm's label (see ``iwprobe._arms``): ``N``, ``Np`` (paced), ``Nq``/``Npq`` (the same over
#: QUIC, wire v9) or ``learned``; empty = plain.
ArmLabel = Annotated[str, StringConstraints(pattern=wire.ARM_LABEL_PATTERN, max_length=16)]
#: The IP version a record says (``wire.FAMILIES``); empty = not said (before wire v4).
Family: TypeAlias = Literal[wire.FAMILIES]  # type: ignore[valid-type]
#: The IP versions a record or a campaign may name (``wire.FAMILIES`` without "not said"), as
#: a type, and the ``family`` column's check (trials, observations, campaigns).
NAMED_FAMILIES: tuple[str, ...] = tuple(family for family in wire.FAMILIES if family)
NamedFamily: TypeAlias = Literal[NAMED_FAMILIES]  # type: ignore[valid-type]
FAMILY_KNOWN_SQL = f"family IN ({', '.join(repr(family) for family in NAMED_FAMILIES)})"
#: How the origin wrote a response (``wire.SEND_PATHS``, wire v8); empty = not said.
SendPath: TypeAlias = Literal[wire.SEND_PATHS]  # type: ignore[valid-type]
#: What the origin's device did with TCP's large sends (``wire.SEGMENTATION_OFFLOADS``, wire v8);
#: empty = not said.
SegmentationOffload: TypeAlias = Literal[wire.SEGMENTATION_OFFLOADS]  # type: ignore[valid-type]
#: The send paths a record may name (without "not said"): the analysis filter's choices.
NAMED_SEND_PATHS: tuple[str, ...] = tuple(path for path in wire.SEND_PATHS if path)
#: The checks of ``origin_observations.send_path`` / ``segmentation_offload`` (NOT NULL, ``''``:
#: not said, so the check lists every wire value, the empty one included).
SEND_PATH_KNOWN_SQL = f"send_path IN ({', '.join(repr(path) for path in wire.SEND_PATHS)})"
SEGMENTATION_OFFLOAD_KNOWN_SQL = f"segmentation_offload IN ({', '.join(repr(offload) for offload in wire.SEGMENTATION_OFFLOADS)})"
#: The transport a record says (``wire.PROTOCOLS``, wire v9): ``tcp`` or ``quic``; empty = not
#: said, which is TCP (every record before v9).
Protocol: TypeAlias = Literal[wire.PROTOCOLS]  # type: ignore[valid-type]
#: The transports a record may name (``wire.PROTOCOLS`` without "not said"), and the ``protocol``
#: column's check (trials, observations, census records): NULL is "not said", as for ``family``.
NAMED_PROTOCOLS: tuple[str, ...] = tuple(protocol for protocol in wire.PROTOCOLS if protocol)
PROTOCOL_KNOWN_SQL = f"protocol IN ({', '.join(repr(protocol) for protocol in NAMED_PROTOCOLS)})"
#: Wire v9, a QUIC observation's first flight: its datagrams, and the datagram size its window is
#: counted in (RFC 9000 14.1: at least ``wire.QUIC_MIN_DATAGRAM_BYTES``; at most a UDP payload).
QUIC_MAX_FLIGHT_PACKETS = 100_000
QUIC_MAX_DATAGRAM_BYTES = 65_527
QuicPackets = Annotated[int, Field(ge=0, le=QUIC_MAX_FLIGHT_PACKETS)]
QuicDatagramSize = Annotated[int, Field(ge=wire.QUIC_MIN_DATAGRAM_BYTES, le=QUIC_MAX_DATAGRAM_BYTES)]
#: The TLS version a record says (``"TLSv1.3"``); empty = plain HTTP.
TlsVersion = Annotated[str, StringConstraints(max_length=wire.MAX_TLS_VERSION_CHARS, pattern=NO_NUL_PATTERN)]
#: A trial's flow role (``wire.FLOW_ROLES``); empty = wire v1/v2 (from the URL fragment).
FlowRole: TypeAlias = Literal[("",) + wire.FLOW_ROLES]  # type: ignore[valid-type]
#: What an IW inference says (``wire.IW_STATUSES``, spelled out for the type checker; a test
#: checks they agree) and why it is not ``ok`` (a lowercase word).
IwStatus = Literal["ok", "lower_bound", "undetermined"]
IW_REASON_PATTERN = r"^[a-z_]*$"
IwReason = Annotated[str, StringConstraints(max_length=wire.MAX_IW_REASON_CHARS, pattern=IW_REASON_PATTERN)]
IwSegments = Annotated[int, Field(ge=0, le=wire.MAX_IW_SEGMENTS)]
IwBytes = Annotated[int, Field(ge=0, le=16_777_216)]
SegmentSize = Annotated[int, Field(ge=1, le=65535)]
#: A census target: an absolute http(s) URL (the schema's pattern; the campaign API parses it further).
CENSUS_URL_PATTERN = r"^https?://[^\x00]*$"
CensusUrl = Annotated[str, StringConstraints(min_length=1, max_length=wire.MAX_CENSUS_URL_CHARS, pattern=CENSUS_URL_PATTERN)]

# ----------------------------------------------------------------------------- wire v6: passive
#: A passive arm's label: ``default`` or an IW in segments as text (the schema's pattern; the
#: campaign API also bounds the IW to ``1..wire.MAX_PASSIVE_IW``).
PassiveArmLabel = Annotated[str, StringConstraints(pattern=wire.PASSIVE_ARM_PATTERN)]
#: A share of client prefixes in basis points (``wire.PASSIVE_SHARE_SCALE`` = all of them).
ShareBp = Annotated[int, Field(ge=0, le=wire.PASSIVE_SHARE_SCALE)]
#: A study's phase (incremented by every change of its shares).
Phase = Annotated[int, Field(ge=0, le=1_000_000)]
PrefixV4 = Annotated[int, Field(ge=wire.PASSIVE_PREFIX_V4_RANGE[0], le=wire.PASSIVE_PREFIX_V4_RANGE[1])]
PrefixV6 = Annotated[int, Field(ge=wire.PASSIVE_PREFIX_V6_RANGE[0], le=wire.PASSIVE_PREFIX_V6_RANGE[1])]
AssignmentSeed = Annotated[int, Field(ge=0, le=2**32 - 1)]
SampleShare = Annotated[float, Field(ge=0, le=1)]
FlushInterval = Annotated[int, Field(ge=1, le=3600)]
#: The IW an arm gave, as a record reports it (``None``: unknown).
ArmIw = Annotated[int, Field(ge=1, le=65535)]
#: The cluster of a client prefix (``wire.PASSIVE_CLUSTER_GROUPS`` of them).
Cluster = Annotated[int, Field(ge=0, le=wire.PASSIVE_CLUSTER_GROUPS - 1)]
#: Keyed hash of a client's prefix: exactly 16 lower-case hex digits, so nothing else (an
#: address, say) fits in the field.
CLIENT_PREFIX_PATTERN = rf"^[0-9a-f]{{{wire.CLIENT_PREFIX_HEX_CHARS}}}$"
ClientPrefix = Annotated[str, StringConstraints(pattern=CLIENT_PREFIX_PATTERN)]
#: An ISO country code, or ``""`` (unknown).
Country = Annotated[str, StringConstraints(pattern=r"^(?:[A-Z]{2})?$")]
#: Where a passive connection came in (``wire.PASSIVE_PORT_KINDS``).
PortKind: TypeAlias = Literal[wire.PASSIVE_PORT_KINDS]  # type: ignore[valid-type]
#: A count of connections, segments or bytes (a PostgreSQL bigint).
Count = Annotated[int, Field(ge=0, le=BIGINT_MAX)]
#: A client region of a passive record (``""``: unknown).
ClientRegion = Annotated[str, StringConstraints(max_length=64, pattern=NO_NUL_PATTERN)]
