"""lab-twin predictions by arm label: twin_predictions.what_if and compare_arm as text

``iwscope lab twin --what-if 32,32p,learned`` predicts paced and learned arms too, which an
integer column cannot name.  The stored IWs become their plain labels (``32`` -> ``'32'``); the
stored bodies keep their integers, which the API reads as those labels.

Revision ID: 0017_twin_arm_labels
Revises: 0016_twin_predictions
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017_twin_arm_labels"
down_revision: str | None = "0016_twin_predictions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column(
        "twin_predictions",
        "what_if",
        type_=postgresql.ARRAY(sa.Text()),
        existing_type=postgresql.ARRAY(sa.Integer()),
        postgresql_using="what_if::text[]",
    )
    op.alter_column(
        "twin_predictions", "compare_arm", type_=sa.Text(), existing_type=sa.Integer(), postgresql_using="compare_arm::text"
    )


def downgrade() -> None:
    # Labels that are not plain IWs (``32p``, ``learned``) have no integer: those rows go.
    op.execute(
        "DELETE FROM twin_predictions WHERE EXISTS (SELECT 1 FROM unnest(what_if) AS arm WHERE arm !~ '^[0-9]+$') "
        "OR compare_arm !~ '^[0-9]+$'"
    )
    op.alter_column(
        "twin_predictions",
        "compare_arm",
        type_=sa.Integer(),
        existing_type=sa.Text(),
        postgresql_using="compare_arm::integer",
    )
    op.alter_column(
        "twin_predictions",
        "what_if",
        type_=postgresql.ARRAY(sa.Integer()),
        existing_type=postgresql.ARRAY(sa.Text()),
        postgresql_using="what_if::integer[]",
    )
