"""Client-side packet capture of a response's first flight (``AF_PACKET``, no tcpdump needed).

Run inside a lab host's namespace: ``python -m iwscope_lab.capture --source ADDR URL [URL ...]``
fetches each URL with the probe's own ``fetch`` while recording, with kernel receive
timestamps (``SO_TIMESTAMPNS``), every TCP segment that comes from ``ADDR``.  It prints one
JSON object per URL: the fetch's result (bytes, times, error) and the data segments of its
connection (arrival time relative to the first one in ms, sequence offset, payload bytes).

``AF_PACKET`` / ``SOCK_DGRAM`` / ``ETH_P_IP`` yields IP packets without a link header on any
device, Ethernet or TUN (the lab's access links are TUN devices).
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

ETH_P_IP = 0x0800
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")


@dataclass
class Segment:
    """One captured TCP segment from the server."""

    time_ns: int
    source_port: int
    destination_port: int
    seq: int
    payload: int


@dataclass
class SegmentCapture:
    """Records TCP segments from ``source`` (an IPv4 address) while running (a context manager)."""

    source: str
    segments: list[Segment] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
        self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._sock.settimeout(0.1)
        self._source = socket.inet_aton(self.source)
        self._thread = threading.Thread(target=self._run, name="capture", daemon=True)

    def __enter__(self) -> SegmentCapture:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                packet, ancillary, _, address = self._sock.recvmsg(65535, 64)
            except TimeoutError:
                continue
            except OSError:
                return
            if address[2] == socket.PACKET_OUTGOING or len(packet) < 40 or packet[9] != socket.IPPROTO_TCP:
                continue
            if packet[12:16] != self._source:
                continue
            stamp = time.time_ns()
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    seconds, nanoseconds = _TIMESPEC.unpack(data[:_TIMESPEC.size])
                    stamp = seconds * 1_000_000_000 + nanoseconds
            header = (packet[0] & 0x0F) * 4
            total = struct.unpack("!H", packet[2:4])[0]
            sport, dport, seq = struct.unpack("!HHI", packet[header:header + 8])
            offset = (packet[header + 12] >> 4) * 4
            self.segments.append(Segment(stamp, sport, dport, seq, total - header - offset))

    def flight(self, local_port: int) -> list[dict[str, Any]]:
        """The data segments of the connection whose client port is ``local_port``, first
        transmissions and retransmissions alike, in arrival order."""
        data = [s for s in self.segments if s.destination_port == local_port and s.payload > 0]
        if not data:
            return []
        first_time, first_seq = data[0].time_ns, data[0].seq
        return [{"t_ms": (s.time_ns - first_time) / 1e6, "offset": (s.seq - first_seq) % 2**32,
                 "bytes": s.payload} for s in data]


def capture_fetches(source: str, urls: list[str]) -> list[dict[str, Any]]:
    """Fetch each URL in turn (the probe's ``fetch``) while capturing; one dict per URL."""
    from iwprobe import fetch, wire

    results = []
    for url in urls:
        with SegmentCapture(source) as capture:
            result = fetch(url, wire.new_id(), "capture", connect_timeout_s=10, timeout_s=60)
        ports = {s.destination_port for s in capture.segments if s.payload > 0}
        flight = capture.flight(ports.pop()) if len(ports) == 1 else []
        results.append({"url": url, "error_kind": result.error_kind, "bytes_received": result.bytes_received,
                        "total_us": result.total_us, "segments": flight})
    return results


def first_segments_spread_ms(segments: list[dict[str, Any]], count: int = 10) -> float | None:
    """Time between the arrival of the first and the ``count``-th data segment (ms)."""
    if len(segments) < count:
        return None
    return float(segments[count - 1]["t_ms"] - segments[0]["t_ms"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iwscope_lab.capture", description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="server IPv4 address whose segments to record")
    parser.add_argument("urls", nargs="+")
    args = parser.parse_args(argv)
    for entry in capture_fetches(args.source, args.urls):
        print(json.dumps(entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
