"""The API's server process: its garbage collector is settled once it listens (``iwscope.server``)."""

from __future__ import annotations

import json
import subprocess
import sys

# A LameDuckServer with a trivial app on a loopback port of the kernel's choice: once it has
# started, the process reports its collector's state and stops the server.
_SERVE = """
import asyncio, gc, json, socket, uvicorn
from iwscope.server import LameDuckServer

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})

before = gc.get_threshold()[0]
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
config = uvicorn.Config(app, log_level="warning")
state = {}

def started():
    state.update(before=before, after=gc.get_threshold()[0], frozen=gc.get_freeze_count())
    server.should_exit = True

server = LameDuckServer(config, drain_seconds=0, on_started=started)
server.run(sockets=[listener])
print(json.dumps(state))
"""


def test_a_started_server_freezes_its_start_up_heap_and_collects_young_objects_less_often() -> None:
    from iwscope.server import GC_YOUNG_THRESHOLD

    done = subprocess.run([sys.executable, "-c", _SERVE], capture_output=True, text=True, timeout=60, check=True)
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["before"] != GC_YOUNG_THRESHOLD  # CPython's default: importing the module changes nothing
    assert state["after"] == GC_YOUNG_THRESHOLD
    assert state["frozen"] > 1000  # the imported app and uvicorn, out of the collector's way
