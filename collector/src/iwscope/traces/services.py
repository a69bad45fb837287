"""Trial traces: their compact encoding, storage of a validated ``TraceBatch``, and reading a
trial's traces with its twins'.

**Encoding.**  A trace is stored as zlib (level 6) of its canonical JSON:
``json.dumps(trace, separators=(",", ":"), sort_keys=True)``.  Canonical, so the same trace is
the same bytes whoever uploads it and a stored trace can be compared with a sent one; JSON,
so a reader needs nothing of iwscope (``zlib.decompress`` and any JSON parser); zlib rather
than PostgreSQL's own TOAST compression, because TOAST only compresses values above ~2 KB
and would leave a short trace as it came, and the columns of small, repeating integers shrink
to about a fifth under DEFLATE (``stored_bytes`` records each one's cost).

**Storage.**  One set-based ``INSERT ... SELECT FROM unnest(...) ON CONFLICT (trial_id, side)
DO NOTHING`` per batch (the passive batches' way, :mod:`iwscope.passive.services`): a trace
stored before -- a replay after a lost answer, even with another body -- is a duplicate and
changes nothing.  The rows were encoded before the database slot was taken
(:mod:`iwscope.traces.validation`).

**Reading.**  :func:`read_trial_traces`: a trial (``None`` when ``trials`` has no such trial,
whatever traces of it arrived), its traces, and its *twins* -- the other arms of the paired
design: trials of the same campaign, probe, origin, round, object size and role (the same
fetch over the same path with another IW) -- each with its traces, so a plot can overlay the
arms of one round.  Each trial comes with what its origin's observation says of how it was sent
(wire v8: ``send_path``, ``segmentation_offload``), read from ``origin_observations``: the join
does not copy them onto the trial.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from iwscope.metrics import RECORDS
from iwscope.traces.models import TrialTrace
from iwscope.traces.schemas import TracedTrialOut, TraceOut, TrialTracesOut
from iwscope.trials.models import OriginObservation, Trial
from iwscope.trials.services import touch_last_seen

#: zlib's level for stored traces: the default trade-off (level 9 saves ~1 % more, slower).
ZLIB_LEVEL = 6
#: How far apart in ``started_at`` a trial and its twins may be: a round's fetches follow each
#: other within minutes; the bound lets PostgreSQL read one or two monthly partitions of
#: ``trials`` instead of every one.
TWIN_WINDOW = dt.timedelta(days=1)
#: Which table holds the agent of each kind of credential (``last_seen_at``).
_AGENT_TABLES = {"probe": "probes", "origin": "origins"}


def encode_trace(trace: dict[str, Any]) -> bytes:
    """The stored form of a trace: zlib of its canonical compact JSON (see the module)."""
    canonical = json.dumps(trace, separators=(",", ":"), sort_keys=True)
    return zlib.compress(canonical.encode("utf-8"), ZLIB_LEVEL)


def decode_trace(body: bytes) -> dict[str, Any]:
    """The trace dict of a stored ``body`` (:func:`encode_trace`'s inverse)."""
    trace: dict[str, Any] = json.loads(zlib.decompress(body))
    return trace


@dataclass(frozen=True)
class StoredTrace:
    """One row of ``trial_traces`` as it is inserted."""

    trial_id: uuid.UUID
    side: str
    agent_id: uuid.UUID
    captured_at: dt.datetime
    packets: int
    dropped: int
    first_flight_segments: int | None
    first_flight_bytes: int | None
    stored_bytes: int
    body: bytes


@dataclass(frozen=True)
class TraceBatchRows:
    """A validated ``TraceBatch``: its id, who sent it and its rows."""

    batch_id: str
    #: ``probe`` or ``origin``: the kind of the credential that sent it.
    kind: str
    agent_id: uuid.UUID
    traces: Sequence[StoredTrace]


@dataclass(frozen=True)
class TraceResult:
    batch_id: str
    accepted: int
    duplicates: int


#: (column, PostgreSQL array type the values travel as) of ``trial_traces``, in insert order.
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("trial_id", "uuid"),
    ("side", "text"),
    ("agent_id", "uuid"),
    ("captured_at", "timestamptz"),
    ("packets", "int"),
    ("dropped", "int"),
    ("first_flight_segments", "int"),
    ("first_flight_bytes", "int"),
    ("stored_bytes", "int"),
    ("body", "bytea"),
)
_NAMES = ", ".join(name for name, _ in _COLUMNS)
_INSERT = (
    f"INSERT INTO trial_traces ({_NAMES}, received_at) SELECT {_NAMES}, now() "
    f"FROM unnest({', '.join(f'%s::{kind}[]' for _, kind in _COLUMNS)}) AS u({_NAMES}) "
    "ON CONFLICT (trial_id, side) DO NOTHING"
)


def store_trace_batch(engine: Engine, rows: TraceBatchRows) -> TraceResult:
    """Insert a validated batch in one transaction (all or nothing; a trace stored before is a
    duplicate and stays as it was), the agent's ``last_seen_at`` refreshed in the same transaction."""
    accepted = 0
    pooled = engine.raw_connection()
    try:
        connection: psycopg.Connection[Any] = pooled.driver_connection  # type: ignore[assignment]
        if rows.traces:
            with connection.cursor() as cursor:
                columns = [[getattr(trace, name) for trace in rows.traces] for name, _ in _COLUMNS]
                cursor.execute(_INSERT, columns)
                accepted = int(cursor.rowcount)
        touch_last_seen(connection, _AGENT_TABLES[rows.kind], rows.agent_id)
        connection.commit()
    except BaseException:
        pooled.rollback()
        raise
    finally:
        pooled.close()
    duplicates = len(rows.traces) - accepted
    RECORDS.labels("trace", "accepted").inc(accepted)
    RECORDS.labels("trace", "duplicate").inc(duplicates)
    return TraceResult(batch_id=rows.batch_id, accepted=accepted, duplicates=duplicates)


def _trace_out(row: TrialTrace) -> TraceOut:
    return TraceOut(
        side=row.side,
        captured_at=row.captured_at,
        packets=row.packets,
        dropped=row.dropped,
        stored_bytes=row.stored_bytes,
        trace=decode_trace(row.body),
    )


def _traced_trial(trial: Trial, traces: list[TraceOut], sent: tuple[str, str] | None) -> TracedTrialOut:
    """``trial`` as the read model; ``sent``: its observation's send path and segmentation
    offload, None without an observation."""
    return TracedTrialOut(
        trial_id=trial.trial_id,
        campaign_id=trial.campaign_id,
        probe_id=trial.probe_id,
        round=trial.round,
        arm_iw=trial.arm_iw,
        arm=trial.arm or str(trial.arm_iw),
        protocol=trial.protocol,
        object_size=trial.object_size,
        total_us=trial.total_us,
        ttfb_us=trial.ttfb_us,
        error_kind=trial.error_kind,
        client_iw_segments=trial.client_iw_segments,
        client_iw_status=trial.client_iw_status,
        tcp_info=dict(trial.tcp_info or {}),
        send_path=None if sent is None else sent[0],
        segmentation_offload=None if sent is None else sent[1],
        traces=traces,
    )


def _twins(session: Session, trial: Trial) -> Sequence[Trial]:
    """The other arms of ``trial``'s round over its path (see the module), by ``arm_iw``."""
    if trial.campaign_id is None:
        return []  # a trial outside campaigns (``iwprobe fetch`` uploads none) has no round of others
    return session.scalars(
        select(Trial)
        .where(
            Trial.campaign_id == trial.campaign_id,
            Trial.probe_id == trial.probe_id,
            Trial.origin_id.is_not_distinct_from(trial.origin_id),
            Trial.round == trial.round,
            Trial.object_size == trial.object_size,
            Trial.role == trial.role,
            Trial.trial_id != trial.trial_id,
            Trial.started_at.between(trial.started_at - TWIN_WINDOW, trial.started_at + TWIN_WINDOW),
        )
        .order_by(Trial.arm_iw, Trial.arm, Trial.started_at, Trial.trial_id)
    ).all()


def read_trial_traces(session: Session, trial_id: uuid.UUID) -> TrialTracesOut | None:
    """Trial ``trial_id`` with its traces and its twins with theirs (sides in ``receiver``,
    ``sender`` order); ``None`` when ``trials`` has no such trial."""
    trial = session.scalars(select(Trial).where(Trial.trial_id == trial_id).limit(1)).first()
    if trial is None:
        return None
    twins = _twins(session, trial)
    ids = [trial.trial_id, *(twin.trial_id for twin in twins)]
    traces: dict[uuid.UUID, list[TraceOut]] = {}
    for row in session.scalars(
        select(TrialTrace).where(TrialTrace.trial_id.in_(ids)).order_by(TrialTrace.trial_id, TrialTrace.side)
    ):
        traces.setdefault(row.trial_id, []).append(_trace_out(row))
    sent: dict[uuid.UUID, tuple[str, str]] = {
        row.trial_id: (row.send_path, row.segmentation_offload)
        for row in session.execute(
            select(OriginObservation.trial_id, OriginObservation.send_path, OriginObservation.segmentation_offload).where(
                OriginObservation.trial_id.in_(ids)
            )
        )
    }
    return TrialTracesOut(
        trial=_traced_trial(trial, traces.get(trial.trial_id, []), sent.get(trial.trial_id)),
        twins=[_traced_trial(twin, traces.get(twin.trial_id, []), sent.get(twin.trial_id)) for twin in twins],
    )
