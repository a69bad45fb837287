"""Checks of uploaded batches beyond their JSON Schema: whose records they are, the relations
between fields (wire v9's ``protocol`` against the arm: :mod:`iwscope.trials.protocols`),
timestamps in range; :class:`BatchRejected` names every bad record and field (nothing of a
refused batch is stored)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import ValidationError

from iwprobe import wire
from iwscope.trials import census, fastwire, protocols
from iwscope.trials.schemas import RecordError
from iwscope.types import utcnow

#: Oldest instant a record may carry.
EARLIEST_TIMESTAMP = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
#: How far in the future a record's timestamp may lie (clock skew allowance).
MAX_FUTURE = dt.timedelta(days=1)


class BatchRejected(Exception):
    """A batch refused as a whole; ``status_code`` is 403, 413 or 422, nothing was stored."""

    def __init__(self, status_code: int, message: str, errors: Sequence[RecordError] = ()) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.errors = list(errors)

    def detail(self) -> dict[str, Any]:
        return {"message": self.message, "errors": [error.model_dump() for error in self.errors]}


_ID_FIELDS = {"trials": "trial_id", "path_samples": "sample_id", "census": "census_id", "observations": "trial_id"}


def _record_ids(body: bytes, id_fields: dict[str, str]) -> dict[str, list[Any]]:
    """Best-effort UUIDs of the records of a body that failed validation (for error messages)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(document, dict):
        return {}
    ids: dict[str, list[Any]] = {}
    for section, id_field in id_fields.items():
        records = document.get(section)
        if isinstance(records, list):
            ids[section] = [record.get(id_field) if isinstance(record, dict) else None for record in records]
    return ids


def errors_from_validation(error: ValidationError, body: bytes, id_fields: dict[str, str] | None = None) -> BatchRejected:
    """The 422 (413 when a section is over ``wire.MAX_BATCH_RECORDS``) naming every record and
    field pydantic refused; ``id_fields``: each section of the batch and its records' id field
    (default: the trial and observation batches')."""
    id_fields = _ID_FIELDS if id_fields is None else id_fields
    ids = _record_ids(body, id_fields)
    record_errors: list[RecordError] = []
    too_long = False
    for item in error.errors(include_url=False, include_input=False):
        loc = item["loc"]
        if len(loc) >= 2 and loc[0] in id_fields and isinstance(loc[1], int):
            section, index = str(loc[0]), loc[1]
            section_ids = ids.get(section, [])
            record_id = section_ids[index] if index < len(section_ids) else None
            record_errors.append(
                RecordError(
                    section=section,
                    index=index,
                    record_id=record_id if isinstance(record_id, str) else None,
                    field=".".join(str(part) for part in loc[2:]) or "(record)",
                    message=item["msg"],
                )
            )
        else:
            if item["type"] == "too_long" and loc and loc[0] in id_fields:
                too_long = True
            record_errors.append(
                RecordError(
                    section="batch",
                    index=None,
                    record_id=None,
                    field=".".join(str(part) for part in loc) or "(body)",
                    message=item["msg"],
                )
            )
    if too_long:
        return BatchRejected(413, f"a batch holds at most {wire.MAX_BATCH_RECORDS} records", record_errors)
    return BatchRejected(422, "invalid batch: nothing was stored", record_errors)


def check_instant(
    errors: list[RecordError], section: str, index: int, record_id: str, name: str, value: dt.datetime, latest: dt.datetime
) -> None:
    """Name ``value`` in ``errors`` when it is before 2000 or later than ``latest``."""
    if value < EARLIEST_TIMESTAMP:
        errors.append(
            RecordError(section=section, index=index, record_id=record_id, field=name, message="timestamp is before 2000-01-01")
        )
    elif value > latest:
        errors.append(
            RecordError(
                section=section,
                index=index,
                record_id=record_id,
                field=name,
                message="timestamp is more than a day in the future",
            )
        )


def _arm_matches_iw(label: str, iw: int) -> bool:
    """An arm label names the IW it starts from (``10``, ``10p``, ``10q``, ``10pq``: 10; ``learned``: any)."""
    return label in ("", "learned") or wire.arm_label_iw(label) == iw


def _flow_field_errors(trials: Sequence[fastwire.FastTrial]) -> list[RecordError]:
    """The wire-v3 fields of each trial agree with each other (checks the schema cannot state)."""
    errors: list[RecordError] = []

    def error(index: int, trial: fastwire.FastTrial, name: str, message: str) -> None:
        errors.append(RecordError(section="trials", index=index, record_id=trial.trial_id, field=name, message=message))

    for index, trial in enumerate(trials):
        if not (trial.arm or trial.role or trial.page_id or trial.echo):
            continue  # a wire v1/v2 record (or a plain short flow): nothing to relate
        if not _arm_matches_iw(trial.arm, trial.arm_iw):
            error(index, trial, "arm", f"arm {trial.arm!r} does not start from arm_iw {trial.arm_iw}")
        if (trial.role == "interactive") != (trial.echo is not None):
            error(index, trial, "echo", "the interactive role and echo statistics go together")
        if (trial.role == "page-load") != (trial.page_id is not None):
            error(index, trial, "page_id", "the page-load role and a page_id go together")
        if trial.echo is not None:
            if len(trial.echo.rtt_us) != trial.echo.sent:
                error(index, trial, "echo.rtt_us", "one entry per packet sent")
            elif sum(rtt is not None for rtt in trial.echo.rtt_us) != trial.echo.received:
                error(index, trial, "echo.received", "not the number of echoed packets in rtt_us")
    return errors


def validate_trial_batch(body: bytes, probe_id: uuid.UUID) -> fastwire.FastTrialBatch:
    """Parse and check a ``TrialBatch`` uploaded by ``probe_id``, or raise :class:`BatchRejected`.

    The msgspec decoder (:mod:`iwscope.trials.fastwire`) accepts exactly what the pydantic
    model accepts; when it refuses, pydantic runs on the body and names every bad record and
    field.  A record whose ``probe_id`` is not the authenticated probe makes the whole batch
    403 (the body names every such record): a credential may only act for its own probe.
    """
    try:
        batch = fastwire.decode_or_refuse(body)
    except ValidationError as error:
        raise errors_from_validation(error, body) from None
    trials, samples, records = batch.trials, batch.path_samples, batch.census
    if len(trials) + len(samples) + len(records) > wire.MAX_BATCH_RECORDS:
        raise BatchRejected(413, f"a batch holds at most {wire.MAX_BATCH_RECORDS} records")
    own = str(probe_id)
    if (
        batch.probe_id != own
        or any(trial.probe_id != own for trial in trials)
        or any(sample.probe_id != own for sample in samples)
        or any(record.probe_id != own for record in records)
    ):
        foreign: list[RecordError] = []
        if batch.probe_id != own:
            foreign.append(
                RecordError(
                    section="batch",
                    index=None,
                    record_id=batch.batch_id,
                    field="probe_id",
                    message="not the probe of this credential",
                )
            )
        for index, trial in enumerate(trials):
            if trial.probe_id != own:
                foreign.append(
                    RecordError(
                        section="trials",
                        index=index,
                        record_id=trial.trial_id,
                        field="probe_id",
                        message="not the probe of this credential",
                    )
                )
        for index, sample in enumerate(samples):
            if sample.probe_id != own:
                foreign.append(
                    RecordError(
                        section="path_samples",
                        index=index,
                        record_id=sample.sample_id,
                        field="probe_id",
                        message="not the probe of this credential",
                    )
                )
        for index, record in enumerate(records):
            if record.probe_id != own:
                foreign.append(
                    RecordError(
                        section="census",
                        index=index,
                        record_id=record.census_id,
                        field="probe_id",
                        message="not the probe of this credential",
                    )
                )
        raise BatchRejected(403, "records of another probe: nothing was stored", foreign)
    flow_errors = (
        _flow_field_errors(trials) + protocols.trial_errors(trials) + census.client_iw_errors(trials) + census.check(records)
    )
    if flow_errors:
        raise BatchRejected(422, "invalid batch: nothing was stored", flow_errors)
    latest = utcnow() + MAX_FUTURE
    instants = batch.started_at + batch.measured_at + batch.census_measured_at
    if instants and (min(instants) < EARLIEST_TIMESTAMP or max(instants) > latest):
        errors: list[RecordError] = []
        for index, (trial, started_at) in enumerate(zip(trials, batch.started_at, strict=True)):
            check_instant(errors, "trials", index, trial.trial_id, "started_at", started_at, latest)
        for index, (sample, measured_at) in enumerate(zip(samples, batch.measured_at, strict=True)):
            check_instant(errors, "path_samples", index, sample.sample_id, "measured_at", measured_at, latest)
        for index, (record, measured_at) in enumerate(zip(records, batch.census_measured_at, strict=True)):
            check_instant(errors, "census", index, record.census_id, "measured_at", measured_at, latest)
        raise BatchRejected(422, "invalid batch: nothing was stored", errors)
    return batch


def validate_observation_batch(body: bytes, origin_id: uuid.UUID) -> fastwire.FastObservationBatch:
    """Parse and check an ``ObservationBatch`` uploaded by ``origin_id``, or raise :class:`BatchRejected`.

    Decoded as trial batches are (:func:`iwscope.trials.fastwire.decode_or_refuse_observations`:
    msgspec, pydantic naming the errors of a refused body).  A record of another origin makes
    the whole batch 403 (naming every such record); a ``protocol`` that disagrees with the
    record (:func:`iwscope.trials.protocols.observation_errors`) or a ``request_at`` before 2000
    or more than a day ahead, 422.
    """
    try:
        batch = fastwire.decode_or_refuse_observations(body)
    except ValidationError as error:
        raise errors_from_validation(error, body) from None
    observations = batch.observations
    own = str(origin_id)
    if batch.origin_id != own or any(observation.origin_id != own for observation in observations):
        foreign = [
            RecordError(
                section="observations",
                index=index,
                record_id=observation.trial_id,
                field="origin_id",
                message="not the origin of this credential",
            )
            for index, observation in enumerate(observations)
            if observation.origin_id != own
        ]
        if batch.origin_id != own:
            foreign.insert(
                0,
                RecordError(
                    section="batch",
                    index=None,
                    record_id=batch.batch_id,
                    field="origin_id",
                    message="not the origin of this credential",
                ),
            )
        raise BatchRejected(403, "records of another origin: nothing was stored", foreign)
    protocol_errors = protocols.observation_errors(observations)
    if protocol_errors:
        raise BatchRejected(422, "invalid batch: nothing was stored", protocol_errors)
    latest = utcnow() + MAX_FUTURE
    instants = batch.request_at
    if instants and (min(instants) < EARLIEST_TIMESTAMP or max(instants) > latest):
        errors: list[RecordError] = []
        for index, (observation, request_at) in enumerate(zip(observations, instants, strict=True)):
            check_instant(errors, "observations", index, observation.trial_id, "request_at", request_at, latest)
        raise BatchRejected(422, "invalid batch: nothing was stored", errors)
    return batch
