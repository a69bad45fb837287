"""Packets as an ``AF_PACKET`` / ``SOCK_DGRAM`` capture delivers them (from the network header
on, headers only), and classic BPF run on them as the kernel would: shared by the tests of the
probe's capture and of the tap's."""

from __future__ import annotations

import socket
import struct

CLIENT_V4 = "10.64.2.2"
SERVER_V4 = "10.64.1.2"
CLIENT_V6 = "fd69:7773:40:2::2"
SERVER_V6 = "fd69:7773:40:1::2"


def tcp_header(sport: int, dport: int, seq: int, ack: int, flags: int, window: int, options: bytes = b"") -> bytes:
    assert len(options) % 4 == 0
    offset = (20 + len(options)) // 4
    return struct.pack("!HHIIBBHHH", sport, dport, seq, ack, offset << 4, flags, window, 0, 0) + options


def ipv4(
    tcp: bytes,
    payload: int = 0,
    protocol: int = socket.IPPROTO_TCP,
    fragment: int = 0x4000,
    options: bytes = b"",
    source: str = CLIENT_V4,
    destination: str = SERVER_V4,
    data: bytes = b"",
) -> bytes:
    """An IPv4 header (DF set unless ``fragment`` says otherwise) before ``tcp``; the packet's
    payload bytes are counted in the total length but not included (the capture keeps headers),
    except the first ones given as ``data``."""
    ihl = (20 + len(options)) // 4
    total = ihl * 4 + len(tcp) + payload
    header = struct.pack(
        "!BBHHHBBH4s4s",
        0x40 | ihl,
        0,
        total,
        1,
        fragment,
        64,
        protocol,
        0,
        socket.inet_aton(source),
        socket.inet_aton(destination),
    )
    return header + options + tcp + data


def ipv6(
    tcp: bytes,
    payload: int = 0,
    next_header: int = socket.IPPROTO_TCP,
    source: str = CLIENT_V6,
    destination: str = SERVER_V6,
    data: bytes = b"",
) -> bytes:
    header = struct.pack(
        "!IHBB16s16s",
        6 << 28,
        len(tcp) + payload,
        next_header,
        64,
        socket.inet_pton(socket.AF_INET6, source),
        socket.inet_pton(socket.AF_INET6, destination),
    )
    return header + tcp + data


class _OutOfBounds(Exception):
    pass


def run_bpf(program: list[tuple[int, int, int, int]], packet: bytes) -> int:
    """Classic BPF as the kernel runs it on an ``AF_PACKET`` / ``SOCK_DGRAM`` socket's packet
    (from the network header on): the bytes kept, 0 = dropped.  Only the opcodes the filter
    uses; a load past the packet's end drops it, as in the kernel."""
    a = x = 0
    pc = 0

    def load(offset: int, size: int) -> int:
        if offset < 0 or offset + size > len(packet):
            raise _OutOfBounds
        return int.from_bytes(packet[offset : offset + size], "big")

    steps = 0
    while True:
        steps += 1
        assert steps <= len(program), "a classic BPF program only jumps forward"
        code, jt, jf, k = program[pc]
        pc += 1
        try:
            if code == 0x30:  # BPF_LD | BPF_B | BPF_ABS
                a = load(k, 1)
            elif code == 0x28:  # BPF_LD | BPF_H | BPF_ABS
                a = load(k, 2)
            elif code == 0x48:  # BPF_LD | BPF_H | BPF_IND
                a = load(x + k, 2)
            elif code == 0xB1:  # BPF_LDX | BPF_B | BPF_MSH
                x = 4 * (load(k, 1) & 0x0F)
            elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
                a &= k
            elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
                pc += jt if a == k else jf
            elif code == 0x45:  # BPF_JMP | BPF_JSET | BPF_K
                pc += jt if a & k else jf
            elif code == 0x06:  # BPF_RET | BPF_K
                return k
            else:
                raise AssertionError(f"opcode {code:#x} not in the interpreter")
        except _OutOfBounds:
            return 0


def tcp_info_bytes(fields: dict[str, int]) -> bytes:
    """A ``struct tcp_info`` as the kernel fills it (the newest layout), with ``fields`` set."""
    from iwprobe import _tcpinfo

    return _tcpinfo._WHOLE.pack(*([0] * 8), *(fields.get(name, 0) for name, _, _ in _tcpinfo._LAYOUT))
