"""``iwscope lab``: the emulated wide-area testbed."""

import click


@click.group()
def lab() -> None:
    """Emulated wide-area testbed: namespaces as hosts, a user-space link emulator."""
