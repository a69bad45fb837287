"""Alembic: up and down from an empty database, head matches the models, partitions behave."""

from __future__ import annotations

import datetime as dt
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool, text
from testenv import temporary_database

from iwscope import migrate

CORE_TABLES = {
    "probes",
    "origins",
    "api_tokens",
    "campaigns",
    "trial_ids",
    "trials",
    "origin_observations",
    "path_samples",
    "path_estimates",
    "census_records",
    "servers",
    "passive_aggregates",
    "passive_connections",
}


@pytest.fixture
def empty_database_url() -> Iterator[str]:
    """A database of its own (the session database stays at head for the other tests)."""
    with temporary_database(f"iwscope_test_mig_{secrets.token_hex(4)}") as url:
        yield url


def table_names(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_database_url: str) -> None:
    url = empty_database_url
    assert not migrate.at_head(url)
    migrate.upgrade("head", database_url=url)
    assert migrate.at_head(url)
    assert table_names(url) >= CORE_TABLES
    migrate.downgrade("0001_core", database_url=url)
    assert migrate.current_revisions(url) == ("0001_core",)
    migrate.downgrade("base", database_url=url)
    assert migrate.current_revisions(url) == ()
    assert table_names(url) <= {"alembic_version"}
    migrate.upgrade("head", database_url=url)
    assert migrate.at_head(url)


def test_head_matches_models(database_url: str) -> None:
    """``alembic revision --autogenerate`` would find nothing to do."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"include_object": migrate.include_object, "compare_type": True}
            )
            assert compare_metadata(context, migrate.model_metadata()) == []
    finally:
        engine.dispose()


def test_db_check_cli(empty_database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": empty_database_url}
    command = [sys.executable, "-m", "iwscope.cli", "db"]
    assert subprocess.run([*command, "check"], env=env, capture_output=True).returncode == 1
    assert subprocess.run([*command, "upgrade"], env=env, capture_output=True).returncode == 0
    assert subprocess.run([*command, "check"], env=env, capture_output=True).returncode == 0


def test_default_partition_catches_everything_and_rows_move_out(db_engine) -> None:
    """A trial of a month without a partition lands in DEFAULT; creating the partition moves it."""
    trial_id = uuid.uuid4()
    started = dt.datetime(2031, 5, 17, 12, 0, tzinfo=dt.UTC)
    with db_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO trials (trial_id, started_at, probe_id, round, arm_iw, object_size, url, bytes_received,"
                " syn_retrans, tcp_info) VALUES (:t, :s, :p, 0, 10, 1, 'u', 1, 0, '{}')"
            ),
            {"t": trial_id, "s": started, "p": uuid.uuid4()},
        )
        where = connection.execute(
            text("SELECT tableoid::regclass::text FROM trials WHERE trial_id = :t"), {"t": trial_id}
        ).scalar_one()
        assert where == "trials_default"
    try:
        with db_engine.begin() as connection:
            name = connection.execute(text("SELECT iwscope_ensure_trials_partition('2031-05-01')")).scalar_one()
            assert name == "trials_p203105"
            where = connection.execute(
                text("SELECT tableoid::regclass::text FROM trials WHERE trial_id = :t"), {"t": trial_id}
            ).scalar_one()
            assert where == "trials_p203105"
            # Idempotent.
            assert (
                connection.execute(text("SELECT iwscope_ensure_trials_partition('2031-05-31')")).scalar_one() == "trials_p203105"
            )
            bounds = connection.execute(
                text("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'trials_p203105'")
            ).scalar_one()
            assert bounds == "FOR VALUES FROM ('2031-05-01 00:00:00+00') TO ('2031-06-01 00:00:00+00')"
    finally:
        with db_engine.begin() as connection:
            connection.execute(text("DELETE FROM trials WHERE trial_id = :t"), {"t": trial_id})
            connection.execute(text("DROP TABLE IF EXISTS trials_p203105"))


def test_trials_indexes_for_analysis(db_engine) -> None:
    with db_engine.connect() as connection:
        definitions = connection.execute(text("SELECT indexdef FROM pg_indexes WHERE tablename = 'trials'")).scalars().all()
    joined = "\n".join(definitions)
    assert "USING brin (started_at)" in joined
    assert "(campaign_id, arm_iw)" in joined and "(probe_id, origin_id)" in joined
    assert "PRIMARY KEY" not in joined and "(trial_id, started_at)" in joined
