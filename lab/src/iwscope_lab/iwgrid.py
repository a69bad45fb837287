"""The IW-inference grid: ``iwprobe census`` against lab servers of known initial window.

One topology: a server (zero-delay access link) and a probe (``RTT_MS`` round trip, 100 Mbit/s
both ways).  For each cell the server's default route gets ``initcwnd IW`` and a locked path
MTU (the MSS it sends), its TUN device TSO/GSO on or off (``ethtool -K``), and the probe runs
``iwprobe census --json`` against a server nobody here wrote or against a TLS one:

* ``http``: Python's ``http.server`` serving a 1 MB file (the census asks for 256 KB);
* ``https``: the same behind TLS (:func:`serve_https`, a test chain of ``CHAIN_KB`` from
  :mod:`iwscope_lab.certs`): the first flight is the TLS handshake's, so a window larger than
  the chain can only be bounded from below (``client_data``);
* ``nginx`` / ``lighttpd`` when installed (``--servers``).

A cell is correct when ``ok`` says exactly the configured IW, ``lower_bound`` says at most it,
and ``undetermined`` is counted with its reason -- the census's answer and each connection's
own inference in it (``attempts_wrong`` counts those that are not).  ``python -m iwscope_lab.iwgrid --json`` runs
it and prints every cell; ``tests/lab/test_lab_iwgrid.py`` asserts the correctness.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .topology import Host, LinkSpec, Topology, stop_processes

IWS = (1, 2, 3, 4, 10, 16, 32, 64)
#: Path MSS (bytes) -> the locked route MTU that gives it.
MSS_VALUES = (536, 1220, 1460)
TSO = (True, False)
PROTOCOLS = ("http", "https")
RTT_MS = 60.0
RATE_BPS = 100_000_000
OBJECT_BYTES = 1_000_000
CHAIN_KB = 16.0
PORTS = {"http": 8080, "https": 8443, "nginx": 8081, "lighttpd": 8082}


@dataclass
class Cell:
    server: str
    iw: int
    path_mss: int
    tso: bool
    status: str
    iw_segments: int | None
    mss: int | None
    announced_mss: int | None
    reason: str
    correct: bool
    #: Connections of the census's answer (its MSS rung), the determined ones, and those whose
    #: own inference was wrong (``judge`` on each).
    connections: int = 0
    connections_ok: int = 0
    attempts_wrong: int = 0
    seconds: float = 0.0


def judge(iw: int, answer: dict[str, Any]) -> bool:
    """Correct: ``ok`` exactly right, ``lower_bound`` not above, ``undetermined`` anything."""
    if answer.get("status") == "ok":
        return bool(answer.get("iw_segments") == iw)
    if answer.get("status") == "lower_bound":
        return answer.get("iw_segments") is not None and int(answer["iw_segments"]) <= iw
    return answer.get("status") == "undetermined"


def serve_https(address: str, port: int | str, directory: str, cert: str, key: str) -> None:
    """Python's ``http.server`` behind TLS (the grid's HTTPS server)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=directory)
    server = http.server.ThreadingHTTPServer((address, int(port)), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


@contextmanager
def _servers(topo: Topology, work: Path, servers: Sequence[str]) -> Iterator[dict[str, str]]:
    """Start the grid's servers in the server namespace; base URL per server."""
    from .certs import write_chain

    address = topo.host("server").address
    www = work / "www"
    www.mkdir(parents=True, exist_ok=True)
    (www / "big").write_bytes(os.urandom(OBJECT_BYTES))
    os.chmod(work, 0o755)
    logs = open(work / "servers.log", "ab")  # noqa: SIM115 -- handed to the servers, closed at the end
    processes: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}
    try:
        for server in servers:
            port = PORTS[server]
            if server == "http":
                command = [sys.executable, "-m", "http.server", "--bind", address, str(port), "--directory", str(www)]
            elif server == "https":
                chain = write_chain(work / "tls", CHAIN_KB, ips=[address])
                command = [
                    sys.executable,
                    "-c",
                    "import sys; from iwscope_lab.iwgrid import serve_https; serve_https(*sys.argv[1:])",
                    address,
                    str(port),
                    str(www),
                    str(chain.chain_path),
                    str(chain.key_path),
                ]
            elif server == "nginx":
                command = _nginx_command(work, address, port, www)
            elif server == "lighttpd":
                command = _lighttpd_command(work, address, port, www)
            else:
                raise ValueError(f"unknown server {server!r}")
            processes.append(topo.popen("server", command, stdout=logs, stderr=logs))
            scheme = "https" if server == "https" else "http"
            urls[server] = f"{scheme}://{address}:{port}/big"
        topo.wait_listening("server", address, [PORTS[server] for server in servers])
        yield urls
    finally:
        stop_processes(processes)
        logs.close()


def _nginx_command(work: Path, address: str, port: int, www: Path) -> list[str]:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    conf = work / "nginx.conf"
    conf.write_text(f"""daemon off; master_process off; worker_processes 1; pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 64; }}
http {{ access_log off; client_body_temp_path {work}/nginx-tmp;
  server {{ listen {address}:{port}; root {www}; sendfile on; }} }}
""")
    return [binary, "-c", str(conf), "-p", str(work)]


def _lighttpd_command(work: Path, address: str, port: int, www: Path) -> list[str]:
    binary = shutil.which("lighttpd") or "/usr/sbin/lighttpd"
    conf = work / "lighttpd.conf"
    conf.write_text(
        f'server.document-root = "{www}"\nserver.bind = "{address}"\nserver.port = {port}\n'
        f'server.pid-file = "{work}/lighttpd.pid"\nserver.errorlog = "{work}/lighttpd-error.log"\n'
    )
    return [binary, "-D", "-f", str(conf)]


def available_servers() -> list[str]:
    """The grid's servers this machine has (``nginx`` / ``lighttpd`` only when installed)."""
    extra = [name for name in ("nginx", "lighttpd") if shutil.which(name) or Path(f"/usr/sbin/{name}").exists()]
    return ["http", "https", *extra]


def _cell(server: str, iw: int, path_mss: int, tso: bool, answer: dict[str, Any], seconds: float) -> Cell:
    """One cell from the census's ``--json`` answer."""
    attempts = [attempt for attempt in answer.get("attempts") or [] if "status" in attempt]
    wrong = sum(not judge(iw, attempt) for attempt in attempts)
    return Cell(
        server=server,
        iw=iw,
        path_mss=path_mss,
        tso=tso,
        status=str(answer.get("status")),
        iw_segments=answer.get("iw_segments"),
        mss=answer.get("mss"),
        announced_mss=answer.get("announced_mss"),
        reason=str(answer.get("reason") or ""),
        correct=judge(iw, answer) and wrong == 0,
        connections=int(answer.get("connections") or 0),
        connections_ok=int(answer.get("connections_ok") or 0),
        attempts_wrong=wrong,
        seconds=round(seconds, 2),
    )


def run_grid(
    iws: Sequence[int] = IWS,
    mss_values: Sequence[int] = MSS_VALUES,
    tso: Sequence[bool] = TSO,
    servers: Sequence[str] = PROTOCOLS,
    connections: int = 3,
    name: str | None = None,
) -> list[Cell]:
    """Every cell of the grid (one topology for all; ``name``: its run id)."""
    hosts = [
        Host("server", link=LinkSpec.symmetric(rate_bps=RATE_BPS, rtt_ms=0.0)),
        Host("probe", link=LinkSpec.symmetric(rate_bps=RATE_BPS, rtt_ms=RTT_MS)),
    ]
    cells: list[Cell] = []
    with (
        tempfile.TemporaryDirectory(prefix="iwgrid-") as scratch,
        Topology(name, hosts) as topo,
        _servers(topo, Path(scratch), servers) as urls,
    ):
        for tso_on in tso:
            topo.set_offload("server", tso_on)
            for path_mss in mss_values:
                for iw in iws:
                    topo.set_route("server", initcwnd=iw, mtu=path_mss + 40)
                    for server, url in urls.items():
                        command = [
                            sys.executable,
                            "-m",
                            "iwprobe",
                            "census",
                            "--json",
                            "--insecure",
                            "--connections",
                            str(connections),
                            url,
                        ]
                        started = time.monotonic()
                        outcome = topo.run("probe", command, capture_output=True, text=True)
                        answer = (
                            json.loads(outcome.stdout)
                            if outcome.stdout.strip()
                            else {"status": "undetermined", "reason": f"census failed: {outcome.stderr[-300:]}"}
                        )
                        cells.append(_cell(server, iw, path_mss, tso_on, answer, time.monotonic() - started))
    return cells


def summary(cells: Sequence[Cell]) -> dict[str, Any]:
    """Counts: cells, correct, per status, the reasons of those not ``ok`` (``server:reason``),
    the ``undetermined`` cells and their reasons, and the connections judged one by one."""
    undetermined = [cell for cell in cells if cell.status == "undetermined"]
    return {
        "cells": len(cells),
        "correct": sum(cell.correct for cell in cells),
        "status": dict(Counter(cell.status for cell in cells)),
        "reasons": dict(Counter(f"{cell.server}:{cell.reason}" for cell in cells if cell.status != "ok")),
        "undetermined": len(undetermined),
        "undetermined_reasons": dict(Counter(f"{cell.server}:{cell.reason}" for cell in undetermined)),
        "connections": sum(cell.connections for cell in cells),
        "connections_ok": sum(cell.connections_ok for cell in cells),
        "connections_wrong": sum(cell.attempts_wrong for cell in cells),
        "seconds": round(sum(cell.seconds for cell in cells), 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iwscope_lab.iwgrid", description=__doc__.split("\n")[0])
    parser.add_argument("--iws", default=",".join(map(str, IWS)))
    parser.add_argument("--mss", default=",".join(map(str, MSS_VALUES)))
    parser.add_argument("--servers", default=",".join(available_servers()))
    parser.add_argument("--connections", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print every cell, then the summary, as JSON")
    args = parser.parse_args(argv)
    cells = run_grid(
        [int(v) for v in args.iws.split(",")],
        [int(v) for v in args.mss.split(",")],
        TSO,
        args.servers.split(","),
        args.connections,
    )
    if args.json:
        print(json.dumps({"cells": [asdict(cell) for cell in cells], "summary": summary(cells)}, indent=1))
    else:
        for cell in cells:
            print(
                f"{cell.server:8} IW {cell.iw:3} MSS {cell.path_mss:4} TSO {'on ' if cell.tso else 'off'} -> "
                f"{cell.status:12} {cell.iw_segments!s:>4} (mss {cell.mss}, announced {cell.announced_mss}) "
                f"{cell.connections_ok}/{cell.connections} {cell.reason} {'' if cell.correct else 'WRONG'}"
            )
        print(json.dumps(summary(cells)))
    return 0 if all(cell.correct for cell in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
