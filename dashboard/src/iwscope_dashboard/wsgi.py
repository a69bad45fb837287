"""WSGI entry point for production: ``gunicorn iwscope_dashboard.wsgi:server`` (``DATABASE_URL`` read
through the collector's settings, :func:`iwscope.config.get_settings`)."""

from iwscope_dashboard.app import create_app

app = create_app()
server = app.server
