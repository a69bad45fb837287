"""The time-sequence plot of a trial trace (``iwscope_dashboard.tracefigures``) and ``iwscope trace plot``.

Traces are built the way the probe builds them: synthetic :class:`iwprobe._capture.Packet`\\ s
(absolute sequence numbers, window fields unscaled) turned into a dict by
:meth:`iwprobe._trace.Trace.from_packets` / ``to_dict``.  The figure module draws the first
flight the probe wrote into the trace and checks a file's shape as ``Trace.from_dict`` does (the
dashboard may not import it); these tests hold both to the probe's.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iwprobe._capture import ACK, SYN, Packet
from iwprobe._iwinfer import first_flight as inference_first_flight
from iwprobe._trace import Trace
from iwscope_dashboard import tracefigures
from iwscope_dashboard.trace_cli import trace as trace_group

pytestmark = pytest.mark.unit  # pure code, no root, no services

RTT_NS = 100_000_000
MSS = 1448
SPACING_NS = 120_000
PSH = 0x08
CLIENT_ISN, SERVER_ISN = 1_000_000, 4_294_000_000  # the server's numbers wrap during the transfer
CLIENT_WSCALE, SERVER_WSCALE = 7, 9
START_NS = 1_764_000_000_000_000_000
WRAP = 2**32


class Connection:
    """One fetch as the probe captures it, in capture order."""

    def __init__(self) -> None:
        self.packets: list[Packet] = []
        self.client_next = CLIENT_ISN + 1
        self.server_next = SERVER_ISN + 1

    def add(
        self, time_ns: int, outgoing: bool, seq: int, ack: int, flags: int, window: int, payload: int = 0, **options: int
    ) -> None:
        self.packets.append(
            Packet(
                START_NS + time_ns,
                outgoing,
                seq % WRAP,
                ack % WRAP,
                flags,
                payload,
                window,
                options.get("mss"),
                options.get("wscale"),
            )
        )

    def handshake(self) -> int:
        self.add(0, True, CLIENT_ISN, 0, SYN, 64240, mss=1460, wscale=CLIENT_WSCALE)
        self.add(RTT_NS, False, SERVER_ISN, self.client_next, SYN | ACK, 65160, mss=1460, wscale=SERVER_WSCALE)
        self.add(RTT_NS + 50_000, True, self.client_next, self.server_next, ACK, 502)
        self.add(RTT_NS + 60_000, True, self.client_next, self.server_next, ACK | PSH, 502, 120)
        self.client_next += 120
        return RTT_NS + 60_000

    def segment(self, time_ns: int, offset: int, size: int = MSS) -> None:
        """Server data at stream ``offset`` (0 = the first byte), without the probe's ACK."""
        self.add(time_ns, False, SERVER_ISN + 1 + offset, self.client_next, ACK, 128, size)

    def ack(self, time_ns: int, received: int) -> None:
        """The probe's ACK of the stream's first ``received`` bytes."""
        self.add(time_ns, True, self.client_next, SERVER_ISN + 1 + received, ACK, 502)


def transfer(merge: int = 1) -> Connection:
    """A 10-segment first flight one RTT after the request, then a second flight of 20 segments
    whose 4th is lost (duplicate ACKs) and retransmitted one RTT later, then a third of 10;
    ``merge``: the first flight arrives ``merge`` segments per packet (GRO)."""
    conn = Connection()
    start = conn.handshake() + RTT_NS
    received = 0
    for index in range(0, 10, merge):
        size = MSS * min(merge, 10 - index)
        conn.segment(start + index * SPACING_NS, received, size)
        received += size
        conn.ack(start + index * SPACING_NS + 20_000, received)
    start += RTT_NS
    lost = 3
    for index in range(20):
        if index == lost:
            continue
        conn.segment(start + index * SPACING_NS, (10 + index) * MSS)
        if index < lost:
            received += MSS
        conn.ack(start + index * SPACING_NS + 20_000, received)  # duplicates after the hole
    start += RTT_NS
    conn.segment(start, (10 + lost) * MSS)  # the retransmission fills the hole
    received = 30 * MSS
    conn.ack(start + 20_000, received)
    for index in range(1, 11):
        conn.segment(start + index * SPACING_NS, (30 + index - 1) * MSS)
        received += MSS
        conn.ack(start + index * SPACING_NS + 20_000, received)
    return conn


def trace_dict(merge: int = 1, **extras: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"rcv_mss": MSS, "min_rtt_us": RTT_NS // 1000}
    settings.update(extras)
    return Trace.from_packets(transfer(merge).packets, **settings).to_dict()


def by_name(figure: Any) -> dict[str, Any]:
    return {trace.name: trace for trace in figure.data}


def test_every_received_data_packet_is_one_marker_and_the_first_flight_is_ten() -> None:
    data = trace_dict()
    figure = tracefigures.time_sequence_figure(data)
    traces = by_name(figure)
    assert [trace.name for trace in figure.data] == [
        "first flight",
        "data",
        "retransmission",
        "ACK",
        "receive window (ack + window)",
    ]
    received = [i for i in range(data["packets"]) if not data["outgoing"][i] and data["length"][i] > 0]
    markers = sum(len(traces[name].x) for name in ("first flight", "data", "retransmission"))
    assert markers == len(received) == 10 + 19 + 1 + 10
    assert len(traces["first flight"].x) == 10
    # Markers at (ms since the SYN, the segment's end in relative sequence numbers).
    assert list(traces["first flight"].y) == [1 + (k + 1) * MSS for k in range(10)]
    assert traces["first flight"].x[0] == pytest.approx((2 * RTT_NS + 60_000) / 1e6)
    # The first flight as the probe's own Trace finds it, and in the title.
    assert Trace.from_dict(data).first_flight == data["first_flight"]
    assert "first flight 10 segments / 14,480 bytes" in figure.layout.title.text
    assert "wscale 7/9" in figure.layout.title.text and "min RTT 100.0 ms" in figure.layout.title.text


def test_the_retransmission_is_marked_where_it_arrived() -> None:
    data = trace_dict()
    traces = by_name(tracefigures.time_sequence_figure(data))
    retransmission = traces["retransmission"]
    assert len(retransmission.x) == 1
    assert retransmission.y[0] == 1 + 14 * MSS  # the 14th segment's end: below the highest seen
    assert retransmission.x[0] == pytest.approx((4 * RTT_NS + 60_000) / 1e6)
    assert retransmission.marker.color != traces["data"].marker.color != traces["first flight"].marker.color
    assert "bytes %{customdata[0]:,}" in retransmission.hovertemplate
    assert list(retransmission.customdata[0]) == [1 + 13 * MSS, 14 * MSS, MSS, "ACK"]


def test_the_acks_and_the_receive_window_limit_are_the_probes_packets() -> None:
    data = trace_dict()
    traces = by_name(tracefigures.time_sequence_figure(data))
    acks = [i for i in range(data["packets"]) if data["outgoing"][i] and data["flags"][i] & ACK]
    assert list(traces["ACK"].y) == [data["ack"][i] for i in acks]
    window = traces["receive window (ack + window)"]
    assert list(window.y) == [data["ack"][i] + data["window"][i] for i in acks]
    assert {y - a for y, a in zip(window.y, traces["ACK"].y, strict=True)} == {502 << CLIENT_WSCALE}  # scaled to bytes
    assert window.line.shape == traces["ACK"].line.shape == "hv"


def test_times_are_the_traces_and_round_trips_are_bands_from_the_syn() -> None:
    data = trace_dict()
    figure = tracefigures.time_sequence_figure(data, title="lab path 100 ms")
    times = {t / 1000 for t in data["t_us"]}
    plotted = [x for trace in figure.data for x in trace.x]
    assert set(plotted) <= times and min(plotted) >= 0
    bands = [shape for shape in figure.layout.shapes if shape.type == "rect"]
    rtt_ms = RTT_NS / 1e6
    end_ms = max(times)
    assert [(band.x0, band.x1) for band in bands] == [(k * 2 * rtt_ms, min((k * 2 + 1) * rtt_ms, end_ms)) for k in range(3)]
    assert bands[-1].x1 == end_ms  # the last band stops with the trace (4 RTTs and a bit)
    assert figure.layout.title.text.startswith("lab path 100 ms<br>")
    assert figure.layout.legend.orientation == "h" and figure.layout.legend.y < 0  # below the plot, clear of the title
    assert "ms" in figure.layout.xaxis.title.text and "bytes" in figure.layout.yaxis.title.text


def test_a_negative_time_in_the_trace_is_plotted_as_it_is() -> None:
    data = trace_dict()
    data["t_us"][0] = 40  # the SYN stamped late (outgoing stamps are not departures)
    data["t_us"] = [t - 40 for t in data["t_us"]]
    figure = tracefigures.time_sequence_figure(data)
    plotted = [x for trace in figure.data for x in trace.x]
    assert min(plotted) >= min(data["t_us"]) / 1000


@pytest.mark.parametrize(
    ("merge", "extras"), [(1, {}), (4, {}), (4, {"rcv_mss": None}), (1, {"min_rtt_us": 95_000}), (1, {"min_rtt_us": None})]
)
def test_the_drawn_first_flight_is_the_inferences_split(merge: int, extras: dict[str, Any]) -> None:
    """The figure draws the flight the probe split on the captured packets (no second
    implementation): the same packets as the inference's window on the original packets."""
    settings: dict[str, Any] = {"rcv_mss": MSS, "min_rtt_us": RTT_NS // 1000, **extras}
    packets = transfer(merge).packets
    data = Trace.from_packets(packets, **settings).to_dict()
    drawn = tracefigures.first_flight(data)
    split = inference_first_flight(packets, **settings)
    if split is None:
        assert drawn is None
    else:
        assert drawn is not None and (drawn.segments, drawn.payload_bytes) == (split.segments, split.payload_bytes)
        received = [p for p in packets if not p.outgoing and p.payload > 0]
        assert [received.index(p) for p in split.window] == list(range(len(drawn.indexes)))
    markers = len(by_name(tracefigures.time_sequence_figure(data))["first flight"].x)
    assert markers == (0 if drawn is None else len(drawn.indexes))


def test_a_file_the_wire_check_refuses_is_refused_by_the_figure() -> None:
    good = trace_dict()
    for bad in ({**good, "version": 2}, {**good, "seq": good["seq"][:-1]}, {**good, "first_flight": {"segments": "ten"}}):
        with pytest.raises(ValueError):
            tracefigures.time_sequence_figure(bad)


def test_plot_writes_a_self_contained_html_and_prints_its_path(tmp_path: Path) -> None:
    source = tmp_path / "trial.json"
    source.write_text(json.dumps(trace_dict()))
    out = tmp_path / "trial.html"
    result = CliRunner().invoke(trace_group, ["plot", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{out}\n"
    html = out.read_text()
    assert 'class="plotly-graph-div"' in html
    assert "first flight" in html
    assert "<script src=" not in html and len(html) > 1_000_000  # plotly.js inlined: opens offline


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"version": 0, "packets": 0}', "not a version 1 trace (version 0)"),
        ("not json", "cannot read a JSON trace"),
        (None, "cannot read a JSON trace"),
    ],
)
def test_plot_refuses_a_bad_file_in_one_line_with_exit_2(tmp_path: Path, content: str | None, message: str) -> None:
    source = tmp_path / "trial.json"
    if content is not None:
        source.write_text(content)
    out = tmp_path / "trial.html"
    result = CliRunner().invoke(trace_group, ["plot", str(source), "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr and str(source) in result.stderr
    assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("kaleido") is not None, reason="kaleido is installed: PNG works")
def test_png_without_kaleido_says_so(tmp_path: Path) -> None:
    source = tmp_path / "trial.json"
    source.write_text(json.dumps(trace_dict()))
    result = CliRunner().invoke(trace_group, ["plot", str(source), "--out", str(tmp_path / "trial.png")])
    assert result.exit_code == 1
    assert "kaleido" in result.stderr and "not installed" in result.stderr


def test_the_command_module_does_not_import_plotly() -> None:
    """``iwscope --help`` loads every plugin: plotly waits for the command itself."""
    code = "import sys, iwscope_dashboard.trace_cli; print('plotly' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout == "False\n"
    )
