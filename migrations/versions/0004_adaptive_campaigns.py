"""adaptive campaigns: a target precision, and the probes that reached it

Revision ID: 0004_adaptive_campaigns
Revises: 0003_offered_load
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_adaptive_campaigns"
down_revision: str | None = "0003_offered_load"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("campaigns", sa.Column("target_ci_ms", sa.Double(), nullable=True))
    op.create_check_constraint(op.f("ck_campaigns_target_ci_positive"), "campaigns", "target_ci_ms IS NULL OR target_ci_ms > 0")
    op.create_table(
        "campaign_probe_done",
        sa.Column("campaign_id", sa.BigInteger(), nullable=False),
        sa.Column("probe_id", sa.UUID(), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("widest_half_ci_ms", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("campaign_id", "probe_id", name=op.f("pk_campaign_probe_done")),
    )


def downgrade() -> None:
    op.drop_table("campaign_probe_done")
    op.drop_constraint(op.f("ck_campaigns_target_ci_positive"), "campaigns", type_="check")
    op.drop_column("campaigns", "target_ci_ms")
