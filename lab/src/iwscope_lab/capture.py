"""Client-side packet capture of a response's first flight, for the lab's tests.

Run inside a lab host's namespace: ``python -m iwscope_lab.capture URL [URL ...]`` fetches
each URL with the probe's own ``fetch`` and its own capture (``iwprobe.ConnectionCapture``:
``AF_PACKET``, the connection's packets with kernel receive timestamps) and prints one JSON
object per URL: the fetch's result (bytes, times, error), the data segments that arrived on
its connection (arrival time relative to the first one in ms, sequence offset, payload bytes)
and the IW the probe inferred from them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def capture_fetches(urls: list[str]) -> list[dict[str, Any]]:
    """Fetch each URL in turn, capturing its connection; one dict per URL."""
    from iwprobe import fetch, wire

    results = []
    for url in urls:
        result = fetch(url, wire.new_id(), "capture", connect_timeout_s=10, timeout_s=60, infer_iw=True)
        if result.iw_unavailable:
            raise RuntimeError(result.iw_unavailable)
        data = [packet for packet in result.packets if not packet.outgoing and packet.payload > 0]
        segments = (
            []
            if not data
            else [
                {
                    "t_ms": (packet.time_ns - data[0].time_ns) / 1e6,
                    "offset": (packet.seq - data[0].seq) % 2**32,
                    "bytes": packet.payload,
                }
                for packet in data
            ]
        )
        results.append(
            {
                "url": url,
                "error_kind": result.error_kind,
                "bytes_received": result.bytes_received,
                "total_us": result.total_us,
                "segments": segments,
                "iw": None if result.iw is None else result.iw.to_dict(),
            }
        )
    return results


def first_segments_spread_ms(segments: list[dict[str, Any]], count: int = 10) -> float | None:
    """Time between the arrival of the first and the ``count``-th data segment (ms)."""
    if len(segments) < count:
        return None
    return float(segments[count - 1]["t_ms"] - segments[0]["t_ms"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iwscope_lab.capture", description=__doc__.split("\n")[0])
    parser.add_argument("urls", nargs="+")
    args = parser.parse_args(argv)
    for entry in capture_fetches(args.urls):
        print(json.dumps(entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
