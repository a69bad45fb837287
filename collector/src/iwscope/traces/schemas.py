"""Trial traces: the wire v7 upload (``TraceBatch``, mirrors of ``iwprobe.wire``) and the read model.

The upload models are built like every wire model (:mod:`iwscope.wiretypes`, ``extra="forbid"``,
strict), so a document is accepted iff ``wire.schema.json`` accepts it, except the trace
itself: the schema only names its version and columns, and :func:`iwprobe.wire.check_trace`
(the one check every reader of a trace runs) decides the rest in
:mod:`iwscope.traces.validation`, where a refusal can name the record.

The read models are what ``GET /api/v1/trials/{trial_id}/traces`` answers and what the dashboard
draws from (:func:`iwscope.traces.services.read_trial_traces`): a trial, its traces, and its
twins -- the other arms of the same round on the same path -- each with theirs.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, Field

from iwprobe import wire
from iwscope.wiretypes import WIRE_MODEL_CONFIG, TraceWireVersion, WireTimestamp, WireUUID

#: ``wire.TRACE_SIDES``.
TraceSide: TypeAlias = Literal[wire.TRACE_SIDES]  # type: ignore[valid-type]


class TraceRecordIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.TraceRecord`."""

    model_config = WIRE_MODEL_CONFIG

    trial_id: WireUUID
    side: TraceSide
    captured_at: WireTimestamp
    #: A trace dict (``wire.check_trace``); checked after parsing so the 422 names the record.
    trace: dict[str, Any]


class TraceBatchIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.TraceBatch` (wire version 7 only: nothing older has it)."""

    model_config = WIRE_MODEL_CONFIG

    wire_version: TraceWireVersion
    batch_id: WireUUID
    agent_id: WireUUID
    sent_at: WireTimestamp
    traces: Annotated[list[TraceRecordIn], Field(max_length=wire.MAX_TRACES_PER_BATCH)]


class TraceOut(BaseModel):
    """One stored trace of a trial: which end captured it, its size, and the trace as uploaded."""

    side: str
    captured_at: dt.datetime
    packets: int
    dropped: int
    #: Bytes the trace takes in the database (zlib of its canonical JSON).
    stored_bytes: int
    #: The trace dict (``iwprobe.wire.check_trace``'s format), decompressed.
    trace: dict[str, Any]


class TracedTrialOut(BaseModel):
    """A trial as a trace plot needs it: what was fetched over which arm, how long it took, what
    the probe inferred of the server's first flight, its ``TCP_INFO``, and its traces (possibly none)."""

    trial_id: uuid.UUID
    campaign_id: int | None
    probe_id: uuid.UUID
    round: int | None
    #: The IW the arm starts from, and the arm's label (``10``, ``10p``, ``10q``, ``learned``).
    arm_iw: int
    arm: str
    #: The trial's transport as stored (wire v9): ``tcp``, ``quic``, or None: not said (TCP).
    protocol: str | None = None
    object_size: int
    total_us: int | None
    ttfb_us: int | None
    error_kind: str | None
    #: The client-side IW inference (wire v5): segments and status; None: not inferred.
    client_iw_segments: int | None
    client_iw_status: str | None
    #: The probe's ``TCP_INFO`` at the end of the fetch (``wire.TCP_INFO_FIELDS``).
    tcp_info: dict[str, int]
    #: The origin's observation of the trial (wire v8): how it wrote the response
    #: (``wire.SEND_PATHS``) and its device's segmentation offload (``wire.SEGMENTATION_OFFLOADS``);
    #: ``""``: the origin did not say (older than wire v8), None: no observation of the trial.
    send_path: str | None = None
    segmentation_offload: str | None = None
    traces: list[TraceOut]


class TrialTracesOut(BaseModel):
    """A trial with its traces, and its twins: the other trials of the same campaign, probe,
    origin, round and object size -- the other arms of the paired design over the same path --
    ordered by ``arm_iw``, each with its traces (possibly none)."""

    trial: TracedTrialOut
    twins: list[TracedTrialOut]
