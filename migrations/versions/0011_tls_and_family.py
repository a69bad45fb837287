"""HTTPS and the IP version (wire v4): per trial, origin observation, origin and campaign

A trial gains the TLS version it negotiated, the client's handshake time (TCP established to
handshake complete) and its IP version; an origin observation the same plus the server's
handshake time (ClientHello read to complete), the bytes of its first flight and when the
client acknowledged them.  The join copies the server's handshake numbers onto the trial
(``server_tls_*``) as it does the response latency.  All nullable: plain HTTP and older wire
versions leave them empty; ``family`` NULL means "not said" (before wire v4).  An origin
says whether it serves HTTPS (``tls``) and may name an IPv6 host (``host6``); a campaign may
choose the IP version it measures over (``family``).

Revision ID: 0011_tls_and_family
Revises: 0010_path_rollup_sums
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_tls_and_family"
down_revision: str | None = "0010_path_rollup_sums"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRIAL_COLUMNS = (
    ("tls_version", sa.Text()),
    ("tls_handshake_us", sa.BigInteger()),
    ("family", sa.Text()),
    ("server_tls_handshake_us", sa.BigInteger()),
    ("server_tls_first_flight_bytes", sa.BigInteger()),
    ("server_tls_flight_acked_us", sa.BigInteger()),
)
_OBSERVATION_COLUMNS = (
    ("tls_version", sa.Text()),
    ("tls_handshake_us", sa.BigInteger()),
    ("tls_first_flight_bytes", sa.BigInteger()),
    ("tls_flight_acked_us", sa.BigInteger()),
    ("family", sa.Text()),
)


def upgrade() -> None:
    op.add_column("origins", sa.Column("tls", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("origins", sa.Column("host6", sa.Text(), nullable=True))
    op.add_column("campaigns", sa.Column("family", sa.Text(), nullable=True))
    op.create_check_constraint("family_known", "campaigns", "family IN ('ipv4', 'ipv6')")
    for name, kind in _TRIAL_COLUMNS:
        op.add_column("trials", sa.Column(name, kind, nullable=True))
    for name, kind in _OBSERVATION_COLUMNS:
        op.add_column("origin_observations", sa.Column(name, kind, nullable=True))
    for table in ("trials", "origin_observations"):
        op.create_check_constraint("family_known", table, "family IN ('ipv4', 'ipv6')")


def downgrade() -> None:
    op.drop_constraint("family_known", "campaigns", type_="check")
    op.drop_column("campaigns", "family")
    op.drop_column("origins", "host6")
    op.drop_column("origins", "tls")
    for table in ("trials", "origin_observations"):
        op.drop_constraint("family_known", table, type_="check")
    for name, _ in _OBSERVATION_COLUMNS:
        op.drop_column("origin_observations", name)
    for name, _ in _TRIAL_COLUMNS:
        op.drop_column("trials", name)
