"""Census records (wire v5) inside a trial batch: their checks beyond the schema and their
storage in ``census_records``, in the batch's transaction.

A census record is the IW of a server iwscope does not run, as one probe measured it
(``iwprobe census``).  Records are keyed by their own UUID: a replay changes nothing.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Sequence

import psycopg

from iwscope.trials import fastwire
from iwscope.trials.schemas import RecordError

#: ``census_records`` columns in the order :func:`store` gives their values.
CENSUS_COLUMNS = (
    "census_id",
    "probe_id",
    "campaign_id",
    "round",
    "url",
    "host",
    "measured_at",
    "status",
    "iw_segments",
    "iw_bytes",
    "mss",
    "reason",
    "connections",
    "connections_ok",
    "announced_mss",
    "rtt_us",
    "family",
    "tls_version",
    "http_status",
    "error_detail",
    "protocol",
)

_INSERT = f"""
INSERT INTO census_records ({", ".join(CENSUS_COLUMNS)}, received_at)
SELECT * , now() FROM unnest(%s::uuid[], %s::uuid[], %s::bigint[], %s::int[], %s::text[], %s::text[],
                             %s::timestamptz[], %s::text[], %s::smallint[], %s::int[], %s::int[], %s::text[],
                             %s::smallint[], %s::smallint[], %s::int[], %s::bigint[], %s::text[], %s::text[],
                             %s::smallint[], %s::text[], %s::text[])
ON CONFLICT (census_id) DO NOTHING
"""


def target_host(url: str) -> str | None:
    """The host of a census target URL, lower case and without brackets; None: no host."""
    try:
        host = urllib.parse.urlsplit(url).hostname
    except ValueError:
        return None
    return host.lower() if host else None


def window_errors(status: str, segments: int | None) -> str | None:
    """What is wrong with an inference's status and segment count together, if anything:
    ``ok`` and ``lower_bound`` name a count, ``undetermined`` none."""
    if status in ("ok", "lower_bound") and segments is None:
        return f"status {status!r} needs a segment count"
    if status == "undetermined" and segments is not None:
        return "an undetermined window has no segment count"
    return None


def check(records: Sequence[fastwire.FastCensus]) -> list[RecordError]:
    """The relations between a record's fields that the schema cannot state."""
    errors: list[RecordError] = []

    def error(index: int, record: fastwire.FastCensus, name: str, message: str) -> None:
        errors.append(RecordError(section="census", index=index, record_id=record.census_id, field=name, message=message))

    for index, record in enumerate(records):
        if target_host(record.url) is None:
            error(index, record, "url", "not an http(s) URL with a host")
        problem = window_errors(record.status, record.iw_segments)
        if problem:
            error(index, record, "iw_segments", problem)
        if record.connections_ok > record.connections:
            error(index, record, "connections_ok", "more connections determined the IW than were made")
    return errors


def client_iw_errors(trials: Sequence[fastwire.FastTrial]) -> list[RecordError]:
    """Trials whose ``client_iw`` status and segment count disagree."""
    errors: list[RecordError] = []
    for index, trial in enumerate(trials):
        if trial.client_iw is None:
            continue
        problem = window_errors(trial.client_iw.status, trial.client_iw.segments)
        if problem:
            errors.append(
                RecordError(section="trials", index=index, record_id=trial.trial_id, field="client_iw.segments", message=problem)
            )
    return errors


def store(cursor: psycopg.Cursor, records: Sequence[fastwire.FastCensus], measured_at: Sequence[dt.datetime]) -> int:
    """Insert the records never stored before (one statement); how many were new."""
    if not records:
        return 0
    columns: list[list[object]] = [[] for _ in CENSUS_COLUMNS]
    for record, instant in zip(records, measured_at, strict=True):
        values = (
            record.census_id,
            record.probe_id,
            record.campaign_id,
            record.round,
            record.url,
            target_host(record.url),
            instant,
            record.status,
            record.iw_segments,
            record.iw_bytes,
            record.mss,
            record.reason,
            record.connections,
            record.connections_ok,
            record.announced_mss,
            record.rtt_us,
            record.family or None,
            record.tls_version or None,
            record.http_status,
            record.error_detail,
            record.protocol or None,  # "not said" (TCP) as NULL, as family
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    cursor.execute(_INSERT, columns)
    return int(cursor.rowcount)
