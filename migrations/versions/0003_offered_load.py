"""offered-load and fairness campaigns: Poisson arrival rate and a background flow

Revision ID: 0003_offered_load
Revises: 0002_rollups
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_offered_load"
down_revision: str | None = "0002_rollups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("campaigns", sa.Column("arrival_rate_per_s", sa.Double(), nullable=True))
    op.add_column("campaigns", sa.Column("background_bytes", sa.BigInteger(), nullable=True))
    op.add_column("campaigns", sa.Column("background_iw", sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f("ck_campaigns_arrival_rate_positive"), "campaigns", "arrival_rate_per_s IS NULL OR arrival_rate_per_s > 0"
    )
    op.create_check_constraint(
        op.f("ck_campaigns_background_iw_needs_bytes"), "campaigns", "background_iw IS NULL OR background_bytes IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_campaigns_background_iw_needs_bytes"), "campaigns", type_="check")
    op.drop_constraint(op.f("ck_campaigns_arrival_rate_positive"), "campaigns", type_="check")
    op.drop_column("campaigns", "background_iw")
    op.drop_column("campaigns", "background_bytes")
    op.drop_column("campaigns", "arrival_rate_per_s")
