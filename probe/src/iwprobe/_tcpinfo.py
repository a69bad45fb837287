"""Read ``TCP_INFO`` from a socket and parse ``struct tcp_info`` by the returned length.

The layout follows ``include/uapi/linux/tcp.h``.  Each kernel release appended fields to
the end of the struct, and ``getsockopt`` copies ``min(len, sizeof)`` bytes, so a field is
present exactly when the kernel returned enough bytes to cover it.  Offsets are computed
from the C layout (natural alignment: every u64 in the struct happens to sit at a multiple
of 8, so there is no padding), with native byte order.

The byte at offset 6 is a bitfield (``snd_wscale:4, rcv_wscale:4``) and the byte at
offset 7 another one (``delivery_rate_app_limited:1, fastopen_client_fail:2``).  GCC on
little-endian targets allocates bitfields from the least significant bit.
"""

from __future__ import annotations

import socket
import struct
import sys
from typing import Optional

#: ``TCP_INFO`` socket option number (Linux); ``socket.TCP_INFO`` exists on Linux builds.
TCP_INFO = getattr(socket, "TCP_INFO", 11)
#: Larger than any ``struct tcp_info`` so far (248 bytes on Linux 6.7+).
_BUFFER_BYTES = 512

# (name, struct code) in kernel order after the first eight u8 bytes.
_SCALARS: tuple[tuple[str, str], ...] = (
    ("rto", "I"),
    ("ato", "I"),
    ("snd_mss", "I"),
    ("rcv_mss", "I"),
    ("unacked", "I"),
    ("sacked", "I"),
    ("lost", "I"),
    ("retrans", "I"),
    ("fackets", "I"),
    ("last_data_sent", "I"),
    ("last_ack_sent", "I"),
    ("last_data_recv", "I"),
    ("last_ack_recv", "I"),
    ("pmtu", "I"),
    ("rcv_ssthresh", "I"),
    ("rtt", "I"),
    ("rttvar", "I"),
    ("snd_ssthresh", "I"),
    ("snd_cwnd", "I"),
    ("advmss", "I"),
    ("reordering", "I"),
    ("rcv_rtt", "I"),
    ("rcv_space", "I"),
    ("total_retrans", "I"),
    ("pacing_rate", "Q"),
    ("max_pacing_rate", "Q"),
    ("bytes_acked", "Q"),
    ("bytes_received", "Q"),
    ("segs_out", "I"),
    ("segs_in", "I"),
    ("notsent_bytes", "I"),
    ("min_rtt", "I"),
    ("data_segs_in", "I"),
    ("data_segs_out", "I"),
    ("delivery_rate", "Q"),
    ("busy_time", "Q"),
    ("rwnd_limited", "Q"),
    ("sndbuf_limited", "Q"),
    ("delivered", "I"),
    ("delivered_ce", "I"),
    ("bytes_sent", "Q"),
    ("bytes_retrans", "Q"),
    ("dsack_dups", "I"),
    ("reord_seen", "I"),
    ("rcv_ooopack", "I"),
    ("snd_wnd", "I"),
    ("rcv_wnd", "I"),
    ("rehash", "I"),
    ("total_rto", "H"),
    ("total_rto_recoveries", "H"),
    ("total_rto_time", "I"),
)


def _build_layout() -> list[tuple[str, int, str]]:
    """(name, offset, struct code) for every multi-byte field, checked for alignment."""
    layout: list[tuple[str, int, str]] = []
    offset = 8
    for name, code in _SCALARS:
        size = struct.calcsize("=" + code)
        if offset % size:
            raise AssertionError(f"tcp_info layout: {name} misaligned at {offset}")
        layout.append((name, offset, code))
        offset += size
    return layout


_LAYOUT = _build_layout()
#: Size of the newest ``struct tcp_info`` this parser knows (248 bytes).
KNOWN_SIZE = _LAYOUT[-1][1] + struct.calcsize("=" + _LAYOUT[-1][2])
#: The kernel reports "unlimited" u64 values (e.g. ``max_pacing_rate``) as ~0ULL; such a
#: field is left out of the record (it is not a measurement, and PostgreSQL's bigint and the
#: collector stop at 2**63 - 1).
_U64_UNSET = 2**64 - 1
#: Likewise ~0U for u32 fields: ``min_rtt`` before the first RTT sample (a failed connect).
_U32_UNSET = 2**32 - 1
_U8_FIELDS = ("state", "ca_state", "retransmits", "probes", "backoff", "options")
#: The whole known struct in one unpack (what a current kernel returns): the passive agent
#: parses one per closed connection, and field-by-field unpacking was ~10x slower.
_WHOLE = struct.Struct("=6BBB" + "".join(code for _, _, code in _LAYOUT))
_WHOLE_NAMES = tuple(name for name, _, _ in _LAYOUT)
_WHOLE_UNSET = tuple(_U64_UNSET if code == "Q" else _U32_UNSET if code == "I" else -1 for _, _, code in _LAYOUT)


def parse_tcp_info(raw: bytes) -> dict[str, int]:
    """Parse the bytes ``getsockopt(TCP_INFO)`` returned; only fields fully present."""
    length = len(raw)
    if length >= KNOWN_SIZE:
        values = _WHOLE.unpack_from(raw)
        info = dict(zip(_U8_FIELDS, values[:6]))
        info["snd_wscale"] = values[6] & 0x0F
        info["rcv_wscale"] = (values[6] >> 4) & 0x0F
        info["delivery_rate_app_limited"] = values[7] & 0x01
        info["fastopen_client_fail"] = (values[7] >> 1) & 0x03
        for name, value, unset in zip(_WHOLE_NAMES, values[8:], _WHOLE_UNSET):
            if value != unset:
                info[name] = value
        return info
    info = {}
    for index, name in enumerate(_U8_FIELDS):
        if index < length:
            info[name] = raw[index]
    if length > 6:
        info["snd_wscale"] = raw[6] & 0x0F
        info["rcv_wscale"] = (raw[6] >> 4) & 0x0F
    if length > 7:
        info["delivery_rate_app_limited"] = raw[7] & 0x01
        info["fastopen_client_fail"] = (raw[7] >> 1) & 0x03
    for name, offset, code in _LAYOUT:
        end = offset + struct.calcsize("=" + code)
        if end > length:
            break
        value = struct.unpack_from("=" + code, raw, offset)[0]
        if (code == "Q" and value == _U64_UNSET) or (code == "I" and value == _U32_UNSET):
            continue  # all ones = "no limit / no sample yet" (max_pacing_rate, min_rtt before any RTT sample)
        info[name] = value
    return info


class FieldReader:
    """A few fields of ``struct tcp_info`` in one ``unpack_from`` (the passive agent reads six per
    closed connection; building the whole dict cost five times as much).  A field the buffer is
    too short for, or that holds the kernel's "unset" value, reads as ``None``."""

    def __init__(self, names: tuple[str, ...]) -> None:
        where = {name: (offset, code) for name, offset, code in _LAYOUT}
        unknown = [name for name in names if name not in where]
        if unknown:
            raise ValueError(f"not multi-byte tcp_info fields: {', '.join(unknown)}")
        ordered = sorted(names, key=lambda name: where[name][0])
        layout = "="
        position = 0
        for name in ordered:
            offset, code = where[name]
            layout += f"{offset - position}x{code}" if offset > position else code
            position = offset + struct.calcsize("=" + code)
        self._struct = struct.Struct(layout)
        self._order = [ordered.index(name) for name in names]
        self._unset = [_U64_UNSET if where[name][1] == "Q" else _U32_UNSET for name in ordered]
        self.names = names

    def read(self, raw: bytes) -> tuple[Optional[int], ...]:
        if len(raw) < self._struct.size:
            info = parse_tcp_info(raw)
            return tuple(info.get(name) for name in self.names)
        values = [None if value == unset else value for value, unset in zip(self._struct.unpack_from(raw), self._unset)]
        return tuple(values[index] for index in self._order)


def read_tcp_info(sock: socket.socket) -> dict[str, int]:
    """The socket's current ``TCP_INFO`` as a dict keyed by :data:`wire.TCP_INFO_FIELDS`."""
    return parse_tcp_info(sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, _BUFFER_BYTES))


if sys.byteorder != "little":  # pragma: no cover - bitfield order differs on big-endian
    raise ImportError("iwprobe parses tcp_info bitfields for little-endian Linux only")
