"""The origin's side of a traced trial (wire v7, ``TraceRecord.side == "sender"``).

A probe that traces a round asks the origin for its own view too (:data:`wire.TRACE_HEADER`):
the segments as the origin's kernel hands them to the device -- a TSO/GSO super-packet is one
packet here, as the seed's sender plots show it -- and the ACKs as they arrive, with the
origin's clock.  The origin's listening port is shared by every client, so the capture keys on
the client's port (:class:`~iwprobe._capture.ConnectionCapture` ``remote_port``).  It opens once
the request is read: the trace starts at the answer (the handshake and request are past), so
its sequence numbers count from the first byte each side sends after that, which is where both
sides' data starts in a one-request connection.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from . import wire
from ._capture import CaptureUnavailable, ConnectionCapture
from ._measure import Connection
from ._trace import Trace


def open_capture(conn: Connection) -> Optional[ConnectionCapture]:
    """The capture of ``conn`` alone, opened before its answer is sent; None where this
    process cannot capture (not root)."""
    try:
        return ConnectionCapture(conn.port, conn.client_port)
    except CaptureUnavailable:
        return None


def trace_record(conn: Connection, trial_id: str, capture: ConnectionCapture, info: dict[str, int]) -> dict[str, Any]:
    """The spooled :class:`wire.TraceRecord` of the connection, directions as the probe's
    trace has them (``outgoing`` is the client's: the origin's own packets are flipped)."""
    packets = [dataclasses.replace(packet, outgoing=not packet.outgoing) for packet in capture.read()]
    trace = Trace.from_packets(packets, min_rtt_us=info.get("min_rtt"), dropped=capture.dropped())
    return wire.to_dict(wire.TraceRecord(trial_id, "sender", conn.request_at, trace.to_dict()))
