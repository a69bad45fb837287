"""``iwscope dashboard``: serve the Dash app with gunicorn (the same WSGI app as ``iwscope_dashboard.wsgi:server``);
``iwscope dashboard check-pages``: does every page of a running dashboard show data (:mod:`iwscope_dashboard.pagecheck`)."""

from __future__ import annotations

import pathlib
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

    class DashboardServer(BaseApplication):  # type: ignore[misc]  # gunicorn is untyped: the base class is Any
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


@click.group(invoke_without_command=True)
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
@click.pass_context
def dashboard(
    ctx: click.Context,
    hosts: tuple[str, ...],
    port: int,
    workers: int,
    threads: int,
    database_url: str | None,
    cache_seconds: float,
) -> None:
    """Serve the iwscope dashboard (Plotly Dash) on HOST:PORT, reading DATABASE_URL.

    `iwscope dashboard check-pages --url URL` checks that every page of a running dashboard
    shows data instead."""
    if ctx.invoked_subcommand is not None:
        return
    # Named explicitly (option or DATABASE_URL), never the development settings' local stack:
    # a dashboard started without a database says so instead of showing another one.
    if not database_url:
        raise click.ClickException(NO_DATABASE)
    url = resolve_database_url(database_url)
    _check_database(url)
    click.echo("iwscope dashboard on " + ", ".join(f"http://{host}:{port}/" for host in hosts), err=True)
    serve(hosts, port, workers, threads, url, cache_seconds)


@dashboard.command("check-pages")
@click.option("--url", required=True, help="the running dashboard, e.g. http://127.0.0.1:8750/")
@click.option("--query", default="", help="filters for every page, as in a shared URL: e.g. 'campaign=3&region=africa'")
@click.option(
    "--read-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
    default=None,
    help="a read (or admin) token, to check the Real users page too (skipped without one)",
)
@click.option(
    "--may-be-empty",
    "may_be_empty",
    multiple=True,
    help="a figure (graph id) allowed to show nothing; repeat. Default: what `make demo` does not fill "
    "(the Cost page's interactive-delay and share-sweep figures)",
)
@click.option("--timeout", "timeout_s", default=60.0, show_default=True, type=click.FloatRange(1), help="seconds per page")
@click.option("--trial", default=None, help="a traced trial's id: its inspector on the Trials page must draw its packets too")
def check_pages_command(
    url: str,
    query: str,
    read_token_file: pathlib.Path | None,
    may_be_empty: tuple[str, ...],
    timeout_s: float,
    trial: str | None,
) -> None:
    """Open every page in headless Chromium, print page -> figure -> data points, and exit 1 when a
    figure that should show data is empty."""
    from iwscope_dashboard.pagecheck import DEMO_EMPTY, BrowserUnavailable, check_pages, format_report

    token = read_token_file.read_text().strip() if read_token_file is not None else None
    try:
        report = check_pages(
            url,
            query=query,
            read_token=token,
            empty_allowed=frozenset(may_be_empty) or DEMO_EMPTY,
            timeout_s=timeout_s,
            trial=trial,
        )
    except BrowserUnavailable as error:
        raise click.ClickException(f"{error} (`make setup` installs Debian's chromium)") from error
    click.echo(format_report(report))
    if not report.ok:
        raise SystemExit(1)
