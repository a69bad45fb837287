"""Worker task: path estimates for the probe x origin pairs a batch or a join touched."""

from __future__ import annotations

from iwscope.db import session_scope
from iwscope.paths.services import recompute_path_estimates as recompute
from iwscope.worker import celery_app


@celery_app.task(name="iwscope.paths.tasks.recompute_path_estimates")
def recompute_path_estimates(pairs: list[list[str]]) -> int:
    """Recompute the estimates of ``pairs``; idempotent."""
    with session_scope() as session:
        return recompute(session, pairs)
