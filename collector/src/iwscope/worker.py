"""The Celery application: Redis broker and backend, late acks, periodic work through beat.

Tasks live in ``iwscope.trials.tasks``, ``iwscope.campaigns.tasks`` and
``iwscope.analysis.tasks``.  All tasks are idempotent.
"""

from __future__ import annotations

import logging
import os
import tempfile

from celery import Celery
from celery.schedules import crontab

from iwscope import broker
from iwscope.config import get_settings

log = logging.getLogger(__name__)

#: Imported by the worker, not here (they import this module).
TASK_MODULES = ["iwscope.trials.tasks", "iwscope.campaigns.tasks", "iwscope.analysis.tasks"]


def task_queue() -> str:
    return get_settings().celery_queue


def make_celery() -> Celery:
    settings = get_settings()
    # kombu's Redis channel, fixed so a broker restart does not stop the worker (iwscope.broker).
    broker.install()
    app = Celery("iwscope", broker=settings.redis_url, backend=settings.redis_url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.celery_queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
        # Beat's state file: not in the working directory (a checkout or a read-only image).
        beat_schedule_filename=os.path.join(tempfile.gettempdir(), f"iwscope-celerybeat-{settings.celery_queue}"),
        beat_schedule={
            "ensure-trials-partitions": {
                "task": "iwscope.trials.tasks.ensure_partitions",
                "schedule": crontab(minute=7, hour="*/6"),
                "options": {"queue": settings.celery_queue},
            },
            "sweep-unjoined": {
                "task": "iwscope.trials.tasks.sweep",
                "schedule": 60.0,
                "options": {"queue": settings.celery_queue},
            },
            "update-precision": {
                "task": "iwscope.campaigns.tasks.update_precision",
                "schedule": settings.precision_check_s,
                "options": {"queue": settings.celery_queue, "expires": settings.precision_check_s},
            },
            # Trials that never get an origin observation are folded in by this, not by a join.
            "refresh-rollups": {
                "task": "iwscope.analysis.tasks.refresh_rollups",
                "schedule": 60.0,
                "options": {"queue": settings.celery_queue},
            },
        },
    )
    app.conf.include = list(TASK_MODULES)
    return app


celery_app = make_celery()
