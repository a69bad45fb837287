"""Celery task ``iwscope.campaigns.tasks.update_precision`` (beat, every ``IWSCOPE_PRECISION_CHECK_S``)."""

from __future__ import annotations

import logging

from iwscope.campaigns.precision import update_done
from iwscope.db import session_scope
from iwscope.worker import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="iwscope.campaigns.tasks.update_precision", acks_late=True)
def update_precision() -> dict[str, int]:
    """Mark probes of adaptive campaigns whose buckets reached the target precision (idempotent)."""
    with session_scope() as session:
        marked = update_done(session)
    for campaign_id, count in marked.items():
        log.info("campaign %d: %d more probes reached the target precision", campaign_id, count)
    return {str(campaign_id): count for campaign_id, count in marked.items()}
