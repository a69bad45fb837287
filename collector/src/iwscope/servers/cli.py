"""``iwscope servers``: the operators' servers running ``iwprobe tap`` (registered on the
``iwscope`` group by :mod:`iwscope.cli`; heavy imports inside the commands)."""

from __future__ import annotations

import click


@click.group()
def servers() -> None:
    """The servers of passive campaigns (iwprobe tap on operators' web servers)."""


@servers.command("list")
def servers_list() -> None:
    """Name, region, ports, version, arms state, last seen and id of every server."""
    from rich.console import Console
    from rich.table import Table

    from iwscope.db import session_scope
    from iwscope.servers.services import list_servers

    with session_scope() as session:
        fleet = list_servers(session)
    table = Table(title=f"{len(fleet)} servers")
    for heading in ("name", "region", "ports", "version", "arms", "last seen (UTC)", "id"):
        table.add_column(heading)
    for server in fleet:
        heartbeat = server.last_heartbeat or {}
        state = "revoked" if server.revoked_at else str(heartbeat.get("arms_state", "-"))
        table.add_row(
            server.name,
            server.region,
            ",".join(map(str, server.ports)) or "-",
            server.version or "-",
            state,
            server.last_seen_at.strftime("%Y-%m-%d %H:%M:%S") if server.last_seen_at else "never",
            server.id,
        )
    Console().print(table)


@servers.command("revoke")
@click.argument("server_id")
def servers_revoke(server_id: str) -> None:
    """Revoke a server: its credential gets 401 from the next request on (enroll again to return)."""
    from iwscope.auth.services import revoke_identity
    from iwscope.db import session_scope
    from iwscope.servers.models import Server

    with session_scope() as session:
        if not revoke_identity(session, Server, server_id):
            raise click.ClickException(f"no unrevoked server {server_id}")
    click.echo(f"revoked server {server_id}", err=True)
