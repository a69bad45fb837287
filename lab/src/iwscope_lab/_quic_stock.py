"""aioquic's HTTP/3 as shipped: ``python -m iwscope_lab._quic_stock ADDRESS PORT CERT KEY DIR``.

A minimal file server on aioquic's defaults (its New Reno, ``K_INITIAL_WINDOW`` = 10 packets),
for the census to measure a QUIC stack whose window nobody here set.  Every file of ``DIR`` is
served at ``/<name>``; anything else is a 404.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import serve
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent


class FileServer(QuicConnectionProtocol):
    root: Path

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._http = H3Connection(self._quic)

    def quic_event_received(self, event: QuicEvent) -> None:
        for h3_event in self._http.handle_event(event):
            if isinstance(h3_event, HeadersReceived):
                path = dict(h3_event.headers).get(b":path", b"/").decode("latin-1").lstrip("/")
                target = self.root / path
                found = path and "/" not in path and target.is_file()
                body = target.read_bytes() if found else b"not found\n"
                status = b"200" if found else b"404"
                self._http.send_headers(h3_event.stream_id, [(b":status", status), (b"content-length", str(len(body)).encode())])
                self._http.send_data(h3_event.stream_id, body, end_stream=True)
                self.transmit()


async def main(address: str, port: int, cert: str, key: str, root: str) -> None:
    configuration = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN)
    configuration.load_cert_chain(cert, key)
    FileServer.root = Path(root)
    await serve(address, port, configuration=configuration, create_protocol=FileServer)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]))
