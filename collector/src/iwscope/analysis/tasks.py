"""Celery task ``iwscope.analysis.tasks.refresh_rollups`` (queued by the join task after joins).

The refresh never folds rows stamped within the last ``margin`` seconds (see
``rollups``).  When such rows are pending after a run, the task schedules one follow-up run
``margin + 1`` seconds later; a Redis ``SET NX`` key makes sure only one follow-up is pending
at a time, however many joins triggered a refresh.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import redis
from sqlalchemy import text

from iwscope.analysis.rollups import DEFAULT_MARGIN, refresh_rollups as refresh_in_session
from iwscope.config import get_settings
from iwscope.db import session_scope
from iwscope.worker import celery_app, task_queue

log = logging.getLogger(__name__)

FOLLOW_UP_KEY = "iwscope:analysis:refresh-follow-up"
_PENDING = text("""
    SELECT EXISTS (SELECT 1 FROM trials WHERE received_at > :received)
        OR EXISTS (SELECT 1 FROM trials WHERE joined_at > :joined)""")


def _schedule_follow_up(countdown: float) -> bool:
    """Queue one delayed refresh unless one is already queued; True if this call queued it."""
    client = redis.Redis.from_url(get_settings().redis_url)
    try:
        if not client.set(FOLLOW_UP_KEY, "1", nx=True, ex=max(1, int(countdown) + 5)):
            return False
    finally:
        client.close()
    refresh_rollups.apply_async(kwargs={"follow_up": True}, countdown=countdown, queue=task_queue())
    return True


def _clear_follow_up() -> None:
    client = redis.Redis.from_url(get_settings().redis_url)
    try:
        client.delete(FOLLOW_UP_KEY)
    finally:
        client.close()


@celery_app.task(name="iwscope.analysis.tasks.refresh_rollups")
def refresh_rollups(trial_ids: list[str] | None = None, follow_up: bool = False) -> dict[str, Any]:
    """Fold new and newly joined trials into the roll-ups (idempotent, safe to run concurrently).

    ``trial_ids`` (sent by the join task) is informational: the watermarks, not the ids,
    decide what is folded in, so nothing is lost or counted twice whatever the ids say.
    """
    if follow_up:
        _clear_follow_up()
    with session_scope() as session:
        result = refresh_in_session(session, wait=True)
        pending = bool(session.execute(_PENDING, {"received": result.received_upto,
                                                  "joined": result.joined_upto}).scalar())
    outcome: dict[str, Any] = {key: (value.isoformat() if hasattr(value, "isoformat") else value)
                               for key, value in dataclasses.asdict(result).items()}
    outcome["pending"] = pending
    outcome["follow_up_queued"] = _schedule_follow_up(DEFAULT_MARGIN.total_seconds() + 1.0) if pending else False
    log.info("refresh_rollups: %s", outcome)
    return outcome
