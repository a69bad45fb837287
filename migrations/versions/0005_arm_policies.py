"""arm policies: the arm label (``10``, ``10p``, ``learned``) of each origin observation

Revision ID: 0005_arm_policies
Revises: 0004_adaptive_campaigns
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_arm_policies"
down_revision: str | None = "0004_adaptive_campaigns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL: a wire-v1 observation, i.e. the plain arm ``arm_iw``.
    op.add_column("origin_observations", sa.Column("arm", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("origin_observations", "arm")
