"""A reader of classic pcap files (what Debian's ``tcpdump -w`` writes), for checks against an
independent capture: the trace tests compare the probe's own capture with it, and the send-path
experiment (:mod:`iwscope_lab.sendpaths`) reads the sender's segments from it.

IPv4 TCP only; either byte order, micro- or nanosecond stamps; Ethernet, raw IP and Linux
cooked (SLL, SLL2) link types.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

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


def read_pcap(path: Path) -> list[PcapPacket]:
    """The IPv4 TCP packets of a classic pcap file (either byte order, µs or ns stamps)."""
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
    packets: list[PcapPacket] = []
    offset = 24
    while offset + 16 <= len(data):
        seconds, fraction, captured, _ = struct.unpack(order + "IIII", data[offset : offset + 16])
        frame = data[offset + 16 : offset + 16 + captured]
        offset += 16 + captured
        ip = frame[skip:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
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
                seconds * 1_000_000_000 + fraction * unit_ns,
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


__all__ = ["PcapPacket", "read_pcap"]
