"""Trial traces (wire v7): the packets of a traced trial, as one end of its connection saw them.

One row per trial and side (``receiver``: the probe's capture; ``sender``: the origin's), so a
trial's two views sit side by side and a replayed upload changes nothing (``ON CONFLICT DO
NOTHING`` on the primary key).  There is no foreign key to ``trials``: an origin's trace may
arrive before the probe's trial does (each agent uploads on its own schedule), and ``trials``
is partitioned, so its UUID alone is not a key a foreign key could name.

The trace itself is kept as ``body``: zlib (level 6) of its canonical compact JSON
(:func:`iwscope.traces.services.encode_trace`).  A trace is read whole or not at all -- to draw
one trial or to export it -- never filtered by packet in SQL, so columns per packet would cost
rows and indexes for nothing; the few numbers a listing or an export selects on are typed
columns beside it.  The columns compress well (relative sequence numbers, microsecond times
that grow, repeated flags and windows): ``stored_bytes`` records what each trace costs.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import CheckConstraint, Integer, Text
from sqlalchemy.dialects.postgresql import BYTEA, UUID
from sqlalchemy.orm import Mapped, mapped_column

from iwprobe import wire
from iwscope.db import Base
from iwscope.types import CreatedAt, Int, UuidCol

#: The ``side`` check (``wire.TRACE_SIDES``).
SIDE_KNOWN_SQL = "side IN (" + ", ".join(repr(side) for side in wire.TRACE_SIDES) + ")"


class TrialTrace(Base):
    """One trial's trace from one end of its connection."""

    __tablename__ = "trial_traces"
    __table_args__ = (CheckConstraint(SIDE_KNOWN_SQL, name="side_known"),)

    trial_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    #: ``receiver`` (uploaded by the trial's probe) or ``sender`` (by the origin that served it).
    side: Mapped[str] = mapped_column(Text, primary_key=True)
    #: The probe or origin whose credential uploaded it.
    agent_id: Mapped[UuidCol]
    #: Wall-clock UTC instant of the trace's first packet.
    captured_at: Mapped[dt.datetime]
    received_at: Mapped[CreatedAt]
    #: Packets in the trace, and packets the capture's kernel queue dropped (>0: it has gaps).
    packets: Mapped[Int]
    dropped: Mapped[Int]
    #: The trace's ``first_flight`` as the agent's inference split it; NULL: none found.
    first_flight_segments: Mapped[int | None] = mapped_column(Integer)
    first_flight_bytes: Mapped[int | None] = mapped_column(Integer)
    #: Bytes of ``body``: what the trace costs the database (before TOAST's own compression,
    #: which leaves zlib output as it is).
    stored_bytes: Mapped[Int]
    #: zlib of the trace's canonical JSON (``json.dumps(trace, separators=(",", ":"), sort_keys=True)``).
    body: Mapped[bytes] = mapped_column(BYTEA)
