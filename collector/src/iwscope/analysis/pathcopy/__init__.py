"""A columnar copy of the per-path sums the paired figures read: Parquet files read by DuckDB.

Why: the paired estimate needs per-path sums (the path-cluster bootstrap resamples paths), and
at a fleet's size (20,000 paths, 90 days: 1.3 M month rows) PostgreSQL's hash aggregate of
them takes about a second, which no index shortens; DuckDB reads the same sums from Parquet in
a fraction of that (docs/analysis-benchmark.md, "A columnar copy").  PostgreSQL stays the store
of record: the copy is derived, may be deleted at any time and is then rebuilt.

**What it holds.** For the short, plain-arm trials (what ``analysis_rollups`` holds) and per
(campaign, probe, origin, arm, size octave, UTC day): ``n_trials``, ``client_n``,
``client_sum_us``, ``server_n``, ``server_sum_us``, as of a pair of watermarks -- client sides
of the trials received by ``received_upto``, server sides of those joined by ``joined_upto``.
Those sums are a function of the trials and the two instants only, so the copy is exactly the
per-path roll-ups at the same watermarks, whatever happened to the roll-ups in between (a
rebuild folds the same trials again).

**Files** (in ``directory``, one copy per database): immutable Parquet files and
``manifest.json``, replaced atomically, which names the base file, the delta files after it,
the watermarks and the database.

* the base: day rows (``grain`` 0), month rows (1) and one row per key for the whole history
  (2), sorted by grain and day so that row-group statistics skip what a query does not read;
* a delta: the day rows of the trials between two watermarks.

:func:`update` (the worker, after each refresh) adds a delta for the windows between the copy's
watermarks and the roll-ups', and every ``COMPACT_AFTER`` deltas folds them into a new base.
:func:`load_path_stats` answers like ``frames.load_path_stats``; when the copy is behind the
roll-ups' watermarks it adds the trials in between from PostgreSQL with the refresh's own SQL,
so it reads what the roll-ups hold in the same transaction.  It returns ``None`` (the caller
reads PostgreSQL) when the copy is missing, belongs to another database, is ahead of the
roll-ups (a rebuild in progress) or further behind than ``MAX_LAG``.

One process writes (an ``flock`` on ``directory/.lock``); readers in any process open the
files a manifest names, which stay on disk for ``KEEP_UNREFERENCED_S`` after a newer manifest
stops naming them.
"""

from iwscope.analysis.pathcopy._files import (
    COMPACT_AFTER,
    FORMAT_VERSION,
    GRAIN_ALL,
    KEEP_UNREFERENCED_S,
    MANIFEST,
    MAX_LAG,
    MEASURES,
    REBASE_SHARE,
    Manifest,
    database_identity,
    read_manifest,
)
from iwscope.analysis.pathcopy._read import (
    PreparedPathDetail,
    PreparedPathStats,
    load_path_detail,
    load_path_stats,
    prepare_path_detail,
    prepare_path_stats,
    probe_totals,
)
from iwscope.analysis.pathcopy._write import UpdateResult, compact, update

__all__ = [
    "COMPACT_AFTER",
    "FORMAT_VERSION",
    "GRAIN_ALL",
    "KEEP_UNREFERENCED_S",
    "MANIFEST",
    "MAX_LAG",
    "MEASURES",
    "REBASE_SHARE",
    "Manifest",
    "PreparedPathDetail",
    "PreparedPathStats",
    "UpdateResult",
    "compact",
    "database_identity",
    "load_path_detail",
    "load_path_stats",
    "prepare_path_detail",
    "prepare_path_stats",
    "probe_totals",
    "read_manifest",
    "update",
]
