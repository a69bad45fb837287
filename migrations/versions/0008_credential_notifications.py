"""credential notifications: a change to a probe's or origin's credential, name or region (or
its deletion) notifies channel ``iwscope_credentials``, so API processes can empty their
credential caches at once (``iwscope.auth.invalidation``)

Revision ID: 0008_credential_notifications
Revises: 0007_incremental_path_estimates
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008_credential_notifications"
down_revision: str | None = "0007_incremental_path_estimates"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("probes", "origins")


def upgrade() -> None:
    op.execute("""
        CREATE FUNCTION iwscope_notify_credential_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('iwscope_credentials', TG_TABLE_NAME || ':' || OLD.id::text);
            RETURN NULL;
        END $$""")
    for table in _TABLES:
        # Only the columns a cached identity holds or depends on: heartbeats and last_seen_at
        # updates (every few seconds per probe) notify nobody.
        op.execute(f"""
            CREATE TRIGGER {table}_credential_change
            AFTER UPDATE OF secret_hash, revoked_at, name, region OR DELETE ON {table}
            FOR EACH ROW EXECUTE FUNCTION iwscope_notify_credential_change()""")


def downgrade() -> None:
    for table in _TABLES:
        op.execute(f"DROP TRIGGER {table}_credential_change ON {table}")
    op.execute("DROP FUNCTION iwscope_notify_credential_change()")
