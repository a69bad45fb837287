"""lab-twin predictions: twin_predictions, a twin's whole result beside the campaign it predicts for

``iwscope lab twin`` stores its result (per path and RTT bucket: the fitted link, the fit check,
the predicted arms, a held-out arm) here, apart from every measurement: no roll-up, figure or
export of measurements reads this table.  The result is one JSONB document, checked by the
collector before it is stored, with the numbers a listing shows as columns; the same result
stored twice is one row (unique campaign and SHA-256 of its canonical JSON).

Revision ID: 0016_twin_predictions
Revises: 0015_send_paths
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016_twin_predictions"
down_revision: str | None = "0015_send_paths"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "twin_predictions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("campaign_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("baseline_iw", sa.Integer(), nullable=False),
        sa.Column("treatment_iw", sa.Integer(), nullable=False),
        sa.Column("what_if", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("compare_arm", sa.Integer(), nullable=True),
        sa.Column("twin_campaign_id", sa.BigInteger(), nullable=True),
        sa.Column("paths", sa.Integer(), nullable=False),
        sa.Column("fit_judged", sa.Integer(), nullable=False),
        sa.Column("fit_overlapping", sa.Integer(), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("body_sha256", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaigns.id"], name=op.f("fk_twin_predictions_campaign_id_campaigns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_twin_predictions")),
        sa.UniqueConstraint("campaign_id", "body_sha256", name=op.f("uq_twin_predictions_campaign_id_body_sha256")),
    )
    op.create_index(op.f("ix_twin_predictions_campaign_id"), "twin_predictions", ["campaign_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_twin_predictions_campaign_id"), table_name="twin_predictions")
    op.drop_table("twin_predictions")
