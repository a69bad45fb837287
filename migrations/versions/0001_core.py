"""Collector core: probes, origins, tokens, campaigns, partitioned trials, observations, paths.

``trials`` is partitioned by RANGE(started_at), one partition per UTC month named
``trials_pYYYYMM``, plus ``trials_default`` so that no insert fails for lack of a partition.
``iwscope_ensure_trials_partition(day)`` creates a month's partition, moving any rows of
that month out of the default partition first (Celery beat calls it for coming months).

Revision ID: 0001_core
Revises:
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_core"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


ENSURE_PARTITION_FUNCTION = r"""
CREATE OR REPLACE FUNCTION iwscope_ensure_trials_partition(day date) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    month_start timestamp := date_trunc('month', day::timestamp);
    lower_bound timestamptz := month_start AT TIME ZONE 'UTC';
    upper_bound timestamptz := (month_start + interval '1 month') AT TIME ZONE 'UTC';
    partition_name text := 'trials_p' || to_char(month_start, 'YYYYMM');
BEGIN
    -- Serialise creators and keep inserts out of the default partition while rows move.
    LOCK TABLE trials_default IN ACCESS EXCLUSIVE MODE;
    IF to_regclass(partition_name) IS NOT NULL THEN
        RETURN partition_name;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE trials INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   partition_name);
    EXECUTE format('WITH moved AS (DELETE FROM trials_default WHERE started_at >= %L AND started_at < %L'
                   ' RETURNING *) INSERT INTO %I SELECT * FROM moved',
                   lower_bound, upper_bound, partition_name);
    EXECUTE format('ALTER TABLE trials ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   partition_name, lower_bound, upper_bound);
    RETURN partition_name;
END
$fn$
"""


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("token_hash", sa.Text(), nullable=False),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('enroll', 'admin', 'origin')", name=op.f("ck_api_tokens_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
    )
    op.create_index("ix_api_tokens_token_hash", "api_tokens", ["token_hash"], unique=True)
    op.create_table(
        "campaigns",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("origin_ids", postgresql.ARRAY(sa.UUID()), nullable=False),
        sa.Column("probe_regions", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("arms", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("sizes", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("size_dist", sa.Text(), nullable=True),
        sa.Column("sizes_per_round", sa.Integer(), nullable=False),
        sa.Column("repetitions", sa.Integer(), nullable=False),
        sa.Column("interval_s", sa.Double(), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("calibrate", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("(sizes IS NULL) <> (size_dist IS NULL)", name=op.f("ck_campaigns_sizes_xor_size_dist")),
        sa.CheckConstraint("ends_at IS NULL OR ends_at > starts_at", name=op.f("ck_campaigns_window")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaigns")),
    )
    op.create_table(
        "origin_observations",
        sa.Column("trial_id", sa.UUID(), nullable=False),
        sa.Column("origin_id", sa.UUID(), nullable=False),
        sa.Column("arm_iw", sa.SmallInteger(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("client_addr", sa.Text(), nullable=False),
        sa.Column("object_size", sa.BigInteger(), nullable=False),
        sa.Column("request_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_byte_us", sa.BigInteger(), nullable=False),
        sa.Column("response_latency_us", sa.BigInteger(), nullable=True),
        sa.Column("snd_cwnd_at_accept", sa.BigInteger(), nullable=False),
        sa.Column("cwnd_mismatch", sa.Boolean(), nullable=False),
        sa.Column("rwnd_limited", sa.Boolean(), nullable=False),
        sa.Column("peer_rwnd", sa.BigInteger(), nullable=True),
        sa.Column("http_status", sa.SmallInteger(), nullable=False),
        sa.Column("error_kind", sa.Text(), nullable=True),
        sa.Column("tcpi_total_retrans", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_bytes_retrans", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_rtt_us", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_min_rtt_us", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_delivery_rate", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_segs_out", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_bytes_sent", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_snd_cwnd", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_snd_ssthresh", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_busy_time_us", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_rwnd_limited_us", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_sndbuf_limited_us", sa.BigInteger(), nullable=True),
        sa.Column("tcp_info", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("trial_id", name=op.f("pk_origin_observations")),
    )
    op.create_index(
        "ix_origin_observations_origin_id_request_at", "origin_observations", ["origin_id", "request_at"], unique=False
    )
    op.create_index(
        "ix_origin_observations_unjoined",
        "origin_observations",
        ["trial_id"],
        unique=False,
        postgresql_where=sa.text("joined_at IS NULL"),
    )
    op.create_table(
        "origins",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("arms", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("secret_hash", sa.Text(), nullable=False),
        sa.Column("enrolled_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_origins")),
    )
    op.create_table(
        "path_estimates",
        sa.Column("probe_id", sa.UUID(), nullable=False),
        sa.Column("origin_id", sa.UUID(), nullable=False),
        sa.Column("min_rtt_us", sa.BigInteger(), nullable=True),
        sa.Column("bottleneck_bps", sa.BigInteger(), nullable=True),
        sa.Column("bdp_bytes", sa.BigInteger(), nullable=True),
        sa.Column("loss_rate", sa.Double(), nullable=True),
        sa.Column("sample_count", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("probe_id", "origin_id", name=op.f("pk_path_estimates")),
    )
    op.create_table(
        "path_samples",
        sa.Column("sample_id", sa.UUID(), nullable=False),
        sa.Column("probe_id", sa.UUID(), nullable=False),
        sa.Column("origin_id", sa.UUID(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("min_rtt_us", sa.BigInteger(), nullable=False),
        sa.Column("bottleneck_bps", sa.BigInteger(), nullable=True),
        sa.Column("transfer_bytes", sa.BigInteger(), nullable=False),
        sa.Column("method", sa.Text(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("sample_id", name=op.f("pk_path_samples")),
    )
    op.create_index("ix_path_samples_probe_id_origin_id", "path_samples", ["probe_id", "origin_id"], unique=False)
    op.create_table(
        "probes",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("country", sa.Text(), nullable=True),
        sa.Column("asn", sa.BigInteger(), nullable=True),
        sa.Column("labels", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("secret_hash", sa.Text(), nullable=False),
        sa.Column("enrolled_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_heartbeat", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probes")),
    )
    op.create_index("ix_probes_region", "probes", ["region"], unique=False)
    op.create_table(
        "trial_ids",
        sa.Column("trial_id", sa.UUID(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("trial_id", name=op.f("pk_trial_ids")),
    )
    op.create_table(
        "trials",
        sa.Column("trial_id", sa.UUID(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("probe_id", sa.UUID(), nullable=False),
        sa.Column("campaign_id", sa.BigInteger(), nullable=True),
        sa.Column("origin_id", sa.UUID(), nullable=True),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("arm_iw", sa.SmallInteger(), nullable=False),
        sa.Column("object_size", sa.BigInteger(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("dns_us", sa.BigInteger(), nullable=True),
        sa.Column("connect_us", sa.BigInteger(), nullable=True),
        sa.Column("ttfb_us", sa.BigInteger(), nullable=True),
        sa.Column("total_us", sa.BigInteger(), nullable=True),
        sa.Column("bytes_received", sa.BigInteger(), nullable=False),
        sa.Column("http_status", sa.SmallInteger(), nullable=True),
        sa.Column("error_kind", sa.Text(), nullable=True),
        sa.Column("error_detail", sa.Text(), nullable=True),
        sa.Column("syn_retrans", sa.SmallInteger(), nullable=False),
        sa.Column("tcpi_rtt_us", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_rttvar_us", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_min_rtt_us", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_total_retrans", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_segs_in", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_data_segs_in", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_rcv_space", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_rcv_mss", sa.BigInteger(), nullable=True),
        sa.Column("tcpi_bytes_received", sa.BigInteger(), nullable=True),
        sa.Column("tcp_info", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("server_latency_us", sa.BigInteger(), nullable=True),
        sa.Column("server_first_byte_us", sa.BigInteger(), nullable=True),
        sa.Column("server_total_retrans", sa.BigInteger(), nullable=True),
        sa.Column("server_bytes_retrans", sa.BigInteger(), nullable=True),
        sa.Column("server_bytes_sent", sa.BigInteger(), nullable=True),
        sa.Column("server_snd_cwnd_at_accept", sa.BigInteger(), nullable=True),
        sa.Column("cwnd_mismatch", sa.Boolean(), nullable=True),
        sa.Column("rwnd_limited", sa.Boolean(), nullable=True),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("trial_id", "started_at", name=op.f("pk_trials")),
        postgresql_partition_by="RANGE (started_at)",
    )
    op.create_index("ix_trials_campaign_id_arm_iw", "trials", ["campaign_id", "arm_iw"], unique=False)
    op.create_index("ix_trials_origin_id", "trials", ["origin_id"], unique=False)
    op.create_index("ix_trials_probe_id_origin_id", "trials", ["probe_id", "origin_id"], unique=False)
    op.create_index("ix_trials_started_at_brin", "trials", ["started_at"], unique=False, postgresql_using="brin")
    op.execute("CREATE TABLE trials_default PARTITION OF trials DEFAULT")
    op.execute(ENSURE_PARTITION_FUNCTION)
    # The current month and the next two; beat keeps creating them ahead of time.
    op.execute(
        "SELECT iwscope_ensure_trials_partition(((now() AT TIME ZONE 'UTC')::date + make_interval(months => m))::date)"
        " FROM generate_series(0, 2) AS m"
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS iwscope_ensure_trials_partition(date)")
    op.drop_index("ix_trials_started_at_brin", table_name="trials", postgresql_using="brin")
    op.drop_index("ix_trials_probe_id_origin_id", table_name="trials")
    op.drop_index("ix_trials_origin_id", table_name="trials")
    op.drop_index("ix_trials_campaign_id_arm_iw", table_name="trials")
    op.drop_table("trials")
    op.drop_table("trial_ids")
    op.drop_index("ix_probes_region", table_name="probes")
    op.drop_table("probes")
    op.drop_index("ix_path_samples_probe_id_origin_id", table_name="path_samples")
    op.drop_table("path_samples")
    op.drop_table("path_estimates")
    op.drop_table("origins")
    op.drop_index(
        "ix_origin_observations_unjoined", table_name="origin_observations", postgresql_where=sa.text("joined_at IS NULL")
    )
    op.drop_index("ix_origin_observations_origin_id_request_at", table_name="origin_observations")
    op.drop_table("origin_observations")
    op.drop_table("campaigns")
    op.drop_index("ix_api_tokens_token_hash", table_name="api_tokens")
    op.drop_table("api_tokens")
