"""Path estimates per probe x origin, from path samples, trials and joined observations.

* ``min_rtt_us``: the smallest of the path samples' ``min_rtt_us`` and the trials' client
  ``tcpi_min_rtt_us`` (ignoring zeros, which mean "not measured").
* ``bottleneck_bps``: a robust maximum -- the 90th percentile of the path samples'
  bandwidth estimates; without samples, of the joined observations' server
  ``tcpi_delivery_rate`` (bytes/s, times 8).
* ``bdp_bytes``: ``bottleneck_bps * min_rtt_us / 8e6``.
* ``loss_rate``: server retransmitted bytes / bytes sent over the pair's joined trials.
* ``sample_count``: path samples plus trials the estimate rests on.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.orm import Session

_RECOMPUTE = text("""
WITH pairs AS (
    SELECT DISTINCT probe_id::uuid AS probe_id, origin_id::uuid AS origin_id
    FROM unnest(CAST(:probe_ids AS text[]), CAST(:origin_ids AS text[])) AS p(probe_id, origin_id)
),
sample_stats AS (
    SELECT p.probe_id, p.origin_id, count(s.sample_id) AS samples,
           min(NULLIF(s.min_rtt_us, 0)) AS min_rtt_us,
           percentile_cont(0.9) WITHIN GROUP (ORDER BY s.bottleneck_bps) AS bps
    FROM pairs p LEFT JOIN path_samples s ON s.probe_id = p.probe_id AND s.origin_id = p.origin_id
    GROUP BY p.probe_id, p.origin_id
),
trial_stats AS (
    SELECT p.probe_id, p.origin_id, count(t.trial_id) AS trials,
           min(NULLIF(t.tcpi_min_rtt_us, 0)) AS min_rtt_us,
           sum(t.server_bytes_retrans) AS bytes_retrans,
           sum(t.server_bytes_sent) FILTER (WHERE t.server_bytes_retrans IS NOT NULL) AS bytes_sent
    FROM pairs p LEFT JOIN trials t ON t.probe_id = p.probe_id AND t.origin_id = p.origin_id
    GROUP BY p.probe_id, p.origin_id
),
server_rates AS (
    SELECT p.probe_id, p.origin_id,
           percentile_cont(0.9) WITHIN GROUP (ORDER BY o.tcpi_delivery_rate * 8) AS bps
    FROM pairs p
    JOIN trials t ON t.probe_id = p.probe_id AND t.origin_id = p.origin_id AND t.joined_at IS NOT NULL
    JOIN origin_observations o ON o.trial_id = t.trial_id AND o.tcpi_delivery_rate > 0
    GROUP BY p.probe_id, p.origin_id
),
estimates AS (
    SELECT s.probe_id, s.origin_id,
           LEAST(s.min_rtt_us, t.min_rtt_us) AS min_rtt_us,
           round(COALESCE(s.bps, r.bps))::bigint AS bottleneck_bps,
           s.samples + t.trials AS sample_count,
           CASE WHEN t.bytes_sent > 0 THEN t.bytes_retrans::double precision / t.bytes_sent END AS loss_rate
    FROM sample_stats s JOIN trial_stats t USING (probe_id, origin_id)
    LEFT JOIN server_rates r USING (probe_id, origin_id)
    WHERE s.samples + t.trials > 0
)
INSERT INTO path_estimates (probe_id, origin_id, min_rtt_us, bottleneck_bps, bdp_bytes, loss_rate,
                            sample_count, updated_at)
SELECT probe_id, origin_id, min_rtt_us, bottleneck_bps,
       round(bottleneck_bps::numeric * min_rtt_us / 8000000)::bigint, loss_rate, sample_count, now()
FROM estimates
ON CONFLICT (probe_id, origin_id) DO UPDATE SET
    min_rtt_us = EXCLUDED.min_rtt_us, bottleneck_bps = EXCLUDED.bottleneck_bps,
    bdp_bytes = EXCLUDED.bdp_bytes, loss_rate = EXCLUDED.loss_rate,
    sample_count = EXCLUDED.sample_count, updated_at = EXCLUDED.updated_at
""")


def recompute_path_estimates(session: Session, pairs: Sequence[Sequence[str]]) -> int:
    """Recompute the estimates of ``pairs`` (``[probe_id, origin_id]``) from scratch; returns rows written.

    A full recomputation per pair is idempotent (running it twice gives the same row).
    """
    if not pairs:
        return 0
    result = session.execute(_RECOMPUTE, {"probe_ids": [str(pair[0]) for pair in pairs],
                                          "origin_ids": [str(pair[1]) for pair in pairs]})
    return int(getattr(result, "rowcount", 0) or 0)
