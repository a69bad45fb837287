"""bucket roll-ups: the figures' histograms keyed by the path's buckets instead of the path

``analysis_signatures`` names each combination of (region, RTT, bandwidth, BDP, loss bucket) a
path can fall in; ``analysis_path_signatures`` says which one each path's trials are counted
under; ``analysis_bucket_rollups`` holds the same mergeable aggregates as ``analysis_rollups``
keyed by (campaign, signature, arm, size octave, day / month) instead of by path, so a figure
reads rows in proportion to the buckets it draws, not to the fleet.  The per-path roll-ups stay
(paired estimates, re-bucketing, within-path intervals).

Both roll-ups are emptied and their watermark reset: the first refresh after the upgrade folds
every trial in again, into both (one pass over ``trials``).  A covering index on the per-path
roll-ups serves the paired estimates' scan without reading the histograms.

Revision ID: 0009_bucket_rollups
Revises: 0008_credential_notifications
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_bucket_rollups"
down_revision: str | None = "0008_credential_notifications"
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


#: What ``frames.load_path_stats`` and ``queries.fleet`` read from ``analysis_rollups`` (index-only scans).
_CELL_COLUMNS = (
    "campaign_id",
    "probe_id",
    "origin_id",
    "size_bucket",
    "n_trials",
    "n_errors",
    "client_n",
    "client_sum_us",
    "server_n",
    "server_sum_us",
)


def upgrade() -> None:
    op.create_table(
        "analysis_signatures",
        sa.Column("id", sa.Integer(), sa.Identity(), nullable=False),
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("rtt_bucket", sa.SmallInteger(), nullable=False),
        sa.Column("bandwidth_bucket", sa.SmallInteger(), nullable=False),
        sa.Column("bdp_bucket", sa.SmallInteger(), nullable=False),
        sa.Column("loss_bucket", sa.SmallInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_analysis_signatures")),
        sa.UniqueConstraint(
            "region", "rtt_bucket", "bandwidth_bucket", "bdp_bucket", "loss_bucket", name=op.f("uq_analysis_signatures_region")
        ),
    )
    op.create_table(
        "analysis_path_signatures",
        sa.Column("probe_id", sa.UUID(), nullable=False),
        sa.Column("origin_id", sa.UUID(), nullable=False),
        sa.Column("signature_id", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("probe_id", "origin_id", name=op.f("pk_analysis_path_signatures")),
    )
    op.create_index("ix_analysis_path_signatures_signature_id", "analysis_path_signatures", ["signature_id"])
    op.create_table(
        "analysis_bucket_rollups",
        sa.Column("campaign_id", sa.BigInteger(), nullable=False),
        sa.Column("signature_id", sa.Integer(), nullable=False),
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
            "campaign_id", "signature_id", "arm_iw", "size_bucket", "day", "grain", name=op.f("pk_analysis_bucket_rollups")
        ),
    )
    op.create_index("ix_analysis_bucket_rollups_grain_day", "analysis_bucket_rollups", ["grain", "day"])
    # the paired estimates' scan: month rows (or the edge days) of two arms, without the histograms
    op.create_index(
        "ix_analysis_rollups_cells", "analysis_rollups", ["grain", "day", "arm_iw"], postgresql_include=list(_CELL_COLUMNS)
    )
    op.execute("DELETE FROM analysis_rollups")
    op.execute("DELETE FROM analysis_watermarks WHERE name = 'trials'")


def downgrade() -> None:
    op.drop_index("ix_analysis_rollups_cells", table_name="analysis_rollups")
    op.drop_index("ix_analysis_bucket_rollups_grain_day", table_name="analysis_bucket_rollups")
    op.drop_table("analysis_bucket_rollups")
    op.drop_index("ix_analysis_path_signatures_signature_id", table_name="analysis_path_signatures")
    op.drop_table("analysis_path_signatures")
    op.drop_table("analysis_signatures")
