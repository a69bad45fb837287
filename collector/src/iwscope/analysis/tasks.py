"""Celery tasks ``iwscope.analysis.tasks.refresh_rollups`` (queued after joins) and
``update_analysis_copy`` (queued by each refresh after its commit: ``pathcopy``).

Requests go through :func:`iwscope.worker_client.queue_rollup_refresh`: one refresh is queued
at a time (a Redis ``SET NX`` key, cleared when the refresh starts), however many joins ask.
The refresh never folds rows stamped within the last ``margin`` seconds (see ``rollups``);
when such rows are pending after a run, it queues one more ``margin + 1`` seconds later.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from sqlalchemy import text

from iwscope.analysis import pathcopy, rollups
from iwscope.analysis.rollups import DEFAULT_MARGIN
from iwscope.config import get_settings
from iwscope.db import session_scope
from iwscope.worker import celery_app
from iwscope.worker_client import (
    analysis_copy_update_started,
    queue_analysis_copy_update,
    queue_rollup_refresh,
    rollup_refresh_started,
)

log = logging.getLogger(__name__)

_PENDING = text("""
    SELECT EXISTS (SELECT 1 FROM trials WHERE received_at > :received)
        OR EXISTS (SELECT 1 FROM trials WHERE joined_at > :joined)""")


@celery_app.task(name="iwscope.analysis.tasks.refresh_rollups")
def refresh_rollups(trial_ids: list[str] | None = None, follow_up: bool = False) -> dict[str, Any]:
    """Fold new and newly joined trials into the roll-ups (idempotent, safe to run concurrently).

    ``trial_ids`` and ``follow_up`` (sent by earlier versions) are ignored: the watermarks
    decide what is folded in, so nothing is lost or counted twice whoever asked.
    """
    rollup_refresh_started()
    with session_scope() as session:
        result = rollups.refresh_rollups(session, wait=True)
        path_pairs = rollups.refresh_path_estimates(session)
        pending = bool(session.execute(_PENDING, {"received": result.received_upto, "joined": result.joined_upto}).scalar())
    outcome: dict[str, Any] = {
        key: (value.isoformat() if hasattr(value, "isoformat") else value) for key, value in dataclasses.asdict(result).items()
    }
    outcome["path_estimates"] = path_pairs
    outcome["pending"] = pending
    outcome["follow_up_queued"] = queue_rollup_refresh(DEFAULT_MARGIN.total_seconds() + 1.0) if pending else False
    outcome["analysis_copy_queued"] = get_settings().analysis_copy_dir is not None and queue_analysis_copy_update()
    log.info("refresh_rollups: %s", outcome)
    return outcome


@celery_app.task(name="iwscope.analysis.tasks.update_analysis_copy")
def update_analysis_copy() -> str | None:
    """Bring the analysis copy (``pathcopy``; when ``IWSCOPE_ANALYSIS_COPY_DIR`` is set) up to
    the roll-ups' watermarks; returns what it did.  Its own task, queued by each refresh after
    its commit: a new copy takes minutes at a fleet's size (124 s for 10^7 trials), which the
    refreshes do not wait for.  A failure is logged, never raised: readers fall back to
    PostgreSQL while the copy lags, and the next refresh queues another update."""
    analysis_copy_update_started()
    directory = get_settings().analysis_copy_dir
    if directory is None:
        return None
    try:
        with session_scope() as session:
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            result = pathcopy.update(session, directory)
        compacted = pathcopy.compact(directory)  # outside the transaction: it reads files only
    except Exception:
        log.exception("analysis copy in %s not updated", directory)
        return "failed"
    log.info("update_analysis_copy: %s%s", result.action, f", compacted: {compacted}" if compacted else "")
    return result.action + (f" compacted {compacted}" if compacted else "")


@celery_app.task(name="iwscope.analysis.tasks.rebuild_path_estimates")
def rebuild_path_estimates(pairs: list[list[str]]) -> int:
    """Recompute these pairs' path estimates from their history (up to the refresh's
    watermarks); idempotent."""
    with session_scope() as session:
        return rollups.rebuild_path_estimates(session, pairs)
