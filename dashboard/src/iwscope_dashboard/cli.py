"""``iwscope dashboard``: serve the Dash app."""

import click


@click.command()
def dashboard() -> None:
    """Serve the iwscope dashboard."""
    raise click.ClickException("not built yet")
