"""The first response of real users' connections, from their packet headers (server side).

The paper's response latency runs from the request's first byte in to the last byte of the
response acknowledged.  Neither the web server's log (nginx's ``$request_time`` ends at the
last ``write``) nor ``TCP_INFO`` at close (``busy_time`` counts in jiffies, 4 ms here, and
sums every response) gives it, so the agent follows each connection's headers from an
``AF_PACKET`` capture of the server's ports (classic BPF in the kernel keeps only them,
trimmed to the headers and the first two payload bytes):

* an *exchange* starts with new client payload; the next one starts with client payload that
  arrives once everything the server sent is acknowledged (HTTP/1.1 keep-alive: the next
  request).  Client payload while server data is unacknowledged (HTTP/2 control frames,
  pipelining) belongs to the exchange in progress;
* its latency is the arrival of its first client byte to the arrival of the ACK that last
  covered all server data sent in it (both incoming packets, stamped by the kernel when they
  crossed the device); its size is the server payload sent in it;
* plain HTTP: the first exchange is the first response.  HTTPS (first client bytes a TLS
  handshake record, ``16 03``): exchanges whose client flight starts with a handshake record
  are the handshake (the first one's latency is ``handshake_us``), the first exchange that
  starts otherwise is the first request -- nothing is decrypted;
* the first flight: server data sent before the client acknowledged any of it (the window
  the arm gave; a GSO super-packet counts as ``ceil(bytes / MSS)`` segments);
* bias flags: a repeated SYN or SYN-ACK (the connection starts at IW 1, RFC 6298), the
  client's receive window at the handshake (a first flight above it is receiver-limited),
  and an idle gap before a later exchange (the kernel restarts the window after idle).

Following every packet of a busy server costs CPU, so the filter follows a share of
connections, chosen by the client's port: ``(port & mask) == 0`` with ``mask = 2**k - 1``
(:meth:`PassiveCapture.set_sampling`); the agent widens ``k`` when the packet rate exceeds its
budget.  Connections not followed still get their final ``TCP_INFO`` (:mod:`iwprobe._sockdiag`).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Optional, Union

from ._capture import (
    ETH_P_ALL,
    PACKET_STATISTICS,
    SO_RCVBUFFORCE,
    SO_TIMESTAMPNS,
    SOL_PACKET,
    _attach_filter,
    _syn_options,
)

#: Packets per second the agent reads at most by default: above it, it follows fewer connections.
DEFAULT_CAPTURE_PPS = 2000
#: IPv4 with options (60) or IPv6 (40), a TCP header with options (60), 2 payload bytes.
SNAPLEN = 128
RECEIVE_BUFFER_BYTES = 32 * 1024 * 1024
#: An exchange starting after the previous one's last ACK by more than this is "after idle"
#: (Linux restarts the window after an RTO of idle: 200 ms at least).
IDLE_RESTART_NS = 200_000_000
_SEQ = 0xFFFFFFFF
_TCP = struct.Struct("!HHIIBBH")
_U16 = struct.Struct("!H")
_TIMESPEC = struct.Struct("@qq")
FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10
TLS_HANDSHAKE = 0x16

_LD_B, _LD_H, _AND_K, _JEQ, _JSET, _LDX_MSH, _LD_H_IND, _RET = 0x30, 0x28, 0x54, 0x15, 0x45, 0xB1, 0x48, 0x06
_Target = Union[int, str]


def filter_program(ports: list[int], mask: int) -> list[tuple[int, int, int, int]]:
    """Classic BPF: TCP (unfragmented IPv4, IPv6 without extension headers) with a server port
    on one side and a client port with ``port & mask == 0`` on the other, trimmed to
    :data:`SNAPLEN`."""
    code: list[tuple[str, tuple[int, _Target, _Target, int]]] = []

    def emit(instruction: tuple[int, _Target, _Target, int], label: str = "") -> None:
        code.append((label, instruction))

    def port_tests(
        load_server: tuple[int, _Target, _Target, int], load_client: tuple[int, _Target, _Target, int], prefix: str
    ) -> None:
        emit(load_server)
        for port in ports:
            emit((_JEQ, f"{prefix}from_server", 0, port))
        emit(load_client)
        for port in ports:
            emit((_JEQ, f"{prefix}to_server", 0, port))
        emit((_RET, 0, 0, 0))
        emit(load_client, f"{prefix}from_server")  # the client's port is the destination
        emit((_AND_K, 0, 0, mask))
        emit((_JEQ, "accept", "drop", 0))
        emit(load_server, f"{prefix}to_server")  # the client's port is the source
        emit((_AND_K, 0, 0, mask))
        emit((_JEQ, "accept", "drop", 0))

    emit((_LD_B, 0, 0, 0))
    emit((_AND_K, 0, 0, 0xF0))
    emit((_JEQ, 0, "v6", 0x40))
    emit((_LD_B, 0, 0, 9))
    emit((_JEQ, 0, "drop", socket.IPPROTO_TCP))
    emit((_LD_H, 0, 0, 6))
    emit((_JSET, "drop", 0, 0x1FFF))
    emit((_LDX_MSH, 0, 0, 0))
    port_tests((_LD_H_IND, 0, 0, 0), (_LD_H_IND, 0, 0, 2), "v4")
    emit((_JEQ, 0, "drop", 0x60), "v6")
    emit((_LD_B, 0, 0, 6))
    emit((_JEQ, 0, "drop", socket.IPPROTO_TCP))
    port_tests((_LD_H, 0, 0, 40), (_LD_H, 0, 0, 42), "v6")
    emit((_RET, 0, 0, SNAPLEN), "accept")
    emit((_RET, 0, 0, 0), "drop")
    where = {label: index for index, (label, _) in enumerate(code) if label}

    def offset(target: _Target, index: int) -> int:
        if isinstance(target, str):
            distance = where[target] - index - 1
            if not 0 <= distance <= 255:
                raise ValueError("too many ports for one filter")
            return distance
        return target

    return [(op, offset(jt, i), offset(jf, i), k) for i, (_, (op, jt, jf, k)) in enumerate(code)]


@dataclass
class FirstResponse:
    """What the headers of one connection showed (``None``: not seen)."""

    tls: Optional[bool] = None
    response_latency_us: Optional[int] = None
    response_bytes: Optional[int] = None
    handshake_us: Optional[int] = None
    first_flight_segments: Optional[int] = None
    first_flight_bytes: Optional[int] = None
    handshake_rtt_us: Optional[int] = None
    client_rwnd_bytes: Optional[int] = None
    mss: Optional[int] = None
    syn_retrans: bool = False
    reused_after_idle: bool = False
    exchanges: int = 0
    #: Kernel time of the (last) SYN, ns since the epoch (not on the wire: it says under which
    #: assignment the connection started).
    syn_ns: int = 0


class Flow:
    """One followed connection (from its SYN on)."""

    __slots__ = (
        "syns",
        "synacks",
        "syn_ns",
        "client_isn",
        "server_isn",
        "client_mss",
        "client_wscale",
        "handshake_done",
        "client_next",
        "server_next",
        "acked",
        "first_flight_open",
        "ff_bytes",
        "ff_segments",
        "ex_index",
        "ex_start_ns",
        "ex_server_start",
        "ex_full_ack_ns",
        "ex_kind",
        "last_full_ack_ns",
        "last_packet_ns",
        "last_payload_ns",
        "result",
        "closed",
        "settled",
    )

    def __init__(self, now_ns: int) -> None:
        self.syns = 0
        self.synacks = 0
        self.syn_ns = now_ns
        self.client_isn = 0
        self.server_isn: Optional[int] = None
        self.client_mss = 1460
        self.client_wscale: Optional[int] = None
        self.handshake_done = False
        self.client_next = 1
        self.server_next = 1
        self.acked = 0
        self.first_flight_open = True
        self.ff_bytes = 0
        self.ff_segments = 0
        self.ex_index = 0  # exchanges opened so far
        self.ex_start_ns = 0  # 0: no exchange open
        self.ex_server_start = 0
        self.ex_full_ack_ns = 0
        self.ex_kind = ""  # "handshake", "response" or "later"
        self.last_full_ack_ns = 0
        self.last_packet_ns = now_ns
        self.last_payload_ns = 0
        self.result = FirstResponse()
        self.closed = False
        #: The first response is measured: later packets only count exchanges (cheaply).
        self.settled = False

    # ----------------------------------------------------------------- client side
    def client_packet(
        self, now_ns: int, seq: int, ack: int, flags: int, window: int, payload: int, first_bytes: bytes, options: bytes
    ) -> None:
        self.last_packet_ns = now_ns
        if flags & SYN:
            self.syns += 1
            self.syn_ns = now_ns
            self.client_isn = seq
            mss, wscale = _syn_options(options)
            self.client_mss = mss or self.client_mss
            self.client_wscale = wscale
            return
        if self.server_isn is None:
            return
        if flags & ACK:
            acked = (ack - self.server_isn) & _SEQ
            if not self.handshake_done:
                self.handshake_done = True
                self.result.handshake_rtt_us = max(0, (now_ns - self.syn_ns) // 1000)
                scale = self.client_wscale if self.client_wscale is not None else 0
                self.result.client_rwnd_bytes = window << scale
            if acked > self.acked and acked <= self.server_next + 1:
                self.acked = acked
                if self.ex_start_ns:
                    if self.first_flight_open and self.ff_bytes and acked > self.ex_server_start:
                        self.first_flight_open = False
                    if acked >= self.server_next > self.ex_server_start:
                        self.ex_full_ack_ns = now_ns
        if payload:
            end = (seq - self.client_isn + payload) & _SEQ
            if end <= self.client_next:
                return  # a retransmission of client data
            self.client_next = end
            self.last_payload_ns = now_ns
            if not self.ex_start_ns:
                self._open(now_ns, first_bytes)
            elif self.server_next > self.ex_server_start and self.acked >= self.server_next:
                self._close()
                self._open(now_ns, first_bytes)
        if flags & (FIN | RST):
            self.finish()

    def _open(self, now_ns: int, first_bytes: bytes) -> None:
        self.ex_index += 1
        result = self.result
        if self.ex_index == 1:
            result.tls = len(first_bytes) >= 2 and first_bytes[0] == TLS_HANDSHAKE and first_bytes[1] == 3
        elif self.last_full_ack_ns and now_ns - self.last_full_ack_ns > IDLE_RESTART_NS:
            result.reused_after_idle = True
        if result.response_latency_us is not None or (result.tls is False and self.ex_index > 1):
            kind = "later"
        elif result.tls and first_bytes[:1] == bytes((TLS_HANDSHAKE,)):
            kind = "handshake" if result.handshake_us is None else "handshake_more"
        else:
            kind = "response" if result.response_latency_us is None else "later"
        self.ex_kind = kind
        self.ex_start_ns = now_ns
        self.ex_server_start = self.server_next
        self.ex_full_ack_ns = 0

    def _close(self) -> None:
        """End the open exchange: its latency to the last ACK that covered all it sent."""
        result = self.result
        if self.ex_full_ack_ns:
            latency_us = max(0, (self.ex_full_ack_ns - self.ex_start_ns) // 1000)
            if self.ex_kind == "handshake":
                result.handshake_us = latency_us
            elif self.ex_kind == "response":
                result.response_latency_us = latency_us
                result.response_bytes = self.server_next - self.ex_server_start
                self.settled = True
            self.last_full_ack_ns = self.ex_full_ack_ns
        self.ex_start_ns = 0

    # ----------------------------------------------------------------- server side
    def server_packet(self, now_ns: int, seq: int, flags: int, payload: int) -> None:
        self.last_packet_ns = now_ns
        if flags & SYN:
            self.synacks += 1
            self.server_isn = seq
            return
        if self.server_isn is None:
            return
        if payload:
            start = (seq - self.server_isn) & _SEQ
            end = (start + payload) & _SEQ
            if end > self.server_next:
                new = end - max(start, self.server_next)
                self.server_next = end
                if self.first_flight_open and self.ex_start_ns:
                    self.ff_bytes += new
                    self.ff_segments += -(-new // max(1, self.client_mss))
        if flags & (FIN | RST):
            self.finish()

    def settled_packet(self, now_ns: int, from_client: bool, payload: int) -> None:
        """After the first response: new client data more than 1 ms after the last counts as
        an exchange (a request; the approximation is documented), after an idle gap as reuse."""
        if from_client and payload:
            if now_ns - self.last_payload_ns > 1_000_000:
                self.ex_index += 1
                if now_ns - self.last_packet_ns > IDLE_RESTART_NS:
                    self.result.reused_after_idle = True
            self.last_payload_ns = now_ns
        self.last_packet_ns = now_ns

    def finish(self) -> FirstResponse:
        """Close what is open and return the result (idempotent)."""
        if not self.closed:
            if self.ex_start_ns:
                self._close()
            self.closed = True
            result = self.result
            result.exchanges = self.ex_index
            result.syn_retrans = self.syns > 1 or self.synacks > 1
            result.mss = self.client_mss
            result.syn_ns = self.syn_ns
            if self.ff_bytes:
                result.first_flight_bytes = self.ff_bytes
                result.first_flight_segments = self.ff_segments
        return self.result


FlowKey = tuple[bytes, int, int]


class FlowTable:
    """The followed connections of ``ports``, fed with captured packets (no socket: testable)."""

    def __init__(self, ports: list[int], max_flows: int = 200_000) -> None:
        self.port_set = frozenset(ports)
        self.max_flows = max_flows
        self.flows: dict[FlowKey, Flow] = {}
        #: Whether a SYN starts following a connection (off in a capture window's tail).
        self.admitting = True

    def packet(self, data: bytes, stamp: int, packet_type: int) -> None:
        """One captured packet (from its network header on) with its kernel time and type."""
        if len(data) < 40:
            return
        if data[0] >> 4 == 4:
            header = (data[0] & 0x0F) * 4
            ip_payload = _U16.unpack_from(data, 2)[0] - header
            source, destination = data[12:16], data[16:20]
        else:
            header = 40
            ip_payload = _U16.unpack_from(data, 4)[0]
            source, destination = data[8:24], data[24:40]
        if len(data) < header + 20:
            return
        sport, dport, seq, ack, offset_byte, flags, window = _TCP.unpack_from(data, header)
        tcp_header = (offset_byte >> 4) * 4
        payload = max(0, ip_payload - tcp_header)
        if sport in self.port_set:
            if packet_type != socket.PACKET_OUTGOING:
                return  # a loopback copy
            flow = self.flows.get((destination, dport, sport))
            if flow is not None:
                if flow.settled:
                    flow.last_packet_ns = stamp
                else:
                    flow.server_packet(stamp, seq, flags, payload)
            return
        if packet_type == socket.PACKET_OUTGOING or dport not in self.port_set:
            return
        key = (source, sport, dport)
        flow = self.flows.get(key)
        if flow is not None and flow.settled:
            flow.settled_packet(stamp, True, payload)
            return
        if flow is None:
            if not flags & SYN or flags & ACK:
                return  # joined mid-connection (before the agent started, or the sampling changed)
            if len(self.flows) >= self.max_flows or not self.admitting:
                return
            flow = self.flows[key] = Flow(stamp)
        start = header + tcp_header
        flow.client_packet(
            stamp, seq, ack, flags, window, payload, data[start : start + 2], data[header + 20 : start] if flags & SYN else b""
        )

    def pop(self, client: bytes, client_port: int, server_port: int) -> Optional[FirstResponse]:
        """The result of a closed connection (its flow is forgotten); ``None``: not followed."""
        flow = self.flows.pop((client, client_port, server_port), None)
        return flow.finish() if flow is not None else None

    def expire(self, older_than_ns: int) -> int:
        """Forget flows without a packet since ``older_than_ns`` (their close was never seen)."""
        stale = [key for key, flow in self.flows.items() if flow.last_packet_ns < older_than_ns]
        for key in stale:
            del self.flows[key]
        return len(stale)


class PassiveCapture:
    """Follows a share of the connections to ``ports`` (all interfaces, both families)."""

    def __init__(self, ports: list[int], sampling_bits: int = 0, max_flows: int = 200_000) -> None:
        self.ports = sorted(set(ports))
        self.table = FlowTable(self.ports, max_flows)
        self.packets = 0
        self.dropped = 0
        self.sampling_bits = -1
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        try:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
            except OSError:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
            self.set_sampling(sampling_bits)
            self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise

    @property
    def share(self) -> float:
        """Share of connections followed."""
        return 1.0 / (1 << self.sampling_bits)

    def set_sampling(self, bits: int) -> None:
        """Follow connections whose client port has its ``bits`` low bits zero (2**-bits of them)."""
        bits = max(0, min(15, bits))
        if bits != self.sampling_bits:
            _attach_filter(self._sock, filter_program(self.ports, (1 << bits) - 1))
            self.sampling_bits = bits

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self, budget: int = 10_000) -> int:
        """Process queued packets (at most ``budget``); returns how many."""
        handled = 0
        recvmsg = self._sock.recvmsg
        packet = self.table.packet
        while handled < budget:
            try:
                data, ancillary, _, address = recvmsg(SNAPLEN, 64)
            except BlockingIOError:
                break
            handled += 1
            stamp = 0
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                    stamp = seconds * 1_000_000_000 + nanoseconds
            packet(data, stamp, address[2])
        self.packets += handled
        return handled

    def pop(self, client: bytes, client_port: int, server_port: int) -> Optional[FirstResponse]:
        return self.table.pop(client, client_port, server_port)

    def expire(self, older_than_ns: int) -> int:
        return self.table.expire(older_than_ns)

    def kernel_drops(self) -> int:
        """Packets the kernel dropped for this capture since the last call."""
        _, drops = struct.unpack("II", self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        self.dropped += drops
        return int(drops)

    def close(self) -> None:
        self._sock.close()
