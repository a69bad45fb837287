"""Capture one TCP connection's packets on the probe (``AF_PACKET``, standard library, root).

:class:`ConnectionCapture` is opened *before* the connection exists: the client socket is
bound to its local port first, the capture's kernel filter (classic BPF, attached with
``SO_ATTACH_FILTER``) keeps only TCP packets to or from that port, IPv4 or IPv6, trimmed to
their headers, so nothing else on the machine is copied to the probe.  Every packet carries
its kernel timestamp (``SO_TIMESTAMPNS``, taken when the packet crossed the device, not when
the probe read it), so the probe reads the queue after the fetch and the times are still
exact -- for *incoming* packets.  An outgoing packet's stamp is not always its departure: TCP
stamps its skbs with an earliest departure time, and on this kernel a SYN's stamp was now and
then ~200 ms after its SYN-ACK's.  The inference therefore times nothing by outgoing packets
(it uses their sequence, ACK and window fields only).  ``AF_PACKET`` / ``SOCK_DGRAM`` gives packets
from their network header on, on any device (Ethernet, TUN, loopback); outgoing packets are told apart by their packet type.

A receiver's GRO may merge back-to-back segments into one packet: :attr:`Packet.payload` is
then the merged size and :func:`iwprobe._iwinfer.infer` splits it by the sender's MSS.

Opening needs ``CAP_NET_RAW``: without it :class:`ConnectionCapture` raises
:class:`CaptureUnavailable` with a message that says so.
"""

from __future__ import annotations

import ctypes
import queue
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Optional, Union

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33
SOL_PACKET = 263
PACKET_STATISTICS = 6
#: Bytes kept of each packet: an IPv6 header (40) and a TCP header with every option (60).
SNAPLEN = 100
#: The kernel queue for one connection's headers (a 1 MB response is ~700 packets).
RECEIVE_BUFFER_BYTES = 8 * 1024 * 1024

_TIMESPEC = struct.Struct("@qq")
_TCP = struct.Struct("!HHIIBBH")
FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10


class CaptureUnavailable(Exception):
    """The capture cannot be opened here (no ``CAP_NET_RAW``, no ``AF_PACKET``)."""


@dataclass(frozen=True)
class Packet:
    """One captured TCP packet of the connection (headers only)."""

    time_ns: int
    #: Sent by the probe (client -> server).
    outgoing: bool
    seq: int
    ack: int
    flags: int
    #: TCP payload bytes (a GRO-merged packet: all of its segments').
    payload: int
    window: int
    #: The MSS and window-scale options of a SYN or SYN-ACK, else None.
    mss_option: Optional[int] = None
    wscale_option: Optional[int] = None

    @property
    def syn(self) -> bool:
        return bool(self.flags & SYN)

    @property
    def fin(self) -> bool:
        return bool(self.flags & FIN)

    @property
    def has_ack(self) -> bool:
        return bool(self.flags & ACK)


#: Classic BPF opcodes used by the filter.
_LD_B, _LD_H, _AND_K, _JEQ, _JSET, _LDX_MSH, _LD_H_IND, _RET = 0x30, 0x28, 0x54, 0x15, 0x45, 0xB1, 0x48, 0x06
_Instruction = tuple[int, Union[int, str], Union[int, str], int]


def _filter_program(port: int) -> list[tuple[int, int, int, int]]:
    """Classic BPF keeping TCP packets with ``port`` as either port (unfragmented IPv4, or
    IPv6 without extension headers), trimmed to :data:`SNAPLEN`; jumps are written to labels
    and resolved here (a test runs the program on packets)."""
    labelled: list[tuple[str, _Instruction]] = [
        ("", (_LD_B, 0, 0, 0)),
        ("", (_AND_K, 0, 0, 0xF0)),
        ("", (_JEQ, 0, "v6", 0x40)),
        ("", (_LD_B, 0, 0, 9)),
        ("", (_JEQ, 0, "drop", socket.IPPROTO_TCP)),
        ("", (_LD_H, 0, 0, 6)),
        ("", (_JSET, "drop", 0, 0x1FFF)),  # a later fragment
        ("", (_LDX_MSH, 0, 0, 0)),  # X = IPv4 header length
        ("", (_LD_H_IND, 0, 0, 0)),
        ("", (_JEQ, "accept", 0, port)),
        ("", (_LD_H_IND, 0, 0, 2)),
        ("", (_JEQ, "accept", "drop", port)),
        ("v6", (_JEQ, 0, "drop", 0x60)),
        ("", (_LD_B, 0, 0, 6)),
        ("", (_JEQ, 0, "drop", socket.IPPROTO_TCP)),
        ("", (_LD_H, 0, 0, 40)),
        ("", (_JEQ, "accept", 0, port)),
        ("", (_LD_H, 0, 0, 42)),
        ("", (_JEQ, "accept", "drop", port)),
        ("accept", (_RET, 0, 0, SNAPLEN)),
        ("drop", (_RET, 0, 0, 0)),
    ]
    where = {label: index for index, (label, _) in enumerate(labelled) if label}

    def offset(target: Union[int, str], index: int) -> int:
        return where[target] - index - 1 if isinstance(target, str) else target

    return [(code, offset(jt, index), offset(jf, index), k) for index, (_, (code, jt, jf, k)) in enumerate(labelled)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _attach_filter(sock: socket.socket, program: list[tuple[int, int, int, int]]) -> None:
    instructions = (_SockFilter * len(program))(*[_SockFilter(*item) for item in program])
    fprog = _SockFprog(len(program), ctypes.cast(instructions, ctypes.POINTER(_SockFilter)))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(ctypes.string_at(ctypes.addressof(fprog), ctypes.sizeof(fprog))))


def _syn_options(options: bytes) -> tuple[Optional[int], Optional[int]]:
    """(MSS, window scale) of a SYN's TCP options."""
    mss: Optional[int] = None
    wscale: Optional[int] = None
    index = 0
    while index < len(options):
        kind = options[index]
        if kind == 0:
            break
        if kind == 1:
            index += 1
            continue
        if index + 1 >= len(options):
            break
        length = options[index + 1]
        if length < 2 or index + length > len(options):
            break
        if kind == 2 and length == 4:
            mss = int(struct.unpack("!H", options[index + 2 : index + 4])[0])
        elif kind == 3 and length == 3:
            wscale = min(14, options[index + 2])
        index += length
    return mss, wscale


def parse_packet(
    data: bytes, time_ns: int, outgoing: bool, local_port: int, remote_port: Optional[int] = None
) -> Optional[Packet]:
    """One packet from its network header on, or None when it is not TCP of ``local_port``
    (and, given, ``remote_port``)."""
    if not data:
        return None
    version = data[0] >> 4
    if version == 4 and len(data) >= 20:
        header = (data[0] & 0x0F) * 4
        if data[9] != socket.IPPROTO_TCP:
            return None
        total = struct.unpack("!H", data[2:4])[0]
        ip_payload = total - header
    elif version == 6 and len(data) >= 40:
        header = 40
        if data[6] != socket.IPPROTO_TCP:
            return None
        ip_payload = struct.unpack("!H", data[4:6])[0]
    else:
        return None
    if len(data) < header + 20:
        return None
    sport, dport, seq, ack, offset_byte, flags, window = _TCP.unpack(data[header : header + 16])
    if (dport if not outgoing else sport) != local_port:
        return None
    if remote_port is not None and (sport if not outgoing else dport) != remote_port:
        return None
    tcp_header = (offset_byte >> 4) * 4
    mss, wscale = _syn_options(data[header + 20 : header + tcp_header]) if flags & SYN else (None, None)
    return Packet(
        time_ns=time_ns,
        outgoing=outgoing,
        seq=seq,
        ack=ack,
        flags=flags,
        payload=max(0, ip_payload - tcp_header),
        window=window,
        mss_option=mss,
        wscale_option=wscale,
    )


def capture_status() -> str:
    """``"on"`` when this process can open the capture, else ``"off: <why>"`` (the probe's
    heartbeat says it; trials then carry no ``client_iw``)."""
    try:
        probe = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0)  # protocol 0: receives nothing
    except PermissionError:
        return "off: not root (the capture needs CAP_NET_RAW)"
    except (OSError, AttributeError) as error:
        return f"off: no AF_PACKET capture here ({error})"
    probe.close()
    return "on"


#: Capture sockets waiting to be closed by the one closing thread (started on first use).
_CLOSING: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
_closer_lock = threading.Lock()
_closer: list[threading.Thread] = []


def _close_later(sock: socket.socket) -> None:
    with _closer_lock:
        if not _closer:
            _closer.append(threading.Thread(target=_close_forever, name="iwprobe-capture-close", daemon=True))
            _closer[0].start()
    _CLOSING.put(sock)


def _close_forever() -> None:
    while True:
        _CLOSING.get().close()


class ConnectionCapture:
    """The packets of the TCP connection on local port ``local_port`` (both directions): a
    probe's connection owns its port; a server's shares its listening port with every client, so
    the origin names the client's port too (``remote_port``, which the kernel filter keys on)."""

    def __init__(self, local_port: int, remote_port: Optional[int] = None) -> None:
        self.local_port = local_port
        self.remote_port = remote_port
        try:
            self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        except PermissionError:
            raise CaptureUnavailable(
                "the IW inference needs root (CAP_NET_RAW) to open an AF_PACKET capture; run the probe as root or leave it off"
            ) from None
        except (OSError, AttributeError) as error:
            raise CaptureUnavailable(f"no AF_PACKET capture here: {error}") from None
        try:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
            except PermissionError:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
            _attach_filter(self._sock, _filter_program(local_port if remote_port is None else remote_port))
            self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self._sock.setblocking(False)
            self._drain()  # anything queued before the filter was attached
        except BaseException:
            self._sock.close()
            raise
        self.packets: list[Packet] = []

    def _drain(self) -> None:
        while True:
            try:
                self._sock.recv(SNAPLEN)
            except BlockingIOError:
                return

    def read(self) -> list[Packet]:
        """Read what the kernel queued since the last read; the packets of the connection so far."""
        while True:
            try:
                data, ancillary, _, address = self._sock.recvmsg(SNAPLEN, 64)
            except BlockingIOError:
                break
            stamp = 0
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    seconds, nanoseconds = _TIMESPEC.unpack(payload[: _TIMESPEC.size])
                    stamp = seconds * 1_000_000_000 + nanoseconds
            packet_type = address[2]
            outgoing = packet_type == socket.PACKET_OUTGOING
            if not outgoing and packet_type != socket.PACKET_HOST:
                continue  # another host's packet seen promiscuously, or a loopback duplicate
            packet = parse_packet(data, stamp, outgoing, self.local_port, self.remote_port)
            if packet is not None:
                self.packets.append(packet)
        return self.packets

    def dropped(self) -> int:
        """Packets the kernel dropped for this capture (its queue full) since it was opened."""
        stats = self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        _, drops = struct.unpack("II", stats)
        return int(drops)

    def close(self) -> None:
        """Hand the socket to the closing thread: closing an ``AF_PACKET`` socket waits for
        an RCU grace period in the kernel (``synchronize_net``: 6.6 ms median, 15 ms p90 on
        the lab box, measured by ``bench/bench_capture.py``), time the probe need not spend
        between two trials.  Its filter keeps it receiving nothing of later connections."""
        _close_later(self._sock)

    def __enter__(self) -> ConnectionCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
