"""WSGI entry point for production: ``gunicorn iwscope_dashboard.wsgi:server`` (reads DATABASE_URL)."""

from iwscope_dashboard.app import create_app

app = create_app()
server = app.server
