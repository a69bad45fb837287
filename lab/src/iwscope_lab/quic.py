"""QUIC in the lab: HTTP/3 servers nobody here wrote, and the first flight counted from a capture.

* **Caddy** (Debian's package, 2.6: quic-go, whose initial window is 32 packets of 1,252
  bytes) serves a directory over HTTPS and HTTP/3 and advertises it in ``Alt-Svc``
  (:func:`caddy_command`).  Its TLS library refuses the test chains' padding extension, so it
  gets a plain self-signed certificate (:func:`iwscope_lab.certs.write_self_signed`).
* **aioquic as shipped** (:func:`stock_server_command`): aioquic's own New Reno
  (``K_INITIAL_WINDOW`` 10 packets of 1,200 bytes, grown by every acknowledged handshake byte),
  behind a minimal HTTP/3 file server (:mod:`iwscope_lab._quic_stock`); the probe's origin
  registers a congestion controller of its own instead.
* :func:`count_first_flights`: the server's first response flight of every QUIC connection in a
  ``tcpdump`` capture on the client's interface, with the path's round trip known (the lab set
  it): the datagrams that arrived after the response began and before the client's first
  datagram after that could have reached the server and its reaction come back.  This is the
  check on the probe's own inference (:mod:`iwprobe._quic_flight`), which does not know the
  round trip and reads the client's own datagram log instead of a capture.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .certs import ChainInfo, write_chain, write_self_signed
from .links import LinkSpec
from .pcap import UdpDatagram
from .topology import Host, Topology

IWPROBE = [sys.executable, "-m", "iwprobe", "--log-level", "WARNING"]
#: The origin's base port (its arm N: TCP and UDP port ``BASE_PORT + N``), Caddy's and aioquic's.
BASE_PORT, CADDY_PORT, STOCK_PORT = 8700, 8443, 8444
#: The object Caddy and aioquic serve (``/big.bin``): it outlasts any window the census asks about.
BIG_OBJECT_BYTES = 1_000_000

#: Datagrams under this many bytes are ACK-only: no congestion window limits them.
ACK_ONLY_BELOW = 64


@dataclass(frozen=True)
class CountedFlight:
    """One connection's first response flight, from the capture."""

    client_port: int
    datagrams: int
    bytes: int
    #: When the response's first datagram and the client's first datagram after it were captured (ns).
    response_ns: int
    first_ack_ns: int | None


def count_first_flights(captured: list[UdpDatagram], server: str, server_port: int, rtt_ms: float) -> dict[int, CountedFlight]:
    """Per client port: the server's datagrams (of :data:`ACK_ONLY_BELOW` bytes or more) captured
    after the response began and before ``first ACK + rtt_ms``.

    The response begins with the first server datagram at least half a round trip after the
    handshake's first one (the handshake flight arrives within a few milliseconds; the request
    takes a round trip more).
    """
    rtt_ns = int(rtt_ms * 1e6)
    by_client: dict[int, list[UdpDatagram]] = defaultdict(list)
    for datagram in captured:
        if datagram.src == server and datagram.sport == server_port:
            by_client[datagram.dport].append(datagram)
        elif datagram.dst == server and datagram.dport == server_port:
            by_client[datagram.sport].append(datagram)
    flights: dict[int, CountedFlight] = {}
    for port, datagrams in by_client.items():
        from_server = [d for d in datagrams if d.src == server]
        if not from_server:
            continue
        handshake_ns = from_server[0].time_ns
        response = [d for d in from_server if d.time_ns >= handshake_ns + rtt_ns // 2]
        if not response:
            continue
        start = response[0].time_ns
        first_ack = next((d.time_ns for d in datagrams if d.src != server and d.time_ns > start), None)
        end = first_ack + rtt_ns if first_ack is not None else None
        flight = [d for d in response if d.payload >= ACK_ONLY_BELOW and (end is None or d.time_ns < end)]
        flights[port] = CountedFlight(port, len(flight), sum(d.payload for d in flight), start, first_ack)
    return flights


CADDYFILE = """{{
\tadmin off
\tauto_https off
\tstorage file_system {work}/data
}}
https://{address}:{port} {{
\tbind {address}
\ttls {cert} {key}
\troot * {www}
\tfile_server
}}
"""


def caddy_command(work: Path, address: str, port: int, cert: Path, key: Path, www: Path) -> tuple[list[str], dict[str, str]]:
    """Caddy serving ``www`` over HTTPS (TCP) and HTTP/3 (UDP) on ``address:port``: the command
    and the environment (its state stays in ``work``)."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "Caddyfile"
    config.write_text(CADDYFILE.format(work=work, address=address, port=port, cert=cert, key=key, www=www))
    env = {"HOME": str(work), "XDG_CONFIG_HOME": str(work), "XDG_DATA_HOME": str(work), "PATH": "/usr/bin:/bin"}
    return ["caddy", "run", "--config", str(config), "--adapter", "caddyfile"], env


def stock_server_command(address: str, port: int, cert: Path, key: Path, www: Path) -> list[str]:
    """aioquic's HTTP/3 with its own congestion control as shipped, serving ``www``."""
    return [sys.executable, "-m", "iwscope_lab._quic_stock", address, str(port), str(cert), str(key), str(www)]


@dataclass
class QuicLab:
    """A running QUIC lab: the topology, the origin's address and its certificates."""

    topo: Topology
    address: str
    chain: ChainInfo
    #: Caddy's self-signed certificate (its own trust anchor).
    caddy_cert: Path
    #: ``iwprobe origin --quic --no-upload`` (its observations: JSON lines on its stdout, if asked for).
    origin: subprocess.Popen[str]
    work: Path

    def origin_url(self, iw: int, size: int) -> str:
        return f"https://{self.address}:{BASE_PORT + iw}/obj/{size}"

    def server_url(self, server: str) -> str:
        """The big object on ``caddy`` or ``aioquic``."""
        return f"https://{self.address}:{CADDY_PORT if server == 'caddy' else STOCK_PORT}/big.bin"

    def ca_file(self, server: str = "origin") -> Path:
        return self.caddy_cert if server == "caddy" else self.chain.root_path


#: The census's targets in a QUIC lab: (name, arm or server, the window it was given in packets,
#: its datagram size).  Nobody here set Caddy's (quic-go's 32) or aioquic's (10).
CENSUS_TARGETS: tuple[tuple[str, str, int, int], ...] = (
    ("origin IW 10", "10", 10, 1200),
    ("origin IW 32", "32", 32, 1200),
    ("Caddy 2.6 (quic-go)", "caddy", 32, 1252),
    ("aioquic 1.7 as shipped", "aioquic", 10, 1200),
)


def run_census(lab: QuicLab, url: str, ca_file: Path, quic: str = "only", connections: int = 3) -> dict[str, Any]:
    """``iwprobe census --json --quic QUIC`` of ``url`` from the probe's namespace."""
    command = [*IWPROBE, "census", "--json", "--quic", quic, "--connections", str(connections), "--ca-file", str(ca_file), url]
    outcome = lab.topo.run("probe", command, capture_output=True, text=True, timeout=300)
    if outcome.returncode not in (0, 1):
        raise RuntimeError(f"census of {url} failed ({outcome.returncode}): {outcome.stderr[-500:]}")
    result: dict[str, Any] = json.loads(outcome.stdout)
    return result


def census_target_url(lab: QuicLab, target: str, object_bytes: int = 100_000) -> tuple[str, Path]:
    """The URL and the trust anchor of a :data:`CENSUS_TARGETS` entry."""
    if target in ("caddy", "aioquic"):
        return lab.server_url(target), lab.ca_file(target)
    return lab.origin_url(int(target), object_bytes), lab.ca_file()


@contextlib.contextmanager
def quic_lab(
    work: Path,
    *,
    arms: Sequence[int] = (10, 32),
    rtt_ms: float = 100.0,
    rate_bps: float = 100_000_000,
    servers: bool = True,
    observations: bool = False,
    chain_kb: float = 2,
) -> Iterator[QuicLab]:
    """The origin's host behind a zero-delay link and the probe behind ``rate_bps`` and
    ``rtt_ms``; on the origin's host ``iwprobe origin --quic`` (HTTPS and HTTP/3 on every arm,
    CUBIC on TCP) and, with ``servers``, Caddy and aioquic as shipped.  With ``observations`` the
    origin's stdout is a pipe the caller must keep reading (``QuicLab.origin.stdout``); without,
    it is discarded.  ``chain_kb``: the origin's test chain (``certs.write_chain``; 2 KB fits the
    amplification limit, larger ones do not).  Everything is stopped and removed on exit."""
    topo = Topology(
        f"iwt{secrets.token_hex(3)}",
        hosts=[
            Host("origin", role="origin", link=LinkSpec.symmetric(rate_bps=1_000_000_000, rtt_ms=0)),
            Host("probe", role="probe", region="lab", link=LinkSpec.symmetric(rate_bps=rate_bps, rtt_ms=rtt_ms)),
        ],
    )
    with topo, open(work / "servers.log", "ab") as logs:
        address = topo.host("origin").address
        chain = write_chain(work / "chain", chain_kb, ips=[address])
        cert, key = write_self_signed(work / "caddy-cert", [address])
        www = work / "www"
        www.mkdir(exist_ok=True)
        (www / "big.bin").write_bytes(bytes(BIG_OBJECT_BYTES))
        labels = ",".join(map(str, arms))
        setup = topo.run("origin", [*IWPROBE, "origin", "setup-routes", "--arms", labels], capture_output=True, text=True)
        if setup.returncode != 0:
            raise RuntimeError(f"setup-routes failed: {setup.stderr}")
        processes: list[subprocess.Popen[Any]] = []
        try:
            origin = topo.popen(
                "origin",
                [*IWPROBE, "origin", "--no-upload", "--no-echo", "--arms", labels, "--base-port", str(BASE_PORT)]
                + ["--bind", address, "--tls-cert", str(chain.chain_path), "--tls-key", str(chain.key_path)]
                + ["--quic", "--congestion-control", "cubic"],
                stdout=subprocess.PIPE if observations else subprocess.DEVNULL,
                stderr=logs,
                text=True,
            )
            processes.append(origin)
            listening = [BASE_PORT + iw for iw in arms]
            if servers:
                caddy, env = caddy_command(work / "caddy", address, CADDY_PORT, cert, key, www)
                processes.append(topo.popen("origin", caddy, env=env, stdout=logs, stderr=logs))
                stock = stock_server_command(address, STOCK_PORT, chain.chain_path, chain.key_path, www)
                processes.append(topo.popen("origin", stock, stdout=logs, stderr=logs))
                listening.append(CADDY_PORT)
            topo.wait_listening("probe", address, listening, server=origin)
            time.sleep(1.0)  # the UDP listeners start after the TCP ones (nothing to connect to)
            yield QuicLab(topo, address, chain, cert, origin, work)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=10)


__all__ = [
    "ACK_ONLY_BELOW",
    "BASE_PORT",
    "CADDY_PORT",
    "CENSUS_TARGETS",
    "STOCK_PORT",
    "CountedFlight",
    "QuicLab",
    "caddy_command",
    "census_target_url",
    "count_first_flights",
    "quic_lab",
    "run_census",
    "stock_server_command",
]
