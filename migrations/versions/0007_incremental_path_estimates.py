"""incremental path estimates: the counts, sums and recent rates each estimate is computed from;
path samples indexed by received_at (BRIN) for the refresh's window

Revision ID: 0007_incremental_path_estimates
Revises: 0006_cost_flows
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007_incremental_path_estimates"
down_revision: str | None = "0006_cost_flows"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTERS = ("trial_count", "path_sample_count", "bytes_retrans_sum", "bytes_sent_sum")
_RATES = ("recent_sample_bps", "recent_server_bps")


def upgrade() -> None:
    for column in _COUNTERS:
        op.add_column("path_estimates", sa.Column(column, sa.BigInteger(), nullable=False, server_default="0"))
    for column in _RATES:
        op.add_column("path_estimates", sa.Column(column, postgresql.ARRAY(sa.BigInteger()), nullable=False, server_default="{}"))
    # Estimates written before have no parts (their counts are 0 while sample_count is not): the
    # next analysis refresh rebuilds such rows up to its watermarks before it folds its window.
    op.create_index("ix_path_samples_received_at_brin", "path_samples", ["received_at"], postgresql_using="brin")


def downgrade() -> None:
    op.drop_index("ix_path_samples_received_at_brin", table_name="path_samples")
    for column in (*_RATES, *_COUNTERS):
        op.drop_column("path_estimates", column)
