"""The ``iwscope`` command line: one entry point for the collector, the lab and the dashboard.

Sub-commands from other distributions (``iwscope lab``, ``iwscope dashboard``) are found
through the ``iwscope.commands`` entry-point group, so the collector never imports them.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import click

from iwscope.localstack import default_stack


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
    stack = default_stack()
    stack.start()
    click.echo(f"DATABASE_URL={stack.database_url}")
    click.echo(f"REDIS_URL={stack.redis_url}")


@services.command("stop")
def services_stop() -> None:
    """Stop the local PostgreSQL and Redis."""
    default_stack().stop()


@services.command("env")
def services_env() -> None:
    """Print shell exports for the local services."""
    stack = default_stack()
    click.echo(f"export DATABASE_URL={stack.database_url}")
    click.echo(f"export REDIS_URL={stack.redis_url}")


def _load_plugins() -> None:
    for entry in entry_points(group="iwscope.commands"):
        main.add_command(entry.load(), name=entry.name)


_load_plugins()
