"""The ``iwscope`` command line: one entry point for the collector, the lab and the dashboard.

Sub-commands from other distributions (``iwscope lab``, ``iwscope dashboard``) are found
through the ``iwscope.commands`` entry-point group, so the collector never imports them.
Every command reads ``DATABASE_URL`` and ``REDIS_URL`` from the environment.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import signal
import subprocess
import sys
import time
import uuid
from importlib.metadata import entry_points
from typing import Any

import click

from iwscope.campaigns.cli import campaigns
from iwscope.servers.cli import servers

if os.environ.get("IWSCOPE_ENV", "development") != "production":
    # Development: settings that leave DATABASE_URL / REDIS_URL unset use this checkout's local
    # stack, which iwscope.localstack provides when imported (iwscope.config.use_development_urls).
    # At import, not in a command: the API's spawned workers import this module but run none.
    # Production never loads the development-only module.
    importlib.import_module("iwscope.localstack")


@click.group()
@click.version_option(package_name="iwscope-collector")
def main() -> None:
    """iwscope: how much does TCP's initial window change short-transfer latency?"""


@main.group()
def services() -> None:
    """The local PostgreSQL and Redis (data under .run/), for a one-machine stack and tests."""


@services.command("start")
def services_start() -> None:
    """Start PostgreSQL and Redis unless already running."""
    from iwscope.localstack import ServiceError, default_stack

    stack = default_stack()
    try:
        stack.start()
    except ServiceError as error:  # a sentence that says what to do, not a traceback
        raise click.ClickException(str(error)) from None
    click.echo(f"DATABASE_URL={stack.database_url}")
    click.echo(f"REDIS_URL={stack.redis_url}")


@services.command("stop")
def services_stop() -> None:
    """Stop the local PostgreSQL and Redis."""
    from iwscope.localstack import default_stack

    default_stack().stop()


@services.command("env")
def services_env() -> None:
    """Print shell exports for the local services."""
    from iwscope.localstack import default_stack

    stack = default_stack()
    click.echo(f"export DATABASE_URL={stack.database_url}")
    click.echo(f"export REDIS_URL={stack.redis_url}")


# --------------------------------------------------------------------------------------
# Database
# --------------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Schema migrations (Alembic, scripts in migrations/ or $IWSCOPE_MIGRATIONS_DIR)."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Migrate the database of DATABASE_URL up to REVISION (default: head)."""
    from iwscope import migrate

    migrate.upgrade(revision)


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Migrate down to REVISION (``base`` drops everything)."""
    from iwscope import migrate

    migrate.downgrade(revision)


@db.command("check")
def db_check() -> None:
    """Exit 0 iff the schema is at head."""
    from iwscope import migrate

    current, head = migrate.current_revisions(), migrate.head_revisions()
    if set(current) != set(head):
        click.echo(f"database at {', '.join(current) or 'nothing'}; head is {', '.join(head)}", err=True)
        sys.exit(1)
    click.echo(f"database at head ({', '.join(head)})")


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


@main.command()
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("127.0.0.1",),
    show_default=True,
    help="address to listen on; repeat for several (0.0.0.0 = every interface: only behind a firewall)",
)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="API processes on the same sockets, each with its own admission limits and database "
    "pool, each draining on SIGTERM; metrics summed over them",
)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="PEM certificate (chain) to serve HTTPS with; needs --tls-key",
)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM private key of --tls-cert")
def api(hosts: tuple[str, ...], port: int, workers: int, tls_cert: str | None, tls_key: str | None) -> None:
    """Run the HTTP API (uvicorn; SIGTERM drains for IWSCOPE_DRAIN_SECONDS first)."""
    from iwscope.api import serve

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    status = serve(hosts, port, workers, tls_cert=tls_cert, tls_key=tls_key)
    if status:
        sys.exit(status)


def _run_celery(argv: list[str]) -> None:
    """Run the ``celery`` command ``argv`` on the iwscope app; exit with its status if not 0.

    Not ``Celery.worker_main()`` / ``Celery.start()``: they drop the status (click returns it
    instead of raising in non-standalone mode), so a worker that stopped on an unrecoverable
    error would exit 0 and a supervisor restarting on failure would leave it down.
    """
    from celery.bin.celery import celery as celery_command

    from iwscope.worker import celery_app

    celery_command.params[0].default = celery_app  # -A/--app, as Celery.start() sets it
    try:
        status = celery_command.main(args=argv, prog_name="celery", standalone_mode=False)
    finally:
        celery_command.params[0].default = None
    if isinstance(status, int) and status:
        sys.exit(status)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--concurrency", default=2, show_default=True, type=int)
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(concurrency: int, celery_args: tuple[str, ...]) -> None:
    """Run a Celery worker on the queue IWSCOPE_CELERY_QUEUE (extra args go to celery).

    Exits with the worker's status, as ``celery worker`` does: 0 after a warm shutdown
    (SIGTERM), non-zero after an unrecoverable error (so a supervisor restarts it), a cold
    shutdown (SIGQUIT) or Ctrl-C.
    """
    from iwscope.config import get_settings

    settings = get_settings()
    _run_celery(
        [
            "worker",
            "--queues",
            settings.celery_queue,
            "--concurrency",
            str(concurrency),
            "--loglevel",
            settings.log_level,
            "--hostname",
            f"iwscope-{settings.celery_queue}-{os.getpid()}@%h",
            *celery_args,
        ]
    )


@main.command()
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def beat(celery_args: tuple[str, ...]) -> None:
    """Run Celery beat (partition creation, sweep of unjoined observations)."""
    from iwscope.config import get_settings

    settings = get_settings()
    _run_celery(["beat", "--loglevel", settings.log_level, *celery_args])


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--beat/--no-beat", "with_beat", default=True, show_default=True)
def up(host: str, port: int, with_beat: bool) -> None:
    """A local stack: services (unless DATABASE_URL/REDIS_URL are set), migrations, API, worker, beat.

    The API, worker and beat run as child processes; Ctrl-C stops them all.
    """
    environment = dict(os.environ)
    if "DATABASE_URL" not in environment or "REDIS_URL" not in environment:
        from iwscope.localstack import default_stack

        stack = default_stack()
        stack.start()
        environment.setdefault("DATABASE_URL", stack.database_url)
        environment.setdefault("REDIS_URL", stack.redis_url)
    from iwscope import migrate

    migrate.upgrade(database_url=environment["DATABASE_URL"])
    command = [sys.executable, "-m", "iwscope.cli"]
    children = [
        subprocess.Popen([*command, "api", "--host", host, "--port", str(port)], env=environment),
        subprocess.Popen([*command, "worker"], env=environment),
    ]
    if with_beat:
        children.append(subprocess.Popen([*command, "beat"], env=environment))
    click.echo(f"iwscope API on http://{host}:{port} (OpenAPI at /docs); Ctrl-C stops", err=True)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    #: Children that stopped by themselves (which ends the stack), not on Ctrl-C/SIGTERM.
    exited: list[subprocess.Popen[bytes]] = []
    try:
        while not exited:
            time.sleep(0.5)
            exited = [child for child in children if child.poll() is not None]
    except KeyboardInterrupt:
        pass
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 15
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
    # The ones stopped here may report 1 (a Celery worker does after SIGINT): only a child that
    # stopped by itself with an error fails the command.
    failed = [child.args for child in exited if child.returncode not in (0, -signal.SIGINT, -signal.SIGTERM)]
    if failed:
        sys.exit(1)


# --------------------------------------------------------------------------------------
# Tokens, probes, origins (campaigns: iwscope.campaigns.cli; servers: iwscope.servers.cli)
# --------------------------------------------------------------------------------------


@main.group()
def token() -> None:
    """API tokens (enroll, admin, origin, server, read)."""


@token.command("create")
@click.option(
    "--kind",
    required=True,
    type=click.Choice(["enroll", "admin", "origin", "server", "read"]),
    help="enroll: probes; admin: campaigns and listings; origin: origins; server: iwprobe tap servers; "
    "read: the passive, real-user data",
)
@click.option("--label", default=None, help="What the token is for (shown in listings).")
def token_create(kind: str, label: str | None) -> None:
    """Create a token and print it alone on stdout (only its hash is stored)."""
    from iwscope.auth.services import create_api_token
    from iwscope.db import session_scope

    with session_scope() as session:
        new_token = create_api_token(session, kind, label)
    click.echo(new_token)


@token.command("list")
@click.option("--all", "include_revoked", is_flag=True, help="also revoked tokens")
def token_list(include_revoked: bool) -> None:
    """Id, kind, label and dates of the stored tokens (the tokens themselves are never stored)."""
    from iwscope.auth.services import list_api_tokens
    from iwscope.db import session_scope

    with session_scope() as session:
        tokens = list_api_tokens(session, include_revoked)
    for listed in tokens:
        revoked = listed.revoked_at.isoformat() if listed.revoked_at else "-"
        click.echo(f"{listed.id}\t{listed.kind}\t{listed.label or '-'}\t{listed.created_at.isoformat()}\t{revoked}")


@token.command("revoke")
@click.option("--id", "token_id", type=int, default=None, help="the id from 'iwscope token list'")
@click.option(
    "--token",
    "token_value",
    default=None,
    envvar="IWSCOPE_REVOKE_TOKEN",
    help="the token itself (or $IWSCOPE_REVOKE_TOKEN, which keeps it out of the process list)",
)
def token_revoke(token_id: int | None, token_value: str | None) -> None:
    """Revoke a token: requests with it get 401 from the next one on.

    Bootstrap tokens from IWSCOPE_ADMIN_TOKEN / IWSCOPE_ENROLL_TOKEN are not stored: unset them
    and restart the API to retire them."""
    from iwscope.auth.services import revoke_api_token
    from iwscope.db import session_scope

    if (token_id is None) == (token_value is None):
        raise click.UsageError("name the token with exactly one of --id or --token")
    try:
        with session_scope() as session:
            revoked = revoke_api_token(session, token_id=token_id, token=token_value)
    except LookupError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"revoked {revoked.kind} token {revoked.id}", err=True)


@token.command("rotate")
@click.option("--id", "token_id", type=int, required=True, help="the id from 'iwscope token list'")
def token_rotate(token_id: int) -> None:
    """Revoke token ID and print its successor (same kind and label) alone on stdout."""
    from iwscope.auth.services import rotate_api_token
    from iwscope.db import session_scope

    try:
        with session_scope() as session:
            successor, old = rotate_api_token(session, token_id)
    except LookupError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"revoked {old.kind} token {old.id}", err=True)
    click.echo(successor)


@main.group()
def probes() -> None:
    """The probe fleet."""


@probes.command("list")
def probes_list() -> None:
    """Name, region, version, last seen and spool backlog of every probe."""
    from rich.console import Console
    from rich.table import Table

    from iwscope.db import session_scope
    from iwscope.probes.services import list_probes

    with session_scope() as session:
        fleet = list_probes(session)
    table = Table(title=f"{len(fleet)} probes")
    for heading in ("name", "region", "version", "last seen (UTC)", "backlog", "id"):
        table.add_column(heading)
    for probe in fleet:
        table.add_row(
            probe.name,
            probe.region,
            probe.version or "-",
            probe.last_seen_at.strftime("%Y-%m-%d %H:%M:%S") if probe.last_seen_at else "never",
            "-" if probe.backlog is None else str(probe.backlog),
            probe.id,
        )
    Console().print(table)


@probes.command("revoke")
@click.argument("probe_id")
def probes_revoke(probe_id: str) -> None:
    """Revoke a probe: its credential gets 401 from the next request on (re-enroll to return)."""
    from iwscope.auth.services import revoke_identity
    from iwscope.db import session_scope
    from iwscope.probes.models import Probe

    with session_scope() as session:
        if not revoke_identity(session, Probe, probe_id):
            raise click.ClickException(f"no unrevoked probe {probe_id}")
    click.echo(f"revoked probe {probe_id}", err=True)


@main.group()
def origins() -> None:
    """The origins."""


@origins.command("revoke")
@click.argument("origin_id")
def origins_revoke(origin_id: str) -> None:
    """Revoke an origin: its credential gets 401 from the next request on."""
    from iwscope.auth.services import revoke_identity
    from iwscope.db import session_scope
    from iwscope.origins.models import Origin

    with session_scope() as session:
        if not revoke_identity(session, Origin, origin_id):
            raise click.ClickException(f"no unrevoked origin {origin_id}")
    click.echo(f"revoked origin {origin_id}", err=True)


main.add_command(campaigns)
main.add_command(servers)


@main.command("export")
@click.option("--format", "file_format", type=click.Choice(["parquet", "csv"]), default="parquet", show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="directory for the files")
@click.option(
    "--tables",
    default=None,
    help="comma-separated (trials, observations, path_estimates, campaigns, census, traces); default: every table "
    "the filters apply to (traces: Parquet only)",
)
@click.option("--campaign", "campaign_id", type=click.IntRange(min=1), default=None)
@click.option("--probe", "probe_id", type=click.UUID, default=None)
@click.option("--origin", "origin_id", type=click.UUID, default=None)
@click.option(
    "--since",
    type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]),
    default=None,
    help="inclusive, UTC unless an offset is given",
)
@click.option(
    "--until",
    type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]),
    default=None,
    help="inclusive, UTC unless an offset is given",
)
def export(
    file_format: str,
    out_dir: str,
    tables: str | None,
    campaign_id: int | None,
    probe_id: uuid.UUID | None,
    origin_id: uuid.UUID | None,
    since: dt.datetime | None,
    until: dt.datetime | None,
) -> None:
    """Write tables of the database to DIR as <table>.parquet or <table>.csv (DATABASE_URL);
    prints one line per file: rows (Parquet), bytes, path.  ``traces`` (one row per trial trace,
    its packets as list columns) is written as Parquet only."""
    from iwscope.db import session_scope
    from iwscope.exports import columnar
    from iwscope.exports import traces as trace_export

    filters = columnar.ExportFilters(
        campaign_id=campaign_id, probe_id=probe_id, origin_id=origin_id, since=_utc(since), until=_utc(until)
    )
    names = (
        [name.strip() for name in tables.split(",") if name.strip()]
        if tables
        else [spec.name for spec in columnar.TABLES.values() if _applies(columnar, spec, filters)]
        + ([trace_export.TRACES] if file_format == "parquet" else [])
    )
    with_traces = trace_export.TRACES in names
    try:
        if with_traces and file_format != "parquet":
            raise ValueError(f"the {trace_export.TRACES} export is Parquet only (its packets are list columns)")
        specs = columnar.export_names([name for name in names if name != trace_export.TRACES])
        for spec in specs:
            columnar.select_sql(spec, filters)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    os.makedirs(out_dir, exist_ok=True)
    for spec in specs:
        path = os.path.join(out_dir, f"{spec.name}.{file_format}")
        with session_scope() as session:
            if file_format == "parquet":
                rows: int | None = columnar.write_parquet(session, spec, filters, path)
            else:
                with open(path, "wb") as sink:
                    columnar.write_csv(session, spec, filters, sink)
                rows = None
        click.echo(f"{spec.name}\t{'' if rows is None else rows}\t{os.path.getsize(path)}\t{path}")
    if with_traces:
        path = os.path.join(out_dir, f"{trace_export.TRACES}.parquet")
        with session_scope() as session:
            rows = trace_export.write_traces_parquet(session, filters, path)
        click.echo(f"{trace_export.TRACES}\t{rows}\t{os.path.getsize(path)}\t{path}")


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    return None if moment is None else moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _applies(columnar: Any, spec: Any, filters: Any) -> bool:
    try:
        columnar.select_sql(spec, filters)
    except ValueError:
        return False
    return True


def _load_plugins() -> None:
    for entry in entry_points(group="iwscope.commands"):
        main.add_command(entry.load(), name=entry.name)


_load_plugins()

if __name__ == "__main__":
    main()
