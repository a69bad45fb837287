"""``trial_traces`` as Parquet: one row per trace, the packet columns as ``list<int64>``.

The other tables leave PostgreSQL as CSV that pyarrow parses (:mod:`iwscope.exports.columnar`);
a trace cannot: its packets are stored as one zlib-compressed JSON document
(:mod:`iwscope.traces.services`), so each is decoded here and its seven columns become list
cells -- what pandas, DuckDB (``UNNEST``) or R read as arrays, with no JSON to parse.  Memory
stays bounded: rows come from a server-side cursor a few hundred at a time, each trace's
columns are turned into ``int64`` arrays at once (its Python lists freed), and a row group is
written every :data:`ROW_GROUP_TRACES` traces or :data:`ROW_GROUP_PACKETS` packets.

Columns: ``trial_id``, ``side``, ``campaign_id`` (the trial's; null when ``trials`` has no such
trial, e.g. an origin's trace whose probe never uploaded), ``captured_at``, ``packets``,
``dropped``, ``first_flight_segments``, ``first_flight_bytes``, ``stored_bytes``, then
``t_us``, ``outgoing``, ``seq``, ``ack``, ``length``, ``flags``, ``window``
(``wire.TRACE_COLUMNS``).  Filters: campaign, probe and origin (the trial's), and the window on
``captured_at`` (inclusive); oldest first.  Public like the trials they belong to.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.exports.columnar import ExportFilters, stream_parquet, utc_instant
from iwscope.traces.services import decode_trace

#: The export's name (``GET /api/v1/traces.parquet``, ``iwscope export --tables traces``, bundles).
TRACES = "traces"
#: A row group holds at most this many traces or packets (7 int64 columns: ~56 MB per 10^6 packets).
ROW_GROUP_TRACES = 10_000
ROW_GROUP_PACKETS = 1_000_000
#: Rows fetched from the server-side cursor at a time.
FETCH_ROWS = 500
#: The typed columns, in order, as (name, SQL item, Arrow type).
_SCALARS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("trial_id", "x.trial_id::text", pa.string()),
    ("side", "x.side", pa.string()),
    ("campaign_id", "t.campaign_id", pa.int64()),
    ("captured_at", "x.captured_at", pa.timestamp("us", tz="UTC")),
    ("packets", "x.packets", pa.int32()),
    ("dropped", "x.dropped", pa.int32()),
    ("first_flight_segments", "x.first_flight_segments", pa.int32()),
    ("first_flight_bytes", "x.first_flight_bytes", pa.int32()),
    ("stored_bytes", "x.stored_bytes", pa.int32()),
)
#: How each filter applies (the trial's campaign, probe and origin).
_CONDITIONS = {
    "campaign_id": "t.campaign_id = %(campaign_id)s",
    "probe_id": "t.probe_id = %(probe_id)s",
    "origin_id": "t.origin_id = %(origin_id)s",
}


def traces_schema() -> pa.Schema:
    """The Parquet schema of the traces export (see the module)."""
    return pa.schema(
        [pa.field(name, kind, nullable=True) for name, _, kind in _SCALARS]
        + [pa.field(name, pa.list_(pa.int64()), nullable=True) for name in wire.TRACE_COLUMNS]
    )


def traces_sql(filters: ExportFilters) -> tuple[str, dict[str, Any]]:
    """The export's SELECT (the typed columns, then ``body``) and its parameters; ``ValueError``
    for a filter it has not (``server_id``)."""
    if filters.server_id is not None:
        raise ValueError(f"the {TRACES} export has no server_id filter")
    conditions = ["TRUE"]
    params: dict[str, Any] = {}
    for name, condition in _CONDITIONS.items():
        value = getattr(filters, name)
        if value is not None:
            conditions.append(condition)
            params[name] = value
    for bound, operator in (("since", ">="), ("until", "<=")):
        value = getattr(filters, bound)
        if value is not None:
            conditions.append(f"x.captured_at {operator} %({bound})s")
            params[bound] = utc_instant(value)
    items = ", ".join(f"{item} AS {name}" for name, item, _ in _SCALARS)
    # The trial by its UUID alone: one probe of each partition's primary key (trial_id leads it).
    sql = (
        f"SELECT {items}, x.body FROM trial_traces AS x "
        "LEFT JOIN LATERAL (SELECT campaign_id, probe_id, origin_id FROM trials WHERE trials.trial_id = x.trial_id "
        "LIMIT 1) AS t ON TRUE "
        f"WHERE {' AND '.join(conditions)} ORDER BY x.captured_at, x.trial_id, x.side"
    )
    return sql, params


class _Group:
    """The rows of one row group being gathered: scalars as lists, packet columns as one
    ``int64`` array per trace plus offsets."""

    def __init__(self) -> None:
        self.scalars: list[list[Any]] = [[] for _ in _SCALARS]
        self.columns: list[list[np.ndarray[Any, np.dtype[np.int64]]]] = [[] for _ in wire.TRACE_COLUMNS]
        self.offsets = [0]
        self.rows = 0

    @property
    def packets(self) -> int:
        return self.offsets[-1]

    def add(self, row: Any) -> None:
        for values, value in zip(self.scalars, row[: len(_SCALARS)], strict=True):
            values.append(value)
        trace = decode_trace(bytes(row[len(_SCALARS)]))
        for arrays, name in zip(self.columns, wire.TRACE_COLUMNS, strict=True):
            arrays.append(np.asarray(trace[name], dtype=np.int64))
        self.offsets.append(self.offsets[-1] + len(trace[wire.TRACE_COLUMNS[0]]))
        self.rows += 1

    def table(self, schema: pa.Schema) -> pa.Table:
        # int32 offsets: a group stops soon after ROW_GROUP_PACKETS, far below 2**31 values.
        offsets = pa.array(self.offsets, type=pa.int32())
        arrays = [pa.array(values, type=kind) for values, (_, _, kind) in zip(self.scalars, _SCALARS, strict=True)]
        for parts in self.columns:
            values = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
            arrays.append(pa.ListArray.from_arrays(offsets, pa.array(values, type=pa.int64())))
        return pa.Table.from_arrays(arrays, schema=schema)


def _row_groups(session: Session, filters: ExportFilters) -> Iterator[pa.Table]:
    """The export's rows as tables of at most :data:`ROW_GROUP_TRACES` traces or about
    :data:`ROW_GROUP_PACKETS` packets each."""
    sql, params = traces_sql(filters)
    schema = traces_schema()
    connection = session.connection().connection.driver_connection
    assert isinstance(connection, psycopg.Connection)
    # A server-side cursor: rows arrive FETCH_ROWS at a time, whatever the export's size.
    with connection.cursor(name="iwscope_traces_export") as cursor:
        cursor.itersize = FETCH_ROWS
        cursor.execute(sql, params)
        group = _Group()
        for row in cursor:
            group.add(row)
            if group.rows >= ROW_GROUP_TRACES or group.packets >= ROW_GROUP_PACKETS:
                yield group.table(schema)
                group = _Group()
        if group.rows:
            yield group.table(schema)


def _metadata(filters: ExportFilters) -> dict[bytes, bytes]:
    """The file's ``iwscope`` key, as the other exports write it."""
    described = {"table": TRACES, "filters": filters.describe(), "wire_version": wire.WIRE_VERSION}
    return {b"iwscope": json.dumps({**described, "exported_at": wire.utc_timestamp()}).encode()}


def write_traces_parquet(session: Session, filters: ExportFilters, sink: str | BinaryIO) -> int:
    """Write the traces export to ``sink`` (a path or a binary file); the number of rows."""
    schema = traces_schema().with_metadata(_metadata(filters))
    rows = 0
    with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
        for group in _row_groups(session, filters):
            writer.write_table(group.replace_schema_metadata(schema.metadata))
            rows += group.num_rows
    return rows


def iter_traces_parquet(session: Session, filters: ExportFilters) -> Iterator[bytes]:
    """The traces export as Parquet bytes, a row group at a time (for a streamed answer)."""
    schema = traces_schema().with_metadata(_metadata(filters))
    groups = (group.replace_schema_metadata(schema.metadata) for group in _row_groups(session, filters))
    yield from stream_parquet(schema, groups)
