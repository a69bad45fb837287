"""TLS handshakes against the IW: the handshake's time by the size of the server's first flight.

The first server flight of a TLS handshake (ServerHello .. Certificate chain, CertificateVerify,
Finished) is a short transfer bounded by the initial window; its size is mostly the certificate
chain's.  :func:`tls_by_flight` compares two arms per bucket of first-flight size (the origin
counts it exactly: ``server_tls_first_flight_bytes``) with the paired design of every other
figure: per (path, flight bucket) cell, baseline and treatment trials of the same path, the
improvement with its 95 % interval (clusters of paths, or within-path resampling of each
cell's trials when there are few paths), "n too small" below ``paired.MIN_PAIRS``.

The metric: ``client`` is the probe's handshake (TCP established -> handshake complete,
``tls_handshake_us``), ``server`` the origin's (ClientHello read -> client Finished processed).
Read from the raw trials (HTTPS trials are a small share of a fleet's; a roll-up is the next
step when they are not).  Only successful short-flow HTTPS trials whose origin observation was
joined count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.analysis.filters import Filters, trial_where
from iwscope.analysis.paired import Cells, cell_estimate
from iwscope.analysis.queries import arm_stats, bucket_comparison
from iwscope.analysis.results import BucketComparison

DIMENSION = "tls_flight"
#: Upper edges of the first-flight buckets (bytes): classical chains (2-6 KB), IW10's 14.5 KB,
#: post-quantum-like chains beyond.
FLIGHT_EDGES_BYTES = (3_000, 6_000, 10_000, 14_480, 20_000, 28_000, 40_000, 64_000)
FLIGHT_BUCKETS = bk.edge_buckets(tuple(edge / 1000 for edge in FLIGHT_EDGES_BYTES), " KB")


def flight_bucket(first_flight_bytes: int) -> int:
    """The bucket (order) of a first flight of this many bytes (what :func:`tls_by_flight`
    computes for all its rows at once)."""
    return int(np.searchsorted(np.asarray(FLIGHT_EDGES_BYTES), first_flight_bytes, side="left"))


def _where(filters: Filters) -> tuple[str, dict[str, Any]]:
    """The filters (``trial_where``: campaigns, window, regions, sizes) and what makes a trial
    an HTTPS short flow of the two arms with its origin's flight joined."""
    where, params = trial_where(filters)
    conditions = [
        where,
        "t.tls_version IS NOT NULL",
        "t.error_kind IS NULL",
        "t.role = 'short'",
        "t.server_tls_first_flight_bytes IS NOT NULL",
        "t.arm_iw IN (:base, :treat)",
        "t.arm IS NULL",
    ]  # plain arms only, as the other figures
    return " AND ".join(conditions), {**params, "base": filters.baseline_iw, "treat": filters.treatment_iw}


def tls_by_flight(session: Session, filters: Filters) -> list[BucketComparison]:
    """Baseline vs treatment handshake time per first-flight bucket (module docstring)."""
    column = "t.server_tls_handshake_us" if filters.metric == "server" else "t.tls_handshake_us"
    where, params = _where(filters)
    rows = session.execute(
        text(f"""
        SELECT t.probe_id::text || '/' || coalesce(t.origin_id::text, ''), t.arm_iw,
               t.server_tls_first_flight_bytes, {column}, {bk.hist_bin_sql(column)}
          FROM trials t JOIN probes p ON p.id = t.probe_id
         WHERE {where} AND {column} IS NOT NULL"""),
        params,
    ).all()
    if not rows:
        return []
    paths, path_code = np.unique(np.array([row[0] for row in rows]), return_inverse=True)
    arm = np.array([row[1] for row in rows])
    bucket = np.searchsorted(np.asarray(FLIGHT_EDGES_BYTES), np.array([row[2] for row in rows]), side="left")
    latency_us = np.array([float(row[3]) for row in rows])
    bins = np.array([row[4] for row in rows], dtype=np.int64)
    results = []
    for label in FLIGHT_BUCKETS:
        in_bucket = bucket == label.order
        if not in_bucket.any():
            continue
        arms = []
        for iw in (filters.baseline_iw, filters.treatment_iw):
            chosen = in_bucket & (arm == iw)
            values = latency_us[chosen]
            arms.append(
                arm_stats(
                    iw,
                    float(values.size),
                    float(values.sum()),
                    float((values**2).sum()),
                    np.bincount(bins[chosen], minlength=bk.HIST_BINS),
                )
            )
        estimate = cell_estimate(
            _cells(path_code[in_bucket], arm[in_bucket], latency_us[in_bucket], bins[in_bucket], filters, len(paths))
        )
        results.append(bucket_comparison(DIMENSION, label, arms[0], arms[1], estimate))
    return results


def _cells(path: np.ndarray, arm: np.ndarray, latency_us: np.ndarray, bins: np.ndarray, filters: Filters, n_paths: int) -> Cells:
    """One cell per path of a bucket: both arms' counts, sums (ms) and histograms."""
    base, treat = arm == filters.baseline_iw, arm == filters.treatment_iw
    ms = latency_us / 1000.0

    def per_path(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
        return np.bincount(path[mask], weights=values[mask], minlength=n_paths)

    hist_base = np.zeros((n_paths, bk.HIST_BINS), dtype=np.int64)
    hist_treat = np.zeros((n_paths, bk.HIST_BINS), dtype=np.int64)
    np.add.at(hist_base, (path[base], bins[base]), 1)
    np.add.at(hist_treat, (path[treat], bins[treat]), 1)
    present = np.flatnonzero(np.bincount(path, minlength=n_paths))
    ones = np.ones(path.size)
    return Cells(
        path=present,
        n_base=per_path(base, ones)[present],
        sum_base_ms=per_path(base, ms)[present],
        n_treat=per_path(treat, ones)[present],
        sum_treat_ms=per_path(treat, ms)[present],
        hist_base=hist_base[present],
        hist_treat=hist_treat[present],
    )
