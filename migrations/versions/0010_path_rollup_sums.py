"""per-path roll-ups without histograms: sufficient statistics only

The per-path roll-ups (``analysis_rollups``) serve the paired estimate (counts and sums per
path), the fleet table and the roll-ups' bookkeeping; the figures' histograms come from the
bucket roll-ups (0009).  Keeping a packed histogram per path x arm x size x day made every
refresh merge one histogram per touched key in Python (about one key per trial at fleet
density) and made the rows several times wider than the sums the paired scans read.  The few
per-path histograms still needed (percentile and within-path intervals, moving a path between
buckets) are read from the raw trials of those paths.  The counts and sums stay as they are:
nothing is re-folded.  Two indexes go too: ``day`` (the covering index ``ix_analysis_rollups_cells``
leads with grain and day) and ``(probe_id, origin_id)`` (re-bucketing read a path's rows by it;
it now reads the path's trials): every index is written on every upsert of a refresh.

Downgrade adds the columns back, empties the roll-ups and resets their watermark (histograms
cannot be restored from the sums; the next refresh folds every trial again).

Revision ID: 0010_path_rollup_sums
Revises: 0009_bucket_rollups
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_path_rollup_sums"
down_revision: str | None = "0009_bucket_rollups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HISTOGRAM_COLUMNS = ("client_hist_lo", "client_hist", "server_hist_lo", "server_hist")


def upgrade() -> None:
    op.drop_index("ix_analysis_rollups_day", table_name="analysis_rollups")
    op.drop_index("ix_analysis_rollups_probe_id_origin_id", table_name="analysis_rollups")
    for column in _HISTOGRAM_COLUMNS:
        op.drop_column("analysis_rollups", column)


def downgrade() -> None:
    op.create_index("ix_analysis_rollups_day", "analysis_rollups", ["day"])
    op.create_index("ix_analysis_rollups_probe_id_origin_id", "analysis_rollups", ["probe_id", "origin_id"])
    for prefix in ("client", "server"):
        op.add_column("analysis_rollups", sa.Column(f"{prefix}_hist_lo", sa.Integer(), nullable=False, server_default="0"))
        op.add_column(
            "analysis_rollups", sa.Column(f"{prefix}_hist", sa.LargeBinary(), nullable=False, server_default=sa.text("''::bytea"))
        )
    op.execute("DELETE FROM analysis_rollups")
    op.execute("DELETE FROM analysis_bucket_rollups")
    op.execute("DELETE FROM analysis_path_signatures")
    op.execute("DELETE FROM analysis_watermarks WHERE name = 'trials'")
