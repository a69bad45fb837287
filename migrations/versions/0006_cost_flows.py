"""cost experiments: trial arm labels, flow roles, page loads and interactive flows; origin echo
ports; campaign arm labels, shares, interactive flow and page loads (wire v3)

Revision ID: 0006_cost_flows
Revises: 0005_arm_policies
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006_cost_flows"
down_revision: str | None = "0005_arm_policies"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLES = "'short', 'background', 'background-alone', 'interactive', 'page-load'"


def upgrade() -> None:
    # NULL arm: the plain arm ``arm_iw`` (every trial before wire v3).
    op.add_column("trials", sa.Column("arm", sa.Text(), nullable=True))
    op.add_column("trials", sa.Column("role", sa.Text(), nullable=False, server_default="short"))
    op.add_column("trials", sa.Column("page_id", postgresql.UUID(as_uuid=True), nullable=True))
    op.add_column("trials", sa.Column("echo", postgresql.JSONB(), nullable=True))
    # Wire v1/v2 probes carried the background roles as a URL fragment.
    op.execute("UPDATE trials SET role = 'background-alone' WHERE url LIKE '%#iwscope-flow=background-alone'")
    op.execute("UPDATE trials SET role = 'background' WHERE url LIKE '%#iwscope-flow=background'")
    op.create_check_constraint("role_known", "trials", f"role IN ({_ROLES})")
    op.create_index("ix_trials_page_id", "trials", ["page_id"], postgresql_where=sa.text("page_id IS NOT NULL"))
    op.add_column("origins", sa.Column("echo_port", sa.Integer(), nullable=True))
    op.add_column("campaigns", sa.Column("arm_labels", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("campaigns", sa.Column("arm_shares", postgresql.ARRAY(sa.Double()), nullable=True))
    op.add_column("campaigns", sa.Column("interactive_interval_us", sa.Integer(), nullable=True))
    op.add_column("campaigns", sa.Column("interactive_packet_bytes", sa.Integer(), nullable=True))
    op.add_column("campaigns", sa.Column("page_connections", sa.Integer(), nullable=True))


def downgrade() -> None:
    for column in ("page_connections", "interactive_packet_bytes", "interactive_interval_us", "arm_shares", "arm_labels"):
        op.drop_column("campaigns", column)
    op.drop_column("origins", "echo_port")
    op.drop_index("ix_trials_page_id", table_name="trials")
    op.drop_constraint("role_known", "trials", type_="check")
    for column in ("echo", "page_id", "role", "arm"):
        op.drop_column("trials", column)
