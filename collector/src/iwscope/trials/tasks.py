"""Worker tasks: join origin observations into trials, the periodic sweep, monthly partitions.

The join only touches trials whose ``joined_at`` is still NULL and what it joined adds to the
path estimates in the same transaction, so running a join twice changes nothing; a pair given
by name is rebuilt from its history (idempotent too); partitions are created if missing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.db import session_scope
from iwscope.paths.services import Pair, PathDelta, fold_path_deltas, merge_deltas, recompute_path_estimates
from iwscope.worker import celery_app
from iwscope.worker_client import (join_drain_started, pending_joins, queue_join_drain, queue_rollup_refresh,
                                   return_pending_joins)

log = logging.getLogger(__name__)

#: Months of partitions kept ready ahead of time (the current one included).
PARTITION_MONTHS_AHEAD = 3
#: Observations older than this without a trial are left alone by the sweep.
SWEEP_WINDOW = "30 days"

_JOIN = """
WITH joined AS (
    UPDATE trials t SET
        server_latency_us = o.response_latency_us,
        server_first_byte_us = o.first_byte_us,
        server_total_retrans = o.tcpi_total_retrans,
        server_bytes_retrans = o.tcpi_bytes_retrans,
        server_bytes_sent = o.tcpi_bytes_sent,
        server_snd_cwnd_at_accept = o.snd_cwnd_at_accept,
        cwnd_mismatch = o.cwnd_mismatch,
        rwnd_limited = o.rwnd_limited,
        joined_at = now()
    FROM {source}
    WHERE {selection} AND t.trial_id = o.trial_id AND t.joined_at IS NULL
      AND (t.origin_id IS NULL OR t.origin_id = o.origin_id)
    RETURNING t.trial_id, t.probe_id, t.origin_id, t.server_bytes_retrans, t.server_bytes_sent,
              o.tcpi_delivery_rate
), marked AS (
    UPDATE origin_observations o SET joined_at = now() FROM joined j WHERE o.trial_id = j.trial_id
)
SELECT trial_id::text, probe_id::text, origin_id::text, server_bytes_retrans, server_bytes_sent, tcpi_delivery_rate
FROM joined
"""
# The ids as a relation, not ``o.trial_id = ANY(:ids)``: with a drain's 10^5 ids the planner
# scanned origin_observations and tested every row against the whole array (a drain of 1,000
# batches of a 1,000-probe load ran 80 s and more; the worker looked idle, the backlog grew).
_JOIN_IDS = text(_JOIN.format(
    source="unnest(CAST(:trial_ids AS uuid[])) AS ids(trial_id) JOIN origin_observations o USING (trial_id)",
    selection="TRUE"))
_JOIN_SWEEP = text(_JOIN.format(
    source="origin_observations o",
    selection=f"o.joined_at IS NULL AND o.received_at > now() - interval '{SWEEP_WINDOW}'"))


def _join_and_estimate(session: Session, rows: Sequence[Sequence[Any]],
                       client_deltas: Mapping[Pair, PathDelta] | None = None,
                       rebuild: Sequence[Sequence[str]] = ()) -> dict[str, int]:
    """The path estimates after a join returned ``rows``: what the joined trials' server side
    and ``client_deltas`` add is folded in; the pairs in ``rebuild`` are recomputed from their
    history instead (which already holds this transaction's join)."""
    rebuilt = sorted({(str(pair[0]), str(pair[1])) for pair in rebuild})
    deltas: dict[Pair, PathDelta] = {}
    for row in rows:
        if row[2] is not None:
            (deltas.get((row[1], row[2])) or deltas.setdefault((row[1], row[2]), PathDelta())).add_joined(
                row[3], row[4], row[5])
    merge_deltas(deltas, (client_deltas or {}).items())
    for pair in rebuilt:
        deltas.pop(pair, None)
    estimates = recompute_path_estimates(session, [list(pair) for pair in rebuilt]) + fold_path_deltas(session, deltas)
    return {"joined": len(rows), "path_estimates": estimates}


def _refresh_rollups() -> None:
    """Have the analysis roll-ups refreshed soon (one refresh per burst of joins; none when the
    analysis module is not installed)."""
    queue_rollup_refresh()


@celery_app.task(name="iwscope.trials.tasks.join_observations")
def join_observations(trial_ids: list[str]) -> dict[str, int]:
    """Copy the server-side columns of these trials' observations into ``trials``; idempotent."""
    with session_scope() as session:
        rows = session.execute(_JOIN_IDS, {"trial_ids": list(trial_ids)}).all()
        outcome = _join_and_estimate(session, rows)
    if rows:
        _refresh_rollups()
    return outcome


def _join_batches(trial_ids: Sequence[str], client_deltas: Mapping[Pair, PathDelta],
                  rebuild: Sequence[Sequence[str]]) -> dict[str, int]:
    with session_scope() as session:
        rows = session.execute(_JOIN_IDS, {"trial_ids": list(trial_ids)}).all() if trial_ids else []
        outcome = _join_and_estimate(session, rows, client_deltas, rebuild)
    if rows:
        _refresh_rollups()
    return outcome


@celery_app.task(name="iwscope.trials.tasks.trials_stored")
def trials_stored(trial_ids: list[str], pairs: list[list[str]]) -> dict[str, int]:
    """The join of these trials' observations (those that arrived first), the pairs ``pairs``
    rebuilt, and what the join brought folded into the other pairs' estimates; idempotent.
    Queued once per upload by earlier versions (now ``drain_joins`` does this for many)."""
    return _join_batches(trial_ids, {}, pairs)


#: Most pending batches one drain takes (a 10,000-probe fleet queues ~330 a second).
DRAIN_MAX_BATCHES = 1000


def _entry_deltas(entries: Sequence[Mapping[str, Any]]) -> tuple[dict[Pair, PathDelta], list[Pair]]:
    """The path deltas the batches carry, and the pairs of earlier versions' entries (no deltas)."""
    deltas: dict[Pair, PathDelta] = {}
    legacy: set[Pair] = set()
    for entry in entries:
        merge_deltas(deltas, (((str(item[0]), str(item[1])), PathDelta.from_wire(item[2:]))
                              for item in entry.get("d", ())))
        legacy.update((str(pair[0]), str(pair[1])) for pair in entry.get("p", ()))
    return deltas, sorted(legacy)


@celery_app.task(name="iwscope.trials.tasks.drain_joins")
def drain_joins() -> dict[str, int]:
    """Join the trials of every batch waiting in ``worker_client.key(JOIN_PENDING)`` (up to
    ``DRAIN_MAX_BATCHES``) and fold what they add into the path estimates, with one statement
    each, in one transaction.  Batches it took go back to the list when that fails; a worker
    killed meanwhile loses them to the beat sweep, which joins their observations."""
    entries = join_drain_started(DRAIN_MAX_BATCHES)
    trial_ids = [str(trial_id) for entry in entries for trial_id in entry["t"]]
    try:
        deltas, legacy_pairs = _entry_deltas(entries)
        outcome = _join_batches([*dict.fromkeys(trial_ids)], deltas, legacy_pairs) if entries else {
            "joined": 0, "path_estimates": 0}
    except Exception:
        return_pending_joins(entries)
        raise
    if pending_joins():
        queue_join_drain()
    return {"batches": len(entries), **outcome}


@celery_app.task(name="iwscope.trials.tasks.sweep")
def sweep() -> dict[str, int]:
    """Join every observation still unjoined (tasks lost while the broker was down), and queue a
    drain if batches wait without one (its message lost)."""
    with session_scope() as session:
        rows = session.execute(_JOIN_SWEEP).all()
        outcome = _join_and_estimate(session, rows)
    if rows:
        _refresh_rollups()
    try:
        if pending_joins():
            queue_join_drain()
    except Exception:  # Redis down: the next sweep tries again
        log.exception("could not look at the pending joins")
    return outcome


def ensure_partitions_now(session: Session, months_ahead: int = PARTITION_MONTHS_AHEAD) -> list[str]:
    """Create the monthly ``trials`` partitions from this month on (rows waiting in the default move)."""
    rows = session.execute(text(
        "SELECT iwscope_ensure_trials_partition(((now() AT TIME ZONE 'UTC')::date"
        " + make_interval(months => m))::date) FROM generate_series(0, :last) AS m"),
        {"last": months_ahead - 1}).all()
    return [row[0] for row in rows]


@celery_app.task(name="iwscope.trials.tasks.ensure_partitions")
def ensure_partitions() -> list[str]:
    with session_scope() as session:
        return ensure_partitions_now(session)
