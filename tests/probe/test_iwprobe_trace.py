"""The trial trace (``iwprobe._trace``) on packets built as bytes and parsed as the capture does.

No root, no network: packets are made with ``tests/probe/packets.py`` the way an ``AF_PACKET``
capture hands them over (headers only, the payload counted in the IP length), parsed by
:func:`iwprobe._capture.parse_packet` and turned into a :class:`iwprobe._trace.Trace`.  The
netns test against tcpdump is ``test_iwprobe_trace_netns.py``.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest
from packets import CLIENT_V4, SERVER_V4, ipv4, tcp_header

from iwprobe import __main__ as cli
from iwprobe import _capture
from iwprobe._capture import ACK, FIN, SYN, Packet, parse_packet
from iwprobe._fetch import FetchResult
from iwprobe._iwinfer import first_flight, infer
from iwprobe._trace import Trace
from iwprobe.wire import TRACE_COLUMNS as COLUMNS
from iwprobe.wire import TRACE_VERSION

pytestmark = pytest.mark.unit  # pure code, no root, no services

CLIENT_PORT, SERVER_PORT = 40000, 8010
RTT_NS = 100_000_000
MSS = 1448
SPACING_NS = 120_000
PSH = 0x08
WRAP = 2**32


def syn_options(mss: int, wscale: int | None) -> bytes:
    options = struct.pack("!BBH", 2, 4, mss)
    return options + (struct.pack("!BBBB", 1, 3, 3, wscale) if wscale is not None else b"\x01\x01\x01\x01")


class Wire:
    """One connection as the probe's capture sees it: bytes in, parsed :class:`Packet`\\ s out."""

    def __init__(
        self,
        client_isn: int = 1_000_000,
        server_isn: int = 3_000_000_000,
        client_wscale: int | None = 7,
        server_wscale: int | None = 9,
        start_ns: int = 1_764_000_000_000_000_000,
    ) -> None:
        self.client_isn, self.server_isn = client_isn, server_isn
        self.client_wscale, self.server_wscale = client_wscale, server_wscale
        self.start_ns = start_ns
        self.client_next, self.server_next = (client_isn + 1) % WRAP, (server_isn + 1) % WRAP
        self.packets: list[Packet] = []

    def _add(
        self, time_ns: int, outgoing: bool, seq: int, ack: int, flags: int, window: int, payload: int, options: bytes = b""
    ) -> None:
        ports = (CLIENT_PORT, SERVER_PORT) if outgoing else (SERVER_PORT, CLIENT_PORT)
        addresses = (CLIENT_V4, SERVER_V4) if outgoing else (SERVER_V4, CLIENT_V4)
        data = ipv4(tcp_header(*ports, seq, ack, flags, window, options), payload, source=addresses[0], destination=addresses[1])
        packet = parse_packet(data, self.start_ns + time_ns, outgoing, CLIENT_PORT)
        assert packet is not None
        self.packets.append(packet)

    def handshake(self, request: int = 120) -> int:
        """SYN at 0, SYN-ACK one RTT later, the ACK and the request; the request's time."""
        self._add(0, True, self.client_isn, 0, SYN, 64240, 0, syn_options(1460, self.client_wscale))
        self._add(RTT_NS, False, self.server_isn, self.client_next, SYN | ACK, 65160, 0, syn_options(1460, self.server_wscale))
        self._add(RTT_NS + 50_000, True, self.client_next, self.server_next, ACK, 502, 0)
        self._add(RTT_NS + 60_000, True, self.client_next, self.server_next, ACK | PSH, 502, request)
        self.client_next = (self.client_next + request) % WRAP
        return RTT_NS + 60_000

    def data(self, time_ns: int, size: int = MSS, flags: int = ACK) -> None:
        """A server packet of ``size`` payload bytes (several segments' if GRO merged them) and the probe's ACK."""
        self._add(time_ns, False, self.server_next, self.client_next, flags, 128, size)
        self.server_next = (self.server_next + size + (1 if flags & FIN else 0)) % WRAP
        self._add(time_ns + 20_000, True, self.client_next, self.server_next, ACK, 502, 0)

    def flight(self, start_ns: int, count: int, merge: int = 1) -> None:
        """``count`` back-to-back segments, arriving ``merge`` at a time (GRO)."""
        for index in range(0, count, merge):
            self.data(start_ns + index * SPACING_NS, MSS * min(merge, count - index))


def transfer(iw: int, total_segments: int = 70, merge: int = 1, **kwargs: object) -> Wire:
    """A window of ``iw`` segments one RTT after the request, then slow start's rounds."""
    wire = Wire(**kwargs)  # type: ignore[arg-type]
    start = wire.handshake() + RTT_NS
    sent, window = 0, iw
    while sent < total_segments:
        count = min(window, total_segments - sent)
        wire.flight(start, count, merge)
        sent += count
        start += RTT_NS
        window *= 2
    return wire


def test_relative_numbers_directions_and_times() -> None:
    wire = transfer(10, total_segments=30)
    trace = Trace.from_packets(wire.packets)
    assert len(trace) == len(wire.packets) == 4 + 2 * 30
    assert all(len(getattr(trace, name)) == len(trace) for name in COLUMNS)
    # Handshake: SYN, SYN-ACK, ACK, request.
    assert trace.outgoing[:4] == [1, 0, 1, 1]
    assert trace.seq[:4] == [0, 0, 1, 1]
    assert trace.ack[:4] == [0, 1, 1, 1]  # no ACK flag on the SYN: 0
    assert trace.flags[:4] == [SYN, SYN | ACK, ACK, ACK | PSH]
    assert trace.length[:4] == [0, 0, 0, 120]
    assert trace.t_us[:4] == [0, RTT_NS // 1000, RTT_NS // 1000 + 50, RTT_NS // 1000 + 60]
    # The server's data: the first byte is 1, each packet follows the last; the probe ACKs it.
    data = [i for i in range(len(trace)) if not trace.outgoing[i] and trace.length[i]]
    assert [trace.seq[i] for i in data] == [1 + k * MSS for k in range(30)]
    assert all(trace.ack[i] == 121 for i in data)  # the request's 120 bytes acknowledged
    acks = [i + 1 for i in data]
    assert [trace.ack[i] for i in acks] == [1 + (k + 1) * MSS for k in range(30)]
    assert (trace.client_mss, trace.server_mss, trace.client_wscale, trace.server_wscale) == (1460, 1460, 7, 9)
    assert trace.version == TRACE_VERSION and trace.dropped == 0


def test_a_syn_stamped_after_its_syn_ack_is_not_time_zero() -> None:
    """An outgoing stamp is TCP's earliest departure time: a SYN stamped after its SYN-ACK
    arrived (seen in the lab) would put every incoming packet before zero.  Time zero is then
    the SYN-ACK's arrival less the smallest RTT; the flight's cutoff moves with it."""
    good = Trace.from_packets(transfer(10, total_segments=10).packets, min_rtt_us=RTT_NS // 1000)
    late = transfer(10, total_segments=10)
    late.packets[0] = dataclasses.replace(late.packets[0], time_ns=late.packets[0].time_ns + 3 * RTT_NS)
    trace = Trace.from_packets(late.packets, min_rtt_us=RTT_NS // 1000)
    assert trace.t_us[1:] == good.t_us[1:] and trace.t_us[1] == RTT_NS // 1000
    assert trace.t_us[0] == 3 * RTT_NS // 1000  # the SYN keeps its own (late) stamp
    assert trace.first_flight is not None and good.first_flight is not None
    assert trace.first_flight["cutoff_us"] == good.first_flight["cutoff_us"]


def test_windows_are_scaled_by_their_senders_option_but_not_in_syns() -> None:
    trace = Trace.from_packets(transfer(10, total_segments=10).packets)
    assert trace.window[0] == 64240 and trace.window[1] == 65160  # SYN and SYN-ACK: never scaled
    assert {trace.window[i] for i in range(2, len(trace)) if trace.outgoing[i]} == {502 << 7}
    assert {trace.window[i] for i in range(2, len(trace)) if not trace.outgoing[i]} == {128 << 9}


@pytest.mark.parametrize(("client", "server"), [(7, None), (None, 9), (None, None)])
def test_without_both_window_scale_options_windows_are_the_field(client: int | None, server: int | None) -> None:
    trace = Trace.from_packets(transfer(10, total_segments=10, client_wscale=client, server_wscale=server).packets)
    assert not trace.scaled
    assert (trace.client_wscale, trace.server_wscale) == (client, server)
    assert {trace.window[i] for i in range(2, len(trace))} == {502, 128}


@pytest.mark.parametrize(("client_isn", "server_isn"), [(WRAP - 50, WRAP - 3000), (0, WRAP - 1)])
def test_sequence_numbers_are_relative_across_the_wrap(client_isn: int, server_isn: int) -> None:
    trace = Trace.from_packets(transfer(4, total_segments=12, client_isn=client_isn, server_isn=server_isn).packets)
    data = [i for i in range(len(trace)) if not trace.outgoing[i] and trace.length[i]]
    assert [trace.seq[i] for i in data] == [1 + k * MSS for k in range(12)]
    assert trace.seq[3] == 1 and trace.ack[1] == 1


def test_a_capture_without_the_syns_numbers_from_the_first_packet() -> None:
    packets = transfer(4, total_segments=8).packets[2:]
    trace = Trace.from_packets(packets)
    assert trace.client_mss is None and trace.server_wscale is None
    assert trace.t_us[0] == 0  # times from the first packet
    assert trace.seq[:2] == [1, 1]  # the ACK and the request: the probe's first bytes
    assert trace.seq[2] == 1 and not trace.outgoing[2]  # the server's first data
    assert trace.first_flight is None  # no handshake: no flight


@pytest.mark.parametrize("iw", [3, 10, 32])
def test_first_flight_is_the_inferences_window(iw: int) -> None:
    packets = transfer(iw).packets
    trace = Trace.from_packets(packets, rcv_mss=MSS, min_rtt_us=RTT_NS // 1000)
    expected = infer(packets, rcv_mss=MSS, min_rtt_us=RTT_NS // 1000)
    assert (expected.status, expected.iw_segments) == ("ok", iw)
    assert trace.first_flight is not None
    assert (trace.first_flight["segments"], trace.first_flight["bytes"]) == (expected.iw_segments, expected.iw_bytes)
    assert trace.first_flight["packets"] == iw  # one segment per packet here (no GRO)


def test_first_flight_counts_gro_merged_packets_in_the_senders_segments() -> None:
    packets = transfer(10, merge=4).packets  # 10 segments arrive as packets of 4, 4, 2
    trace = Trace.from_packets(packets, rcv_mss=MSS)
    flight = [trace.length[i] for i in range(len(trace)) if not trace.outgoing[i] and trace.length[i]][:3]
    assert flight == [4 * MSS, 4 * MSS, 2 * MSS]  # the lengths as captured
    assert trace.first_flight is not None
    assert (trace.first_flight["packets"], trace.first_flight["segments"], trace.first_flight["bytes"]) == (3, 10, 10 * MSS)
    # Without rcv_mss a merged packet above the announced MSS leaves the segment size unknown.
    assert Trace.from_packets(packets).first_flight is None


def test_the_flight_is_split_at_capture_precision_not_the_columns() -> None:
    """A packet 0.4 us before the inference's cutoff: in the flight (the split ran on ns stamps);
    rounded to microseconds it would sit on the cutoff -- why the trace stores the split."""
    packets = transfer(10, total_segments=20).packets
    data = [p for p in packets if not p.outgoing and p.payload]
    cutoff = data[0].time_ns + int(0.75 * RTT_NS)
    late = dataclasses.replace(data[10], time_ns=cutoff - 400)
    packets = [late if p is data[10] else p for p in packets]
    trace = Trace.from_packets(packets, rcv_mss=MSS, min_rtt_us=RTT_NS // 1000)
    expected = first_flight(packets, rcv_mss=MSS, min_rtt_us=RTT_NS // 1000)
    assert expected is not None and len(expected.window) == 11
    assert trace.first_flight is not None and trace.first_flight["packets"] == 11


def test_to_dict_from_dict_round_trip_through_json() -> None:
    trace = Trace.from_packets(transfer(10).packets, rcv_mss=MSS, min_rtt_us=100_012, dropped=0)
    data = json.loads(json.dumps(trace.to_dict()))
    assert data["version"] == TRACE_VERSION and data["packets"] == len(trace)
    assert set(data) >= set(COLUMNS) | {"client_mss", "server_mss", "client_wscale", "server_wscale", "rcv_mss", "min_rtt_us"}
    assert Trace.from_dict(data) == trace
    # the first data 200.06 ms after the SYN + 0.75 of the 100 ms RTT: the inference's cutoff
    flight = {"packets": 10, "segments": 10, "bytes": 10 * MSS, "rtt_us": 100_000, "mss": MSS, "cutoff_us": 275_060}
    assert data["first_flight"] == flight


@pytest.mark.parametrize(
    "change",
    [
        {"version": 2},
        {"version": None},
        {"seq": [1, 2]},
        {"flags": "16"},
        {"length": [True] * 10},
        {"packets": 3},
        {"rcv_mss": "1448"},
        {"dropped": 1.5},
        {"dropped": None},
        {"first_flight": {"segments": "ten"}},
    ],
)
def test_from_dict_refuses_other_versions_and_malformed_traces(change: dict) -> None:
    data = Trace.from_packets(transfer(3, total_segments=3).packets).to_dict()
    assert len(data["seq"]) == 10
    with pytest.raises(ValueError):
        Trace.from_dict({**data, **change})


def test_json_size_per_packet_of_a_100_kb_trial() -> None:
    """~70 full segments (100 KB) and the probe's ACKs: the compact JSON stays small."""
    wire = transfer(10, total_segments=70)
    trace = Trace.from_packets(wire.packets, rcv_mss=MSS, min_rtt_us=100_000)
    text = json.dumps(trace.to_dict(), separators=(",", ":"))
    per_packet = len(text) / len(trace)
    print(f"{len(trace)} packets, {len(text)} bytes, {per_packet:.1f} bytes/packet")
    assert len(trace) == 4 + 2 * 70
    assert per_packet < 45, per_packet
    assert len(text) < 6500


def test_the_cli_writes_the_fetchs_trace(tmp_path: Path) -> None:
    packets = transfer(10).packets
    result = FetchResult(url="http://x/obj/1", started_at="", packets=packets, tcp_info={"rcv_mss": MSS, "min_rtt": 100_000})
    line = cli._write_trace(str(tmp_path / "t.json"), result)
    text = (tmp_path / "t.json").read_text()
    assert f"{len(packets)} packets, {len(text)} bytes" in line
    trace = Trace.from_dict(json.loads(text))
    assert trace == Trace.from_packets(packets, rcv_mss=MSS, min_rtt_us=100_000)
    assert trace.first_flight is not None and trace.first_flight["segments"] == 10


def test_fetch_trace_without_the_capture_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_capture, "capture_status", lambda: "off: not root (the capture needs CAP_NET_RAW)")
    code = cli.main(["fetch", "--trace", str(tmp_path / "t.json"), "http://127.0.0.1:9/obj/1"])
    assert code == 2
    assert "--trace needs the packet capture" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_the_origin_keeps_only_its_client_s_packets_and_reads_the_trace_request() -> None:
    """The origin's capture shares its listening port with every client: ``remote_port``
    keeps one connection; the request head's trace header says whether to capture at all."""
    from iwprobe._http import wants_trace

    def packet(client_port: int, outgoing: bool) -> bytes:
        ports = (SERVER_PORT, client_port) if outgoing else (client_port, SERVER_PORT)
        addresses = (SERVER_V4, CLIENT_V4) if outgoing else (CLIENT_V4, SERVER_V4)
        return ipv4(tcp_header(*ports, 1, 1, ACK, 500), 100, source=addresses[0], destination=addresses[1])

    for outgoing in (True, False):
        assert parse_packet(packet(CLIENT_PORT, outgoing), 0, outgoing, SERVER_PORT, CLIENT_PORT) is not None
        assert parse_packet(packet(CLIENT_PORT + 1, outgoing), 0, outgoing, SERVER_PORT, CLIENT_PORT) is None
        assert parse_packet(packet(CLIENT_PORT + 1, outgoing), 0, outgoing, SERVER_PORT) is not None  # no remote port: all
    head = b"GET /obj/9000 HTTP/1.1\r\nHost: x\r\nX-Iwscope-Trial: 0b6f7f3e-1d1c-4f0e-9a55-3f0d2b4c5a61"
    assert not wants_trace(head)
    assert wants_trace(head + b"\r\nx-iwscope-trace: 1")
    assert not wants_trace(head + b"\r\nX-Iwscope-Trace: 0")
    assert not wants_trace(b"GET /obj/1 HTTP/1.1\r\nX-Iwscope-Trace-Not: 1")
