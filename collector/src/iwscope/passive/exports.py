"""The passive tables as Parquet, for holders of the read credential only.

The same machinery as the public exports (:mod:`iwscope.exports.columnar`: PostgreSQL's COPY
output parsed by pyarrow a block at a time, one row group per ~10^5 rows), but these specs are
not in its public ``TABLES``: neither ``GET /api/v1/<table>.parquet``, ``iwscope export`` nor a
bundle can reach them.  Filters: campaign, server, and the window on ``hour`` (aggregates) or
``closed_at`` (connections), inclusive.
"""

from __future__ import annotations

from iwscope import models
from iwscope.exports.columnar import TableSpec

_TABLES = models.Base.metadata.tables
_FILTERS = {"campaign_id": "x.campaign_id = %(campaign_id)s", "server_id": "x.server_id = %(server_id)s"}

PASSIVE_TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        TableSpec("aggregates", _TABLES["passive_aggregates"], "x.hour, x.aggregate_id", "hour", _FILTERS),
        TableSpec("connections", _TABLES["passive_connections"], "x.closed_at, x.record_id", "closed_at", _FILTERS),
    )
}
