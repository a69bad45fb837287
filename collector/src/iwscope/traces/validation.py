"""Checks of an uploaded ``TraceBatch`` beyond its JSON Schema, and the rows it becomes.

Like every batch (:mod:`iwscope.trials.validation`), a refused batch is refused whole with
:class:`~iwscope.trials.validation.BatchRejected` naming every bad record (section ``traces``
or ``batch``), and nothing of it is stored:

* 413 over ``wire.MAX_TRACES_PER_BATCH`` traces;
* 403 when ``agent_id`` is not the credential's, or a trace is of the other end of the
  connection than the credential's kind captures (a probe is the ``receiver``, an origin the
  ``sender``): a credential speaks only for what its own agent saw;
* 422 for a trace :func:`iwprobe.wire.check_trace` refuses (its one-line reason, with the
  record's index and trial), a number a typed column or the export's ``int64`` lists cannot
  hold, or an instant out of range.

The accepted traces are encoded here (:func:`iwscope.traces.services.encode_trace`), in the
request's worker thread, so the database slot is held for the insert alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from iwprobe import wire
from iwscope.traces.schemas import TraceBatchIn, TraceRecordIn
from iwscope.traces.services import StoredTrace, TraceBatchRows, encode_trace
from iwscope.trials.schemas import RecordError
from iwscope.trials.validation import MAX_FUTURE, BatchRejected, check_instant, errors_from_validation
from iwscope.types import utcnow

#: The batch's one section and its records' id field (for the 422's ``record_id``).
TRACE_ID_FIELDS = {"traces": "trial_id"}
#: The side each kind of credential captures (``wire.TRACE_SIDES``).
SIDE_OF_KIND: Mapping[str, str] = {"probe": "receiver", "origin": "sender"}
#: What every failed ownership check answers: as vague as the other credential refusals.
NOT_YOURS = "credential does not belong to this id: nothing was stored"
_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _range_error(trace: dict[str, Any]) -> str | None:
    """What of a trace ``check_trace`` accepted cannot be stored as typed: ``dropped`` and the
    first flight go into ``integer`` columns, the per-packet columns into ``int64`` lists of the
    Parquet export."""
    dropped = trace.get("dropped", 0)
    if not 0 <= dropped <= _INT32_MAX:
        return f"trace field 'dropped' must be 0 to {_INT32_MAX}"
    flight = trace.get("first_flight")
    if flight is not None:
        for name in ("segments", "bytes"):
            if not 0 <= flight[name] <= _INT32_MAX:
                return f"trace field 'first_flight.{name}' must be 0 to {_INT32_MAX}"
    for name in wire.TRACE_COLUMNS:
        values = trace[name]
        if values and (min(values) < _INT64_MIN or max(values) > _INT64_MAX):
            return f"trace column {name!r} holds a value beyond a signed 64-bit integer"
    return None


def _stored(record: TraceRecordIn, agent_id: uuid.UUID, packets: int) -> StoredTrace:
    flight = record.trace.get("first_flight")
    body = encode_trace(record.trace)
    return StoredTrace(
        trial_id=uuid.UUID(record.trial_id),
        side=record.side,
        agent_id=agent_id,
        captured_at=record.captured_at,
        packets=packets,
        dropped=int(record.trace.get("dropped", 0)),
        first_flight_segments=None if flight is None else int(flight["segments"]),
        first_flight_bytes=None if flight is None else int(flight["bytes"]),
        stored_bytes=len(body),
        body=body,
    )


def validate_trace_batch(body: bytes, kind: str, agent_id: uuid.UUID) -> TraceBatchRows:
    """Parse and check a ``TraceBatch`` uploaded with the credential of the ``kind`` (``probe``
    or ``origin``) ``agent_id``: its rows, ready to insert, or :class:`BatchRejected`."""
    try:
        batch = TraceBatchIn.model_validate_json(body)
    except ValidationError as error:
        rejected = errors_from_validation(error, body, TRACE_ID_FIELDS)
        if rejected.status_code == 413:  # its message names the trial batches' limit
            raise BatchRejected(413, f"a trace batch holds at most {wire.MAX_TRACES_PER_BATCH} traces", rejected.errors) from None
        raise rejected from None
    if batch.agent_id != str(agent_id):
        raise BatchRejected(
            403,
            NOT_YOURS,
            [
                RecordError(
                    section="batch", index=None, record_id=batch.batch_id, field="agent_id", message="not this credential's"
                )
            ],
        )
    side = SIDE_OF_KIND[kind]
    foreign = [
        RecordError(
            section="traces", index=index, record_id=record.trial_id, field="side", message=f"a {kind} uploads {side} traces only"
        )
        for index, record in enumerate(batch.traces)
        if record.side != side
    ]
    if foreign:
        raise BatchRejected(403, NOT_YOURS, foreign)
    errors: list[RecordError] = []
    rows: list[StoredTrace] = []
    latest = utcnow() + MAX_FUTURE
    for index, record in enumerate(batch.traces):
        check_instant(errors, "traces", index, record.trial_id, "captured_at", record.captured_at, latest)
        try:
            packets = wire.check_trace(record.trace)
        except ValueError as error:
            problem: str | None = str(error)
        else:
            problem = _range_error(record.trace)
        if problem is not None:
            errors.append(RecordError(section="traces", index=index, record_id=record.trial_id, field="trace", message=problem))
        elif not errors:  # once a record failed, the batch is refused: encode nothing more
            rows.append(_stored(record, agent_id, packets))
    if errors:
        raise BatchRejected(422, "invalid batch: nothing was stored", errors)
    return TraceBatchRows(batch_id=batch.batch_id, kind=kind, agent_id=agent_id, traces=rows)
