"""CSV export of the trials a filter selects, streamed from ``iter_trials_csv``.

``GET /download/trials.csv?<Filters.to_query()>``: the same query string the pages keep in
the URL, so the Trials page links to exactly what it shows.
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Flask, Response, request, stream_with_context
from iwscope.analysis import Filters, iter_trials_csv

from iwscope_dashboard import db

CSV_ROUTE = "/download/trials.csv"


def _stream(filters: Filters) -> Iterator[str]:
    # The session lives as long as the response streams.
    with db.session_scope() as session:
        yield from iter_trials_csv(session, filters)


def register_exports(server: Flask) -> None:
    @server.route(CSV_ROUTE)
    def trials_csv() -> Response:
        filters = Filters.from_query({key: value for key, value in request.args.items()})
        return Response(
            stream_with_context(_stream(filters)),
            mimetype="text/csv",
            headers={"Content-Disposition": 'attachment; filename="iwscope-trials.csv"', "Cache-Control": "no-store"},
        )
