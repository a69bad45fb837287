"""The Dash app factory: ``create_app(database_url=None) -> dash.Dash``.

Pages live one per module in ``iwscope_dashboard/pages/`` (``dash.register_page``); their
callbacks are global (``dash.callback``), so one process serves one app. The Flask server
(``app.server``) also answers ``/download/trials.csv`` (see :mod:`iwscope_dashboard.exports`) and
guards the Real users page, which needs a read token (:mod:`iwscope_dashboard.access`).
"""

from __future__ import annotations

from pathlib import Path

import dash
from dash import html

from iwscope_dashboard import db
from iwscope_dashboard.access import register_access
from iwscope_dashboard.exports import register_exports
from iwscope_dashboard.pagekit import DEFAULT_CACHE_SECONDS, configure_cache

PACKAGE_DIR = Path(__file__).resolve().parent

#: The navigation bar: (path, label); analysis pages keep the filter query when followed.
NAVIGATION: tuple[tuple[str, str, bool], ...] = (
    ("/", "Overview", True),
    ("/latency", "Latency vs IW", True),
    ("/sizes", "Sizes", True),
    ("/regions", "Regions", True),
    ("/loss", "Loss", True),
    ("/tls", "TLS", True),
    ("/http3", "HTTP/3", True),
    ("/cost", "Cost", True),
    ("/wild", "IW in the wild", True),
    ("/model", "Model", True),
    ("/real-users", "Real users", False),
    ("/probes", "Probes", True),
    ("/trials", "Trials", True),
)


def _shell() -> html.Div:
    links = [
        html.A(label, href=path, className="iw-nav-link", **({"data-keep-query": "1"} if keep else {}))  # type: ignore[arg-type]
        for path, label, keep in NAVIGATION
    ]
    return html.Div(
        [
            html.Header(
                [
                    html.Div(
                        [
                            html.Span("iwscope", className="iw-brand"),
                            html.Span("initial-window latency study", className="iw-tagline"),
                        ]
                    ),
                    html.Nav(links, className="iw-nav", id="app-nav"),
                ],
                className="iw-header",
            ),
            html.Main(dash.page_container, className="iw-main"),
        ]
    )


_created = False


def create_app(database_url: str | None = None, cache_seconds: float = DEFAULT_CACHE_SECONDS) -> dash.Dash:
    """Build the dashboard over the database at ``database_url`` (default: ``DATABASE_URL``).

    Roll-up results are reused for ``cache_seconds`` (0: never). Raises
    :class:`iwscope_dashboard.db.DatabaseNotConfigured` when no database is given.
    """
    global _created
    if _created:
        # Page callbacks are registered globally when the page modules are imported; a second
        # app in the same process would silently lose them.
        raise RuntimeError("create_app() was already called in this process; run one dashboard per process")
    db.configure(database_url)
    configure_cache(cache_seconds)
    app = dash.Dash(
        "iwscope_dashboard",
        use_pages=True,
        pages_folder=str(PACKAGE_DIR / "pages"),
        assets_folder=str(PACKAGE_DIR / "assets"),
        title="iwscope",
        suppress_callback_exceptions=True,
        serve_locally=True,
        update_title=None,  # type: ignore[arg-type]  # no "Updating..." title flicker
    )
    app.layout = _shell
    register_exports(app.server)
    register_access(app.server)
    _created = True
    return app
