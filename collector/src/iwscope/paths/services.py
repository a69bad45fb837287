"""Path estimates per probe x origin, from path samples, trials and joined observations.

* ``min_rtt_us``: the smallest of the path samples' ``min_rtt_us`` and the trials' client
  ``tcpi_min_rtt_us`` (ignoring zeros, which mean "not measured").
* ``bottleneck_bps``: a robust maximum -- the 90th percentile of the pair's most recent
  ``RECENT_RATES`` bandwidth estimates of its path samples; without samples, of its joined
  observations' server ``tcpi_delivery_rate`` (bytes/s, times 8).
* ``bdp_bytes``: ``bottleneck_bps * min_rtt_us / 8e6``.
* ``loss_rate``: server retransmitted bytes / bytes sent over the pair's joined trials.
* ``sample_count``: path samples plus trials the estimate rests on.

The worker keeps them up to date **incrementally** (:func:`fold_path_deltas`): a row holds the
parts its estimates are computed from (counts, the minimum, byte sums, the recent rates) and a
drain adds what its batches and joins brought, with one statement for all the pairs it touched.
Recomputing from the pair's whole history on every drain (what this module did before) read
every trial of every touched pair again, a cost that grows with the history: 0.73 s per drain
of ~1,000 pairs once a 1,000-probe benchmark had stored 360,000 trials, against 0.17 s for the
fold (medians of 3, quiet box; the fold does not depend on the history).  :func:`recompute_path_estimates` still does
that (for the pairs it is given): the rebuild, and the first touch of a row written before the
parts existed (``sample_count`` differs from ``trial_count + path_sample_count``).

Each part is added exactly once when every input reaches the fold exactly once: server-side
parts come from the join's own ``RETURNING`` (a trial joins once), client-side parts from the
upload that stored the trials (``PathDelta`` in the pending join, built from the records the
idempotent insert admitted).  A drain lost with its worker loses its client-side parts (a trial
count, at most a smaller minimum RTT) until the pair is rebuilt; the beat sweep still joins
its observations, whose parts then arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

#: Bandwidth estimates kept per pair and kind (the bottleneck is their 90th percentile): enough
#: for a stable robust maximum, few enough that a row stays small and follows a path that changed.
RECENT_RATES = 128

Pair = tuple[str, str]


@dataclass
class PathDelta:
    """What new trials, samples and joined observations add to one pair's estimate."""

    trials: int = 0
    samples: int = 0
    min_rtt_us: int | None = None
    bytes_retrans: int = 0
    bytes_sent: int = 0
    #: Newest last; at most ``RECENT_RATES`` are kept.
    sample_bps: list[int] = field(default_factory=list)
    server_bps: list[int] = field(default_factory=list)

    def add_rtt(self, rtt_us: int | None) -> None:
        if rtt_us is not None and rtt_us > 0 and (self.min_rtt_us is None or rtt_us < self.min_rtt_us):
            self.min_rtt_us = rtt_us

    def add_trial(self, min_rtt_us: int | None) -> None:
        self.trials += 1
        self.add_rtt(min_rtt_us)

    def add_sample(self, min_rtt_us: int | None, bottleneck_bps: int | None) -> None:
        self.samples += 1
        self.add_rtt(min_rtt_us)
        if bottleneck_bps is not None:
            self.sample_bps.append(bottleneck_bps)

    def add_joined(self, bytes_retrans: int | None, bytes_sent: int | None, delivery_rate: int | None) -> None:
        """A trial's server side, as the join copied it (``bytes_sent`` counts only with ``bytes_retrans``)."""
        if bytes_retrans is not None:
            self.bytes_retrans += bytes_retrans
            self.bytes_sent += bytes_sent or 0
        if delivery_rate is not None and delivery_rate > 0:
            self.server_bps.append(delivery_rate * 8)

    def merge(self, other: PathDelta) -> None:
        self.trials += other.trials
        self.samples += other.samples
        self.add_rtt(other.min_rtt_us)
        self.bytes_retrans += other.bytes_retrans
        self.bytes_sent += other.bytes_sent
        self.sample_bps = (self.sample_bps + other.sample_bps)[-RECENT_RATES:]
        self.server_bps = (self.server_bps + other.server_bps)[-RECENT_RATES:]

    def to_wire(self) -> list[Any]:
        """A compact JSON form for the pending-join list (see ``worker_client``)."""
        return [self.trials, self.samples, self.min_rtt_us, self.bytes_retrans, self.bytes_sent,
                self.sample_bps[-RECENT_RATES:], self.server_bps[-RECENT_RATES:]]

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> PathDelta:
        trials, samples, min_rtt_us, bytes_retrans, bytes_sent, sample_bps, server_bps = values
        return cls(int(trials), int(samples), None if min_rtt_us is None else int(min_rtt_us), int(bytes_retrans),
                   int(bytes_sent), [int(v) for v in sample_bps], [int(v) for v in server_bps])


def merge_deltas(into: dict[Pair, PathDelta], deltas: Iterable[tuple[Pair, PathDelta]]) -> dict[Pair, PathDelta]:
    for pair, delta in deltas:
        existing = into.get(pair)
        if existing is None:
            into[pair] = PathDelta()
            existing = into[pair]
        existing.merge(delta)
    return into


def _array_text(values: Sequence[int]) -> str:
    return "{" + ",".join(str(int(value)) for value in values) + "}"


def _recent(column: str) -> str:
    """``column`` with the excluded row's rates appended, the oldest beyond ``RECENT_RATES`` dropped."""
    return (f"(pe.{column} || EXCLUDED.{column})[greatest(1, cardinality(pe.{column})"
            f" + cardinality(EXCLUDED.{column}) - {RECENT_RATES} + 1):]")


#: Adds the parts of each pair (rows locked in pair order: concurrent folds cannot deadlock).
_FOLD = text(f"""
INSERT INTO path_estimates AS pe (probe_id, origin_id, sample_count, updated_at, trial_count, path_sample_count,
                                  min_rtt_us, bytes_retrans_sum, bytes_sent_sum, recent_sample_bps, recent_server_bps)
SELECT probe_id, origin_id, trials + samples, now(), trials, samples, min_rtt_us, bytes_retrans, bytes_sent,
       CAST(sample_bps AS bigint[]), CAST(server_bps AS bigint[])
FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:origin_ids AS uuid[]), CAST(:trials AS bigint[]),
            CAST(:samples AS bigint[]), CAST(:min_rtts AS bigint[]), CAST(:bytes_retrans AS bigint[]),
            CAST(:bytes_sent AS bigint[]), CAST(:sample_bps AS text[]), CAST(:server_bps AS text[]))
     AS d(probe_id, origin_id, trials, samples, min_rtt_us, bytes_retrans, bytes_sent, sample_bps, server_bps)
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

_WITHOUT_PARTS = text("""
SELECT pe.probe_id::text, pe.origin_id::text
FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:origin_ids AS uuid[])) AS p(probe_id, origin_id)
JOIN path_estimates AS pe USING (probe_id, origin_id)
WHERE pe.sample_count <> pe.trial_count + pe.path_sample_count
""")

#: Every part from the pairs' whole history (what ``_FOLD`` accumulates), replacing the row's.
_REBUILD = text(f"""
WITH pairs AS (
    SELECT DISTINCT probe_id, origin_id
    FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:origin_ids AS uuid[])) AS p(probe_id, origin_id)
),
sample_stats AS (
    SELECT p.probe_id, p.origin_id, count(s.sample_id) AS samples, min(NULLIF(s.min_rtt_us, 0)) AS min_rtt_us
    FROM pairs p LEFT JOIN path_samples s ON s.probe_id = p.probe_id AND s.origin_id = p.origin_id
    GROUP BY p.probe_id, p.origin_id
),
sample_rates AS (
    SELECT probe_id, origin_id, array_agg(bps ORDER BY measured_at, sample_id) AS bps
    FROM (SELECT s.probe_id, s.origin_id, s.bottleneck_bps AS bps, s.measured_at, s.sample_id,
                 row_number() OVER (PARTITION BY s.probe_id, s.origin_id
                                    ORDER BY s.measured_at DESC, s.sample_id DESC) AS recency
          FROM pairs p JOIN path_samples s ON s.probe_id = p.probe_id AND s.origin_id = p.origin_id
          WHERE s.bottleneck_bps IS NOT NULL) AS recent
    WHERE recency <= {RECENT_RATES}
    GROUP BY probe_id, origin_id
),
trial_stats AS (
    SELECT p.probe_id, p.origin_id, count(t.trial_id) AS trials,
           min(NULLIF(t.tcpi_min_rtt_us, 0)) AS min_rtt_us,
           COALESCE(sum(t.server_bytes_retrans), 0) AS bytes_retrans,
           COALESCE(sum(t.server_bytes_sent) FILTER (WHERE t.server_bytes_retrans IS NOT NULL), 0) AS bytes_sent
    FROM pairs p LEFT JOIN trials t ON t.probe_id = p.probe_id AND t.origin_id = p.origin_id
    GROUP BY p.probe_id, p.origin_id
),
server_rates AS (
    SELECT probe_id, origin_id, array_agg(bps ORDER BY started_at, trial_id) AS bps
    FROM (SELECT t.probe_id, t.origin_id, o.tcpi_delivery_rate * 8 AS bps, t.started_at, t.trial_id,
                 row_number() OVER (PARTITION BY t.probe_id, t.origin_id
                                    ORDER BY t.started_at DESC, t.trial_id DESC) AS recency
          FROM pairs p
          JOIN trials t ON t.probe_id = p.probe_id AND t.origin_id = p.origin_id AND t.joined_at IS NOT NULL
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


def recompute_path_estimates(session: Session, pairs: Sequence[Sequence[str]]) -> int:
    """Rebuild the estimates of ``pairs`` (``[probe_id, origin_id]``) and their parts from the
    pairs' whole history; returns rows written.  Idempotent (twice gives the same row)."""
    if not pairs:
        return 0
    params = _pair_params(pairs)
    result = session.execute(_REBUILD, params)
    session.execute(_DERIVE, params)
    return int(getattr(result, "rowcount", 0) or 0)


def fold_path_deltas(session: Session, deltas: Mapping[Pair, PathDelta]) -> int:
    """Add ``deltas`` to their pairs' estimates (creating rows for new pairs) and derive the
    estimates again; a row without parts yet is rebuilt from its history instead.  Returns
    the rows written."""
    if not deltas:
        return 0
    ordered = sorted(deltas)
    legacy = {(row[0], row[1]) for row in session.execute(_WITHOUT_PARTS, _pair_params(ordered)).all()}
    folded = [pair for pair in ordered if pair not in legacy]
    written = recompute_path_estimates(session, sorted(legacy))
    if folded:
        values = [deltas[pair] for pair in folded]
        session.execute(_FOLD, {
            **_pair_params(folded),
            "trials": [delta.trials for delta in values], "samples": [delta.samples for delta in values],
            "min_rtts": [delta.min_rtt_us for delta in values],
            "bytes_retrans": [delta.bytes_retrans for delta in values],
            "bytes_sent": [delta.bytes_sent for delta in values],
            "sample_bps": [_array_text(delta.sample_bps[-RECENT_RATES:]) for delta in values],
            "server_bps": [_array_text(delta.server_bps[-RECENT_RATES:]) for delta in values]})
        session.execute(_DERIVE, _pair_params(folded))
        written += len(folded)
    return written
