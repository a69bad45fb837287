"""Queue worker tasks by name (the API never imports the task code).

Tasks are sent only after the batch's transaction committed, and carry IDs, never objects.
If the broker is down the upload still succeeds (its data is committed); the periodic sweep
(``iwscope.trials.tasks.sweep``) joins and recomputes whatever was missed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from functools import lru_cache

import orjson
import redis

from iwscope.config import get_settings
from iwscope.metrics import TASKS_NOT_SENT
from iwscope.worker import celery_app, task_queue  # imported with the API, not on the first upload

log = logging.getLogger(__name__)

#: The worker task that joins every batch waiting in ``key(JOIN_PENDING)`` at once.
JOIN_DRAIN_TASK = "iwscope.trials.tasks.drain_joins"
#: Stored trial and observation batches waiting for their join: a Redis list of JSON
#: ``{"t": [trial ids]}`` (``key(...)``; entries of earlier versions also carry ``"p"``, ignored).
JOIN_PENDING = "join-pending"
#: Set while a drain is queued or running (renewed by each of its takes, dropped as it ends).
JOIN_DRAIN_QUEUED = "join-drain-queued"
#: The analysis module's roll-up refresh.
ROLLUP_TASK = "iwscope.analysis.tasks.refresh_rollups"
#: Set while a roll-up refresh is queued and has not started: later requests ride on it.
ROLLUP_QUEUED = "refresh-queued"
#: Default delay of a refresh: the joins of the next seconds ride on it, and it is longer than
#: the refresh's safety margin (1 s, ``analysis.rollups``) so the rows that asked are folded in.
ROLLUP_DELAY_S = 2.0
#: The analysis copy's update (``analysis.pathcopy``), queued after each refresh commits.
ANALYSIS_COPY_TASK = "iwscope.analysis.tasks.update_analysis_copy"
#: Set while an update of the analysis copy is queued and has not started.
ANALYSIS_COPY_QUEUED = "analysis-copy-queued"
#: Lifetime of a "queued" mark: a task lost between queue and start blocks others at most this long.
QUEUED_TTL_S = 60
#: The same for the join drain: a drain lost with a killed worker or Redis would otherwise hold
#: every join back until the mark expired (up to a minute, beside the beat sweep's minute); a
#: short mark costs at most one spare drain message per 10 s while the worker is backlogged
#: (drains are idempotent).
JOIN_QUEUED_TTL_S = 10


def queue_join(trial_ids: Sequence[str]) -> bool:
    """The join of these trials with their observations: of a stored trial batch (its
    observations arrived first; ``trial_ids`` may be empty when it held only path samples) or
    of a stored observation batch (its trials did); sent after the answer went out.  Path
    estimates and roll-ups follow from the refresh the drain queues.  False when Redis did not
    take the ids (the caller may send them again; else the beat's sweep joins them)."""
    return _request_join(trial_ids)


def _request_join(trial_ids: Sequence[str]) -> bool:
    """Append a batch to the pending joins and make sure one drain is queued (False: Redis
    did not take the batch).

    One message per upload was one task per upload: at 10,000 probes (~330 uploads/s) one
    worker process fell behind by 17k tasks in two minutes, each a handful of round trips for
    20 trials.  A drain joins every batch waiting (``DRAIN_MAX_BATCHES`` at a time) in one
    statement.  If Redis is down the upload still succeeded: the API sends the ids again
    (``iwscope.trials.ingest.JoinBatcher``) and the beat sweep joins what was missed."""
    entry = orjson.dumps({"t": list(trial_ids)})
    try:
        # one round trip: append, and mark a drain as queued unless one is
        pipeline = _redis().pipeline(transaction=False)
        pipeline.rpush(key(JOIN_PENDING), entry)
        pipeline.set(key(JOIN_DRAIN_QUEUED), "1", nx=True, ex=JOIN_QUEUED_TTL_S)
        _, newly_marked = pipeline.execute()
    except redis.RedisError:
        TASKS_NOT_SENT.labels(JOIN_DRAIN_TASK).inc()
        log.exception("could not record a pending join")
        return False
    if newly_marked:
        _send_marked(JOIN_DRAIN_TASK, key(JOIN_DRAIN_QUEUED), 0.0)
    return True


def queue_join_drain() -> bool:
    """Queue one join drain unless one is queued and not yet started; True if this call did."""
    return _queue_once(JOIN_DRAIN_TASK, key(JOIN_DRAIN_QUEUED), 0.0, JOIN_QUEUED_TTL_S)


def take_pending_joins(max_batches: int) -> list[dict[str, list[object]]]:
    """The running drain takes up to ``max_batches`` pending batches, oldest first, and renews
    its mark: uploads meanwhile see a drain queued and send no message of their own (one Celery
    message per 50 ms window of uploads was 6 % of the API's CPU at the fleet's shape; the drain
    takes their batches before it ends)."""
    pipeline = _redis().pipeline(transaction=False)
    pipeline.set(key(JOIN_DRAIN_QUEUED), "1", ex=JOIN_QUEUED_TTL_S)
    pipeline.lpop(key(JOIN_PENDING), max_batches)  # with a count: a list, or None when empty
    _, popped = pipeline.execute()
    entries: list[bytes | str] = popped if isinstance(popped, list) else []
    return [orjson.loads(entry) for entry in entries]


def wait_for_pending_joins(timeout_s: float, max_batches: int) -> list[dict[str, list[object]]]:
    """Up to ``max_batches`` pending batches once one comes within ``timeout_s`` (the drain's mark
    held meanwhile); ``[]`` when none came."""
    client = _redis()
    first = client.blpop([key(JOIN_PENDING)], timeout=timeout_s)
    if first is None:
        return []
    return [orjson.loads(first[1]), *take_pending_joins(max_batches - 1)] if max_batches > 1 else [orjson.loads(first[1])]


def join_drain_ended() -> bool:
    """The drain is done: its mark goes (the next upload queues a drain).  True when batches wait
    (they came after its last take and saw the mark: the caller queues a drain for them)."""
    pipeline = _redis().pipeline(transaction=False)
    pipeline.delete(key(JOIN_DRAIN_QUEUED))
    pipeline.llen(key(JOIN_PENDING))
    _, waiting = pipeline.execute()
    return bool(waiting)


def return_pending_joins(entries: Sequence[dict[str, list[object]]]) -> None:
    """Put batches a drain took but could not join back at the head of the list, in order."""
    if entries:
        _redis().lpush(key(JOIN_PENDING), *(orjson.dumps(entry) for entry in reversed(entries)))


def pending_joins() -> int:
    return int(_redis().llen(key(JOIN_PENDING)))


def key(name: str) -> str:
    """The Redis key ``name`` of this deployment: namespaced by its Celery queue, so that two
    deployments sharing a Redis database never drain each other's joins into their databases."""
    return f"iwscope:{task_queue()}:{name}"


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
    return _queue_once(ROLLUP_TASK, key(ROLLUP_QUEUED), countdown_s)


def _queue_once(task: str, queued_key: str, countdown_s: float, ttl_s: int = QUEUED_TTL_S) -> bool:
    """Send ``task`` unless ``queued_key`` says one is queued and not started; True if sent."""
    try:
        if not _redis().set(queued_key, "1", nx=True, ex=ttl_s + int(countdown_s)):
            return False
    except redis.RedisError:
        TASKS_NOT_SENT.labels(task).inc()
        log.exception("could not queue %s", task)
        return False
    return _send_marked(task, queued_key, countdown_s)


def _send_marked(task: str, queued_key: str, countdown_s: float) -> bool:
    """Send ``task``, whose queued mark this process just set; on failure drop the mark again."""
    try:
        celery_app.send_task(task, kwargs={}, countdown=countdown_s, queue=task_queue(), ignore_result=True)
    except Exception:  # the broker is optional for ingest; the sweep catches up
        with contextlib.suppress(redis.RedisError):
            _redis().delete(queued_key)
        TASKS_NOT_SENT.labels(task).inc()
        log.exception("could not queue %s", task)
        return False
    return True


def rollup_refresh_started() -> None:
    """Called by the refresh as it starts: what is joined from now on needs another refresh."""
    _redis().delete(key(ROLLUP_QUEUED))


def queue_analysis_copy_update() -> bool:
    """Queue one update of the analysis copy unless one is queued and not yet started (a
    refresh that commits while one runs queues the next); True if this call queued it."""
    if celery_app.tasks.get(ANALYSIS_COPY_TASK) is None:
        return False
    return _queue_once(ANALYSIS_COPY_TASK, key(ANALYSIS_COPY_QUEUED), 0.0)


def analysis_copy_update_started() -> None:
    """Called by the copy's update as it starts: a refresh committed from now on queues another."""
    _redis().delete(key(ANALYSIS_COPY_QUEUED))
