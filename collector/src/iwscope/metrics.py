"""Prometheus metrics of the API.

One registry per process; with several API workers (:mod:`iwscope.supervisor`) each writes its
values to ``PROMETHEUS_MULTIPROC_DIR`` and :func:`exposition` sums them across the workers.
"""

from __future__ import annotations

import functools
import os
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

REQUESTS = Counter("iwscope_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram(
    "iwscope_http_request_duration_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECORDS = Counter(
    "iwscope_records_total", "Uploaded records by kind and outcome", ["kind", "outcome"]
)  # kind: trial|path_sample|census|observation|passive_aggregate|passive_connection|passive;
# outcome: accepted|duplicate|rejected
JOINED_AT_INGEST = Counter(
    "iwscope_trials_joined_at_ingest_total", "Trials stored joined: their origin observation was stored before them"
)
TASKS_NOT_SENT = Counter(
    "iwscope_tasks_not_sent_total", "Worker tasks that could not be queued (the periodic sweep catches up)", ["task"]
)
DB_BUSY = Counter(
    "iwscope_db_busy_total",
    "Requests answered 503 because no database connection became free "
    "in time (admission: no slot; reads: public reads over their share; pool: pool_timeout)",
    ["where"],
)
ADMISSION_REJECTED = Counter(
    "iwscope_admission_rejected_total",
    "Requests answered 503 at the front door, "
    "by class (probe|other) and reason (in_progress: too many in progress in the "
    "process; loop_lag: its event loop behind; upload_latency: as many uploads in progress as "
    "their latency allows, admission.UploadLimit)",
    ["kind", "reason"],
)
RETRY_AFTER = Gauge(
    "iwscope_admission_retry_after_seconds",
    "Retry-After the door answers probe traffic with (the largest over workers; admission.RetryAfter)",
    multiprocess_mode="livemax",
)
UPLOAD_LIMIT = Gauge(
    "iwscope_admission_upload_limit",
    "Uploads the API process(es) take at once (summed over workers), adjusted each second from "
    "the trial uploads' latency (admission.UploadLimit)",
    multiprocess_mode="livesum",
)
LOOP_LAG = Gauge(
    "iwscope_event_loop_lag_seconds",
    "Smoothed event-loop lag of the API process(es) (the largest over workers)",
    multiprocess_mode="livemax",
)
ANALYSIS_PATH_READS = Counter(
    "iwscope_analysis_path_reads_total",
    "Per-path reads of the analysis (the paired "
    "figures' sums, the intervals' histograms, the fleet table's totals) by source "
    "(copy: the analysis copy, analysis/pathcopy/; postgresql: when no copy is "
    "configured or it could not be used)",
    ["source"],
)
ANALYSIS_READ_CACHE = Counter(
    "iwscope_analysis_read_cache_total",
    "Roll-up reads of the analysis answered from the process's copy of recent reads (hit) or "
    "read and kept (miss), analysis/readcache.py",
    ["result"],
)
IN_PROGRESS = Gauge(
    "iwscope_requests_in_progress",
    "Requests in progress (summed over the API's worker processes), by admission class",
    ["kind"],
    multiprocess_mode="livesum",
)


Metric = TypeVar("Metric", Counter, Gauge, Histogram)


@functools.cache
def labelled(metric: Metric, *values: str) -> Any:
    """``metric.labels(*values)``, looked up once per label set: prometheus-client checks and
    locks on every ``labels()`` call: 4 % of the API's GIL-held samples (py-spy, 2,000 probes,
    2026-11-28) when every request counted itself that way.  The label sets are
    bounded (routes, methods, statuses, record kinds), so is the cache."""
    return metric.labels(*values)


def exposition() -> bytes:
    """The text exposition of this process's metrics, or of every worker's when there are several."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest()
