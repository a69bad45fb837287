"""The raw path: trials read exactly as stored -- the trials page and the one raw-trials CSV writer.

Every raw-trials CSV is written here: ``GET /api/v1/trials.csv`` (every column of ``trials``),
``GET /api/v1/analysis/trials.csv`` and the dashboard's ``/download/trials.csv`` (the trials
page's columns).  They select rows with the same rule, :func:`~iwscope.analysis.filters.trial_where`
(``since`` and ``until`` both inclusive, see :class:`~iwscope.analysis.filters.Filters`), in the
same order, streamed in chunks through a server-side cursor (constant memory).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.analysis.filters import Filters, trial_where
from iwscope.trials.models import Trial

#: Columns of the trials page and its CSV export, in order (``region`` is the probe's,
#: ``send_path`` the origin observation's: NULL when the trial has none; ``protocol`` the trial's
#: as stored, wire v9: ``tcp``, ``quic``, or NULL -- not said, which is TCP).
TRIAL_COLUMNS: tuple[str, ...] = (
    "trial_id",
    "started_at",
    "campaign_id",
    "probe_id",
    "region",
    "origin_id",
    "arm_iw",
    "protocol",
    "object_size",
    "total_us",
    "ttfb_us",
    "server_latency_us",
    "send_path",
    "http_status",
    "error_kind",
    "tcpi_total_retrans",
    "tcpi_min_rtt_us",
    "server_total_retrans",
    "server_bytes_retrans",
    "server_bytes_sent",
)
#: The trials page counts at most this many matches (then reports ``TRIALS_COUNT_CAP + 1``).
TRIALS_COUNT_CAP = 100_000

#: The observation's join is on its primary key: at most one row per trial, and PostgreSQL
#: drops the join where no column of ``o`` is read (the counts, ``FULL_CSV``).
_FROM = "trials AS t LEFT JOIN probes AS p ON p.id = t.probe_id LEFT JOIN origin_observations AS o ON o.trial_id = t.trial_id"
#: The selected columns that are not the trial's own, by the name they are read as.
_JOINED_COLUMNS = {"region": "p.region", "send_path": "o.send_path"}


@dataclass(frozen=True)
class CsvLayout:
    """What one raw-trials CSV holds: its ``columns`` (``region`` is the probe's, ``send_path``
    the observation's, every other name a column of ``trials``) and how it writes a timestamp."""

    columns: tuple[str, ...]
    timestamp: Callable[[dt.datetime], str]


#: The analysis export and the dashboard's download: the trials page's columns, ISO 8601 timestamps.
PAGE_CSV = CsvLayout(TRIAL_COLUMNS, dt.datetime.isoformat)
#: ``GET /api/v1/trials.csv``: every column of ``trials``, timestamps in the wire's RFC 3339 UTC
#: form, JSON columns as JSON text (keys sorted).
FULL_CSV = CsvLayout(tuple(column.name for column in Trial.__table__.columns), wire.utc_timestamp)


def _select(columns: tuple[str, ...], filters: Filters, probe_id: uuid.UUID | None) -> tuple[str, dict[str, Any]]:
    where, params = trial_where(filters)
    if probe_id is not None:
        where, params = f"{where} AND t.probe_id = :probe_id", {**params, "probe_id": probe_id}
    selected = ", ".join(f"{_JOINED_COLUMNS[name]} AS {name}" if name in _JOINED_COLUMNS else f"t.{name}" for name in columns)
    return f"SELECT {selected} FROM {_FROM} WHERE {where}", params


def trials_page(session: Session, filters: Filters, limit: int = 100, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Raw trials matching the filters exactly, newest first, and how many match (capped).

    The count stops at :data:`TRIALS_COUNT_CAP`; more matches are reported as cap + 1.
    """
    limit = max(0, min(int(limit), 10_000))
    offset = max(0, int(offset))
    select, params = _select(TRIAL_COLUMNS, filters, None)
    rows = session.execute(
        text(f"{select} ORDER BY t.started_at DESC, t.trial_id LIMIT :limit OFFSET :offset"),
        {**params, "limit": limit, "offset": offset},
    ).all()
    where, count_params = trial_where(filters)
    total = session.execute(
        text(f"SELECT count(*) FROM (SELECT 1 FROM {_FROM} WHERE {where} LIMIT :cap) AS matches"),
        {**count_params, "cap": TRIALS_COUNT_CAP + 1},
    ).scalar_one()
    return [dict(row._mapping) for row in rows], int(total)


#: A traced trial within this share of the latency asked for is preferred to a nearer untraced one.
TRACED_NEAR_SHARE = 0.1


def trial_near(session: Session, filters: Filters, iw: int, latency_ms: float) -> uuid.UUID | None:
    """The trial of arm ``iw`` matching the filters whose latency (the filters' metric: the
    client's total, or the server's response latency) is nearest ``latency_ms``, a traced one
    preferred within :data:`TRACED_NEAR_SHARE` of it; ``None`` when the arm has none.  Where a
    click on a latency figure's point leads: the Trials page's inspector of a trial like it.
    A raw read over the arm's matching trials (no index orders by latency): keep filters narrow."""
    where, params = trial_where(filters)
    column = "t.total_us" if filters.metric == "client" else "t.server_latency_us"
    target_us = max(0.0, float(latency_ms)) * 1000.0
    found = session.execute(
        text(
            f"SELECT t.trial_id FROM {_FROM} WHERE {where} AND t.arm_iw = :iw AND {column} IS NOT NULL "
            "ORDER BY (abs(" + column + " - :target) <= :near "
            "AND EXISTS (SELECT 1 FROM trial_traces AS traced WHERE traced.trial_id = t.trial_id)) DESC, "
            f"abs({column} - :target), t.trial_id LIMIT 1"
        ),
        {**params, "iw": int(iw), "target": target_us, "near": TRACED_NEAR_SHARE * target_us},
    ).scalar()
    return found if found is None or isinstance(found, uuid.UUID) else uuid.UUID(str(found))


def iter_trials_csv(
    session: Session, filters: Filters, chunk_rows: int = 2000, *, layout: CsvLayout = PAGE_CSV, probe_id: uuid.UUID | None = None
) -> Iterator[str]:
    """Raw trials matching ``filters`` (and ``probe_id`` when given) as CSV text chunks, header
    first, oldest first, read ``chunk_rows`` at a time through a server-side cursor."""
    select, params = _select(layout.columns, filters, probe_id)

    def cell(value: Any) -> Any:
        if isinstance(value, dt.datetime):
            return layout.timestamp(value)
        if isinstance(value, dict):
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        return "" if value is None else value

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(layout.columns)
    result = session.execute(
        text(f"{select} ORDER BY t.started_at, t.trial_id"),
        params,
        execution_options={"yield_per": chunk_rows, "stream_results": True},
    )
    for partition in result.partitions(chunk_rows):
        for row in partition:
            writer.writerow([cell(value) for value in row])
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()
