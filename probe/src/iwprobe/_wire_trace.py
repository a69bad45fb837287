"""The trial trace's file format (``iwprobe fetch --trace``), specified once.

Written by :class:`iwprobe._trace.Trace` and read by whatever draws or stores traces (the
dashboard's ``iwscope trace plot``), which may import the probe's wire module only: the
version, the columns and the one check of a trace dict live here, re-exported by
:mod:`iwprobe.wire`.  Not yet a message on the wire: no upload carries traces.
"""

from __future__ import annotations

from typing import Any

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
    if not _is_int(data.get("dropped", 0)):
        raise ValueError("trace field 'dropped' is not an integer")
    flight = data.get("first_flight")
    if flight is not None and (not isinstance(flight, dict) or not all(_is_int(flight.get(key)) for key in TRACE_FLIGHT_FIELDS)):
        raise ValueError(f"trace field 'first_flight' is not null or integers {', '.join(TRACE_FLIGHT_FIELDS)}")
    return count


__all__ = ["TRACE_VERSION", "TRACE_COLUMNS", "TRACE_OPTIONAL_INTS", "TRACE_FLIGHT_FIELDS", "check_trace"]
