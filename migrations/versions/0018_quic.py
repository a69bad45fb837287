"""HTTP/3 (wire v9): the protocol of trials, origin observations and census records; an observation's QUIC first flight

A QUIC arm (``10q``, ``10pq``) runs the same policy as its TCP arm over HTTP/3, so a record says
its transport: ``protocol`` on ``trials``, ``origin_observations`` and ``census_records``, ``text``
NULL, where NULL is "not said", which is TCP (every record stored before, and every one an agent
older than wire v9 uploads), as ``family`` is; checked against the wire's named values.  A QUIC
observation adds its first flight as the origin counted it (datagrams and bytes sent before an
ACK of the response could arrive, the datagram size its window is counted in), the connection's
lost packets and whether the request came as 0-RTT data: all nullable, NULL on TCP.  Nothing
here is copied onto the trial by the join (like ``arm`` and ``send_path``, they say how the
observation was made), and nothing of a table is rewritten (nullable columns without a default).

Revision ID: 0018_quic
Revises: 0017_twin_arm_labels
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_quic"
down_revision: str | None = "0017_twin_arm_labels"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The tables that gain ``protocol``.
_TABLES = ("trials", "origin_observations", "census_records")
#: The values as wire v9 defines them (``wire.PROTOCOLS`` without "not said"), written out: a
#: migration must not change when the code does.
_PROTOCOL_KNOWN = "protocol IN ('tcp', 'quic')"
_OBSERVATION_COLUMNS = (
    ("quic_first_flight_packets", sa.Integer()),
    ("quic_first_flight_bytes", sa.BigInteger()),
    ("quic_max_datagram_size", sa.Integer()),
    ("quic_lost_packets", sa.BigInteger()),
    ("quic_zero_rtt", sa.Boolean()),
)


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("protocol", sa.Text(), nullable=True))
        op.create_check_constraint("protocol_known", table, _PROTOCOL_KNOWN)
    for name, kind in _OBSERVATION_COLUMNS:
        op.add_column("origin_observations", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for name, _ in _OBSERVATION_COLUMNS:
        op.drop_column("origin_observations", name)
    for table in _TABLES:
        op.drop_constraint(op.f(f"ck_{table}_protocol_known"), table, type_="check")
        op.drop_column(table, "protocol")
