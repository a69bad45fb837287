"""``iwscope trace plot FILE --out OUT.html``: the time-sequence plot of one trial's packet trace
(``iwprobe fetch --trace FILE``), drawn by :func:`iwscope_dashboard.tracefigures.time_sequence_figure`.

Plotly is imported inside the command, so ``iwscope --help`` (which loads every plugin) stays fast.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import click

#: Output suffixes written by plotly's ``write_html`` (self-contained: plotly.js inlined) and,
#: with kaleido installed, by ``write_image``.
HTML_SUFFIXES = (".html", ".htm")
IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


class BadTraceFile(click.ClickException):
    """An unreadable or malformed trace file: one line on stderr, exit code 2 (bad input)."""

    exit_code = 2


@click.group()
def trace() -> None:
    """Trial packet traces written by `iwprobe fetch --trace FILE`."""


@trace.command("plot")
@click.argument("file", type=click.Path(dir_okay=False, path_type=pathlib.Path))
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, writable=True, path_type=pathlib.Path),
    help="the figure: .html (self-contained, plotly.js included); .png/.svg/.pdf need kaleido",
)
@click.option("--title", default="", help="the figure's title (default: 'Time-sequence plot (receiver side)')")
def plot_command(file: pathlib.Path, out: pathlib.Path, title: str) -> None:
    """Draw the time-sequence plot of a trace and print the output's path.

    Received segments (the first flight and retransmissions in their own colours), the probe's
    ACKs and its receive window against time since the SYN, alternate round trips shaded."""
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
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0]
        raise BadTraceFile(f"{file}: cannot read a JSON trace: {reason}") from error

    from iwscope_dashboard.tracefigures import time_sequence_figure

    try:
        figure = time_sequence_figure(data, title=title)  # checks the file first (iwprobe.wire.check_trace)
    except ValueError as error:
        raise BadTraceFile(f"{file}: {error} (expected a trace from `iwprobe fetch --trace FILE`)") from error
    if suffix in HTML_SUFFIXES:
        figure.write_html(str(out), include_plotlyjs=True, full_html=True)
    else:
        figure.write_image(str(out))
    click.echo(str(out))
