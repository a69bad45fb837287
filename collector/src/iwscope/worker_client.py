"""Queue worker tasks by name (the API never imports the task code).

Tasks are sent only after the batch's transaction committed, and carry IDs, never objects.
If the broker is down the upload still succeeds (its data is committed); the periodic sweep
(``iwscope.trials.tasks.sweep``) joins and recomputes whatever was missed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache

import redis

from iwscope.config import get_settings
from iwscope.metrics import TASKS_NOT_SENT
from iwscope.worker import celery_app, task_queue  # imported with the API, not on the first upload

log = logging.getLogger(__name__)

JOIN_TASK = "iwscope.trials.tasks.join_observations"
#: The worker task of a stored trial batch (join + path estimates): one message per batch.
TRIALS_STORED_TASK = "iwscope.trials.tasks.trials_stored"
PATH_ESTIMATES_TASK = "iwscope.paths.tasks.recompute_path_estimates"
#: The analysis module's roll-up refresh (absent when that module is not installed).
ROLLUP_TASK = "iwscope.analysis.tasks.refresh_rollups"
#: Set while a roll-up refresh is queued and has not started: later requests ride on it.
ROLLUP_QUEUED_KEY = "iwscope:analysis:refresh-queued"
#: Default delay of a refresh: the joins of the next seconds ride on it, and it is longer than
#: the refresh's safety margin (1 s, ``analysis.rollups``) so the rows that asked are folded in.
ROLLUP_DELAY_S = 2.0
#: Lifetime of that key: a refresh lost between queue and start blocks others at most this long.
ROLLUP_QUEUED_TTL_S = 60


def _send(name: str, *args: object) -> None:
    """Queue task ``name``; nobody here waits for its result, so none is subscribed to (with the
    Redis result backend every send otherwise subscribes to the task's result channel: 3 % of
    the API's CPU at 1,000 probes)."""
    try:
        celery_app.send_task(name, args=list(args), queue=task_queue(), ignore_result=True)
    except Exception:  # the broker is optional for ingest; the sweep catches up
        TASKS_NOT_SENT.labels(name).inc()
        log.exception("could not queue %s", name)


def queue_join(trial_ids: Sequence[str]) -> None:
    _send(JOIN_TASK, list(trial_ids))


def queue_trials_stored(trial_ids: Sequence[str], pairs: Sequence[tuple[str, str]]) -> None:
    """The join and path estimates of a stored trial batch (sent after the answer went out)."""
    _send(TRIALS_STORED_TASK, list(trial_ids), [list(pair) for pair in pairs])


def queue_path_estimates(pairs: Sequence[tuple[str, str]]) -> None:
    _send(PATH_ESTIMATES_TASK, [list(pair) for pair in pairs])


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_settings().redis_url)


def queue_rollup_refresh(countdown_s: float = ROLLUP_DELAY_S) -> bool:
    """Queue one roll-up refresh in ``countdown_s`` unless one is queued and not yet started;
    True if this call queued it.

    A refresh folds in everything up to its watermark bound, whoever asked for it, so one per
    burst of joins is enough: at 1,000 probes one refresh per join kept the worker's queue
    growing while each refresh waited for the previous one's lock to fold in a handful of rows.
    """
    if celery_app.tasks.get(ROLLUP_TASK) is None:
        return False
    client = _redis()
    if not client.set(ROLLUP_QUEUED_KEY, "1", nx=True, ex=ROLLUP_QUEUED_TTL_S + int(countdown_s)):
        return False
    try:
        celery_app.send_task(ROLLUP_TASK, kwargs={}, countdown=countdown_s, queue=task_queue(), ignore_result=True)
    except Exception:
        client.delete(ROLLUP_QUEUED_KEY)
        TASKS_NOT_SENT.labels(ROLLUP_TASK).inc()
        log.exception("could not queue %s", ROLLUP_TASK)
        return False
    return True


def rollup_refresh_started() -> None:
    """Called by the refresh as it starts: what is joined from now on needs another refresh."""
    _redis().delete(ROLLUP_QUEUED_KEY)
