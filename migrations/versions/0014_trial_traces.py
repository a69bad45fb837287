"""trial traces (wire v7): trial_traces, one compressed packet trace per trial and side; campaigns.trace_share

A traced trial's packets, as the probe (``receiver``) or the origin (``sender``) captured them,
are stored once per trial and side: typed columns for what listings and exports select on
(packets, drops, the first flight) and the trace itself as ``body``, zlib of its canonical
compact JSON.  No foreign key to ``trials``: an origin's trace may arrive before the probe's
trial.  A campaign's ``trace_share`` (0 to 1, default 0: every campaign made before traces
nothing) is the share of rounds the probes trace.

Revision ID: 0014_trial_traces
Revises: 0013_passive
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014_trial_traces"
down_revision: str | None = "0013_passive"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRACE_SHARE = "trace_share >= 0 AND trace_share <= 1"
_SIDES = "side IN ('receiver', 'sender')"


def upgrade() -> None:
    op.add_column("campaigns", sa.Column("trace_share", sa.Double(), server_default=sa.text("0"), nullable=False))
    op.create_check_constraint("trace_share_range", "campaigns", _TRACE_SHARE)

    op.create_table(
        "trial_traces",
        sa.Column("trial_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("side", sa.Text(), nullable=False),
        sa.Column("agent_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("packets", sa.Integer(), nullable=False),
        sa.Column("dropped", sa.Integer(), nullable=False),
        sa.Column("first_flight_segments", sa.Integer(), nullable=True),
        sa.Column("first_flight_bytes", sa.Integer(), nullable=True),
        sa.Column("stored_bytes", sa.Integer(), nullable=False),
        sa.Column("body", postgresql.BYTEA(), nullable=False),
        sa.PrimaryKeyConstraint("trial_id", "side", name=op.f("pk_trial_traces")),
        sa.CheckConstraint(_SIDES, name=op.f("ck_trial_traces_side_known")),
    )


def downgrade() -> None:
    op.drop_table("trial_traces")
    op.drop_constraint(op.f("ck_campaigns_trace_share_range"), "campaigns", type_="check")
    op.drop_column("campaigns", "trace_share")
