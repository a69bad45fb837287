"""Storage of a validated ``PassiveBatch``: all or nothing, idempotent by record UUID.

Each section goes in with one set-based statement, ``INSERT ... SELECT FROM unnest(...) ON
CONFLICT DO NOTHING`` (the census records' way, :mod:`iwscope.trials.census`): a record whose
UUID was stored before -- a replay after a lost answer, even with other values -- is a
duplicate and changes nothing, and a batch of 5,000 records is two statements, not 5,000.
A latency histogram travels as an array literal per row (``{3,17}``) cast to ``int[]`` in the
statement, since ``unnest`` cannot carry arrays of different lengths.

Before any insert, in the same transaction, every campaign the records name is read once: it
must be a passive campaign that includes this server, at a phase no earlier than the record's.
The heartbeat, if any, is stored (or ``last_seen_at`` refreshed) as the transaction's last
statement, as trial uploads do.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy.engine import Engine

from iwscope.metrics import RECORDS
from iwscope.passive.models import CONNECTION_TCPI_COLUMNS
from iwscope.passive.schemas import PassiveAggregateIn, PassiveBatchIn, PassiveConnectionIn
from iwscope.servers.services import heartbeat_values
from iwscope.trials.models import tcpi_column_name
from iwscope.trials.schemas import RecordError
from iwscope.trials.services import touch_last_seen
from iwscope.trials.validation import BatchRejected
from iwscope.types import utcnow


@dataclass
class PassiveResult:
    batch_id: str
    accepted: int
    duplicates: int


#: (column, PostgreSQL array type the values travel as, expression stored) of ``passive_aggregates``.
_AGGREGATE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("aggregate_id", "uuid", ""),
    ("server_id", "uuid", ""),
    ("campaign_id", "bigint", ""),
    ("phase", "int", ""),
    ("hour", "timestamptz", ""),
    ("arm", "text", ""),
    ("arm_iw", "int", ""),
    ("treated_share_bp", "smallint", ""),
    ("family", "text", ""),
    ("port_kind", "text", ""),
    ("region", "text", ""),
    ("cluster", "smallint", ""),
    ("rtt_bucket", "smallint", ""),
    ("bandwidth_bucket", "smallint", ""),
    ("bdp_bucket", "smallint", ""),
    ("size_octave", "smallint", ""),
    ("biased", "boolean", ""),
    ("connections", "bigint", ""),
    ("responses", "bigint", ""),
    ("latency_sum_us", "bigint", ""),
    ("latency_bins", "text", "::int[]"),
    ("latency_counts", "text", "::bigint[]"),
    ("retrans_connections", "bigint", ""),
    ("data_segs_out", "bigint", ""),
    ("total_retrans", "bigint", ""),
    ("bytes_acked", "bigint", ""),
    ("bytes_retrans", "bigint", ""),
    ("syn_retrans", "bigint", ""),
    ("rwnd_limited", "bigint", ""),
    ("reused_after_idle", "bigint", ""),
    ("tls", "bigint", ""),
)
_CONNECTION_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("record_id", "uuid", ""),
    ("server_id", "uuid", ""),
    ("campaign_id", "bigint", ""),
    ("phase", "int", ""),
    ("closed_at", "timestamptz", ""),
    ("arm", "text", ""),
    ("arm_iw", "int", ""),
    ("treated_share_bp", "smallint", ""),
    ("family", "text", ""),
    ("port_kind", "text", ""),
    ("port", "int", ""),
    ("region", "text", ""),
    ("country", "text", ""),
    ("client_prefix", "text", ""),
    ("cluster", "smallint", ""),
    *((tcpi_column_name(name), "bigint", "") for name in CONNECTION_TCPI_COLUMNS),
    ("tcp_info", "text", "::jsonb"),
    ("captured", "boolean", ""),
    ("tls", "boolean", ""),
    ("response_latency_us", "bigint", ""),
    ("response_bytes", "bigint", ""),
    ("handshake_us", "bigint", ""),
    ("first_flight_segments", "int", ""),
    ("first_flight_bytes", "bigint", ""),
    ("handshake_rtt_us", "bigint", ""),
    ("client_rwnd_bytes", "bigint", ""),
    ("syn_retrans", "boolean", ""),
    ("rwnd_limited", "boolean", ""),
    ("reused_after_idle", "boolean", ""),
    ("exchanges", "int", ""),
)


def _insert_sql(table: str, key: str, columns: Sequence[tuple[str, str, str]]) -> str:
    names = ", ".join(name for name, _, _ in columns)
    arrays = ", ".join(f"%s::{kind}[]" for _, kind, _ in columns)
    stored = ", ".join(f"u.{name}{cast}" for name, _, cast in columns)
    return (
        f"INSERT INTO {table} ({names}, received_at) SELECT {stored}, now() "
        f"FROM unnest({arrays}) AS u({names}) ON CONFLICT ({key}) DO NOTHING"
    )


_INSERT_AGGREGATES = _insert_sql("passive_aggregates", "aggregate_id", _AGGREGATE_COLUMNS)
_INSERT_CONNECTIONS = _insert_sql("passive_connections", "record_id", _CONNECTION_COLUMNS)


def _int_array(values: Sequence[int]) -> str:
    """An array literal of integers (``{3,17}``)."""
    return "{" + ",".join(str(value) for value in values) + "}"


def _aggregate_row(record: PassiveAggregateIn) -> tuple[Any, ...]:
    histogram = sorted(record.latency_hist)
    return (
        record.aggregate_id,
        record.server_id,
        record.campaign_id,
        record.phase,
        record.hour.astimezone(dt.UTC),
        record.arm,
        record.arm_iw,
        record.treated_share_bp,
        record.family,
        record.port_kind,
        record.region,
        record.cluster,
        record.rtt_bucket,
        record.bandwidth_bucket,
        record.bdp_bucket,
        record.size_octave,
        record.biased,
        record.connections,
        record.responses,
        record.latency_sum_us,
        _int_array([pair[0] for pair in histogram]),
        _int_array([pair[1] for pair in histogram]),
        record.retrans_connections,
        record.data_segs_out,
        record.total_retrans,
        record.bytes_acked,
        record.bytes_retrans,
        record.syn_retrans,
        record.rwnd_limited,
        record.reused_after_idle,
        record.tls,
    )


def _connection_row(record: PassiveConnectionIn) -> tuple[Any, ...]:
    tcp_info = record.tcp_info
    return (
        record.record_id,
        record.server_id,
        record.campaign_id,
        record.phase,
        record.closed_at.astimezone(dt.UTC),
        record.arm,
        record.arm_iw,
        record.treated_share_bp,
        record.family,
        record.port_kind,
        record.port,
        record.region,
        record.country,
        record.client_prefix,
        record.cluster,
        *(tcp_info.get(name) for name in CONNECTION_TCPI_COLUMNS),
        orjson.dumps(tcp_info).decode(),
        record.captured,
        record.tls,
        record.response_latency_us,
        record.response_bytes,
        record.handshake_us,
        record.first_flight_segments,
        record.first_flight_bytes,
        record.handshake_rtt_us,
        record.client_rwnd_bytes,
        record.syn_retrans,
        record.rwnd_limited,
        record.reused_after_idle,
        record.exchanges,
    )


def _insert(cursor: psycopg.Cursor[Any], statement: str, rows: Sequence[tuple[Any, ...]]) -> int:
    """Insert ``rows`` (one statement, column arrays); how many were new."""
    if not rows:
        return 0
    cursor.execute(statement, [list(column) for column in zip(*rows, strict=True)])
    return int(cursor.rowcount)


@dataclass(frozen=True)
class _Named:
    """What a record says of its campaign (for :func:`campaign_errors`)."""

    section: str
    index: int
    record_id: str
    campaign_id: int
    phase: int


def _named(batch: PassiveBatchIn) -> list[_Named]:
    return [
        _Named("aggregates", index, record.aggregate_id, record.campaign_id, record.phase)
        for index, record in enumerate(batch.aggregates)
    ] + [
        _Named("connections", index, record.record_id, record.campaign_id, record.phase)
        for index, record in enumerate(batch.connections)
    ]


def campaign_errors(cursor: psycopg.Cursor[Any], batch: PassiveBatchIn, server_id: uuid.UUID) -> list[RecordError]:
    """Records whose campaign is unknown, not passive, without this server, or behind their phase."""
    named = _named(batch)
    if not named:
        return []
    cursor.execute(
        "SELECT id, server_ids, phase FROM campaigns WHERE id = ANY(%s::bigint[])",
        (sorted({record.campaign_id for record in named}),),
    )
    campaigns: dict[int, tuple[list[uuid.UUID] | None, int | None]] = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
    errors: list[RecordError] = []

    def problem(record: _Named) -> tuple[str, str] | None:
        found = campaigns.get(record.campaign_id)
        if found is None:
            return "campaign_id", "unknown campaign"
        servers, phase = found
        if servers is None:
            return "campaign_id", f"campaign {record.campaign_id} is not a passive campaign"
        if server_id not in servers:
            return "campaign_id", f"this server is not part of passive campaign {record.campaign_id}"
        if phase is not None and record.phase > phase:
            return "phase", f"phase {record.phase} is ahead of the campaign's phase {phase}"
        return None

    for record in named:
        found = problem(record)
        if found is not None:
            errors.append(
                RecordError(
                    section=record.section, index=record.index, record_id=record.record_id, field=found[0], message=found[1]
                )
            )
    return errors


def _store_heartbeat(connection: psycopg.Connection[Any], server_id: uuid.UUID, heartbeat: dict[str, Any]) -> None:
    """The heartbeat folded into the upload, as the batch transaction's last statement (the caller commits)."""
    values = heartbeat_values(heartbeat, utcnow())
    connection.execute(
        "UPDATE servers SET last_seen_at = %s, version = %s, last_heartbeat = %s WHERE id = %s",
        (values["last_seen_at"], values["version"], Jsonb(values["last_heartbeat"]), server_id),
    )


def store_passive_batch(engine: Engine, batch: PassiveBatchIn, server_id: uuid.UUID) -> PassiveResult:
    """Store a validated batch of ``server_id`` in one transaction (all or nothing, idempotent by
    UUID); raises ``BatchRejected`` (422, nothing stored) for records of a wrong campaign."""
    pooled = engine.raw_connection()
    try:
        connection: psycopg.Connection[Any] = pooled.driver_connection  # type: ignore[assignment]
        with connection.cursor() as cursor:
            errors = campaign_errors(cursor, batch, server_id)
            if errors:
                raise BatchRejected(422, "invalid batch: nothing was stored", errors)
            new_aggregates = _insert(cursor, _INSERT_AGGREGATES, [_aggregate_row(record) for record in batch.aggregates])
            new_connections = _insert(cursor, _INSERT_CONNECTIONS, [_connection_row(record) for record in batch.connections])
        if batch.heartbeat is not None:
            _store_heartbeat(connection, server_id, batch.heartbeat.model_dump())
        else:
            touch_last_seen(connection, "servers", server_id)
        connection.commit()
    except BaseException:
        pooled.rollback()
        raise
    finally:
        pooled.close()
    _count("passive_aggregate", new_aggregates, len(batch.aggregates))
    _count("passive_connection", new_connections, len(batch.connections))
    total = len(batch.aggregates) + len(batch.connections)
    accepted = new_aggregates + new_connections
    return PassiveResult(batch_id=batch.batch_id, accepted=accepted, duplicates=total - accepted)


def _count(kind: str, accepted: int, sent: int) -> None:
    RECORDS.labels(kind, "accepted").inc(accepted)
    RECORDS.labels(kind, "duplicate").inc(sent - accepted)
