"""client-side IW inference and the IW census (wire v5)

A trial gains the initial window the probe inferred from its own capture (status, segments,
bytes, the sender's segment size, why not ``ok``; all NULL: not inferred).  ``census_records``
holds the IW of servers iwscope does not run, one row per probe, target and round of a census
campaign (idempotent by ``census_id``).  A campaign may be a census campaign: it names
``census_urls`` and no origins, arms or sizes.

Revision ID: 0012_client_iw_and_census
Revises: 0011_tls_and_family
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012_client_iw_and_census"
down_revision: str | None = "0011_tls_and_family"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = "IN ('ok', 'lower_bound', 'undetermined')"
_TRIAL_COLUMNS = (
    ("client_iw_status", sa.Text()),
    ("client_iw_segments", sa.SmallInteger()),
    ("client_iw_bytes", sa.Integer()),
    ("client_iw_mss", sa.Integer()),
    ("client_iw_reason", sa.Text()),
)
#: An ordinary campaign has exactly one of sizes and size_dist; a census campaign neither.
_SIZES_CHECK = (
    "(census_urls IS NULL AND (sizes IS NULL) <> (size_dist IS NULL)) "
    "OR (census_urls IS NOT NULL AND sizes IS NULL AND size_dist IS NULL)"
)


def upgrade() -> None:
    for name, kind in _TRIAL_COLUMNS:
        op.add_column("trials", sa.Column(name, kind, nullable=True))
    op.create_check_constraint("client_iw_status_known", "trials", f"client_iw_status {_STATUSES}")
    op.add_column("campaigns", sa.Column("census_urls", postgresql.ARRAY(sa.Text()), nullable=True))
    op.drop_constraint(op.f("ck_campaigns_sizes_xor_size_dist"), "campaigns", type_="check")
    op.create_check_constraint("sizes_xor_size_dist", "campaigns", _SIZES_CHECK)
    op.create_table(
        "census_records",
        sa.Column("census_id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("probe_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("campaign_id", sa.BigInteger(), nullable=True),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("iw_segments", sa.SmallInteger(), nullable=True),
        sa.Column("iw_bytes", sa.Integer(), nullable=True),
        sa.Column("mss", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("connections", sa.SmallInteger(), nullable=False),
        sa.Column("connections_ok", sa.SmallInteger(), nullable=False),
        sa.Column("announced_mss", sa.Integer(), nullable=True),
        sa.Column("rtt_us", sa.BigInteger(), nullable=True),
        sa.Column("family", sa.Text(), nullable=True),
        sa.Column("tls_version", sa.Text(), nullable=True),
        sa.Column("http_status", sa.SmallInteger(), nullable=True),
        sa.Column("error_detail", sa.Text(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(f"status {_STATUSES}", name=op.f("ck_census_records_status_known")),
        sa.CheckConstraint("family IN ('ipv4', 'ipv6')", name=op.f("ck_census_records_family_known")),
    )
    op.create_index("ix_census_records_campaign_id_url", "census_records", ["campaign_id", "url"])
    op.create_index("ix_census_records_measured_at_brin", "census_records", ["measured_at"], postgresql_using="brin")


def downgrade() -> None:
    op.drop_index("ix_census_records_measured_at_brin", table_name="census_records")
    op.drop_index("ix_census_records_campaign_id_url", table_name="census_records")
    op.drop_table("census_records")
    op.execute("DELETE FROM campaigns WHERE census_urls IS NOT NULL")
    op.drop_constraint(op.f("ck_campaigns_sizes_xor_size_dist"), "campaigns", type_="check")
    op.create_check_constraint("sizes_xor_size_dist", "campaigns", "(sizes IS NULL) <> (size_dist IS NULL)")
    op.drop_column("campaigns", "census_urls")
    op.drop_constraint("client_iw_status_known", "trials", type_="check")
    for name, _ in _TRIAL_COLUMNS:
        op.drop_column("trials", name)
