"""``iwprobe fetch --trace`` against an independent capture: Debian's ``tcpdump -w`` (root).

A lab ``Topology``: an ``iwprobe origin`` (arms 3, 10, 32: route ``initcwnd`` per arm via
``setup-routes``) behind a zero-delay link, the probe behind an emulated 100 Mbit/s, 100 ms RTT
link.  For each IW the probe fetches 100 KB with ``--trace`` while tcpdump captures the probe's
TUN device into a pcap, which this test parses itself (pcap global and record headers, IPv4 and
TCP headers with ``struct``) and from which it finds the server's first flight with its own,
simpler rule (the data before the first silence longer than a quarter of the RTT): the trace's
first flight (segments and bytes) must equal it, and the server's data packets must be the same
in both (relative sequence number and length, in order).

Both captures are ``AF_PACKET`` taps of the same device, so they see the same view: incoming
packets after the probe's GRO.  The lab's TUN devices are not NAPI devices (``IFF_TUN |
IFF_NO_PI``), so there is no GRO here: every data packet in both captures was one segment
(observed: 69 of 1,448 bytes and the 207-byte tail, at every IW; see the printed lines).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iwprobe._trace import Trace

topology_module = pytest.importorskip("iwscope_lab.topology")
pcap_module = pytest.importorskip("iwscope_lab.pcap")
PcapPacket, read_pcap = pcap_module.PcapPacket, pcap_module.read_pcap
Topology, Host, LinkSpec = topology_module.Topology, topology_module.Host, topology_module.LinkSpec

IWPROBE = [sys.executable, "-m", "iwprobe"]
IWS = (3, 10, 32)
BASE_PORT = 8700
OBJECT_BYTES = 100_000
RTT_MS = 100.0
#: The first flight ends at the first silence between data packets longer than this.
FLIGHT_GAP_NS = int(RTT_MS * 1e6 / 4)
SYN, ACK = 0x02, 0x10


def pcap_first_flight(packets: list[PcapPacket], server_port: int) -> tuple[int, int, list[tuple[int, int]]]:
    """(segments, bytes, [(relative seq, length) of every server data packet]) from tcpdump's
    capture: the first flight is the server's data up to the first silence > ``FLIGHT_GAP_NS``;
    a packet longer than the server's MSS (GRO) counts as the segments it holds."""
    syn = next(p for p in packets if p.dport == server_port and p.flags & SYN and not p.flags & ACK)
    syn_ack = next(p for p in packets if p.sport == server_port and p.flags & SYN and p.flags & ACK)
    data = [p for p in packets if p.sport == server_port and p.payload > 0]
    assert data, "tcpdump saw no data from the server"
    # The server's segments are capped by the MSS the probe announced in its SYN.
    mss = max(p.payload for p in data if syn.mss_option is None or p.payload <= syn.mss_option)
    flight = [data[0]]
    for before, after in zip(data, data[1:], strict=False):
        if after.time_ns - before.time_ns > FLIGHT_GAP_NS:
            break
        flight.append(after)
    segments = sum(-(-p.payload // mss) for p in flight)
    relative = [((p.seq - syn_ack.seq) % 2**32, p.payload) for p in data]
    return segments, sum(p.payload for p in flight), relative


def pcap_rows(packets: list[PcapPacket], server_port: int) -> list[tuple[int, int, int, int, int, int]]:
    """tcpdump's packets in the trace's terms, worked out here from the headers: (outgoing,
    seq relative to its sender's SYN, ack relative to the other's (0 without ACK), flags,
    length, window shifted by its sender's scale unless in a SYN)."""
    syn = next(p for p in packets if p.dport == server_port and p.flags & SYN and not p.flags & ACK)
    syn_ack = next(p for p in packets if p.sport == server_port and p.flags & SYN and p.flags & ACK)
    both = syn.wscale_option is not None and syn_ack.wscale_option is not None
    rows = []
    for p in packets:
        out = p.dport == server_port
        mine, theirs = (syn, syn_ack) if out else (syn_ack, syn)
        scale = (mine.wscale_option or 0) if both and not p.flags & SYN else 0
        ack = (p.ack - theirs.seq) % 2**32 if p.flags & ACK else 0
        rows.append((int(out), (p.seq - mine.seq) % 2**32, ack, p.flags, p.payload, p.window << scale))
    return rows


@pytest.fixture(scope="module")
def lab() -> Iterator[Any]:
    if os.geteuid() != 0:
        pytest.skip("the lab and the captures need root")
    assert shutil.which("tcpdump"), "tcpdump is missing: `make setup` installs Debian's tcpdump package"
    topo = Topology(
        f"iwt{secrets.token_hex(3)}",
        hosts=[
            Host("origin", role="origin", link=LinkSpec.symmetric()),
            Host("probe", role="probe", region="test", link=LinkSpec.symmetric(rate_bps=100_000_000, rtt_ms=RTT_MS)),
        ],
    )
    with topo:
        arms = ",".join(map(str, IWS))
        address = topo.host("origin").address
        setup = topo.run("origin", [*IWPROBE, "origin", "setup-routes", "--arms", arms], capture_output=True, text=True)
        assert setup.returncode == 0, setup.stderr
        command = [*IWPROBE, "--log-level", "WARNING", "origin", "--no-upload", "--arms", arms, "--base-port", str(BASE_PORT)]
        origin = topo.popen("origin", [*command, "--bind", address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        topo.wait_listening("probe", address, [BASE_PORT + iw for iw in IWS], server=origin)
        yield topo


def _fetch_traced(lab: Any, iw: int, trace_file: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``iwprobe fetch --trace`` of the test object from the origin's IW ``iw`` arm, in the probe's namespace."""
    url = f"http://{lab.host('origin').address}/obj/{OBJECT_BYTES}"
    command = [*IWPROBE, "fetch", *options, "--arm", str(iw), "--base-port", str(BASE_PORT), "--trace", str(trace_file), url]
    return lab.run("probe", command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("iw", IWS)
def test_the_traces_first_flight_is_the_one_tcpdump_saw(lab: Any, iw: int, tmp_path: Path) -> None:
    port = BASE_PORT + iw
    pcap, trace_file = tmp_path / "probe.pcap", tmp_path / "trace.json"
    with pcap_module.tcpdump(lab, "probe", pcap, f"tcp port {port}") as capture:
        outcome = _fetch_traced(lab, iw, trace_file)
    errors = capture.errors
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    assert "trace:" in outcome.stdout, outcome.stdout

    text = trace_file.read_text()
    trace = Trace.from_dict(json.loads(text))
    flight = None if trace.first_flight is None else (trace.first_flight["segments"], trace.first_flight["bytes"])
    captured = read_pcap(pcap)
    segments, flight_bytes, relative = pcap_first_flight(captured, port)
    trace_data = [(trace.seq[i], trace.length[i]) for i in range(len(trace)) if not trace.outgoing[i] and trace.length[i]]
    print(
        f"IW {iw}: trace first flight {flight}, tcpdump ({segments}, {flight_bytes}); "
        f"trace {len(trace)} packets ({len(trace_data)} data, lengths {sorted({n for _, n in trace_data})}), "
        f"tcpdump {len(captured)} packets ({len(relative)} data); trace JSON {len(text)} bytes "
        f"({len(text) / len(trace):.1f}/packet), rcv_mss {trace.rcv_mss}, min_rtt {trace.min_rtt_us} us, "
        f"dropped {trace.dropped}; tcpdump: {errors.strip().splitlines()[-2:]}"
    )
    assert trace.dropped == 0
    assert flight == (segments, flight_bytes), (flight, segments, flight_bytes)
    assert trace_data == relative  # the same data packets, the same relative numbers
    # Every packet of the trace is tcpdump's, in the same order, field by field; tcpdump has the
    # close too: the trace is read right after the probe's socket is closed, so the last packets
    # come after it (observed: 2, the server's FIN about an RTT later and the probe's ACK of it).
    rows = pcap_rows(captured, port)
    assert (
        list(zip(trace.outgoing, trace.seq, trace.ack, trace.flags, trace.length, trace.window, strict=True))
        == rows[: len(trace)]
    )
    assert 0 <= len(rows) - len(trace) <= 4, rows[len(trace) :]
    assert any(flags & 0x01 for _, _, _, flags, _, _ in rows[len(trace) - 1 :]), "the rest is the connection's close"
    print(f"  after the trace, tcpdump saw {rows[len(trace) :]}")
    assert segments == iw  # the route's initcwnd: the setup measured what it meant to
    assert sum(n for _, n in trace_data) > OBJECT_BYTES
    # The size docs/probe.md quotes (compact JSON of a 100 KB trial on this path).
    assert len(text) / len(trace) < 40 and len(text) < 6_000, (len(text), len(trace))


def test_a_first_flight_cut_by_a_small_client_window_is_flagged_and_the_trace_shows_why(lab: Any, tmp_path: Path) -> None:
    """A probe whose socket starts with a small receive buffer (``tcp_rmem`` 8 KB) advertises a
    window far below IW 32: the inference says ``lower_bound`` / ``receive_window`` rather than
    a wrong IW, and the trace holds why -- the first flight ends at the window the probe
    advertised (its ``ack + window``, the receive-window line of the plot)."""
    trace_file = tmp_path / "trace.json"
    before = lab.run("probe", ["sysctl", "-n", "net.ipv4.tcp_rmem"], capture_output=True, text=True).stdout.split()
    assert len(before) == 3, before
    lab.run("probe", ["sysctl", "-q", "-w", "net.ipv4.tcp_rmem=4096 8192 8192"], check=True)
    try:
        outcome = _fetch_traced(lab, 32, trace_file, "--json")
    finally:
        lab.run("probe", ["sysctl", "-q", "-w", f"net.ipv4.tcp_rmem={' '.join(before)}"], check=True)
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    client_iw = json.loads(outcome.stdout)["client_iw"]
    assert (client_iw["status"], client_iw["reason"]) == ("lower_bound", "receive_window"), client_iw
    trace = Trace.from_dict(json.loads(trace_file.read_text()))
    assert trace.first_flight is not None
    count, flight_bytes = trace.first_flight["packets"], trace.first_flight["bytes"]
    data = [i for i in range(len(trace)) if not trace.outgoing[i] and trace.length[i]][:count]
    last = data[-1]
    # the window the probe had advertised when the flight left: its last packet before the data
    advertised = max(i for i in range(data[0]) if trace.outgoing[i])
    limit = trace.ack[advertised] + trace.window[advertised]
    flight_end = trace.seq[last] + trace.length[last]
    print(
        f"tcp_rmem 8 KB: client_iw {client_iw}; first flight {flight_bytes} bytes ending at {flight_end}, "
        f"the probe's window line at {limit}"
    )
    assert flight_end <= limit < 32 * trace.first_flight["mss"]  # the window, not IW 32, ended the flight
    assert limit - flight_end < trace.first_flight["mss"]  # ... and the flight filled it
