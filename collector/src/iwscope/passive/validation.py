"""Checks of an uploaded ``PassiveBatch`` beyond its JSON Schema: whose records they are, the
relations between fields, instants in range, and no client address in the free text.

Like the trial batches' (:mod:`iwscope.trials.validation`), a refused batch is refused whole
with :class:`~iwscope.trials.validation.BatchRejected` naming every bad record and field
(sections ``aggregates``, ``connections``, ``batch``); nothing of it is stored.  The checks that
need the database (the campaign a record names) run in the storing transaction
(:func:`iwscope.passive.services.campaign_errors`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from pydantic import ValidationError

from iwprobe import wire
from iwscope.passive.privacy import holds_address
from iwscope.passive.schemas import PassiveAggregateIn, PassiveBatchIn, PassiveConnectionIn
from iwscope.trials.schemas import RecordError
from iwscope.trials.validation import MAX_FUTURE, BatchRejected, check_instant, errors_from_validation
from iwscope.types import utcnow

#: Each section of a passive batch and its records' id field (for the 422's ``record_id``).
PASSIVE_ID_FIELDS = {"aggregates": "aggregate_id", "connections": "record_id"}
#: Counters of an aggregate that count connections, so none may exceed ``connections``.
_PER_CONNECTION = ("responses", "retrans_connections", "syn_retrans", "rwnd_limited", "reused_after_idle", "tls")
#: A connection's fields that only its captured headers give (``None`` unless ``captured``).
CAPTURED_ONLY = (
    "tls",
    "response_latency_us",
    "response_bytes",
    "handshake_us",
    "first_flight_segments",
    "first_flight_bytes",
    "handshake_rtt_us",
    "client_rwnd_bytes",
    "exchanges",
)


def _arm_iw_error(arm: str, arm_iw: int | None) -> str | None:
    """A treated arm gives its own IW (the default arm the server's, whatever it is)."""
    if arm != wire.DEFAULT_ARM and arm_iw is not None and arm_iw != int(arm):
        return f"arm_iw {arm_iw} is not the IW of arm {arm!r}"
    return None


def _aggregate_errors(index: int, record: PassiveAggregateIn) -> list[RecordError]:
    found: list[tuple[str, str]] = []
    problem = _arm_iw_error(record.arm, record.arm_iw)
    if problem:
        found.append(("arm_iw", problem))
    hour = record.hour.astimezone(dt.UTC)
    if (hour.minute, hour.second, hour.microsecond) != (0, 0, 0):
        found.append(("hour", "must be the start of a UTC hour"))
    found += [(name, f"{name} exceeds connections") for name in _PER_CONNECTION if getattr(record, name) > record.connections]
    bins = [pair[0] for pair in record.latency_hist]
    if len(set(bins)) != len(bins):
        found.append(("latency_hist", "a bin must not repeat"))
    if sum(pair[1] for pair in record.latency_hist) != record.responses:
        found.append(("latency_hist", "the counts must add up to responses"))
    if record.responses == 0 and record.latency_sum_us != 0:
        found.append(("latency_sum_us", "must be 0 without responses"))
    if holds_address(record.region):
        found.append(("region", "must not hold an IP address"))
    return [
        RecordError(section="aggregates", index=index, record_id=record.aggregate_id, field=name, message=message)
        for name, message in found
    ]


def _connection_errors(index: int, record: PassiveConnectionIn) -> list[RecordError]:
    found: list[tuple[str, str]] = []
    problem = _arm_iw_error(record.arm, record.arm_iw)
    if problem:
        found.append(("arm_iw", problem))
    if not record.captured:
        found += [
            (name, "set although the connection's headers were not captured")
            for name in CAPTURED_ONLY
            if getattr(record, name) is not None
        ]
    if holds_address(record.region):
        found.append(("region", "must not hold an IP address"))
    return [
        RecordError(section="connections", index=index, record_id=record.record_id, field=name, message=message)
        for name, message in found
    ]


def _foreign(batch: PassiveBatchIn, own: str) -> list[RecordError]:
    message = "not the server of this credential"
    foreign = [
        RecordError(section="aggregates", index=index, record_id=record.aggregate_id, field="server_id", message=message)
        for index, record in enumerate(batch.aggregates)
        if record.server_id != own
    ]
    foreign += [
        RecordError(section="connections", index=index, record_id=record.record_id, field="server_id", message=message)
        for index, record in enumerate(batch.connections)
        if record.server_id != own
    ]
    if batch.server_id != own:
        foreign.insert(0, RecordError(section="batch", index=None, record_id=batch.batch_id, field="server_id", message=message))
    return foreign


def _instant_errors(aggregates: Sequence[PassiveAggregateIn], connections: Sequence[PassiveConnectionIn]) -> list[RecordError]:
    errors: list[RecordError] = []
    latest = utcnow() + MAX_FUTURE
    for index, aggregate in enumerate(aggregates):
        check_instant(errors, "aggregates", index, aggregate.aggregate_id, "hour", aggregate.hour, latest)
    for index, connection in enumerate(connections):
        check_instant(errors, "connections", index, connection.record_id, "closed_at", connection.closed_at, latest)
    return errors


def validate_passive_batch(body: bytes, server_id: uuid.UUID) -> PassiveBatchIn:
    """Parse and check a ``PassiveBatch`` uploaded by ``server_id``, or raise ``BatchRejected``:
    422 naming every bad record and field, 413 over ``wire.MAX_BATCH_RECORDS`` records, 403 when
    the envelope or any record names another server (a credential acts only for its own)."""
    try:
        batch = PassiveBatchIn.model_validate_json(body)
    except ValidationError as error:
        raise errors_from_validation(error, body, PASSIVE_ID_FIELDS) from None
    if len(batch.aggregates) + len(batch.connections) > wire.MAX_BATCH_RECORDS:
        raise BatchRejected(413, f"a batch holds at most {wire.MAX_BATCH_RECORDS} records")
    foreign = _foreign(batch, str(server_id))
    if foreign:
        raise BatchRejected(403, "records of another server: nothing was stored", foreign)
    errors = [error for index, record in enumerate(batch.aggregates) for error in _aggregate_errors(index, record)]
    errors += [error for index, record in enumerate(batch.connections) for error in _connection_errors(index, record)]
    errors += _instant_errors(batch.aggregates, batch.connections)
    if errors:
        raise BatchRejected(422, "invalid batch: nothing was stored", errors)
    return batch
