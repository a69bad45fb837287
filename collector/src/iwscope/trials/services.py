"""Batch ingest of trials, path samples, census records and origin observations.

A batch arrives checked (msgspec decodes and validates the JSON body in one call,
:mod:`iwscope.trials.fastwire`; semantic checks over the typed records,
:mod:`iwscope.trials.validation`) and is stored with the uploads of its group
(:mod:`iwscope.trials.writer`) by :func:`store_group`: one statement, :data:`_STORE_GROUP`,
whose data-modifying CTEs admit the trial UUIDs never seen before to the registry
(``trial_ids``, the idempotency gate) and insert exactly their rows, and insert the path samples
and observations never seen before (keyed by their own UUIDs), the folded heartbeats and
``last_seen_at``.  A replay (even with changed values) is counted as a duplicate and never
overwrites.  Census records (wire v5) go in first, in the same transaction
(:mod:`iwscope.trials.census`).  An upload is stored completely or not at all.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
import psycopg
from sqlalchemy.engine import Engine

from iwscope.metrics import JOINED_AT_INGEST, RECORDS, labelled
from iwscope.probes.services import heartbeat_values
from iwscope.trials import census, fastwire, rows
from iwscope.trials.schemas import RecordError
from iwscope.trials.validation import BatchRejected
from iwscope.types import utcnow

log = logging.getLogger(__name__)


@dataclass
class IngestResult:
    batch_id: str
    accepted: int
    duplicates: int
    #: Trial UUIDs stored by this request (of its trials, or of its observations).
    new_trial_ids: list[str] = field(default_factory=list)
    #: A trial batch's ``wire_version`` (the answer's ``schedule_etag`` is the schedule of that
    #: version's level); ``None`` for observations.
    wire_version: int | None = None


# --------------------------------------------------------------------------------------
# Storage
# --------------------------------------------------------------------------------------


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


#: ``last_seen_at`` is refreshed at most this often per probe or origin.
LAST_SEEN_RESOLUTION = "10 seconds"

_TRIAL_COLUMNS = rows.columns(rows.TRIAL_STAGE_COLUMNS)
_SERVER_COLUMNS = rows.columns(rows.SERVER_SIDE_COLUMNS)
_OBSERVATION_COLUMNS = rows.columns(rows.OBSERVATION_STAGE_COLUMNS)

#: A whole group in ONE statement (data-modifying CTEs run exactly once each, whether the final
#: SELECT reads them or not): the trials' UUIDs never seen before admitted to the registry (the
#: idempotency gate) and exactly their rows inserted; the path samples and observations never
#: seen before; the folded heartbeats; ``last_seen_at`` of the other probes and the origins.
#: Every part takes one JSON document: an array of one array of records per upload
#: (:func:`iwscope.trials.rows.grouped_document`; ``[]`` when the group has none), whose
#: duplicates the statement drops where it inserts (the first record of a UUID in the group wins:
#: ``ORDER BY <id>, at``, then ``DISTINCT ON`` or ``ON CONFLICT DO NOTHING``); it returns each
#: stored record's kind, UUID and upload (its position in the document, from 1).  Rows in UUID
#: order, so concurrent groups lock in one order.
#:
#: **The join at write**: a new trial whose origin observation is already stored (unjoined) is
#: inserted joined -- its server-side columns and ``joined_at`` -- and the observation marked, in the
#: same transaction: no second version of the trial's row, which the worker's join writes.  An
#: observation is stored as it is and asks the worker for its join (its trial may be in this very
#: statement, which cannot see it, or not yet stored); a trial stored unjoined asks nothing (its
#: observation's own request covers it).  Joining the other way round too (a new observation
#: updating its stored trial) measured dearer than the worker's bulk join: PostgreSQL's CPU per
#: trial 450-621 us against 390-404 (docs/ingest-throughput.md).  Kinds returned: ``t``/``T`` a
#: trial stored unjoined / joined, ``s``, ``o``.  The lookup names its keys as ``= ANY(ARRAY(SELECT
#: ...))``: joined to the CTE instead, the planner hashed it against every unjoined observation.
#: The heartbeats' update names its probes as ``= ANY(...)`` too: joined to the heartbeat
#: document alone, the planner hashed the document against a scan of every probe -- 10,000 rows
#: for every group at the fleet's shape, where nearly every upload carries a heartbeat.
_STORE_GROUP = f"""
WITH trial_rows AS MATERIALIZED (
    {rows.trial_row_sql("%(trials)s", "%(trial_starts)s")}
), fresh AS (
    INSERT INTO trial_ids (trial_id, started_at)
    SELECT trial_id, started_at FROM trial_rows ORDER BY trial_id, at
    ON CONFLICT (trial_id) DO NOTHING
    RETURNING trial_id
), early AS MATERIALIZED (
    SELECT o.trial_id, {", ".join(f"o.{observation} AS {trial}" for trial, observation in rows.SERVER_SIDE_COLUMNS.items())}
    FROM origin_observations o JOIN trial_rows r ON r.trial_id = o.trial_id
    WHERE o.trial_id = ANY(ARRAY(SELECT trial_id FROM trial_rows)) AND o.joined_at IS NULL
      AND COALESCE(r.origin_id, o.origin_id) = o.origin_id
), new_trials AS (
    INSERT INTO trials ({_TRIAL_COLUMNS}, {_SERVER_COLUMNS}, joined_at)
    SELECT DISTINCT ON (r.trial_id) {rows.columns(f"r.{column}" for column in rows.TRIAL_STAGE_COLUMNS)},
        {rows.columns(f"e.{column}" for column in rows.SERVER_SIDE_COLUMNS)},
        CASE WHEN e.trial_id IS NOT NULL THEN now() END
    FROM trial_rows r LEFT JOIN early e ON e.trial_id = r.trial_id
    WHERE r.trial_id IN (SELECT trial_id FROM fresh)
    ORDER BY r.trial_id, r.at
    RETURNING trial_id, joined_at IS NOT NULL AS joined
), early_marked AS (
    UPDATE origin_observations o SET joined_at = now()
    WHERE o.trial_id = ANY(ARRAY(SELECT trial_id FROM new_trials WHERE joined)) AND o.joined_at IS NULL
    RETURNING 1
), sample_rows AS MATERIALIZED (
    {rows.sample_row_sql("%(samples)s", "%(sample_starts)s")}
), new_samples AS (
    INSERT INTO path_samples ({rows.columns(rows.SAMPLE_COLUMNS)}, received_at)
    SELECT {rows.columns(rows.SAMPLE_COLUMNS)}, now() FROM sample_rows ORDER BY sample_id, at
    ON CONFLICT (sample_id) DO NOTHING
    RETURNING sample_id
), observation_rows AS MATERIALIZED (
    {rows.observation_row_sql("%(observations)s", "%(observation_starts)s")}
), new_observations AS (
    INSERT INTO origin_observations ({_OBSERVATION_COLUMNS}, received_at)
    SELECT {_OBSERVATION_COLUMNS}, now() FROM observation_rows ORDER BY trial_id, at
    ON CONFLICT (trial_id) DO NOTHING
    RETURNING trial_id
), heartbeats AS (
    UPDATE probes AS p SET last_seen_at = %(received)s, version = v.version, last_heartbeat = v.body
    FROM json_to_recordset(%(heartbeats)s::text::json) AS v(id uuid, version text, body jsonb)
    WHERE p.id = v.id AND p.id = ANY(%(heartbeat_probes)s::text::uuid[])
    RETURNING 1
), seen_probes AS (
    UPDATE probes SET last_seen_at = now() WHERE id = ANY(%(probes)s::text::uuid[])
    AND (last_seen_at IS NULL OR last_seen_at < now() - interval '{LAST_SEEN_RESOLUTION}')
    RETURNING 1
), seen_origins AS (
    UPDATE origins SET last_seen_at = now() WHERE id = ANY(%(origins)s::text::uuid[])
    AND (last_seen_at IS NULL OR last_seen_at < now() - interval '{LAST_SEEN_RESOLUTION}')
    RETURNING 1
)
SELECT CASE WHEN n.joined THEN 'T' ELSE 't' END, n.trial_id::text, r.upload FROM new_trials n
    JOIN (SELECT DISTINCT ON (trial_id) trial_id, upload FROM trial_rows ORDER BY trial_id, at) r USING (trial_id)
UNION ALL SELECT 's', n.sample_id::text, r.upload FROM new_samples n
    JOIN (SELECT DISTINCT ON (sample_id) sample_id, upload FROM sample_rows ORDER BY sample_id, at) r USING (sample_id)
UNION ALL SELECT 'o', n.trial_id::text, r.upload FROM new_observations n
    JOIN (SELECT DISTINCT ON (trial_id) trial_id, upload FROM observation_rows ORDER BY trial_id, at) r USING (trial_id)
"""
#: The order of :data:`_STORE_GROUP`'s parameters in :data:`_STORE_GROUP_RAW`.
_STORE_GROUP_PARAMETERS = (
    "trials",
    "trial_starts",
    "samples",
    "sample_starts",
    "observations",
    "observation_starts",
    "received",
    "heartbeats",
    "heartbeat_probes",
    "probes",
    "origins",
)


def _positional(statement: str, names: Sequence[str]) -> bytes:
    """``statement`` with its ``%(name)s`` placeholders as PostgreSQL's ``$1``, ``$2``, ... in the
    order of ``names`` (for a :class:`psycopg.RawCursor`)."""
    for position, name in enumerate(names, 1):
        statement = statement.replace(f"%({name})s", f"${position}")
    if "%(" in statement or "%%" in statement:
        raise ValueError("a placeholder or an escaped % left in the statement")
    return statement.encode()


#: :data:`_STORE_GROUP` with positional parameters, run by a :class:`psycopg.RawCursor`: psycopg
#: converts a query's ``%(name)s`` placeholders afresh on every execution of a statement longer
#: than 4,096 bytes (it caches the conversion only below that), and this one is about 10 KB --
#: a regex scan of it per group, 20 % of an upload lane's CPU under a profiler
#: (docs/ingest-throughput.md).
_STORE_GROUP_RAW = _positional(_STORE_GROUP, _STORE_GROUP_PARAMETERS)


#: When this process last refreshed ``last_seen_at`` of a probe or origin (``time.monotonic()``).
_LAST_TOUCHED: dict[tuple[str, uuid.UUID], float] = {}
_LAST_SEEN_RESOLUTION_S = 10.0


def touch_last_seen(connection: psycopg.Connection, table: str, identity: uuid.UUID) -> None:
    """Refresh ``last_seen_at`` of one probe or origin as the caller's transaction's last
    statement (the caller commits; the row's lock is then held only for the commit).  At most
    once per :data:`LAST_SEEN_RESOLUTION` per process and identity."""
    due = _due_for_last_seen(table, [identity])
    if due:
        connection.execute(
            f"UPDATE {table} SET last_seen_at = now() WHERE id = ANY(%s::text::uuid[]) AND "
            f"(last_seen_at IS NULL OR last_seen_at < now() - interval '{LAST_SEEN_RESOLUTION}')",
            (_uuid_array(due),),
        )
        _mark_seen(table, due)


def _due_for_last_seen(table: str, identities: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    """Those of ``identities`` whose ``last_seen_at`` this process last refreshed more than the
    resolution ago, in order (:func:`_mark_seen` marks them once the refresh is stored)."""
    now = time.monotonic()
    return sorted(
        {
            identity
            for identity in identities
            if now - _LAST_TOUCHED.get((table, identity), -_LAST_SEEN_RESOLUTION_S) >= _LAST_SEEN_RESOLUTION_S
        }
    )


def _mark_seen(table: str, identities: Iterable[uuid.UUID]) -> None:
    now = time.monotonic()
    for identity in identities:
        _LAST_TOUCHED[(table, identity)] = now


def _uuid_array(identities: Iterable[uuid.UUID]) -> str:
    """A ``uuid[]`` literal (psycopg's list adaptation inspects every element in Python)."""
    return "{" + ",".join(map(str, identities)) + "}"


def _heartbeats_document(heartbeats: dict[uuid.UUID, dict[str, Any]], received: dt.datetime) -> str:
    """Heartbeats folded into uploads as :data:`_STORE_GROUP` stores them (the columns
    ``POST .../heartbeat`` sets), in id order."""
    document = []
    for probe_id in sorted(heartbeats):
        values = heartbeat_values(heartbeats[probe_id], received)
        document.append({"id": str(probe_id), "version": values["version"], "body": values["last_heartbeat"]})
    return orjson.dumps(document).decode()


@dataclass
class Upload:
    """One validated upload of a group: its batch, whose it is, and (once stored) its result."""

    batch: fastwire.FastTrialBatch | fastwire.FastObservationBatch
    identity_id: uuid.UUID
    #: Set by :func:`store_group`: the result, or why this upload alone was refused.
    outcome: IngestResult | BatchRejected | None = None


def _trial_records(uploads: Sequence[Upload]) -> tuple[str, str]:
    """The trials of a group's trial uploads, one array per upload (:func:`rows.grouped_document`)."""
    batches = [_trial_batch(upload) for upload in uploads]
    return rows.grouped_document(rows.records_in_utc(batch.trials, "started_at", batch.started_at) for batch in batches)


def _sample_records(uploads: Sequence[Upload]) -> tuple[str, str]:
    batches = [_trial_batch(upload) for upload in uploads]
    return rows.grouped_document(rows.records_in_utc(batch.path_samples, "measured_at", batch.measured_at) for batch in batches)


def _observation_records(uploads: Sequence[Upload]) -> tuple[str, str]:
    batches = [upload.batch for upload in uploads]
    return rows.grouped_document(
        rows.records_in_utc(batch.observations, "request_at", batch.request_at)
        for batch in batches
        if isinstance(batch, fastwire.FastObservationBatch)
    )


def _trial_batch(upload: Upload) -> fastwire.FastTrialBatch:
    assert isinstance(upload.batch, fastwire.FastTrialBatch)
    return upload.batch


def store_group(database: Engine | psycopg.Connection, uploads: Sequence[Upload]) -> None:
    """Store several validated uploads in ONE transaction (a group commit); sets each one's
    ``outcome``.

    A trial batch naming an unknown campaign or origin is refused alone (its outcome is the
    :class:`BatchRejected`) and stores nothing; every other upload is stored completely, as a
    duplicate-free union (the first record of a UUID in the group wins), by ONE statement
    (:data:`_STORE_GROUP`) run as its own transaction: one round trip, where a registry insert,
    a two-round-trip COPY, an update and a commit took five (a psycopg round trip cost 115-240 us
    of CPU on the benchmark machine, docs/ingest-throughput.md).  A group with census records
    (a few per probe an hour) inserts them first, in the same transaction.  Any other error
    rolls the whole group back and propagates (the caller then stores each upload alone:
    :mod:`iwscope.trials.writer`).  One upload is a group of one.

    ``database``: an engine (a pooled connection is checked out and returned) or a connection
    of the caller's own, left as found (the writer's lanes: :mod:`iwscope.trials.writer`).
    """
    pooled = database.raw_connection() if isinstance(database, Engine) else None
    connection: psycopg.Connection = database if pooled is None else pooled.driver_connection  # type: ignore[assignment]
    trial_uploads: list[Upload] = []
    observation_uploads: list[Upload] = []
    censuses: dict[int, int] = {}
    try:
        with connection.cursor() as cursor:
            for upload in uploads:
                batch = upload.batch
                if isinstance(batch, fastwire.FastObservationBatch):
                    observation_uploads.append(upload)
                    continue
                unknown = _unknown_references(cursor, batch)
                if unknown:
                    upload.outcome = BatchRejected(422, "invalid batch: nothing was stored", unknown)
                else:
                    trial_uploads.append(upload)
            if connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                connection.commit()  # the reads of _unknown_references: nothing to keep
            with_census = any(
                isinstance(upload.batch, fastwire.FastTrialBatch) and upload.batch.census for upload in trial_uploads
            )
            connection.autocommit = not with_census
            for position, upload in enumerate(trial_uploads):  # rare: census records (a statement each)
                batch = upload.batch
                assert isinstance(batch, fastwire.FastTrialBatch)
                censuses[position] = census.store(cursor, batch.census, batch.census_measured_at)
            heartbeats = {
                upload.identity_id: msgspec.structs.asdict(upload.batch.envelope.heartbeat)
                for upload in trial_uploads
                if isinstance(upload.batch, fastwire.FastTrialBatch) and upload.batch.envelope.heartbeat is not None
            }
            received = utcnow()
            seen_probes = _due_for_last_seen(
                "probes", [upload.identity_id for upload in trial_uploads if upload.identity_id not in heartbeats]
            )
            seen_origins = _due_for_last_seen("origins", [upload.identity_id for upload in observation_uploads])
            parameters: dict[str, object] = {}
            parameters["trials"], parameters["trial_starts"] = _trial_records(trial_uploads)
            parameters["samples"], parameters["sample_starts"] = _sample_records(trial_uploads)
            parameters["observations"], parameters["observation_starts"] = _observation_records(observation_uploads)
            parameters |= {
                "received": received,
                "heartbeats": _heartbeats_document(heartbeats, received),
                "heartbeat_probes": _uuid_array(list(heartbeats)),
                "probes": _uuid_array(seen_probes),
                "origins": _uuid_array(seen_origins),
            }
            with psycopg.RawCursor(connection) as raw:
                raw.execute(_STORE_GROUP_RAW, [parameters[name] for name in _STORE_GROUP_PARAMETERS])
                stored = raw.fetchall()
            if with_census:
                connection.commit()
    except BaseException:
        if not connection.closed:
            with contextlib.suppress(psycopg.Error):  # a broken connection: the original error tells
                connection.rollback()
        raise
    finally:
        if not connection.closed:  # as every other user of a pooled connection expects it
            connection.autocommit = False
        if pooled is not None:
            pooled.close()
    # Marked only once stored: a group that failed leaves them due for the uploads stored alone.
    _mark_seen("probes", [*heartbeats, *seen_probes])
    _mark_seen("origins", seen_origins)
    by_upload: dict[str, dict[int, list[str]]] = {"t": {}, "s": {}, "o": {}}
    joined_at_write = 0
    for kind, record_id, upload in stored:
        if kind == "T":  # a trial joined by this statement to its stored observation
            joined_at_write += 1
            kind = "t"
        by_upload[kind].setdefault(upload - 1, []).append(record_id)
    JOINED_AT_INGEST.inc(joined_at_write)
    for position, upload in enumerate(trial_uploads):
        batch = upload.batch
        assert isinstance(batch, fastwire.FastTrialBatch)
        new_trials = by_upload["t"].get(position, [])
        new_samples, new_census = len(by_upload["s"].get(position, [])), censuses.get(position, 0)
        accepted = len(new_trials) + new_samples + new_census
        total = len(batch.trials) + len(batch.path_samples) + len(batch.census)
        upload.outcome = IngestResult(
            batch.batch_id, accepted, total - accepted, new_trials, wire_version=int(batch.envelope.wire_version)
        )
        _count("trial", "accepted", len(new_trials))
        _count("trial", "duplicate", len(batch.trials) - len(new_trials))
        _count("path_sample", "accepted", new_samples)
        _count("path_sample", "duplicate", len(batch.path_samples) - new_samples)
        _count("census", "accepted", new_census)
        _count("census", "duplicate", len(batch.census) - new_census)
    for position, upload in enumerate(observation_uploads):
        batch = upload.batch
        assert isinstance(batch, fastwire.FastObservationBatch)
        new_observations = by_upload["o"].get(position, [])
        upload.outcome = IngestResult(
            batch.batch_id,
            len(new_observations),
            len(batch.observations) - len(new_observations),
            new_observations,
        )
        _count("observation", "accepted", len(new_observations))
        _count("observation", "duplicate", len(batch.observations) - len(new_observations))


def _count(kind: str, outcome: str, count: int) -> None:
    """Count ``count`` records of ``kind`` with ``outcome`` (nothing to do for none: with several
    API processes each increment is a locked write to a shared file)."""
    if count:
        labelled(RECORDS, kind, outcome).inc(count)


def count_rejected(kind: str, count: int) -> None:
    labelled(RECORDS, kind, "rejected").inc(count)
