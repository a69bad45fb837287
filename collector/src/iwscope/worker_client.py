"""Queue worker tasks from the API, by name (the API never imports the task code).

Tasks are sent only after the batch's transaction committed, and carry IDs, never objects.
If the broker is down the upload still succeeds (its data is committed); the periodic sweep
(``iwscope.trials.tasks.sweep``) joins and recomputes whatever was missed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from iwscope.metrics import TASKS_NOT_SENT
from iwscope.worker import celery_app, task_queue  # imported with the API, not on the first upload

log = logging.getLogger(__name__)

JOIN_TASK = "iwscope.trials.tasks.join_observations"
PATH_ESTIMATES_TASK = "iwscope.paths.tasks.recompute_path_estimates"


def _send(name: str, *args: object) -> None:
    try:
        celery_app.send_task(name, args=list(args), queue=task_queue())
    except Exception:  # the broker is optional for ingest; the sweep catches up
        TASKS_NOT_SENT.labels(name).inc()
        log.exception("could not queue %s", name)


def queue_join(trial_ids: Sequence[str]) -> None:
    _send(JOIN_TASK, list(trial_ids))


def queue_path_estimates(pairs: Sequence[tuple[str, str]]) -> None:
    _send(PATH_ESTIMATES_TASK, [list(pair) for pair in pairs])
