"""The collector's tables as Parquet, in bounded memory.

PostgreSQL writes the selected rows as CSV (``COPY (SELECT ...) TO STDOUT``: its own fast
text output, timestamps as RFC 3339 UTC, JSON and arrays as JSON text); pyarrow's streaming CSV
reader parses them in C++ a block at a time against a schema derived from the tables'
SQLAlchemy columns, and each block becomes one Parquet row group.  So memory stays at a few
blocks whatever the row count, and no Python object is made per value.

What each table holds and how it is filtered (:data:`TABLES`):

* ``trials``: every column of ``trials`` (as ``GET /api/v1/trials.csv``), filters campaign,
  probe, ``since``/``until`` on ``started_at`` (inclusive), oldest first;
* ``observations``: ``origin_observations``, filters campaign (its trials'), origin, and the
  window on ``request_at``;
* ``path_estimates``: the paths' estimates, filters campaign (paths it measured) and probe;
* ``campaigns``: campaign rows, filter campaign -- never a passive campaign, and without the
  passive columns (which servers, their assignment seed: passive data, ``iwscope.passive``);
* ``census``: ``census_records``, filters campaign, probe, and the window on ``measured_at``.

These are public.  The passive, real-user tables are not among them: they are exported by the
same machinery only behind the read credential (``iwscope.passive.exports``).

Column types: ``bigint`` -> int64, ``integer`` -> int32, ``smallint`` -> int16, ``double
precision`` -> float64, ``boolean`` -> bool, ``timestamptz`` -> timestamp[us, UTC], ``uuid``
and ``text`` -> string, ``jsonb`` and arrays -> string holding JSON.  The Parquet file's
metadata names the table, the filters and the wire version.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from sqlalchemy import BigInteger, Boolean, DateTime, Double, Float, Integer, SmallInteger, Table
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope import models  # every table registered on the metadata
from iwscope.campaigns.models import PASSIVE_COLUMNS

#: Bytes of CSV parsed per block (about 1,500 trials); blocks are gathered into row groups.
#: The reader parses one block at a time (``use_threads=False``: its threaded mode reads blocks
#: ahead, 1.6 GB of peak RSS at 10^7 trials).  Measured at 5 * 10^6 trials
#: (docs/data.md): peak RSS 314 MB with 1 MB blocks, 356 MB with 2, 440 with 4, 545-612 with 8
#: (the pool's own peak stays at 55-130 MB: the rest is the allocator holding freed blocks),
#: the same time.
BLOCK_BYTES = 1024 * 1024
#: Rows per Parquet row group: blocks are gathered up to this many (DuckDB and pandas read
#: row groups of 10^5 rows well; fewer, larger groups compress better).
ROW_GROUP_ROWS = 100_000
FORMATS = ("parquet", "csv")


@dataclass(frozen=True)
class ExportFilters:
    """Which rows an export holds (``None``: no restriction); the window is inclusive."""

    campaign_id: int | None = None
    probe_id: uuid.UUID | None = None
    origin_id: uuid.UUID | None = None
    #: Passive tables only (wire v6): the server that uploaded the rows.
    server_id: uuid.UUID | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    def describe(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.__dict__.items() if value is not None}


@dataclass(frozen=True)
class TableSpec:
    """One exportable table: its model, the column its window applies to, its order, how each
    filter applies (SQL over alias ``x``; ``%(name)s`` parameters), the rows it never holds
    (``where``) and the columns it leaves out (``omit``)."""

    name: str
    table: Table
    order: str
    window_column: str | None = None
    conditions: dict[str, str] = field(default_factory=dict)
    where: str = "TRUE"
    omit: frozenset[str] = frozenset()

    @property
    def columns(self) -> list[Any]:
        """The exported columns, in table order."""
        return [column for column in self.table.columns if column.name not in self.omit]


_TABLES = models.Base.metadata.tables
TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        TableSpec(
            "trials",
            _TABLES["trials"],
            "x.started_at, x.trial_id",
            "started_at",
            {"campaign_id": "x.campaign_id = %(campaign_id)s", "probe_id": "x.probe_id = %(probe_id)s"},
        ),
        TableSpec(
            "observations",
            _TABLES["origin_observations"],
            "x.request_at, x.trial_id",
            "request_at",
            {
                "campaign_id": "EXISTS (SELECT 1 FROM trials t WHERE t.trial_id = x.trial_id "
                "AND t.campaign_id = %(campaign_id)s)",
                "origin_id": "x.origin_id = %(origin_id)s",
            },
        ),
        TableSpec(
            "path_estimates",
            _TABLES["path_estimates"],
            "x.probe_id, x.origin_id",
            None,
            {
                "campaign_id": "EXISTS (SELECT 1 FROM trials t WHERE t.probe_id = x.probe_id "
                "AND t.origin_id = x.origin_id AND t.campaign_id = %(campaign_id)s)",
                "probe_id": "x.probe_id = %(probe_id)s",
            },
        ),
        TableSpec(
            "campaigns",
            _TABLES["campaigns"],
            "x.id",
            None,
            {"campaign_id": "x.id = %(campaign_id)s"},
            where="x.server_ids IS NULL",
            omit=frozenset(PASSIVE_COLUMNS),
        ),
        TableSpec(
            "census",
            _TABLES["census_records"],
            "x.measured_at, x.census_id",
            "measured_at",
            {"campaign_id": "x.campaign_id = %(campaign_id)s", "probe_id": "x.probe_id = %(probe_id)s"},
        ),
    )
}


def _arrow_type(column_type: Any) -> pa.DataType:
    if isinstance(column_type, SmallInteger):
        return pa.int16()
    if isinstance(column_type, BigInteger):
        return pa.int64()
    if isinstance(column_type, Integer):
        return pa.int32()
    if isinstance(column_type, (Double, Float)):
        return pa.float64()
    if isinstance(column_type, Boolean):
        return pa.bool_()
    if isinstance(column_type, DateTime):
        return pa.timestamp("us", tz="UTC")
    return pa.string()  # text, uuid, jsonb and arrays (as JSON)


def arrow_schema(spec: TableSpec) -> pa.Schema:
    """The Parquet schema of a table (see the module for the mapping)."""
    return pa.schema([pa.field(column.name, _arrow_type(column.type), nullable=True) for column in spec.columns])


def _select_item(column: Any) -> str:
    """One column as CSV text PostgreSQL writes and pyarrow reads back exactly."""
    name = f"x.{column.name}"
    if isinstance(column.type, DateTime):
        return f"""to_char({name} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS {column.name}"""
    if isinstance(column.type, ARRAY):
        return f"array_to_json({name})::text AS {column.name}"
    if isinstance(column.type, (JSONB, UUID)):
        return f"{name}::text AS {column.name}"
    return name


def utc_instant(moment: dt.datetime) -> dt.datetime:
    """``moment`` in UTC (naive: taken as UTC).  The export's parameters reach PostgreSQL as
    literals inside ``COPY (...)``, where an offset beyond +-15:59 (which Python and ISO 8601
    allow: ``-18:04``) is an error; an instant beyond ``datetime``'s years clamps to its end."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:
        return (dt.datetime.min if moment.year < 5000 else dt.datetime.max).replace(tzinfo=dt.UTC)


def select_sql(spec: TableSpec, filters: ExportFilters) -> tuple[str, dict[str, Any]]:
    """The export's SELECT (columns in table order) and its parameters."""
    conditions: list[str] = [spec.where]
    params: dict[str, Any] = {}
    for name in ("campaign_id", "probe_id", "origin_id", "server_id"):
        value = getattr(filters, name)
        if value is None:
            continue
        if name not in spec.conditions:
            raise ValueError(f"the {spec.name} export has no {name} filter")
        conditions.append(spec.conditions[name])
        params[name] = value
    for bound, operator in (("since", ">="), ("until", "<=")):
        value = getattr(filters, bound)
        if value is None:
            continue
        if spec.window_column is None:
            raise ValueError(f"the {spec.name} export has no time window")
        conditions.append(f"x.{spec.window_column} {operator} %({bound})s")
        params[bound] = utc_instant(value)
    items = ", ".join(_select_item(column) for column in spec.columns)
    where = " AND ".join(conditions)
    return f"SELECT {items} FROM {spec.table.name} AS x WHERE {where} ORDER BY {spec.order}", params


class _CopyReader(io.RawIOBase):
    """``COPY ... TO STDOUT`` output as a readable file (what pyarrow's CSV reader takes)."""

    def __init__(self, chunks: Iterator[bytes | bytearray | memoryview]) -> None:
        self._chunks = chunks
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


class ChunkSink(io.RawIOBase):
    """A write-only file whose bytes are handed out as they come (the Parquet writer's sink
    for a streamed answer)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        part = bytes(data)
        self.parts.append(part)
        self.position += len(part)
        return len(part)

    def tell(self) -> int:
        return self.position

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def _driver_connection(session: Session) -> psycopg.Connection[Any]:
    connection = session.connection().connection.driver_connection
    assert isinstance(connection, psycopg.Connection)
    return connection


def _metadata(spec: TableSpec, filters: ExportFilters) -> dict[bytes, bytes]:
    return {
        b"iwscope": json.dumps(
            {
                "table": spec.name,
                "filters": filters.describe(),
                "wire_version": wire.WIRE_VERSION,
                "exported_at": wire.utc_timestamp(),
            }
        ).encode()
    }


def _batches(
    session: Session, spec: TableSpec, filters: ExportFilters, block_bytes: int = BLOCK_BYTES
) -> Iterator[pa.RecordBatch]:
    """The rows of ``spec`` under ``filters`` as record batches, one CSV block each."""
    sql, params = select_sql(spec, filters)
    schema = arrow_schema(spec)
    with _driver_connection(session).cursor() as cursor, cursor.copy(f"COPY ({sql}) TO STDOUT (FORMAT csv)", params) as copy:
        chunks = iter(copy)
        first = next(chunks, None)
        if first is None:
            return  # no rows: pyarrow's reader refuses an empty input; the file gets the schema alone
        reader = pacsv.open_csv(
            io.BufferedReader(_CopyReader(itertools.chain([first], chunks)), buffer_size=1 << 20),
            read_options=pacsv.ReadOptions(column_names=schema.names, block_size=block_bytes, use_threads=False),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types=schema,
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
                true_values=["t"],
                false_values=["f"],
                timestamp_parsers=["%Y-%m-%dT%H:%M:%S%z", pacsv.ISO8601],
            ),
        )
        for batch in reader:
            yield batch.cast(schema) if batch.schema != schema else batch


def write_parquet(
    session: Session, spec: TableSpec, filters: ExportFilters, sink: str | BinaryIO, block_bytes: int = BLOCK_BYTES
) -> int:
    """Write the export to ``sink`` (a path or a binary file); the number of rows."""
    schema = arrow_schema(spec).with_metadata(_metadata(spec, filters))
    rows = 0
    with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
        for group in _row_groups(_batches(session, spec, filters, block_bytes)):
            writer.write_table(group)
            rows += group.num_rows
    return rows


def _row_groups(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
    """The batches gathered into tables of about :data:`ROW_GROUP_ROWS` rows (one row group each)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        pending.append(batch)
        count += batch.num_rows
        if count >= ROW_GROUP_ROWS:
            yield pa.Table.from_batches(pending)
            pending, count = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def stream_parquet(schema: pa.Schema, groups: Iterable[pa.Table]) -> Iterator[bytes]:
    """A Parquet file of ``groups`` (each a row group of ``schema``) as bytes, handed on as each
    group is written (for a streamed answer), the footer last."""
    sink = ChunkSink()
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema, compression="zstd")
    try:
        for group in groups:
            writer.write_table(group)
            data = sink.take()
            if data:
                yield data
    finally:
        writer.close()
    yield sink.take()


def iter_parquet(session: Session, spec: TableSpec, filters: ExportFilters, block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """The export as Parquet bytes, a row group at a time (for a streamed answer)."""
    schema = arrow_schema(spec).with_metadata(_metadata(spec, filters))
    yield from stream_parquet(schema, _row_groups(_batches(session, spec, filters, block_bytes)))


def write_csv(session: Session, spec: TableSpec, filters: ExportFilters, sink: BinaryIO) -> None:
    """Write the export as CSV with a header (PostgreSQL's own CSV output of the same SELECT:
    the same columns and values as the Parquet file, timestamps as RFC 3339 UTC)."""
    sql, params = select_sql(spec, filters)
    with (
        _driver_connection(session).cursor() as cursor,
        cursor.copy(f"COPY ({sql}) TO STDOUT (FORMAT csv, HEADER)", params) as copy,
    ):
        for chunk in copy:
            sink.write(chunk)


def _same_cell(csv_value: str, parquet_value: Any) -> bool:
    """A cell of ``/api/v1/trials.csv`` (``raw.FULL_CSV``: RFC 3339 UTC timestamps, JSON with
    sorted keys, empty for NULL) and the Parquet value of the same column and row."""
    if parquet_value is None:
        return csv_value == ""
    if isinstance(parquet_value, dt.datetime):
        return csv_value == wire.utc_timestamp(parquet_value)
    if isinstance(parquet_value, str) and parquet_value[:1] in "{[":
        return bool(json.loads(csv_value) == json.loads(parquet_value))
    return csv_value == str(parquet_value)


def csv_mismatches(table: pa.Table, csv_text: str) -> list[str]:
    """Where a Parquet export of ``trials`` and ``/api/v1/trials.csv`` of the same filters
    differ (empty: the same rows, columns and values); for checking an export."""
    rows = list(csv.reader(io.StringIO(csv_text)))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    if table.column_names != header:
        return [f"columns differ: {table.column_names} vs {header}"]
    if table.num_rows != len(body):
        return [f"rows differ: {table.num_rows} vs {len(body)}"]
    columns = table.to_pydict()
    return [
        f"row {index} column {name}"
        for index, row in enumerate(body)
        for name, cell in zip(header, row, strict=True)
        if not _same_cell(cell, columns[name][index])
    ]


def export_names(tables: Sequence[str]) -> list[TableSpec]:
    """The specs of the named tables (``ValueError`` naming an unknown one)."""
    unknown = [name for name in tables if name not in TABLES]
    if unknown:
        raise ValueError(f"unknown table {', '.join(unknown)} (known: {', '.join(TABLES)})")
    return [TABLES[name] for name in tables]
