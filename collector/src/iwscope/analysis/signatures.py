"""Path signatures: the figure buckets a path's trials are counted under.

A figure groups trials by their path's region and its RTT, bandwidth, BDP and loss bucket
(:mod:`buckets`).  ``analysis_bucket_rollups`` keeps the roll-ups keyed by that combination, a
*signature*, instead of by path, so a figure reads rows in proportion to the buckets it draws,
not to the fleet (10,000 probes x 2 origins fall in a few hundred signatures).

``analysis_path_signatures`` records the signature each path's trials were counted under.  A
path gets its current one the first time its trials are folded in; when its path estimate moves
across a bucket edge, :func:`moved` reports it and the refresh moves the path's per-path
roll-ups from the old signature's rows to the new one's (``rollups.rebucket``), so a figure
always counts a path's trials, old and new, in the bucket of its current estimate -- as the
per-path roll-ups joined with ``path_estimates`` did.  Callers hold the roll-up refresh lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk

Pair = tuple[uuid.UUID, uuid.UUID]
#: A value that changes whenever a path's signature does (``path_signatures`` stamps
#: ``updated_at`` on every insert and change) or a signature is added: the analysis copy's
#: signature table and the process's kept reads (``readcache``) are valid while it holds.
VERSION_SQL = """
    SELECT count(*), COALESCE(sum(signature_id), 0), COALESCE(sum(extract(epoch FROM updated_at)), 0),
           (SELECT count(*) FROM analysis_signatures)
    FROM analysis_path_signatures"""
#: (region, rtt bucket, bandwidth bucket, bdp bucket, loss bucket); -1 = unknown.
SignatureValues = tuple[str, int, int, int, int]

_CURRENT = text("""
    SELECT k.probe_id, k.origin_id, COALESCE(p.region, 'unknown') AS region,
           COALESCE(pe.min_rtt_us::float8, 'NaN') AS min_rtt_us,
           COALESCE(pe.bottleneck_bps::float8, 'NaN') AS bottleneck_bps,
           COALESCE(pe.bdp_bytes::float8, 'NaN') AS bdp_bytes, COALESCE(pe.loss_rate, 'NaN') AS loss_rate
    FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:origin_ids AS uuid[])) AS k(probe_id, origin_id)
    LEFT JOIN probes AS p ON p.id = k.probe_id
    LEFT JOIN path_estimates AS pe ON pe.probe_id = k.probe_id AND pe.origin_id = k.origin_id""")

_STORED = text("""
    SELECT s.probe_id, s.origin_id, s.signature_id FROM analysis_path_signatures AS s
    JOIN unnest(CAST(:probe_ids AS uuid[]), CAST(:origin_ids AS uuid[])) AS k(probe_id, origin_id)
      ON s.probe_id = k.probe_id AND s.origin_id = k.origin_id""")


def _pair_params(pairs: Sequence[Pair]) -> dict[str, list[str]]:
    return {"probe_ids": [str(pair[0]) for pair in pairs], "origin_ids": [str(pair[1]) for pair in pairs]}


def current(session: Session, pairs: Sequence[Pair]) -> dict[Pair, SignatureValues]:
    """Each pair's signature from its probe's region and its path estimate now."""
    if not pairs:
        return {}
    rows = session.execute(_CURRENT, _pair_params(pairs)).all()
    values = np.array(
        [(row.min_rtt_us, row.bottleneck_bps, row.bdp_bytes, row.loss_rate) for row in rows], dtype=np.float64
    ).reshape(len(rows), 4)
    rtt, bandwidth = bk.rtt_index(values[:, 0]), bk.bandwidth_index(values[:, 1])
    bdp, loss = bk.bdp_index(values[:, 2]), bk.loss_index(values[:, 3])
    return {
        (row.probe_id, row.origin_id): (row.region, int(rtt[i]), int(bandwidth[i]), int(bdp[i]), int(loss[i]))
        for i, row in enumerate(rows)
    }


def _ids(session: Session, wanted: set[SignatureValues]) -> dict[SignatureValues, int]:
    """Ids of ``wanted`` signatures, creating missing ones."""
    known = {
        (row.region, row.rtt_bucket, row.bandwidth_bucket, row.bdp_bucket, row.loss_bucket): int(row.id)
        for row in session.execute(text("SELECT * FROM analysis_signatures"))
    }
    missing = sorted(wanted - known.keys())
    if missing:
        columns = list(zip(*missing, strict=True))
        for row in session.execute(
            text("""
                INSERT INTO analysis_signatures (region, rtt_bucket, bandwidth_bucket, bdp_bucket, loss_bucket)
                SELECT * FROM unnest(CAST(:regions AS text[]), CAST(:rtt AS smallint[]), CAST(:bandwidth AS smallint[]),
                                     CAST(:bdp AS smallint[]), CAST(:loss AS smallint[]))
                ON CONFLICT ON CONSTRAINT uq_analysis_signatures_region DO UPDATE SET region = EXCLUDED.region
                RETURNING *"""),
            {
                "regions": list(columns[0]),
                "rtt": list(columns[1]),
                "bandwidth": list(columns[2]),
                "bdp": list(columns[3]),
                "loss": list(columns[4]),
            },
        ):
            known[(row.region, row.rtt_bucket, row.bandwidth_bucket, row.bdp_bucket, row.loss_bucket)] = int(row.id)
    return known


def _store(session: Session, assigned: dict[Pair, int]) -> None:
    if not assigned:
        return
    pairs = list(assigned)
    session.execute(
        text("""
        INSERT INTO analysis_path_signatures (probe_id, origin_id, signature_id, updated_at)
        SELECT k.probe_id, k.origin_id, k.signature_id, now()
        FROM unnest(CAST(:probe_ids AS uuid[]), CAST(:origin_ids AS uuid[]), CAST(:signature_ids AS int[]))
             AS k(probe_id, origin_id, signature_id)
        ON CONFLICT (probe_id, origin_id) DO UPDATE SET signature_id = EXCLUDED.signature_id, updated_at = now()"""),
        {**_pair_params(pairs), "signature_ids": [assigned[pair] for pair in pairs]},
    )


def path_signatures(session: Session, pairs: Sequence[Pair]) -> dict[Pair, int]:
    """The stored signature id of each pair; pairs without one get their current signature."""
    stored = (
        {(row.probe_id, row.origin_id): int(row.signature_id) for row in session.execute(_STORED, _pair_params(pairs))}
        if pairs
        else {}
    )
    new = [pair for pair in pairs if pair not in stored]
    if new:
        values = current(session, new)
        ids = _ids(session, set(values.values()))
        assigned = {pair: ids[values[pair]] for pair in new}
        _store(session, assigned)
        stored.update(assigned)
    return stored


def moved(session: Session, pairs: Sequence[Pair]) -> list[tuple[Pair, int, int]]:
    """Pairs (with a stored signature) whose current signature differs: ``(pair, old id, new id)``,
    with the stored signature already updated to the new id."""
    if not pairs:
        return []
    stored = {(row.probe_id, row.origin_id): int(row.signature_id) for row in session.execute(_STORED, _pair_params(pairs))}
    if not stored:
        return []
    values = current(session, list(stored))
    ids = _ids(session, set(values.values()))
    moves = [(pair, old, ids[values[pair]]) for pair, old in stored.items() if ids[values[pair]] != old]
    _store(session, {pair: new for pair, _, new in moves})
    return moves
