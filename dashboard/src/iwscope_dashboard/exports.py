"""CSV export of the trials a filter selects, streamed from ``iter_trials_csv``.

``GET /download/trials.csv?<Filters.to_query()>``: the same query string the pages keep in
the URL, so the Trials page links to exactly what it shows.  The CSV is the collector's
``/api/v1/analysis/trials.csv`` (one writer, :mod:`iwscope.analysis.raw`).
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Flask, Response, request, stream_with_context

from iwscope.analysis import Filters, iter_trials_csv
from iwscope.db import session_scope
from iwscope_dashboard import db

CSV_ROUTE = "/download/trials.csv"


def _stream(filters: Filters) -> Iterator[str]:
    # The session lives as long as the response streams.
    with session_scope(db.session_factory()) as session:
        yield from iter_trials_csv(session, filters)


def register_exports(server: Flask) -> None:
    @server.route(CSV_ROUTE)
    def trials_csv() -> Response:
        filters = Filters.from_query(dict(request.args.items()))
        return Response(
            stream_with_context(_stream(filters)),
            mimetype="text/csv",
            headers={"Content-Disposition": 'attachment; filename="iwscope-trials.csv"', "Cache-Control": "no-store"},
        )
