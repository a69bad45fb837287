"""Worker tasks: join origin observations into trials, the periodic sweep, monthly partitions.

A trial whose observation was stored first never comes here: its upload stores it joined
(``services._STORE_GROUP``, the same columns: ``rows.SERVER_SIDE_COLUMNS``).  The drain joins
the observations' requests -- their trials stored earlier, in the same statement or not yet --
in bulk, which measured cheaper than each observation upload updating its trials; the sweep
joins what two concurrent transactions stored without seeing each other or a lost message left.

The join only touches trials whose ``joined_at`` is still NULL, so running it twice changes
nothing; partitions are created if missing.  What a join or an upload brings reaches the path
estimates and the roll-ups through the refresh it queues (``iwscope.analysis.tasks``), which
folds every trial in exactly once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.db import session_scope
from iwscope.trials import rows
from iwscope.worker import celery_app
from iwscope.worker_client import (
    join_drain_ended,
    pending_joins,
    queue_join_drain,
    queue_rollup_refresh,
    return_pending_joins,
    take_pending_joins,
    wait_for_pending_joins,
)

log = logging.getLogger(__name__)

#: Months of partitions kept ready ahead of time (the current one included).
PARTITION_MONTHS_AHEAD = 3
#: Observations older than this without a trial are left alone by the sweep.
SWEEP_WINDOW = "30 days"

_SERVER_SIDE = ",\n        ".join(f"{trial} = o.{observation}" for trial, observation in rows.SERVER_SIDE_COLUMNS.items())
_JOIN = f"""
WITH joined AS (
    UPDATE trials t SET
        {_SERVER_SIDE},
        joined_at = now()
    FROM {{source}}
    WHERE {{selection}} AND t.trial_id = o.trial_id AND t.joined_at IS NULL
      AND (t.origin_id IS NULL OR t.origin_id = o.origin_id)
    RETURNING t.trial_id
), marked AS (
    UPDATE origin_observations o SET joined_at = now() FROM joined j WHERE o.trial_id = j.trial_id
)
SELECT count(*) FROM joined
"""
# The drain's ids go into a temporary table with a primary key, analysed, not into the statement
# as an array: (1) as ``o.trial_id = ANY(:ids)`` the planner scanned origin_observations and
# tested every row against the whole array; (2) as ``unnest(:ids)`` the ids could end up the
# inner side of a nested loop, rescanned for every unjoined trial: when the statistics of
# ``trials`` lagged a fast-growing table (the start of a 1,000-probe stage) one join ran 53 s,
# and that plan forced on a kept benchmark database ran 290 s for 60,000 ids, against 2.3 s for
# an index-driven one.  With an indexed, analysed table a rescanned inner is an index lookup.
_JOIN_IDS_TABLE = text("CREATE TEMPORARY TABLE IF NOT EXISTS iwscope_join_ids (trial_id uuid PRIMARY KEY) ON COMMIT DELETE ROWS")
_FILL_JOIN_IDS = text("INSERT INTO iwscope_join_ids SELECT DISTINCT unnest(CAST(:trial_ids AS uuid[]))")
_ANALYZE_JOIN_IDS = text("ANALYZE iwscope_join_ids")
_JOIN_IDS = text(_JOIN.format(source="iwscope_join_ids AS ids JOIN origin_observations o USING (trial_id)", selection="TRUE"))
_JOIN_SWEEP = text(
    _JOIN.format(
        source="origin_observations o", selection=f"o.joined_at IS NULL AND o.received_at > now() - interval '{SWEEP_WINDOW}'"
    )
)


def _refresh_rollups() -> None:
    """Have the roll-ups and path estimates refreshed soon (one refresh per burst)."""
    queue_rollup_refresh()


def _join(trial_ids: Sequence[str]) -> int:
    """Join these trials' observations (one statement); the number joined."""
    if not trial_ids:
        return 0
    with session_scope() as session:
        session.execute(_JOIN_IDS_TABLE)
        session.execute(_FILL_JOIN_IDS, {"trial_ids": list(trial_ids)})
        session.execute(_ANALYZE_JOIN_IDS)
        return int(session.execute(_JOIN_IDS).scalar_one())


@celery_app.task(name="iwscope.trials.tasks.join_observations")
def join_observations(trial_ids: list[str]) -> dict[str, int]:
    """Copy the server-side columns of these trials' observations into ``trials``; idempotent.
    Nothing here sends it any more (uploads go through ``drain_joins``): kept for messages
    queued by earlier versions, and to join by hand."""
    joined = _join(trial_ids)
    if joined:
        _refresh_rollups()
    return {"joined": joined}


@celery_app.task(name="iwscope.trials.tasks.trials_stored")
def trials_stored(trial_ids: list[str], pairs: list[list[str]] | None = None) -> dict[str, int]:
    """Queued once per upload by earlier versions: the join of these trials (``pairs`` is
    ignored: the refresh keeps the path estimates) and a refresh."""
    joined = _join(trial_ids)
    _refresh_rollups()
    return {"joined": joined}


#: Most pending batches one drain takes at a time (a 10,000-probe fleet queues ~40 a second).
DRAIN_MAX_BATCHES = 1000
#: A drain whose list is empty waits this long for another batch before it ends (its mark held,
#: so the uploads of the meantime send no message), and it ends after :data:`DRAIN_MAX_S` in any
#: case, so the refreshes and other tasks of a one-process worker wait at most that long.
DRAIN_LINGER_S = 0.2
DRAIN_MAX_S = 2.0


@celery_app.task(name="iwscope.trials.tasks.drain_joins")
def drain_joins() -> dict[str, int]:
    """Join the trials of the batches waiting in ``worker_client.key(JOIN_PENDING)`` (up to
    ``DRAIN_MAX_BATCHES`` a statement), those that come while it runs or within
    ``DRAIN_LINGER_S`` of its last take, for at most ``DRAIN_MAX_S``; then queue one refresh
    (which folds the new trials, joined or not, into the path estimates and roll-ups).  Batches
    it took go back to the list when the join fails; a worker killed meanwhile loses them to the
    beat sweep, which joins their observations."""
    started = time.monotonic()
    batches = joined = 0
    while True:
        entries = take_pending_joins(DRAIN_MAX_BATCHES)
        if not entries and time.monotonic() - started < DRAIN_MAX_S:
            entries = wait_for_pending_joins(DRAIN_LINGER_S, DRAIN_MAX_BATCHES)
        if not entries:
            break
        trial_ids = [str(trial_id) for entry in entries for trial_id in entry["t"]]
        try:
            joined += _join([*dict.fromkeys(trial_ids)])
        except Exception:
            return_pending_joins(entries)
            join_drain_ended()  # the next upload (or the sweep) queues another
            raise
        batches += len(entries)
        if time.monotonic() - started >= DRAIN_MAX_S:
            break
    if batches:  # new trials, joined or not, or new path samples
        _refresh_rollups()
    if join_drain_ended():  # batches came after the last take, and their uploads saw the mark
        queue_join_drain()
    return {"batches": batches, "joined": joined}


@celery_app.task(name="iwscope.trials.tasks.sweep")
def sweep() -> dict[str, int]:
    """Join every observation still unjoined (tasks lost while the broker was down), and queue a
    drain if batches wait without one (its message lost)."""
    with session_scope() as session:
        joined = int(session.execute(_JOIN_SWEEP).scalar_one())
    if joined:
        _refresh_rollups()
    try:
        if pending_joins():
            queue_join_drain()
    except Exception:  # Redis down: the next sweep tries again
        log.exception("could not look at the pending joins")
    return {"joined": joined}


def ensure_partitions_now(session: Session, months_ahead: int = PARTITION_MONTHS_AHEAD) -> list[str]:
    """Create the monthly ``trials`` partitions from this month on (rows waiting in the default move)."""
    rows = session.execute(
        text(
            "SELECT iwscope_ensure_trials_partition(((now() AT TIME ZONE 'UTC')::date"
            " + make_interval(months => m))::date) FROM generate_series(0, :last) AS m"
        ),
        {"last": months_ahead - 1},
    ).all()
    return [row[0] for row in rows]


@celery_app.task(name="iwscope.trials.tasks.ensure_partitions")
def ensure_partitions() -> list[str]:
    with session_scope() as session:
        return ensure_partitions_now(session)
