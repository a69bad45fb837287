"""HTTP/3 against TCP at the same initial window, and QUIC arms against each other (wire v9).

A campaign with QUIC arms (``10q``: IW 10 in packets of 1,200 bytes over HTTP/3, on the same
origin as the TCP arm ``10``) measures both protocols in the same rounds, on the same paths,
with the same sizes: the paired design of every other figure (:mod:`iwscope.analysis.paired`),
with cells (path, round, size).

* :func:`tcp_vs_quic`: per size octave, TCP arm ``N`` (baseline) against QUIC arm ``Nq``
  (treatment) for each IW of the filters (``base`` and ``treat``) that has QUIC trials.  With
  ``metric=client`` (the probe's total: first packet to last byte, handshakes included) the
  improvement is what HTTP/3 saves a user; QUIC's handshake is a round trip shorter than
  TCP + TLS 1.3's, so it is about one RTT for objects the window carries at once
  (``iwscope.model.predict_quic_saving`` is the prediction).  With ``metric=server`` (request
  read -> last byte acknowledged) it is the transfer alone.
* :func:`quic_arms`: QUIC arm ``<base>q`` against ``<treat>q`` per size octave: the IW question
  over QUIC.

Read from the raw trials, as the TLS figure is: QUIC arms are labelled arms and so are not in
the roll-ups (which hold plain TCP arms only).  Only successful short flows count; a bucket
with fewer than ``paired.MIN_PAIRS`` pairs says "n too small".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.analysis.filters import Filters, trial_where
from iwscope.analysis.paired import make_pairs, paired_estimate
from iwscope.analysis.queries import arm_stats, bucket_comparison
from iwscope.analysis.results import BucketComparison

#: ``dimension`` of :func:`tcp_vs_quic`'s comparisons (baseline TCP, treatment QUIC, one IW).
TCP_VS_QUIC = "tcp-vs-quic"
#: ``dimension`` of :func:`quic_arms`' comparisons (two QUIC arms).
QUIC_ARMS = "quic-arms"


def _trials(session: Session, filters: Filters, labels: list[str]) -> list[Any]:
    """(path, round, size, label, latency µs, histogram bin) of the successful short flows of
    the arms ``labels`` (a plain TCP arm is stored without a label: its IW names it), read once
    for every comparison of a call."""
    column = "t.server_latency_us" if filters.metric == "server" else "t.total_us"
    # both protocols are wanted here, whatever the filter says
    where, params = trial_where(replace(filters, protocol=""))
    return list(
        session.execute(
            text(f"""
            SELECT t.probe_id::text || '/' || coalesce(t.origin_id::text, ''), t.round, t.object_size,
                   COALESCE(t.arm, t.arm_iw::text), {column}, {bk.hist_bin_sql(column)}
              FROM trials t JOIN probes p ON p.id = t.probe_id
             WHERE {where} AND t.error_kind IS NULL AND t.role = 'short' AND {column} IS NOT NULL
               AND COALESCE(t.arm, t.arm_iw::text) = ANY(:labels)"""),
            {**params, "labels": labels},
        ).all()
    )


def _by_size(rows: list[Any], labels: tuple[str, str], iws: tuple[int, int], dimension: str) -> list[BucketComparison]:
    """One paired comparison per size octave of ``rows`` (:func:`_trials`), ``labels[0]`` the
    baseline."""
    if not rows:
        return []
    _, path_code = np.unique(np.array([row[0] for row in rows]), return_inverse=True)
    round_ = np.array([row[1] for row in rows], dtype=np.int64)
    size = np.array([row[2] for row in rows], dtype=np.int64)
    treated = np.array([row[3] == labels[1] for row in rows])
    latency_us = np.array([float(row[4]) for row in rows])
    bins = np.array([row[5] for row in rows], dtype=np.int64)
    octave = np.array([bk.size_bucket(int(value)) for value in size])
    results = []
    for bucket in np.unique(octave):
        chosen = octave == bucket
        arms = []
        for iw, mask in ((iws[0], chosen & ~treated), (iws[1], chosen & treated)):
            values = latency_us[mask]
            hist = np.bincount(bins[mask], minlength=bk.HIST_BINS)
            arms.append(arm_stats(iw, float(values.size), float(values.sum()), float((values**2).sum()), hist))
        pairs = make_pairs(path_code[chosen], round_[chosen], size[chosen], treated[chosen], latency_us[chosen] / 1000.0)
        lower, upper = bk.size_bucket_bounds(int(bucket))
        label = bk.Bucket(bk.size_bucket_label(int(bucket)), int(bucket), float(lower), None if upper is None else float(upper))
        results.append(bucket_comparison(dimension, label, arms[0], arms[1], paired_estimate(pairs)))
    return results


def _compare(rows: list[Any], labels: tuple[str, str], iws: tuple[int, int], dimension: str) -> list[BucketComparison]:
    """The comparison of two arms from :func:`_trials`' rows; nothing without the treatment's."""
    mine = [row for row in rows if row[3] in labels]
    if not any(row[3] == labels[1] for row in mine):
        return []
    return _by_size(mine, labels, iws, dimension)


def _tcp_vs_quic(rows: list[Any], filters: Filters) -> list[BucketComparison]:
    results: list[BucketComparison] = []
    for iw in sorted({filters.baseline_iw, filters.treatment_iw}):
        results += _compare(rows, (str(iw), f"{iw}q"), (iw, iw), TCP_VS_QUIC)
    return results


def _quic_arms(rows: list[Any], filters: Filters) -> list[BucketComparison]:
    base, treat = filters.baseline_iw, filters.treatment_iw
    if base == treat:  # one arm: nothing to compare
        return []
    return _compare(rows, (f"{base}q", f"{treat}q"), (base, treat), QUIC_ARMS)


def _labels(filters: Filters) -> list[str]:
    iws = sorted({filters.baseline_iw, filters.treatment_iw})
    return [str(iw) for iw in iws] + [f"{iw}q" for iw in iws]


def tcp_vs_quic(session: Session, filters: Filters) -> list[BucketComparison]:
    """TCP arm ``N`` against QUIC arm ``Nq`` per size octave, for ``N`` in the filters' two IWs
    (module docstring); an IW without QUIC trials gives nothing."""
    return _tcp_vs_quic(_trials(session, filters, _labels(filters)), filters)


def quic_arms(session: Session, filters: Filters) -> list[BucketComparison]:
    """QUIC arm ``<base>q`` against ``<treat>q`` per size octave (module docstring); nothing when
    the two IWs are one."""
    return _quic_arms(_trials(session, filters, _labels(filters)), filters)


def protocol_comparisons(session: Session, filters: Filters) -> list[BucketComparison]:
    """Both, from one read of the trials: :func:`tcp_vs_quic`, then :func:`quic_arms`
    (``dimension`` tells them apart)."""
    rows = _trials(session, filters, _labels(filters))
    return _tcp_vs_quic(rows, filters) + _quic_arms(rows, filters)


__all__ = ["QUIC_ARMS", "TCP_VS_QUIC", "protocol_comparisons", "quic_arms", "tcp_vs_quic"]
