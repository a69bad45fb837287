"""passive measurement of real users (wire v6, ``iwprobe tap``)

Operators' own web servers enroll as ``servers`` (a token of the new kind ``server``; their own
``<uuid>.<secret>`` credential, whose changes notify the API processes like probes' and
origins'), and a campaign may be a *passive* campaign: ``server_ids`` and the study's arms,
shares, ports, prefix lengths, assignment seed, sample share, upload interval and phase, no
origins, arms or sizes, and a time box.  What the servers upload lands in
``passive_aggregates`` (mergeable hourly sums; the latency histogram as two parallel arrays an
analysis merges with ``unnest``) and ``passive_connections`` (sampled connections, typed
``TCP_INFO`` columns), both idempotent by the record's UUID.  Token kind ``read`` reads them.

Revision ID: 0013_passive
Revises: 0012_client_iw_and_census
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013_passive"
down_revision: str | None = "0012_client_iw_and_census"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_KINDS = "kind IN ('enroll', 'admin', 'origin')"
_KINDS = "kind IN ('enroll', 'admin', 'origin', 'server', 'read')"
_OLD_SIZES_CHECK = (
    "(census_urls IS NULL AND (sizes IS NULL) <> (size_dist IS NULL)) "
    "OR (census_urls IS NOT NULL AND sizes IS NULL AND size_dist IS NULL)"
)
#: An ordinary campaign has exactly one of sizes and size_dist; census and passive campaigns neither.
_SIZES_CHECK = (
    "(census_urls IS NULL AND server_ids IS NULL AND (sizes IS NULL) <> (size_dist IS NULL)) "
    "OR ((census_urls IS NOT NULL OR server_ids IS NOT NULL) AND sizes IS NULL AND size_dist IS NULL)"
)
#: No passive column set, or a complete, time-boxed passive campaign in range.
_PASSIVE_CHECK = (
    "(server_ids IS NULL AND passive_arms IS NULL AND passive_ports IS NULL AND prefix_v4 IS NULL "
    "AND prefix_v6 IS NULL AND assignment_seed IS NULL AND sample_share IS NULL AND flush_interval_s IS NULL "
    "AND phase IS NULL) OR (server_ids IS NOT NULL AND cardinality(server_ids) > 0 AND passive_arms IS NOT NULL "
    "AND census_urls IS NULL AND ends_at IS NOT NULL "
    "AND prefix_v4 IS NOT NULL AND prefix_v4 BETWEEN 16 AND 24 AND prefix_v6 IS NOT NULL AND prefix_v6 BETWEEN 32 AND 64 "
    "AND assignment_seed IS NOT NULL AND assignment_seed BETWEEN 0 AND 4294967295 "
    "AND sample_share IS NOT NULL AND sample_share BETWEEN 0 AND 1 "
    "AND flush_interval_s IS NOT NULL AND flush_interval_s BETWEEN 1 AND 3600 AND phase IS NOT NULL AND phase >= 0)"
)
_CAMPAIGN_COLUMNS = (
    ("server_ids", postgresql.ARRAY(sa.UUID())),
    ("passive_arms", postgresql.JSONB()),
    ("passive_ports", postgresql.ARRAY(sa.Integer())),
    ("prefix_v4", sa.Integer()),
    ("prefix_v6", sa.Integer()),
    ("assignment_seed", sa.BigInteger()),
    ("sample_share", sa.Double()),
    ("flush_interval_s", sa.Integer()),
    ("phase", sa.Integer()),
)
_FAMILY = "family IN ('ipv4', 'ipv6')"
_PORT_KIND = "port_kind IN ('user')"


def _record_key_columns() -> list[sa.Column]:
    """The columns aggregates and connections share (after their own id)."""
    return [
        sa.Column("server_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("campaign_id", sa.BigInteger(), nullable=False),
        sa.Column("phase", sa.Integer(), nullable=False),
    ]


def _arm_columns() -> list[sa.Column]:
    return [
        sa.Column("arm", sa.Text(), nullable=False),
        sa.Column("arm_iw", sa.Integer(), nullable=True),
        sa.Column("treated_share_bp", sa.SmallInteger(), nullable=False),
        sa.Column("family", sa.Text(), nullable=False),
        sa.Column("port_kind", sa.Text(), nullable=False),
    ]


def _received_at() -> sa.Column:
    return sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False)


def upgrade() -> None:
    op.drop_constraint(op.f("ck_api_tokens_kind"), "api_tokens", type_="check")
    op.create_check_constraint("kind", "api_tokens", _KINDS)

    op.create_table(
        "servers",
        sa.Column("id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("ports", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("kernel", sa.Text(), nullable=False),
        sa.Column("secret_hash", sa.Text(), nullable=False),
        sa.Column("enrolled_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_heartbeat", postgresql.JSONB(), nullable=True),
    )
    # Migration 0008's notification: a revoked or re-keyed server is refused at once everywhere.
    op.execute("""
        CREATE TRIGGER servers_credential_change
        AFTER UPDATE OF secret_hash, revoked_at, name, region OR DELETE ON servers
        FOR EACH ROW EXECUTE FUNCTION iwscope_notify_credential_change()""")

    for name, kind in _CAMPAIGN_COLUMNS:
        op.add_column("campaigns", sa.Column(name, kind, nullable=True))
    op.drop_constraint(op.f("ck_campaigns_sizes_xor_size_dist"), "campaigns", type_="check")
    op.create_check_constraint("sizes_xor_size_dist", "campaigns", _SIZES_CHECK)
    op.create_check_constraint("passive_complete", "campaigns", _PASSIVE_CHECK)

    op.create_table(
        "passive_aggregates",
        sa.Column("aggregate_id", postgresql.UUID(as_uuid=True), primary_key=True),
        *_record_key_columns(),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        *_arm_columns(),
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("cluster", sa.SmallInteger(), nullable=False),
        sa.Column("rtt_bucket", sa.SmallInteger(), nullable=False),
        sa.Column("bandwidth_bucket", sa.SmallInteger(), nullable=False),
        sa.Column("bdp_bucket", sa.SmallInteger(), nullable=False),
        sa.Column("size_octave", sa.SmallInteger(), nullable=False),
        sa.Column("biased", sa.Boolean(), nullable=False),
        sa.Column("connections", sa.BigInteger(), nullable=False),
        sa.Column("responses", sa.BigInteger(), nullable=False),
        sa.Column("latency_sum_us", sa.BigInteger(), nullable=False),
        sa.Column("latency_bins", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("latency_counts", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        *[
            sa.Column(name, sa.BigInteger(), nullable=False)
            for name in (
                "retrans_connections",
                "data_segs_out",
                "total_retrans",
                "bytes_acked",
                "bytes_retrans",
                "syn_retrans",
                "rwnd_limited",
                "reused_after_idle",
                "tls",
            )
        ],
        _received_at(),
        sa.CheckConstraint(_FAMILY, name=op.f("ck_passive_aggregates_family_known")),
        sa.CheckConstraint(_PORT_KIND, name=op.f("ck_passive_aggregates_port_kind_known")),
        sa.CheckConstraint(
            "cardinality(latency_bins) = cardinality(latency_counts)", name=op.f("ck_passive_aggregates_hist_pairs")
        ),
    )
    op.create_index("ix_passive_aggregates_hour_brin", "passive_aggregates", ["hour"], postgresql_using="brin")
    op.create_index("ix_passive_aggregates_campaign_id_hour", "passive_aggregates", ["campaign_id", "hour"])

    op.create_table(
        "passive_connections",
        sa.Column("record_id", postgresql.UUID(as_uuid=True), primary_key=True),
        *_record_key_columns(),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=False),
        *_arm_columns(),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("country", sa.Text(), nullable=False),
        sa.Column("client_prefix", sa.Text(), nullable=False),
        sa.Column("cluster", sa.SmallInteger(), nullable=False),
        *[
            sa.Column(name, sa.BigInteger(), nullable=True)
            for name in (
                "tcpi_min_rtt_us",
                "tcpi_rtt_us",
                "tcpi_delivery_rate",
                "tcpi_bytes_acked",
                "tcpi_data_segs_out",
                "tcpi_total_retrans",
                "tcpi_bytes_retrans",
                "tcpi_snd_cwnd",
            )
        ],
        sa.Column("tcp_info", postgresql.JSONB(), nullable=False),
        sa.Column("captured", sa.Boolean(), nullable=False),
        sa.Column("tls", sa.Boolean(), nullable=True),
        sa.Column("response_latency_us", sa.BigInteger(), nullable=True),
        sa.Column("response_bytes", sa.BigInteger(), nullable=True),
        sa.Column("handshake_us", sa.BigInteger(), nullable=True),
        sa.Column("first_flight_segments", sa.Integer(), nullable=True),
        sa.Column("first_flight_bytes", sa.BigInteger(), nullable=True),
        sa.Column("handshake_rtt_us", sa.BigInteger(), nullable=True),
        sa.Column("client_rwnd_bytes", sa.BigInteger(), nullable=True),
        sa.Column("syn_retrans", sa.Boolean(), nullable=False),
        sa.Column("rwnd_limited", sa.Boolean(), nullable=False),
        sa.Column("reused_after_idle", sa.Boolean(), nullable=False),
        sa.Column("exchanges", sa.Integer(), nullable=True),
        _received_at(),
        sa.CheckConstraint(_FAMILY, name=op.f("ck_passive_connections_family_known")),
        sa.CheckConstraint(_PORT_KIND, name=op.f("ck_passive_connections_port_kind_known")),
        sa.CheckConstraint("client_prefix ~ '^[0-9a-f]{16}$'", name=op.f("ck_passive_connections_client_prefix_hash")),
    )
    op.create_index("ix_passive_connections_closed_at_brin", "passive_connections", ["closed_at"], postgresql_using="brin")
    op.create_index("ix_passive_connections_campaign_id_closed_at", "passive_connections", ["campaign_id", "closed_at"])


def downgrade() -> None:
    op.drop_table("passive_connections")
    op.drop_table("passive_aggregates")
    op.execute("DELETE FROM campaigns WHERE server_ids IS NOT NULL")
    op.drop_constraint(op.f("ck_campaigns_passive_complete"), "campaigns", type_="check")
    op.drop_constraint(op.f("ck_campaigns_sizes_xor_size_dist"), "campaigns", type_="check")
    op.create_check_constraint("sizes_xor_size_dist", "campaigns", _OLD_SIZES_CHECK)
    for name, _ in reversed(_CAMPAIGN_COLUMNS):
        op.drop_column("campaigns", name)
    op.execute("DROP TRIGGER servers_credential_change ON servers")
    op.drop_table("servers")
    op.execute("DELETE FROM api_tokens WHERE kind IN ('server', 'read')")
    op.drop_constraint(op.f("ck_api_tokens_kind"), "api_tokens", type_="check")
    op.create_check_constraint("kind", "api_tokens", _OLD_KINDS)
