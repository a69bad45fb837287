"""``iwscope trace plot TRIAL --out OUT.html``: the time-sequence plot of one trial's packet trace.

TRIAL is a trace file (``iwprobe fetch --trace FILE``), drawn by
:func:`iwscope_dashboard.tracefigures.time_sequence_figure`, or a trial id: the trial is read
from the database with its twins and their stored traces
(:func:`iwscope.traces.services.read_trial_traces`, what the Trials page's inspector reads) and
drawn by :func:`iwscope_dashboard.trialfigures.trial_figure`.

Plotly, SQLAlchemy and the collector are imported inside the command, so ``iwscope --help``
(which loads every plugin) stays fast.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import uuid
from typing import TYPE_CHECKING

import click

from iwprobe.wire import TRACE_SIDES

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

    from iwscope.traces.schemas import TrialTracesOut

#: Output suffixes written by plotly's ``write_html`` (self-contained: plotly.js inlined) and,
#: with kaleido installed, by ``write_image``.
HTML_SUFFIXES = (".html", ".htm")
IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


class BadTraceFile(click.ClickException):
    """An unreadable or malformed trace file: one line on stderr, exit code 2 (bad input)."""

    exit_code = 2


@click.group()
def trace() -> None:
    """Trial packet traces: files written by `iwprobe fetch --trace FILE`, and traces stored per trial."""


def _format(out: pathlib.Path) -> str:
    """The output's suffix, refused before anything is read when it cannot be written."""
    suffix = out.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        if importlib.util.find_spec("kaleido") is None:
            raise click.ClickException(
                f"{suffix[1:].upper()} output needs the kaleido package, which is not installed: write --out FILE.html instead"
            )
    elif suffix not in HTML_SUFFIXES:
        raise click.UsageError(
            f"--out {out}: unknown format {suffix or '(no suffix)'!r}; use .html (or .png/.svg/.pdf with kaleido)"
        )
    return suffix


def _trial_id(source: str) -> uuid.UUID | None:
    """``source`` as a trial id, unless it names a file (a file called like a UUID is a file)."""
    if pathlib.Path(source).exists():
        return None
    try:
        return uuid.UUID(source)
    except ValueError:
        return None


def _file_figure(file: pathlib.Path, title: str) -> Figure:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0]
        raise BadTraceFile(f"{file}: cannot read a JSON trace: {reason}") from error

    from iwscope_dashboard.tracefigures import time_sequence_figure

    try:
        return time_sequence_figure(data, title=title)  # checks the file first (iwprobe.wire.check_trace)
    except ValueError as error:
        raise BadTraceFile(f"{file}: {error} (expected a trace from `iwprobe fetch --trace FILE`)") from error


def read_stored(trial_id: uuid.UUID, database_url: str | None) -> TrialTracesOut | None:
    """The trial, its twins and their traces, read from the database as the dashboard reads
    them (:func:`iwscope.traces.services.read_trial_traces` in a session of its own engine);
    a missing or unreachable database is a one-line :class:`click.ClickException`."""
    from sqlalchemy import create_engine, pool
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import sessionmaker

    from iwscope.db import session_scope
    from iwscope.traces.services import read_trial_traces
    from iwscope_dashboard.db import DatabaseNotConfigured, resolve_database_url

    try:
        url = resolve_database_url(database_url)
    except DatabaseNotConfigured as error:
        raise click.ClickException(str(error)) from error
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with session_scope(sessionmaker(bind=engine)) as session:
            return read_trial_traces(session, trial_id)
    except SQLAlchemyError as error:
        where = engine.url.render_as_string(hide_password=True)
        raise click.ClickException(f"cannot read trial {trial_id} from {where}: {str(error).splitlines()[0]}") from error
    finally:
        engine.dispose()


def _stored_figure(trial_id: uuid.UUID, side: str, title: str, database_url: str | None) -> Figure:
    traced = read_stored(trial_id, database_url)
    if traced is None:
        raise click.ClickException(f"no trial {trial_id} in the database")

    from iwscope_dashboard.trialfigures import NoTrace, trial_figure

    try:
        return trial_figure(traced, side=side, title=title)
    except NoTrace as error:
        raise click.ClickException(str(error)) from error
    except ValueError as error:  # a stored trace the collector took; not expected
        raise click.ClickException(f"trial {trial_id}: a stored trace cannot be drawn: {error}") from error


@trace.command("plot")
@click.argument("source", metavar="TRIAL")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, writable=True, path_type=pathlib.Path),
    help="the figure: .html (self-contained, plotly.js included); .png/.svg/.pdf need kaleido",
)
@click.option("--title", default="", help="the figure's title (default: says what is drawn)")
@click.option(
    "--side",
    type=click.Choice(TRACE_SIDES),
    default="receiver",
    show_default=True,
    help="a stored trial's capture to draw: the probe's (receiver) or the origin's (sender)",
)
@click.option(
    "--database-url",
    default=None,
    help="for a trial id: the PostgreSQL URL (default: $DATABASE_URL, else the local stack of `iwscope services`)",
)
def plot_command(source: str, out: pathlib.Path, title: str, side: str, database_url: str | None) -> None:
    """Draw the time-sequence plot of TRIAL and print the output's path.

    TRIAL is a trace file (`iwprobe fetch --trace FILE`) or the id of a trial whose trace the
    collector stored: then its twins (the other arms' trials of its round) are overlaid, one
    colour per arm.  Received segments (the first flight and retransmissions marked), the
    client's ACKs and its receive window against time since the SYN, alternate round trips
    shaded."""
    suffix = _format(out)
    trial_id = _trial_id(source)
    if trial_id is None:
        figure = _file_figure(pathlib.Path(source), title)
    else:
        figure = _stored_figure(trial_id, side, title, database_url)
    if suffix in HTML_SUFFIXES:
        figure.write_html(str(out), include_plotlyjs=True, full_html=True)
    else:
        figure.write_image(str(out))
    click.echo(str(out))
