"""The one address in the root namespace where lab hosts reach the collector stack.

The stack's API and dashboard listen on loopback and on this address only (never on every
interface unless asked: ``iwscope lab demo --expose``), so a machine with a public address
does not serve them to the world.  Each lab run's core routes this address over its veth to
the root namespace (``topology.py``); the address sits on ``lo`` as a /32 (this kernel has
no ``dummy`` device), so it exists before any run and outlives them all.

It is taken from the lab's 10.0.0.0/8 space outside the per-run subnets (10.64-249.0.0/16),
so it never collides with a run's addresses.
"""

from __future__ import annotations

import subprocess

#: Where lab hosts reach the API (``http://10.63.0.1:<port>``).
SERVICE_ADDRESS = "10.63.0.1"
#: Every address the stack's servers listen on by default.
DEFAULT_LISTEN = ("127.0.0.1", SERVICE_ADDRESS)
#: What ``--expose`` listens on instead.
EXPOSED_LISTEN = ("0.0.0.0",)
_LABEL = "lo:iwscope"


def present() -> bool:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True, check=False).stdout
    return f" {SERVICE_ADDRESS}/32 " in out


def ensure() -> str:
    """Put :data:`SERVICE_ADDRESS` on ``lo`` unless it is there (idempotent); returns it."""
    if not present():
        done = subprocess.run(
            ["ip", "addr", "add", f"{SERVICE_ADDRESS}/32", "dev", "lo", "label", _LABEL],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 and not present():
            raise RuntimeError(f"cannot add the lab's service address {SERVICE_ADDRESS} to lo: {done.stderr.strip()}")
    return SERVICE_ADDRESS


def remove() -> None:
    """Take the address away again (``make clean``, after the stack has stopped)."""
    if present():
        subprocess.run(["ip", "addr", "del", f"{SERVICE_ADDRESS}/32", "dev", "lo"], capture_output=True, check=False)
