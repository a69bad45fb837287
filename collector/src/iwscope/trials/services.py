"""Batch ingest of trials, path samples and origin observations; the observation join.

The fast path for a batch of trials: msgspec parses and validates the JSON body in one call
(:mod:`iwscope.trials.fastwire`; observation batches too), semantic checks run over the typed
records (:mod:`iwscope.trials.validation`), then one
set-based ``INSERT INTO trial_ids SELECT * FROM unnest(...) ON CONFLICT DO NOTHING
RETURNING`` admits the UUIDs never seen before, and exactly those records go into ``trials``
with psycopg 3 ``COPY``.  A replay (even with changed values) is counted as a duplicate and
never overwrites.  Path samples and observations (keyed by their own UUID in unpartitioned
tables) go through a per-connection temporary staging table and ``INSERT ... SELECT ... ON
CONFLICT DO NOTHING``; census records (wire v5) go in with one ``INSERT ... SELECT FROM
unnest(...)`` (:mod:`iwscope.trials.census`).  All of it is one transaction: a batch is stored
completely or not at all.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy.engine import Engine

from iwprobe import wire
from iwscope.metrics import RECORDS
from iwscope.probes.services import heartbeat_values
from iwscope.trials import census, fastwire
from iwscope.trials.models import OBSERVATION_TCPI_COLUMNS, TRIAL_TCPI_COLUMNS, tcpi_column_name
from iwscope.trials.schemas import RecordError
from iwscope.trials.validation import BatchRejected
from iwscope.types import utcnow

log = logging.getLogger(__name__)


@dataclass
class IngestResult:
    batch_id: str
    accepted: int
    duplicates: int
    #: Trial UUIDs stored by this request (the join task's input).
    new_trial_ids: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# Storage
# --------------------------------------------------------------------------------------

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
)
OBSERVATION_STAGE_COLUMNS = (
    OBSERVATION_WIRE_COLUMNS + tuple(tcpi_column_name(name) for name in OBSERVATION_TCPI_COLUMNS) + ("tcp_info",)
)


def _columns(names: Iterable[str]) -> str:
    return ", ".join(names)


def _ensure_staging(connection: psycopg.Connection, info: dict[str, Any]) -> None:
    """Temporary staging tables, created once per pooled connection, emptied at every commit."""
    if info.get("iwscope_staging"):
        return
    connection.execute(
        "CREATE TEMP TABLE IF NOT EXISTS path_samples_stage ON COMMIT DELETE ROWS AS SELECT "
        f"{_columns(SAMPLE_COLUMNS)} FROM path_samples WITH NO DATA"
    )
    connection.execute(
        "CREATE TEMP TABLE IF NOT EXISTS observations_stage ON COMMIT DELETE ROWS AS SELECT "
        f"{_columns(OBSERVATION_STAGE_COLUMNS)} FROM origin_observations WITH NO DATA"
    )
    connection.commit()
    info["iwscope_staging"] = True


#: COPY text format escapes (``\\``, tab, newline, carriage return) of free-text values.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NEEDS_COPY_ESCAPE = re.compile(r"[\\\t\n\r]")
_NULL = "\\N"


def _copy_text(value: str | None) -> str:
    """A free-text value as a COPY text-format cell."""
    if value is None:
        return _NULL
    return value.translate(_COPY_ESCAPES) if _NEEDS_COPY_ESCAPE.search(value) else value


def _trial_line(trial: fastwire.FastTrial, started_at: str) -> str:
    """One ``trials`` row (``TRIAL_STAGE_COLUMNS``) as a line of COPY text, without a newline.

    One f-string per row instead of psycopg's per-value adaptation.  UUIDs, ISO timestamps,
    integers and error kinds are validated and need no escaping; the ``tcp_info`` JSON holds
    only the schema's field names and integers, so it contains no backslash, tab or newline
    either.  ``url`` and ``error_detail`` are escaped.  The typed ``tcpi_*`` columns are
    spelled out (``TRIAL_TCPI_COLUMNS``, checked at import) to save a loop per row.
    """
    tcp = trial.tcp_info
    get = tcp.get
    n = _NULL
    iw = trial.client_iw
    client_iw = (
        f"{n}\t{n}\t{n}\t{n}\t{n}"
        if iw is None
        else f"{iw.status}\t{n if iw.segments is None else iw.segments}\t{n if iw.bytes is None else iw.bytes}\t"
        f"{n if iw.mss is None else iw.mss}\t{iw.reason or n}"
    )
    return (
        f"{trial.trial_id}\t{started_at}\t{trial.probe_id}\t"
        f"{n if trial.campaign_id is None else trial.campaign_id}\t"
        f"{n if trial.origin_id is None else trial.origin_id}\t{trial.round}\t{trial.arm_iw}\t"
        f"{trial.object_size}\t{_copy_text(trial.url)}\t"
        f"{n if trial.dns_us is None else trial.dns_us}\t{n if trial.connect_us is None else trial.connect_us}\t"
        f"{n if trial.ttfb_us is None else trial.ttfb_us}\t{n if trial.total_us is None else trial.total_us}\t"
        f"{trial.bytes_received}\t{n if trial.http_status is None else trial.http_status}\t"
        f"{n if trial.error_kind is None else trial.error_kind}\t{_copy_text(trial.error_detail)}\t"
        f"{trial.syn_retrans}\t{get('rtt', n)}\t{get('rttvar', n)}\t{get('min_rtt', n)}\t"
        f"{get('total_retrans', n)}\t{get('segs_in', n)}\t{get('data_segs_in', n)}\t{get('rcv_space', n)}\t"
        f"{get('rcv_mss', n)}\t{get('bytes_received', n)}\t{orjson.dumps(tcp).decode()}\t"
        f"{n if wire.is_plain_arm(trial.arm, trial.arm_iw) else trial.arm}\t{wire.flow_role(trial.url, trial.role)}\t"
        f"{n if trial.page_id is None else trial.page_id}\t"
        f"{n if trial.echo is None else msgspec.json.encode(trial.echo).decode()}\t"
        f"{_copy_text(trial.tls_version or None)}\t{n if trial.tls_handshake_us is None else trial.tls_handshake_us}\t"
        f"{trial.family or n}\t{client_iw}"
    )


#: The ``tcpi_*`` columns :func:`_trial_line` writes, in its order.
_TRIAL_LINE_TCPI = (
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
if _TRIAL_LINE_TCPI != TRIAL_TCPI_COLUMNS:  # pragma: no cover (a model change must update _trial_line)
    raise RuntimeError("_trial_line does not match TRIAL_TCPI_COLUMNS")


def _utc_text(original: str, parsed: dt.datetime) -> str:
    """A validated timestamp as PostgreSQL reads it: the wire text itself when it is plain UTC
    (``...Z``, ASCII), else the instant converted to UTC (PostgreSQL refuses offsets beyond
    +-15:59, which Python accepts)."""
    if original[-1] == "Z" and original.isascii():
        return original
    return parsed.astimezone(dt.UTC).isoformat()


def _observation_row(observation: fastwire.FastObservation, request_at: dt.datetime) -> tuple[Any, ...]:
    """One ``observations_stage`` row (``OBSERVATION_STAGE_COLUMNS``); ``request_at`` is the
    record's parsed ``request_at`` (the record keeps the wire text)."""
    tcp_info = observation.tcp_info
    return (
        observation.trial_id,
        observation.origin_id,
        observation.arm_iw,
        observation.port,
        observation.client_addr,
        observation.object_size,
        request_at,
        observation.first_byte_us,
        observation.response_latency_us,
        observation.snd_cwnd_at_accept,
        observation.cwnd_mismatch,
        observation.rwnd_limited,
        observation.peer_rwnd,
        observation.http_status,
        observation.error_kind,
        observation.arm or None,
        observation.tls_version or None,
        observation.tls_handshake_us,
        observation.tls_first_flight_bytes,
        observation.tls_flight_acked_us,
        observation.family or None,
        observation.send_path,  # NOT NULL: '' is "not said"
        observation.segmentation_offload,
        *(tcp_info.get(name) for name in OBSERVATION_TCPI_COLUMNS),
        orjson.dumps(tcp_info).decode(),
    )


def _sample_row(sample: fastwire.FastPathSample, measured_at: dt.datetime) -> tuple[Any, ...]:
    return (
        sample.sample_id,
        sample.probe_id,
        sample.origin_id,
        measured_at,
        sample.min_rtt_us,
        sample.bottleneck_bps,
        sample.transfer_bytes,
        sample.method,
    )


def _copy(cursor: psycopg.Cursor, table: str, columns: Sequence[str], rows: Iterable[tuple[Any, ...]]) -> None:
    with cursor.copy(f"COPY {table} ({_columns(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


#: Campaign and origin ids known to exist (neither is ever deleted), so most batches need no lookup.
_KNOWN_CAMPAIGNS: set[int] = set()
_KNOWN_ORIGINS: set[str] = set()


def _unknown_references(cursor: psycopg.Cursor, batch: fastwire.FastTrialBatch) -> list[RecordError]:
    """Records that name a campaign or an origin the collector does not know."""
    campaign_ids = {trial.campaign_id for trial in batch.trials if trial.campaign_id is not None} | {
        record.campaign_id for record in batch.census if record.campaign_id is not None
    }
    origin_ids = {trial.origin_id for trial in batch.trials if trial.origin_id is not None} | {
        sample.origin_id for sample in batch.path_samples
    }
    if campaign_ids - _KNOWN_CAMPAIGNS:
        cursor.execute("SELECT id FROM campaigns WHERE id = ANY(%s)", (list(campaign_ids - _KNOWN_CAMPAIGNS),))
        _KNOWN_CAMPAIGNS.update(row[0] for row in cursor.fetchall())
    if origin_ids - _KNOWN_ORIGINS:
        cursor.execute("SELECT id::text FROM origins WHERE id = ANY(%s::uuid[])", (list(origin_ids - _KNOWN_ORIGINS),))
        _KNOWN_ORIGINS.update(row[0] for row in cursor.fetchall())
    known_campaigns, known_origins = _KNOWN_CAMPAIGNS, _KNOWN_ORIGINS
    errors: list[RecordError] = []
    if campaign_ids <= known_campaigns and origin_ids <= known_origins:
        return errors
    for index, trial in enumerate(batch.trials):
        if trial.campaign_id is not None and trial.campaign_id not in known_campaigns:
            errors.append(
                RecordError(
                    section="trials", index=index, record_id=trial.trial_id, field="campaign_id", message="unknown campaign"
                )
            )
        if trial.origin_id is not None and trial.origin_id not in known_origins:
            errors.append(
                RecordError(section="trials", index=index, record_id=trial.trial_id, field="origin_id", message="unknown origin")
            )
    for index, sample in enumerate(batch.path_samples):
        if sample.origin_id not in known_origins:
            errors.append(
                RecordError(
                    section="path_samples", index=index, record_id=sample.sample_id, field="origin_id", message="unknown origin"
                )
            )
    for index, record in enumerate(batch.census):
        if record.campaign_id is not None and record.campaign_id not in known_campaigns:
            errors.append(
                RecordError(
                    section="census", index=index, record_id=record.census_id, field="campaign_id", message="unknown campaign"
                )
            )
    return errors


#: Admits the UUIDs never seen before (the idempotency registry) and returns them.
_REGISTER_TRIAL_IDS = """
INSERT INTO trial_ids (trial_id, started_at)
SELECT * FROM unnest(%s::text::uuid[], %s::text::timestamptz[])
ON CONFLICT (trial_id) DO NOTHING
RETURNING trial_id::text
"""

_INSERT_SAMPLES = f"""
INSERT INTO path_samples ({_columns(SAMPLE_COLUMNS)}, received_at)
SELECT DISTINCT ON (sample_id) {_columns(SAMPLE_COLUMNS)}, now() FROM path_samples_stage
ON CONFLICT (sample_id) DO NOTHING
"""

_INSERT_OBSERVATIONS = f"""
INSERT INTO origin_observations ({_columns(OBSERVATION_STAGE_COLUMNS)}, received_at)
SELECT DISTINCT ON (trial_id) {_columns(OBSERVATION_STAGE_COLUMNS)}, now() FROM observations_stage
ON CONFLICT (trial_id) DO NOTHING
RETURNING trial_id::text
"""


#: ``last_seen_at`` is refreshed at most this often per probe or origin.
LAST_SEEN_RESOLUTION = "10 seconds"


#: When this process last refreshed ``last_seen_at`` of a probe or origin (``time.monotonic()``).
_LAST_TOUCHED: dict[tuple[str, uuid.UUID], float] = {}
_LAST_SEEN_RESOLUTION_S = 10.0


def _store_heartbeat(connection: psycopg.Connection, probe_id: uuid.UUID, heartbeat: dict[str, Any]) -> None:
    """A heartbeat folded into the upload, stored as ``POST .../heartbeat`` stores one, as the
    batch transaction's last statement (see :func:`touch_last_seen`; the caller commits)."""
    values = heartbeat_values(heartbeat, utcnow())
    connection.execute(
        "UPDATE probes SET last_seen_at = %s, version = %s, last_heartbeat = %s WHERE id = %s",
        (values["last_seen_at"], values["version"], Jsonb(values["last_heartbeat"]), probe_id),
    )
    _LAST_TOUCHED[("probes", probe_id)] = time.monotonic()


def touch_last_seen(connection: psycopg.Connection, table: str, identity: uuid.UUID) -> None:
    """Refresh ``last_seen_at`` as the batch transaction's last statement (the caller commits).

    The row's lock is then held only for the commit, and one agent's uploads come one at a
    time: a refresh in a transaction of its own cost every upload a second commit (a WAL flush)
    and two round trips.  The resolution keeps the writes rare, and a process that refreshed
    the row less than the resolution ago skips the statement.
    """
    now = time.monotonic()
    key = (table, identity)
    if now - _LAST_TOUCHED.get(key, -_LAST_SEEN_RESOLUTION_S) < _LAST_SEEN_RESOLUTION_S:
        return
    connection.execute(
        f"UPDATE {table} SET last_seen_at = now() WHERE id = %s AND "
        f"(last_seen_at IS NULL OR last_seen_at < now() - interval '{LAST_SEEN_RESOLUTION}')",
        (identity,),
    )
    _LAST_TOUCHED[key] = now


def store_trial_batch(engine: Engine, batch: fastwire.FastTrialBatch, probe_id: uuid.UUID) -> IngestResult:
    """Store a validated batch in one transaction (all or nothing, idempotent by UUID)."""
    pooled = engine.raw_connection()
    try:
        connection: psycopg.Connection = pooled.driver_connection  # type: ignore[assignment]
        _ensure_staging(connection, pooled.info)
        with connection.cursor() as cursor:
            unknown = _unknown_references(cursor, batch)
            if unknown:
                raise BatchRejected(422, "invalid batch: nothing was stored", unknown)
            result = IngestResult(batch_id=batch.batch_id, accepted=0, duplicates=0)
            if batch.trials:
                # One record per UUID (the first wins), then only UUIDs never stored before are
                # copied straight into ``trials``: the registry insert is the idempotency gate.
                trials = batch.trials
                first_index: dict[str, int] = {}
                for index, trial in enumerate(trials):
                    first_index.setdefault(trial.trial_id, index)
                unique = list(first_index.values())
                started_at = batch.started_at
                started = [_utc_text(trials[index].started_at, started_at[index]) for index in unique]
                # Array literals by hand: psycopg's list adaptation is pure Python per element;
                # validated UUIDs and ISO timestamps need no quoting.
                cursor.execute(_REGISTER_TRIAL_IDS, ("{" + ",".join(first_index) + "}", '{"' + '","'.join(started) + '"}'))
                fresh = {row[0] for row in cursor.fetchall()}
                if len(fresh) == len(unique):
                    new_indices = unique
                    new_started = started
                else:
                    kept = [position for position, index in enumerate(unique) if trials[index].trial_id in fresh]
                    new_indices = [unique[position] for position in kept]
                    new_started = [started[position] for position in kept]
                if new_indices:
                    payload = (
                        "\n".join(
                            [
                                _trial_line(trials[index], started_text)
                                for index, started_text in zip(new_indices, new_started, strict=True)
                            ]
                        )
                        + "\n"
                    )
                    with cursor.copy(f"COPY trials ({_columns(TRIAL_STAGE_COLUMNS)}) FROM STDIN") as copy:
                        copy.write(payload.encode())
                result.new_trial_ids.extend(trials[index].trial_id for index in new_indices)
            new_samples = 0
            if batch.path_samples:
                _copy(cursor, "path_samples_stage", SAMPLE_COLUMNS, map(_sample_row, batch.path_samples, batch.measured_at))
                cursor.execute(_INSERT_SAMPLES)
                new_samples = cursor.rowcount  # rows inserted (conflicts are not counted)
            new_census = census.store(cursor, batch.census, batch.census_measured_at)
        if batch.envelope.heartbeat is not None:
            _store_heartbeat(connection, probe_id, msgspec.structs.asdict(batch.envelope.heartbeat))
        else:
            touch_last_seen(connection, "probes", probe_id)
        connection.commit()
    except BaseException:
        pooled.rollback()
        raise
    finally:
        pooled.close()
    total = len(batch.trials) + len(batch.path_samples) + len(batch.census)
    result.accepted = len(result.new_trial_ids) + new_samples + new_census
    result.duplicates = total - result.accepted
    RECORDS.labels("trial", "accepted").inc(len(result.new_trial_ids))
    RECORDS.labels("trial", "duplicate").inc(len(batch.trials) - len(result.new_trial_ids))
    RECORDS.labels("path_sample", "accepted").inc(new_samples)
    RECORDS.labels("path_sample", "duplicate").inc(len(batch.path_samples) - new_samples)
    RECORDS.labels("census", "accepted").inc(new_census)
    RECORDS.labels("census", "duplicate").inc(len(batch.census) - new_census)
    return result


def store_observation_batch(engine: Engine, batch: fastwire.FastObservationBatch, origin_id: uuid.UUID) -> IngestResult:
    """Store a validated observation batch in one transaction (all or nothing, idempotent by trial UUID)."""
    pooled = engine.raw_connection()
    try:
        connection: psycopg.Connection = pooled.driver_connection  # type: ignore[assignment]
        _ensure_staging(connection, pooled.info)
        with connection.cursor() as cursor:
            result = IngestResult(batch_id=batch.batch_id, accepted=0, duplicates=0)
            if batch.observations:
                rows = map(_observation_row, batch.observations, batch.request_at)
                _copy(cursor, "observations_stage", OBSERVATION_STAGE_COLUMNS, rows)
                cursor.execute(_INSERT_OBSERVATIONS)
                result.new_trial_ids = [row[0] for row in cursor.fetchall()]
        touch_last_seen(connection, "origins", origin_id)
        connection.commit()
    except BaseException:
        pooled.rollback()
        raise
    finally:
        pooled.close()
    result.accepted = len(result.new_trial_ids)
    result.duplicates = len(batch.observations) - result.accepted
    RECORDS.labels("observation", "accepted").inc(result.accepted)
    RECORDS.labels("observation", "duplicate").inc(result.duplicates)
    return result


def count_rejected(kind: str, count: int) -> None:
    RECORDS.labels(kind, "rejected").inc(count)
