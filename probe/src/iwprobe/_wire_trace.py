"""Trial traces, specified once: the trace's format (``iwprobe fetch --trace``) and, wire v7,
its upload (:class:`TraceBatch` to :data:`TRACES_BATCH_PATH`).

Written by :class:`iwprobe._trace.Trace` and read by whatever draws or stores traces (the
collector, the dashboard's ``iwscope trace plot``), which may import the probe's wire module
only: the version, the columns, the one check of a trace dict and the upload's records live
here, re-exported by :mod:`iwprobe.wire`.

Traces travel on their own path, not inside a :class:`~iwprobe.wire.TrialBatch`: a traced
trial's packets are ~4-5 KB of JSON against ~1 KB for the trial, and a campaign traces a share
of its rounds (``CampaignSchedule.trace_share``), so the hot ingest path never parses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: POST :class:`TraceBatch` with the credential of the agent that captured the traces (a
#: probe: the receiver side; an origin: the sender side); answers ``UploadResult``.
TRACES_BATCH_PATH = "/api/v1/traces/batch"
#: Request header by which a probe asks the origin to keep its own (sender-side) trace of a
#: traced trial (value ``1``); the origin links it to the trial by :data:`~iwprobe.wire.TRIAL_HEADER`.
TRACE_HEADER = "X-Iwscope-Trace"
#: Which end of the connection a trace was captured at: the probe (``receiver``, the client)
#: or the origin (``sender``).
TRACE_SIDES = ("receiver", "sender")
#: Most traces in one :class:`TraceBatch`, and most packets in one trace (a 16 MiB object is
#: ~12,000 data packets and as many ACKs; longer captures are cut and say so in ``dropped``).
MAX_TRACES_PER_BATCH = 200
MAX_TRACE_PACKETS = 50_000

#: Bumped when a field changes meaning; :func:`check_trace` refuses other versions.
TRACE_VERSION = 1
#: The per-packet columns (parallel lists of ints, capture order).
TRACE_COLUMNS = ("t_us", "outgoing", "seq", "ack", "length", "flags", "window")
#: Per-trace integers that may be null (options not seen, ``TCP_INFO`` not read).
TRACE_OPTIONAL_INTS = ("client_mss", "server_mss", "client_wscale", "server_wscale", "rcv_mss", "min_rtt_us")
#: The fields of a trace's ``first_flight`` (null when the probe found none): the inference's
#: split of the received data, made once on the captured packets; ``packets`` is how many of the
#: first received data packets (capture order) it covers, ``cutoff_us`` where the split fell
#: (for drawing: the columns' microseconds cannot redo an ns split exactly).
TRACE_FLIGHT_FIELDS = ("packets", "segments", "bytes", "rtt_us", "mss", "cutoff_us")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_trace(data: Any) -> int:
    """The number of packets of a version :data:`TRACE_VERSION` trace dict; ``ValueError`` (one
    line: what is wrong) for anything else."""
    version = data.get("version") if isinstance(data, dict) else None
    if version != TRACE_VERSION:
        raise ValueError(f"not a version {TRACE_VERSION} trace (version {version!r})")
    lengths = set()
    for name in TRACE_COLUMNS:
        values = data.get(name)
        if not isinstance(values, list) or not all(_is_int(value) for value in values):
            raise ValueError(f"trace column {name!r} is not a list of integers")
        lengths.add(len(values))
    if len(lengths) != 1:
        raise ValueError(f"trace columns differ in length: {sorted(lengths)}")
    count = lengths.pop()
    if "packets" in data and data["packets"] != count:
        raise ValueError("trace 'packets' does not match its columns")
    for name in TRACE_OPTIONAL_INTS:
        value = data.get(name)
        if value is not None and not _is_int(value):
            raise ValueError(f"trace field {name!r} is not an integer")
    if count > MAX_TRACE_PACKETS:
        raise ValueError(f"trace of {count} packets: at most {MAX_TRACE_PACKETS}")
    if not _is_int(data.get("dropped", 0)):
        raise ValueError("trace field 'dropped' is not an integer")
    flight = data.get("first_flight")
    if flight is not None and (not isinstance(flight, dict) or not all(_is_int(flight.get(key)) for key in TRACE_FLIGHT_FIELDS)):
        raise ValueError(f"trace field 'first_flight' is not null or integers {', '.join(TRACE_FLIGHT_FIELDS)}")
    return count


@dataclass
class TraceRecord:
    """One trial's trace as uploaded (wire v7)."""

    #: The trial (the probe's id; an origin takes it from ``TRIAL_HEADER`` as its observation does).
    trial_id: str
    #: :data:`TRACE_SIDES`.
    side: str
    #: Wall-clock UTC instant the traced connection started (a probe: the trial's ``started_at``;
    #: the trace's ``t_us`` count from its SYN, a DNS lookup later at most).
    captured_at: str
    #: The trace: a dict :func:`check_trace` accepts.
    trace: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceBatch:
    """What an agent uploads to :data:`TRACES_BATCH_PATH`; all-or-nothing, idempotent per
    (``trial_id``, ``side``)."""

    wire_version: int
    batch_id: str
    #: The probe or origin whose credential signs the batch.
    agent_id: str
    sent_at: str
    traces: list[TraceRecord] = field(default_factory=list)


__all__ = [
    "TRACE_VERSION",
    "TRACE_COLUMNS",
    "TRACE_OPTIONAL_INTS",
    "TRACE_FLIGHT_FIELDS",
    "TRACES_BATCH_PATH",
    "TRACE_HEADER",
    "TRACE_SIDES",
    "MAX_TRACES_PER_BATCH",
    "MAX_TRACE_PACKETS",
    "TraceRecord",
    "TraceBatch",
    "check_trace",
]
