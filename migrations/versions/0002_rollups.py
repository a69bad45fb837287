"""analysis roll-ups: analysis_rollups, analysis_watermarks, BRIN indexes for watermark scans

Revision ID: 0002_rollups
Revises: 0001_core
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_rollups"
down_revision: str | None = "0001_core"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _metric_columns(prefix: str) -> list[sa.Column]:
    return [
        sa.Column(f"{prefix}_n", sa.BigInteger(), nullable=False),
        sa.Column(f"{prefix}_sum_us", sa.BigInteger(), nullable=False),
        sa.Column(f"{prefix}_sumsq_us2", sa.Numeric(), nullable=False),
        sa.Column(f"{prefix}_hist_lo", sa.Integer(), nullable=False),
        sa.Column(f"{prefix}_hist", sa.LargeBinary(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "analysis_rollups",
        sa.Column("campaign_id", sa.BigInteger(), nullable=False),
        sa.Column("probe_id", sa.UUID(), nullable=False),
        sa.Column("origin_id", sa.UUID(), nullable=False),
        sa.Column("arm_iw", sa.SmallInteger(), nullable=False),
        sa.Column("size_bucket", sa.SmallInteger(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("grain", sa.SmallInteger(), nullable=False),
        sa.Column("n_trials", sa.BigInteger(), nullable=False),
        sa.Column("n_errors", sa.BigInteger(), nullable=False),
        sa.Column("size_min", sa.BigInteger(), nullable=False),
        sa.Column("size_max", sa.BigInteger(), nullable=False),
        *_metric_columns("client"),
        *_metric_columns("server"),
        sa.Column("retrans_n", sa.BigInteger(), nullable=False),
        sa.Column("retrans_trials", sa.BigInteger(), nullable=False),
        sa.Column("bytes_retrans", sa.BigInteger(), nullable=False),
        sa.Column("bytes_sent", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint(
            "campaign_id", "probe_id", "origin_id", "arm_iw", "size_bucket", "day", "grain", name=op.f("pk_analysis_rollups")
        ),
    )
    op.create_index("ix_analysis_rollups_day", "analysis_rollups", ["day"], unique=False)
    op.create_index("ix_analysis_rollups_probe_id_origin_id", "analysis_rollups", ["probe_id", "origin_id"], unique=False)
    op.create_table(
        "analysis_watermarks",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("received_upto", sa.DateTime(timezone=True), nullable=False),
        sa.Column("joined_upto", sa.DateTime(timezone=True), nullable=False),
        sa.Column("refreshed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("folded_total", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_analysis_watermarks")),
    )
    op.create_index("ix_trials_received_at_brin", "trials", ["received_at"], unique=False, postgresql_using="brin")
    op.create_index("ix_trials_joined_at_brin", "trials", ["joined_at"], unique=False, postgresql_using="brin")


def downgrade() -> None:
    op.drop_index("ix_trials_joined_at_brin", table_name="trials", postgresql_using="brin")
    op.drop_index("ix_trials_received_at_brin", table_name="trials", postgresql_using="brin")
    op.drop_table("analysis_watermarks")
    op.drop_index("ix_analysis_rollups_probe_id_origin_id", table_name="analysis_rollups")
    op.drop_index("ix_analysis_rollups_day", table_name="analysis_rollups")
    op.drop_table("analysis_rollups")
