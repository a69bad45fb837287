"""Path estimates per probe x origin, from path samples, trials and joined observations.

* ``min_rtt_us``: the smallest of the path samples' ``min_rtt_us`` and the trials' client
  ``tcpi_min_rtt_us`` (ignoring zeros, which mean "not measured").
* ``bottleneck_bps``: a robust maximum -- the 90th percentile of the pair's most recent
  ``RECENT_RATES`` bandwidth estimates of its path samples; without samples, of its joined
  observations' server ``tcpi_delivery_rate`` (bytes/s, times 8).
* ``bdp_bytes``: ``bottleneck_bps * min_rtt_us / 8e6``.
* ``loss_rate``: server retransmitted bytes / bytes sent over the pair's joined trials.
* ``sample_count``: path samples plus trials the estimate rests on.

They are kept **incrementally**: a row holds the parts its estimates are computed from (counts,
the minimum, byte sums, the recent rates) and :func:`fold_window` adds what arrived in a time
window -- trials and samples by ``received_at``, joins by ``joined_at`` -- with one statement
for every pair the window touched.  The worker's refresh task calls it after the roll-ups, with
windows of the estimates' own watermarks under the roll-ups' advisory lock
(``analysis.rollups.refresh_path_estimates``), so every trial, sample and join is added
exactly once, and :func:`rebuild` bounded by those watermarks gives the same row (tested).
Recomputing every touched pair from its whole history on every drain (what the worker did
before) cost 0.73 s per drain of ~1,000 pairs once a
1,000-probe benchmark had stored 360,000 trials, and grew with the history.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.orm import Session

#: Bandwidth estimates kept per pair and kind (the bottleneck is their 90th percentile): enough
#: for a stable robust maximum, few enough that a row stays small and follows a path that changed.
RECENT_RATES = 128


def _newest(array: str) -> str:
    """SQL: the last ``RECENT_RATES`` elements of the array expression ``array``."""
    return f"({array})[greatest(1, cardinality({array}) - {RECENT_RATES} + 1):]"


def _recent(column: str) -> str:
    """``column`` with the excluded row's rates appended, the oldest beyond ``RECENT_RATES`` dropped."""
    return _newest(f"pe.{column} || EXCLUDED.{column}")


#: Adds what arrived in the windows to each pair's parts (rows locked in pair order).
_FOLD = text(f"""
WITH client AS (
    SELECT probe_id, origin_id, count(*) AS trials, min(NULLIF(tcpi_min_rtt_us, 0)) AS min_rtt_us
    FROM trials
    WHERE received_at > :received_low AND received_at <= :received_high AND origin_id IS NOT NULL
    GROUP BY probe_id, origin_id
), samples AS (
    SELECT probe_id, origin_id, count(*) AS samples, min(NULLIF(min_rtt_us, 0)) AS min_rtt_us,
           COALESCE(array_agg(bottleneck_bps ORDER BY measured_at, sample_id)
                    FILTER (WHERE bottleneck_bps IS NOT NULL), '{{}}') AS bps
    FROM path_samples WHERE received_at > :received_low AND received_at <= :received_high
    GROUP BY probe_id, origin_id
), server AS (
    SELECT t.probe_id, t.origin_id, COALESCE(sum(t.server_bytes_retrans), 0) AS bytes_retrans,
           COALESCE(sum(t.server_bytes_sent) FILTER (WHERE t.server_bytes_retrans IS NOT NULL), 0) AS bytes_sent,
           COALESCE(array_agg(o.tcpi_delivery_rate * 8 ORDER BY t.started_at, t.trial_id)
                    FILTER (WHERE o.tcpi_delivery_rate > 0), '{{}}') AS bps
    FROM trials t JOIN origin_observations o ON o.trial_id = t.trial_id
    WHERE t.joined_at > :joined_low AND t.joined_at <= :joined_high AND t.origin_id IS NOT NULL
    GROUP BY t.probe_id, t.origin_id
), delta AS (
    SELECT probe_id, origin_id, COALESCE(c.trials, 0) AS trials, COALESCE(s.samples, 0) AS samples,
           LEAST(c.min_rtt_us, s.min_rtt_us) AS min_rtt_us,
           COALESCE(r.bytes_retrans, 0) AS bytes_retrans, COALESCE(r.bytes_sent, 0) AS bytes_sent,
           COALESCE({_newest("s.bps")}, '{{}}') AS sample_bps,
           COALESCE({_newest("r.bps")}, '{{}}') AS server_bps
    FROM client c FULL JOIN samples s USING (probe_id, origin_id) FULL JOIN server r USING (probe_id, origin_id)
)
INSERT INTO path_estimates AS pe (probe_id, origin_id, sample_count, updated_at, trial_count, path_sample_count,
                                  min_rtt_us, bytes_retrans_sum, bytes_sent_sum, recent_sample_bps, recent_server_bps)
SELECT probe_id, origin_id, trials + samples, now(), trials, samples, min_rtt_us, bytes_retrans, bytes_sent,
       sample_bps, server_bps
FROM delta
ORDER BY probe_id, origin_id
ON CONFLICT (probe_id, origin_id) DO UPDATE SET
    trial_count = pe.trial_count + EXCLUDED.trial_count,
    path_sample_count = pe.path_sample_count + EXCLUDED.path_sample_count,
    sample_count = pe.sample_count + EXCLUDED.sample_count,
    min_rtt_us = LEAST(pe.min_rtt_us, EXCLUDED.min_rtt_us),
    bytes_retrans_sum = pe.bytes_retrans_sum + EXCLUDED.bytes_retrans_sum,
    bytes_sent_sum = pe.bytes_sent_sum + EXCLUDED.bytes_sent_sum,
    recent_sample_bps = {_recent("recent_sample_bps")},
    recent_server_bps = {_recent("recent_server_bps")}
RETURNING probe_id::text, origin_id::text
""")

#: The estimates from their parts, for the given pairs.
_DERIVE = text("""
UPDATE path_estimates AS pe SET
    (bottleneck_bps, bdp_bytes) = (
        SELECT q.bps, round(q.bps::numeric * pe.min_rtt_us / 8000000)::bigint
        FROM (SELECT round(percentile_cont(0.9) WITHIN GROUP (ORDER BY x))::bigint AS bps
              FROM unnest(CASE WHEN cardinality(pe.recent_sample_bps) > 0 THEN pe.recent_sample_bps
                               ELSE pe.recent_server_bps END) AS x) AS q),
    loss_rate = CASE WHEN pe.bytes_sent_sum > 0 THEN pe.bytes_retrans_sum::double precision / pe.bytes_sent_sum END,
    updated_at = now()
FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:origin_ids AS uuid[])) AS p(probe_id, origin_id)
WHERE pe.probe_id = p.probe_id AND pe.origin_id = p.origin_id
""")

_FORGET_PARTS = text("""
UPDATE path_estimates SET sample_count = 0, trial_count = 0, path_sample_count = 0, bytes_retrans_sum = 0,
       bytes_sent_sum = 0, recent_sample_bps = '{}', recent_server_bps = '{}'
""")

#: Every part from the pairs' history up to the watermarks (what ``_FOLD`` accumulated so far),
#: replacing the row's.
_REBUILD = text(f"""
WITH pairs AS (
    SELECT DISTINCT probe_id, origin_id
    FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:origin_ids AS uuid[])) AS p(probe_id, origin_id)
),
sample_stats AS (
    SELECT p.probe_id, p.origin_id, count(s.sample_id) AS samples, min(NULLIF(s.min_rtt_us, 0)) AS min_rtt_us
    FROM pairs p LEFT JOIN path_samples s ON s.probe_id = p.probe_id AND s.origin_id = p.origin_id
                                        AND s.received_at <= :received_upto
    GROUP BY p.probe_id, p.origin_id
),
sample_rates AS (
    SELECT probe_id, origin_id, array_agg(bps ORDER BY measured_at, sample_id) AS bps
    FROM (SELECT s.probe_id, s.origin_id, s.bottleneck_bps AS bps, s.measured_at, s.sample_id,
                 row_number() OVER (PARTITION BY s.probe_id, s.origin_id
                                    ORDER BY s.measured_at DESC, s.sample_id DESC) AS recency
          FROM pairs p JOIN path_samples s ON s.probe_id = p.probe_id AND s.origin_id = p.origin_id
          WHERE s.bottleneck_bps IS NOT NULL AND s.received_at <= :received_upto) AS recent
    WHERE recency <= {RECENT_RATES}
    GROUP BY probe_id, origin_id
),
trial_stats AS (
    SELECT p.probe_id, p.origin_id, count(t.trial_id) FILTER (WHERE t.received_at <= :received_upto) AS trials,
           min(NULLIF(t.tcpi_min_rtt_us, 0)) FILTER (WHERE t.received_at <= :received_upto) AS min_rtt_us,
           COALESCE(sum(t.server_bytes_retrans) FILTER (WHERE t.joined_at <= :joined_upto), 0) AS bytes_retrans,
           COALESCE(sum(t.server_bytes_sent) FILTER (WHERE t.server_bytes_retrans IS NOT NULL
                                                       AND t.joined_at <= :joined_upto), 0) AS bytes_sent
    FROM pairs p LEFT JOIN trials t ON t.probe_id = p.probe_id AND t.origin_id = p.origin_id
    GROUP BY p.probe_id, p.origin_id
),
server_rates AS (
    SELECT probe_id, origin_id, array_agg(bps ORDER BY started_at, trial_id) AS bps
    FROM (SELECT t.probe_id, t.origin_id, o.tcpi_delivery_rate * 8 AS bps, t.started_at, t.trial_id,
                 row_number() OVER (PARTITION BY t.probe_id, t.origin_id
                                    ORDER BY t.started_at DESC, t.trial_id DESC) AS recency
          FROM pairs p
          JOIN trials t ON t.probe_id = p.probe_id AND t.origin_id = p.origin_id AND t.joined_at <= :joined_upto
          JOIN origin_observations o ON o.trial_id = t.trial_id AND o.tcpi_delivery_rate > 0) AS recent
    WHERE recency <= {RECENT_RATES}
    GROUP BY probe_id, origin_id
)
INSERT INTO path_estimates (probe_id, origin_id, min_rtt_us, sample_count, updated_at, trial_count,
                            path_sample_count, bytes_retrans_sum, bytes_sent_sum, recent_sample_bps,
                            recent_server_bps)
SELECT s.probe_id, s.origin_id, LEAST(s.min_rtt_us, t.min_rtt_us), s.samples + t.trials, now(), t.trials,
       s.samples, t.bytes_retrans, t.bytes_sent, COALESCE(sr.bps, '{{}}'), COALESCE(r.bps, '{{}}')
FROM sample_stats s JOIN trial_stats t USING (probe_id, origin_id)
LEFT JOIN sample_rates sr USING (probe_id, origin_id)
LEFT JOIN server_rates r USING (probe_id, origin_id)
WHERE s.samples + t.trials > 0
ORDER BY s.probe_id, s.origin_id
ON CONFLICT (probe_id, origin_id) DO UPDATE SET
    min_rtt_us = EXCLUDED.min_rtt_us, sample_count = EXCLUDED.sample_count, trial_count = EXCLUDED.trial_count,
    path_sample_count = EXCLUDED.path_sample_count, bytes_retrans_sum = EXCLUDED.bytes_retrans_sum,
    bytes_sent_sum = EXCLUDED.bytes_sent_sum, recent_sample_bps = EXCLUDED.recent_sample_bps,
    recent_server_bps = EXCLUDED.recent_server_bps
""")


def _pair_params(pairs: Sequence[Sequence[str]]) -> dict[str, list[str]]:
    return {"probe_ids": [str(pair[0]) for pair in pairs], "origin_ids": [str(pair[1]) for pair in pairs]}


def rebuild(session: Session, pairs: Sequence[Sequence[str]], received_upto: dt.datetime, joined_upto: dt.datetime) -> int:
    """Recompute the estimates of ``pairs`` (``[probe_id, origin_id]``) and their parts from
    what was received up to ``received_upto`` and joined up to ``joined_upto`` (the analysis
    refresh's watermarks, held under its lock: ``analysis.rollups.rebuild_path_estimates``);
    returns rows written.  Idempotent."""
    if not pairs:
        return 0
    params = _pair_params(pairs)
    result = session.execute(_REBUILD, {**params, "received_upto": received_upto, "joined_upto": joined_upto})
    session.execute(_DERIVE, params)
    return int(getattr(result, "rowcount", 0) or 0)


def forget_parts(session: Session) -> None:
    """Zero every row's parts and counts (their estimates stay until the next fold derives them):
    before the whole history is folded in again, from the first watermark."""
    session.execute(_FORGET_PARTS)


def fold_window(
    session: Session, received_low: dt.datetime, received_high: dt.datetime, joined_low: dt.datetime, joined_high: dt.datetime
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Add the trials and path samples received in ``(received_low, received_high]`` and the
    joins made in ``(joined_low, joined_high]`` to their pairs' estimates, creating rows for new
    pairs, and derive the estimates again; returns the (probe, origin) pairs written.  The caller holds the
    analysis refresh's lock and moves its watermarks to the high ends in the same transaction
    (``analysis.rollups.refresh_path_estimates``)."""
    pairs = [
        (row[0], row[1])
        for row in session.execute(
            _FOLD,
            {"received_low": received_low, "received_high": received_high, "joined_low": joined_low, "joined_high": joined_high},
        ).all()
    ]
    if pairs:
        session.execute(_DERIVE, _pair_params(pairs))
    return pairs
