"""``iwscope dashboard``: serve the Dash app with gunicorn (the same WSGI app as ``iwscope_dashboard.wsgi:server``)."""

from __future__ import annotations

from typing import Any

import click
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from iwscope_dashboard.db import NO_DATABASE, resolve_database_url


def _check_database(url: str) -> None:
    """Fail at start with a readable message instead of on the first page view."""
    probe_engine = create_engine(url, pool_pre_ping=True)
    try:
        with probe_engine.connect() as connection:
            connection.execute(text("select 1"))
    except SQLAlchemyError as error:
        raise click.ClickException(
            f"cannot reach the database {probe_engine.url.render_as_string(hide_password=True)}: {str(error).splitlines()[0]}"
        ) from error
    finally:
        probe_engine.dispose()


def serve(hosts: tuple[str, ...], port: int, workers: int, threads: int, database_url: str, cache_seconds: float) -> None:
    from gunicorn.app.base import BaseApplication

    class DashboardServer(BaseApplication):  # type: ignore[misc]
        """gunicorn run in-process; each worker builds its own app (own database pool)."""

        def load_config(self) -> None:
            settings: dict[str, Any] = {
                "bind": [f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host in dict.fromkeys(hosts)],
                "workers": workers,
                "threads": threads,
                "worker_class": "gthread",
                "timeout": 120,
                "accesslog": None,
                "errorlog": "-",
                "loglevel": "info",
                "preload_app": False,
                # gunicorn >= 23.1 opens a control socket at a fixed path under $HOME; two
                # dashboards (tests, demo) would fight over it.
                "control_socket_disable": True,
            }
            for key, value in settings.items():
                if key in self.cfg.settings:
                    self.cfg.set(key, value)

        def load(self) -> Any:
            from iwscope_dashboard.app import create_app

            return create_app(database_url, cache_seconds=cache_seconds).server

    DashboardServer().run()


@click.command()
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("127.0.0.1",),
    show_default=True,
    help="address to listen on; repeat for several (0.0.0.0 = every interface)",
)
@click.option("--port", default=8050, show_default=True, type=click.IntRange(1, 65535), help="port to listen on")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="gunicorn worker processes")
@click.option("--threads", default=4, show_default=True, type=click.IntRange(1, 64), help="threads per worker")
@click.option("--database-url", envvar="DATABASE_URL", default=None, help="PostgreSQL URL (default: $DATABASE_URL)")
@click.option(
    "--cache-seconds", default=30.0, show_default=True, type=click.FloatRange(0), help="reuse roll-up results this long (0: off)"
)
def dashboard(
    hosts: tuple[str, ...], port: int, workers: int, threads: int, database_url: str | None, cache_seconds: float
) -> None:
    """Serve the iwscope dashboard (Plotly Dash) on HOST:PORT, reading DATABASE_URL."""
    # Named explicitly (option or DATABASE_URL), never the development settings' local stack:
    # a dashboard started without a database says so instead of showing another one.
    if not database_url:
        raise click.ClickException(NO_DATABASE)
    url = resolve_database_url(database_url)
    _check_database(url)
    click.echo("iwscope dashboard on " + ", ".join(f"http://{host}:{port}/" for host in hosts), err=True)
    serve(hosts, port, workers, threads, url, cache_seconds)
