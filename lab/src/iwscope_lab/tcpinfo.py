"""``struct tcp_info`` (linux/tcp.h) read with ``getsockopt(TCP_INFO)`` and parsed with ``struct``.

Only the leading fields the lab needs; the kernel returns at least these on every Linux
since 2.6 (and more on newer ones, which are ignored).
"""

from __future__ import annotations

import socket
import struct

#: u8 state, ca_state, retransmits, probes, backoff, options, wscale nibbles, rate-app-limited bits
_HEAD = "8B"
_U32_FIELDS = ("rto", "ato", "snd_mss", "rcv_mss", "unacked", "sacked", "lost", "retrans", "fackets",
               "last_data_sent", "last_ack_sent", "last_data_recv", "last_ack_recv", "pmtu",
               "rcv_ssthresh", "rtt", "rttvar", "snd_ssthresh", "snd_cwnd", "advmss", "reordering",
               "rcv_rtt", "rcv_space", "total_retrans")
_FORMAT = "=" + _HEAD + "%dI" % len(_U32_FIELDS)
_SIZE = struct.calcsize(_FORMAT)
#: snd_cwnd sits at byte 80 of struct tcp_info: a check that the layout above is right.
assert struct.calcsize("=8B18I") == 80


def parse_tcp_info(raw: bytes) -> dict[str, int]:
    """Fields of ``struct tcp_info`` from the raw getsockopt bytes (rtt/rttvar in microseconds)."""
    if len(raw) < _SIZE:
        raise ValueError(f"tcp_info: got {len(raw)} bytes, need at least {_SIZE}")
    values = struct.unpack_from(_FORMAT, raw)
    info = {"state": values[0], "ca_state": values[1], "retransmits": values[2]}
    info.update(zip(_U32_FIELDS, values[8:]))
    return info


def read_tcp_info(sock: socket.socket) -> dict[str, int]:
    """TCP_INFO of a connected TCP socket."""
    return parse_tcp_info(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256))
