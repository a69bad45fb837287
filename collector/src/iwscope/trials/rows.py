"""How validated records become rows: the records go to PostgreSQL as the wire's own JSON, and
SQL makes each row from its record.

:mod:`iwscope.trials.services` sends a group's records as ONE JSON document per table
(:func:`document`: msgspec encodes the decoded Structs in one C pass) and inserts them in one
statement.  Each row is read from its record by ``json_populate_record`` (the table's own
column types parse each value, as COPY did) plus the expressions of :func:`trial_row_sql` and
:func:`observation_row_sql` for the columns a record does not carry as such: the typed
``tcpi_*`` columns out of ``tcp_info``, the client-side IW out of ``client_iw``, NULL for the
empty strings of "not said" (``family``, ``protocol``, ...), the plain arm as NULL and the flow
role of a wire-v1/v2 URL.

Building each row as a Python dict instead cost 5-9 us of API CPU per trial (45 keys, a
dozen lookups) where the encoding costs 1.1-1.6 us (docs/ingest-throughput.md).
``tests/collector/test_collector_rows.py`` stores records that exercise every derived column
and checks each stored value against the wire's Python rules.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from typing import TypeVar

import msgspec
from sqlalchemy import Table
from sqlalchemy.dialects import postgresql

from iwprobe import wire
from iwscope.trials import fastwire
from iwscope.trials.models import OBSERVATION_TCPI_COLUMNS, TRIAL_TCPI_COLUMNS, OriginObservation, Trial, tcpi_column_name

TRIAL_WIRE_COLUMNS = (
    "trial_id",
    "started_at",
    "probe_id",
    "campaign_id",
    "origin_id",
    "round",
    "arm_iw",
    "object_size",
    "url",
    "dns_us",
    "connect_us",
    "ttfb_us",
    "total_us",
    "bytes_received",
    "http_status",
    "error_kind",
    "error_detail",
    "syn_retrans",
)
TRIAL_STAGE_COLUMNS = (
    TRIAL_WIRE_COLUMNS
    + tuple(tcpi_column_name(name) for name in TRIAL_TCPI_COLUMNS)
    + (
        "tcp_info",
        "arm",
        "role",
        "page_id",
        "echo",
        "tls_version",
        "tls_handshake_us",
        "family",
        "client_iw_status",
        "client_iw_segments",
        "client_iw_bytes",
        "client_iw_mss",
        "client_iw_reason",
        "protocol",
    )
)
SAMPLE_COLUMNS = ("sample_id", "probe_id", "origin_id", "measured_at", "min_rtt_us", "bottleneck_bps", "transfer_bytes", "method")
OBSERVATION_WIRE_COLUMNS = (
    "trial_id",
    "origin_id",
    "arm_iw",
    "port",
    "client_addr",
    "object_size",
    "request_at",
    "first_byte_us",
    "response_latency_us",
    "snd_cwnd_at_accept",
    "cwnd_mismatch",
    "rwnd_limited",
    "peer_rwnd",
    "http_status",
    "error_kind",
    "arm",
    "tls_version",
    "tls_handshake_us",
    "tls_first_flight_bytes",
    "tls_flight_acked_us",
    "family",
    "send_path",
    "segmentation_offload",
    "protocol",
    "quic_first_flight_packets",
    "quic_first_flight_bytes",
    "quic_max_datagram_size",
    "quic_lost_packets",
    "quic_zero_rtt",
)
OBSERVATION_STAGE_COLUMNS = (
    OBSERVATION_WIRE_COLUMNS + tuple(tcpi_column_name(name) for name in OBSERVATION_TCPI_COLUMNS) + ("tcp_info",)
)

#: A trial's server-side columns, each with the ``origin_observations`` column it is copied from
#: when the trial is joined to its observation (by the ingest statement when the observation
#: came first, else by the worker's join: both read this).
SERVER_SIDE_COLUMNS = {
    "server_latency_us": "response_latency_us",
    "server_first_byte_us": "first_byte_us",
    "server_total_retrans": "tcpi_total_retrans",
    "server_bytes_retrans": "tcpi_bytes_retrans",
    "server_bytes_sent": "tcpi_bytes_sent",
    "server_snd_cwnd_at_accept": "snd_cwnd_at_accept",
    "cwnd_mismatch": "cwnd_mismatch",
    "rwnd_limited": "rwnd_limited",
    "server_tls_handshake_us": "tls_handshake_us",
    "server_tls_first_flight_bytes": "tls_first_flight_bytes",
    "server_tls_flight_acked_us": "tls_flight_acked_us",
}

_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def columns(names: Iterable[str]) -> str:
    return ", ".join(names)


def _sql_type(table: Table, column: str) -> str:
    """The column's type as PostgreSQL spells it (the model is its one home)."""
    return str(table.c[column].type.compile(dialect=_DIALECT))


def _tcpi(table: Table, fields: Sequence[str]) -> dict[str, str]:
    """The typed ``tcpi_*`` columns, each out of the record's ``tcp_info`` (NULL when absent)."""
    return {tcpi_column_name(name): f"(r.tcp_info->>'{name}')::{_sql_type(table, tcpi_column_name(name))}" for name in fields}


def _not_said(column: str) -> str:
    """The wire's empty string ("not said") as NULL."""
    return f"NULLIF(r.{column}, '')"


def _regex_literal(text: str) -> str:
    """``text`` matched literally by a PostgreSQL regular expression, inside a SQL string literal."""
    escaped = re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)
    assert "'" not in escaped and "%" not in escaped  # neither a quote nor a psycopg placeholder
    return escaped


def _flow_role_sql() -> str:
    """:func:`iwprobe.wire.flow_role` in SQL: the ``role`` field, else the role named after the
    URL's last flow fragment, else ``short``."""
    fragment = f"substring(r.url FROM '.*{_regex_literal(wire.FLOW_FRAGMENT_PREFIX)}(.*)$')"
    roles = ", ".join(f"'{role}'" for role in wire.FLOW_ROLES)
    return f"CASE WHEN r.role <> '' THEN r.role WHEN {fragment} IN ({roles}) THEN {fragment} ELSE 'short' END"


def _trial_expressions() -> dict[str, str]:
    table = Trial.__table__
    assert isinstance(table, Table)
    inference = "j->'client_iw'"
    derived = {
        **_tcpi(table, TRIAL_TCPI_COLUMNS),
        # wire.is_plain_arm: an empty label (wire v1) or the IW itself is the plain arm
        "arm": "NULLIF(NULLIF(r.arm, ''), r.arm_iw::text)",
        "role": _flow_role_sql(),
        "tls_version": _not_said("tls_version"),
        "family": _not_said("family"),
        "client_iw_status": f"{inference}->>'status'",
        "client_iw_segments": f"({inference}->>'segments')::{_sql_type(table, 'client_iw_segments')}",
        "client_iw_bytes": f"({inference}->>'bytes')::{_sql_type(table, 'client_iw_bytes')}",
        "client_iw_mss": f"({inference}->>'mss')::{_sql_type(table, 'client_iw_mss')}",
        "client_iw_reason": f"NULLIF({inference}->>'reason', '')",
        "protocol": _not_said("protocol"),
    }
    return {column: derived.get(column, f"r.{column}") for column in TRIAL_STAGE_COLUMNS}


def _observation_expressions() -> dict[str, str]:
    table = OriginObservation.__table__
    assert isinstance(table, Table)
    derived = {
        **_tcpi(table, OBSERVATION_TCPI_COLUMNS),
        "arm": _not_said("arm"),
        "tls_version": _not_said("tls_version"),
        "family": _not_said("family"),
        "protocol": _not_said("protocol"),
        # send_path stays '' ("not said"): its column is NOT NULL
    }
    return {column: derived.get(column, f"r.{column}") for column in OBSERVATION_STAGE_COLUMNS}


def _row_sql(expressions: dict[str, str], table: str, document: str, starts: str) -> str:
    select = ",\n        ".join(f"{expression} AS {column}" for column, expression in expressions.items())
    return (
        f"SELECT {select},\n        width_bucket(e.at, {starts}::text::int[]) AS upload, e.at\n"
        f"    FROM json_array_elements({document}::text::json) WITH ORDINALITY AS e(j, at),"
        f" json_populate_record(NULL::{table}, e.j) AS r"
    )


def trial_row_sql(document: str, starts: str) -> str:
    """A ``SELECT`` of one ``trials`` row (``TRIAL_STAGE_COLUMNS``, then ``upload`` and ``at``) per
    record of ``document`` (placeholders such as ``$1``, ``$2``): the group's records as one JSON
    array and where each upload's begin in it, from 1 (:func:`grouped_document`).  ``upload`` is
    the record's upload (its position, from 1) and ``at`` its place in the group: of several
    records of one UUID the statement keeps the first (``ORDER BY ..., at``).  One flat array, not
    one per upload, and no ``DISTINCT ON`` here: either made the planner misjudge the group's
    size (a product of two functions' estimates, or a single row) and plan the statement's
    lookups as scans of whole tables -- PostgreSQL's CPU per trial rose tenfold in the fleet's
    benchmark."""
    return _row_sql(_trial_expressions(), "trials", document, starts)


def observation_row_sql(document: str, starts: str) -> str:
    """As :func:`trial_row_sql`: ``origin_observations`` rows (``OBSERVATION_STAGE_COLUMNS``, ``upload``, ``at``)."""
    return _row_sql(_observation_expressions(), "origin_observations", document, starts)


def sample_row_sql(document: str, starts: str) -> str:
    """As :func:`trial_row_sql`, one ``path_samples`` row (``SAMPLE_COLUMNS``, ``upload``, ``at``) per record."""
    return _row_sql({column: f"r.{column}" for column in SAMPLE_COLUMNS}, "path_samples", document, starts)


def utc_text(original: str, parsed: dt.datetime) -> str:
    """A validated timestamp as PostgreSQL reads it: the wire text itself when it is plain UTC
    (``...Z``, ASCII), else the instant converted to UTC (PostgreSQL refuses offsets beyond
    +-15:59, which Python accepts)."""
    if original[-1] == "Z" and original.isascii():
        return original
    return parsed.astimezone(dt.UTC).isoformat()


Record = TypeVar("Record", fastwire.FastTrial, fastwire.FastPathSample, fastwire.FastObservation)


def in_utc(record: Record, field: str, parsed: dt.datetime) -> Record:
    """``record`` with its timestamp ``field`` as :func:`utc_text` (a copy only when it changes)."""
    original: str = getattr(record, field)
    text = utc_text(original, parsed)
    return record if text is original else msgspec.structs.replace(record, **{field: text})


_ENCODER = msgspec.json.Encoder()


def records_in_utc(records: Sequence[Record], field: str, parsed: Sequence[dt.datetime]) -> Sequence[Record]:
    """``records`` with their timestamps ``field`` as :func:`utc_text`: the same list when every
    one is already plain UTC (``...Z``, as probes and origins send them), else a list of copies
    where needed."""
    if all(getattr(record, field)[-1:] == "Z" and getattr(record, field).isascii() for record in records):
        return records
    return [in_utc(record, field, instant) for record, instant in zip(records, parsed, strict=True)]


def grouped_document(uploads: Iterable[Sequence[msgspec.Struct]]) -> tuple[str, str]:
    """A group's records as one JSON array, as the wire spells them (their timestamps in UTC:
    :func:`records_in_utc`), and where each upload's begin in it (from 1; an empty upload begins
    where the next one does), as PostgreSQL's text of an ``int[]`` -- what :func:`trial_row_sql`
    and the others read.  msgspec encodes each upload's records in one C pass and the group is
    joined as bytes: no Python work per record (dropping the duplicates of a group, which a
    dictionary of every record did, is the statement's: the first record of a UUID wins)."""
    parts: list[bytes] = []
    starts: list[str] = []
    at = 1
    for records in uploads:
        starts.append(str(at))
        if records:
            parts.append(_ENCODER.encode(records)[1:-1])
            at += len(records)
    return (b"[" + b",".join(parts) + b"]").decode(), "{" + ",".join(starts or ["1"]) + "}"
