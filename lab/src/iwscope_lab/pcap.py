"""A reader of classic pcap files (what Debian's ``tcpdump -w`` writes), for checks against an
independent capture: the trace tests compare the probe's own capture with it, and the send-path
experiment (:mod:`iwscope_lab.sendpaths`) reads the sender's segments from it.

IPv4 TCP segments (:func:`read_pcap`) and UDP datagrams (:func:`read_udp_pcap`, for QUIC:
:mod:`iwscope_lab.quic` counts a server's first flight from them); either byte order, micro- or
nanosecond stamps; Ethernet, raw IP and Linux cooked (SLL, SLL2) link types.  :func:`tcpdump`
writes such a file from a lab host's device.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .topology import Topology

#: Debian's tcpdump (make setup installs it).
TCPDUMP = shutil.which("tcpdump") or "tcpdump"

LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2 = 1, 101, 113, 276
_LINK_HEADER = {LINKTYPE_ETHERNET: 14, LINKTYPE_RAW: 0, LINKTYPE_LINUX_SLL: 16, LINKTYPE_LINUX_SLL2: 20}


@dataclass
class PcapPacket:
    time_ns: int
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int
    window: int
    payload: int
    mss_option: int | None
    wscale_option: int | None


@dataclass(frozen=True)
class UdpDatagram:
    """One IPv4 UDP datagram of a capture."""

    time_ns: int
    src: str
    sport: int
    dst: str
    dport: int
    #: UDP payload bytes (the QUIC datagram), from the UDP header's length.
    payload: int


def _ipv4_frames(path: Path, protocol: int) -> Iterator[tuple[int, bytes]]:
    """(capture time in ns, IPv4 packet) of every IPv4 packet of ``protocol`` in the file."""
    data = path.read_bytes()
    magics = {
        b"\xd4\xc3\xb2\xa1": ("<", 1000),
        b"\xa1\xb2\xc3\xd4": (">", 1000),
        b"\x4d\x3c\xb2\xa1": ("<", 1),
        b"\xa1\xb2\x3c\x4d": (">", 1),
    }
    if data[:4] not in magics:
        raise ValueError(f"not a pcap file: {data[:4]!r}")
    order, unit_ns = magics[data[:4]]
    linktype = struct.unpack(order + "I", data[20:24])[0] & 0x0FFFFFFF
    if linktype not in _LINK_HEADER:
        raise ValueError(f"pcap link type {linktype} is not one this reader knows")
    skip = _LINK_HEADER[linktype]
    offset = 24
    while offset + 16 <= len(data):
        seconds, fraction, captured, _ = struct.unpack(order + "IIII", data[offset : offset + 16])
        frame = data[offset + 16 : offset + 16 + captured]
        offset += 16 + captured
        ip = frame[skip:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != protocol:
            continue
        yield seconds * 1_000_000_000 + fraction * unit_ns, ip


def read_udp_pcap(path: Path) -> list[UdpDatagram]:
    """The IPv4 UDP datagrams of a classic pcap file, in capture order."""
    datagrams: list[UdpDatagram] = []
    for time_ns, ip in _ipv4_frames(path, 17):
        ihl = (ip[0] & 0x0F) * 4
        if len(ip) < ihl + 8:
            continue
        sport, dport, length = struct.unpack("!HHH", ip[ihl : ihl + 6])
        src, dst = str(ipaddress.IPv4Address(ip[12:16])), str(ipaddress.IPv4Address(ip[16:20]))
        datagrams.append(UdpDatagram(time_ns, src, sport, dst, dport, length - 8))
    return datagrams


def read_pcap(path: Path) -> list[PcapPacket]:
    """The IPv4 TCP packets of a classic pcap file (either byte order, µs or ns stamps)."""
    packets: list[PcapPacket] = []
    for time_ns, ip in _ipv4_frames(path, 6):
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        sport, dport, seq, ack, offset_byte, flags, window = struct.unpack("!HHIIBBH", ip[ihl : ihl + 16])
        tcp_length = (offset_byte >> 4) * 4
        mss = wscale = None
        options = ip[ihl + 20 : ihl + tcp_length]
        index = 0
        while index < len(options) and options[index] != 0:
            if options[index] == 1:
                index += 1
                continue
            if options[index] == 2:
                mss = struct.unpack("!H", options[index + 2 : index + 4])[0]
            elif options[index] == 3:
                wscale = options[index + 2]
            index += max(2, options[index + 1])
        packets.append(
            PcapPacket(
                time_ns,
                sport,
                dport,
                seq,
                ack,
                flags,
                window,
                total - ihl - tcp_length,
                mss,
                wscale,
            )
        )
    return packets


@dataclass
class Capture:
    """A finished :func:`tcpdump` run: its file and what tcpdump said when it stopped."""

    path: Path
    errors: str = ""


@contextlib.contextmanager
def tcpdump(
    topo: Topology, host: str, path: Path, bpf_filter: str, snaplen: int = 160, settle_s: float = 0.3
) -> Iterator[Capture]:
    """Capture ``host``'s device into ``path`` while the block runs (and ``settle_s`` after it,
    for a connection's last packets).

    ``--immediate-mode``: packets handed over at once (else the ring buffer's blocks wait up to
    1 s and a SIGINT right after a fetch lost the last ~35 packets of an IW 3 trial); ``-U``:
    each written at once; ``-Z root``: written where root's temporary directory is (no
    privilege drop).  The block starts once the file has its header: tcpdump is capturing."""
    command = [TCPDUMP, "-i", topo.host(host).device, "-n", "--immediate-mode", "-U", "-Z", "root"]
    process = topo.popen(
        host, [*command, "-s", str(snaplen), "-w", str(path), bpf_filter], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    capture = Capture(path)
    try:
        deadline = time.monotonic() + 10
        while not (path.exists() and path.stat().st_size >= 24):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tcpdump did not start: {process.stderr.read().decode() if process.stderr else ''}")
            time.sleep(0.05)
        time.sleep(0.2)
        yield capture
        time.sleep(settle_s)
    finally:
        process.send_signal(signal.SIGINT)
        _, errors = process.communicate(timeout=10)
        capture.errors = errors.decode(errors="replace")


__all__ = ["TCPDUMP", "Capture", "PcapPacket", "UdpDatagram", "read_pcap", "read_udp_pcap", "tcpdump"]
