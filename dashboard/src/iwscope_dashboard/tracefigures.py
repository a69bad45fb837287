"""The time-sequence plot of one trial's packet trace (``iwprobe fetch --trace FILE``).

The plot network engineers read in tcptrace or Wireshark's "Stevens" graph, drawn from the
receiver's side (the probe's capture): time since the probe's SYN across, the server's relative
sequence numbers up; one marker per data packet the probe received at the end of its bytes
(``seq + length``: the sequence number the probe's ACK of it carries), the probe's ACKs and the
receive window it offered (``ack + window``) as steps, the server's first flight and its
retransmissions in their own colours, and alternate round trips shaded.

The trace is the plain dict of ``iwprobe._trace.Trace.to_dict`` (format version 1, see
docs/probe.md "Trial traces").  The dashboard may import only ``iwprobe.wire`` from the probe
(tests/test_import_graph.py), which specifies the format and its one check
(:func:`iwprobe.wire.check_trace`); the probe writes the first flight into the trace (the
inference's own split, ``first_flight``), so this module only draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from iwprobe.wire import check_trace

#: Round-trip bands are drawn only when the trace spans at most this many round trips (a loopback
#: RTT of 13 µs over a 3.5 ms trace is 270: stripes, not rounds one can count).
MAX_BANDS = 100

_SYN, _ACK = 0x02, 0x10
_FLAG_NAMES = (
    (0x01, "FIN"),
    (0x02, "SYN"),
    (0x04, "RST"),
    (0x08, "PSH"),
    (0x10, "ACK"),
    (0x20, "URG"),
    (0x40, "ECE"),
    (0x80, "CWR"),
)

FIRST_FLIGHT_COLOUR = "#d9731a"
DATA_COLOUR = "#1f6fb2"
RETRANSMISSION_COLOUR = "#c0392b"
ACK_COLOUR = "#2a9d55"
WINDOW_COLOUR = "#8e44ad"
_BAND_COLOUR = "#eef2f7"
_GRID = "#e6ebf2"


@dataclass(frozen=True)
class FirstFlight:
    """The server's first flight as the probe split it (the trace's ``first_flight``) and the
    received data packets it covers (their indexes in the trace)."""

    indexes: tuple[int, ...]
    #: The sender's segment size that counts GRO-merged packets, the RTT and the split (µs).
    mss: int
    rtt_us: int
    cutoff_us: int
    segments: int
    payload_bytes: int


def first_flight(trace: Mapping[str, Any]) -> FirstFlight | None:
    """The first flight the probe wrote into the trace (the IW inference's own split, made on
    the captured packets): the first ``packets`` received data packets.  None when the probe
    found none (no handshake, data or RTT)."""
    summary = trace.get("first_flight")
    if not isinstance(summary, Mapping):
        return None
    outgoing, length = trace["outgoing"], trace["length"]
    received = [i for i in range(len(length)) if not outgoing[i] and length[i] > 0]
    return FirstFlight(
        indexes=tuple(received[: int(summary["packets"])]),
        mss=int(summary["mss"]),
        rtt_us=int(summary["rtt_us"]),
        cutoff_us=int(summary["cutoff_us"]),
        segments=int(summary["segments"]),
        payload_bytes=int(summary["bytes"]),
    )


def flag_names(flags: int) -> str:
    """``0x18`` -> ``"PSH|ACK"`` (tcpdump's order of the bits, lowest first)."""
    return "|".join(name for bit, name in _FLAG_NAMES if flags & bit) or "none"


def duration(us: int) -> str:
    """``100000`` -> ``"100.0 ms"``, ``13`` -> ``"13 µs"`` (a loopback RTT is not 0.0 ms)."""
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us} µs"


def summary(trace: Mapping[str, Any], flight: FirstFlight | None = None) -> str:
    """One line: packets, first flight, MSS, window scales, min RTT, drops."""
    parts = [f"{len(trace['t_us'])} packets"]
    if flight is not None:
        noun = "segment" if flight.segments == 1 else "segments"
        parts.append(f"first flight {flight.segments} {noun} / {flight.payload_bytes:,} bytes")
    else:
        parts.append("first flight unknown")
    mss = [
        f"{side} {trace.get(key) if trace.get(key) is not None else '-'}"
        for side, key in (("client", "client_mss"), ("server", "server_mss"))
    ]
    parts.append("MSS " + ", ".join(mss) + (f" (rcv_mss {trace['rcv_mss']})" if trace.get("rcv_mss") else ""))
    scales = [trace.get("client_wscale"), trace.get("server_wscale")]
    parts.append("wscale " + "/".join("-" if value is None else str(value) for value in scales) + " (client/server)")
    rtt = trace.get("min_rtt_us")
    parts.append(f"min RTT {duration(rtt)}" if rtt else "min RTT -")
    if trace.get("dropped"):
        parts.append(f"capture dropped {trace['dropped']} packets")
    return " · ".join(parts)


def time_sequence_figure(trace: Mapping[str, Any], title: str = "") -> go.Figure:
    """The time-sequence plot of one trace dict (``ValueError`` for a malformed one).

    Traces, in this order: ``first flight`` (data before the inference's cutoff), ``data``
    (later data), ``retransmission`` (a data packet whose end is not above the highest end seen
    before it; wherever it falls), ``ACK`` (the probe's acknowledgements, a step line) and
    ``receive window`` (``ack + window`` of the probe's ACKs, a step line); empty ones are kept,
    so the legend always reads the same.  Shapes: alternate round trips of the inference's RTT
    from the SYN to the last packet (when at most :data:`MAX_BANDS`), and the first flight's cutoff."""
    check_trace(dict(trace))
    t_us, outgoing, seq, ack = trace["t_us"], trace["outgoing"], trace["seq"], trace["ack"]
    length, flags, window = trace["length"], trace["flags"], trace["window"]
    count = len(t_us)
    flight = first_flight(trace)
    in_flight = set(flight.indexes) if flight is not None else set()

    groups: dict[str, list[int]] = {"first flight": [], "data": [], "retransmission": []}
    highest: int | None = None
    for i in range(count):
        if outgoing[i] or length[i] <= 0:
            continue
        end = seq[i] + length[i]
        if highest is not None and end <= highest:
            groups["retransmission"].append(i)
        else:
            groups["first flight" if i in in_flight else "data"].append(i)
        highest = end if highest is None else max(highest, end)

    fig = go.Figure()
    colours = {"first flight": FIRST_FLIGHT_COLOUR, "data": DATA_COLOUR, "retransmission": RETRANSMISSION_COLOUR}
    symbols = {"first flight": "circle", "data": "circle", "retransmission": "x"}
    for name, indexes in groups.items():
        fig.add_trace(
            go.Scatter(
                name=name,
                x=[t_us[i] / 1000 for i in indexes],
                y=[seq[i] + length[i] for i in indexes],
                mode="markers",
                marker={"color": colours[name], "size": 7 if name == "retransmission" else 6, "symbol": symbols[name]},
                customdata=[[seq[i], seq[i] + length[i] - 1, length[i], flag_names(flags[i])] for i in indexes],
                hovertemplate=(
                    f"<b>{name}</b><br>%{{x:.3f}} ms<br>bytes %{{customdata[0]:,}}-%{{customdata[1]:,}}"
                    " (%{customdata[2]:,} B)<br>%{customdata[3]}<extra></extra>"
                ),
            )
        )
    acks = [i for i in range(count) if outgoing[i] and flags[i] & _ACK and not flags[i] & _SYN]
    fig.add_trace(
        go.Scatter(
            name="ACK",
            x=[t_us[i] / 1000 for i in acks],
            y=[ack[i] for i in acks],
            mode="lines",
            line={"color": ACK_COLOUR, "width": 1.5, "shape": "hv"},
            hovertemplate="<b>ACK</b><br>%{x:.3f} ms<br>ack %{y:,}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            name="receive window (ack + window)",
            x=[t_us[i] / 1000 for i in acks],
            y=[ack[i] + window[i] for i in acks],
            mode="lines",
            line={"color": WINDOW_COLOUR, "width": 1.2, "shape": "hv", "dash": "dot"},
            customdata=[window[i] for i in acks],
            hovertemplate="<b>receive window</b><br>%{x:.3f} ms<br>up to %{y:,} (window %{customdata:,} B)<extra></extra>",
        )
    )

    rtt = flight.rtt_us if flight is not None else trace.get("min_rtt_us")
    end_us = max(t_us, default=0)
    band_note = ""
    if rtt and end_us > 0 and -(-end_us // rtt) <= MAX_BANDS:
        for start in range(0, end_us, 2 * rtt):
            # The last band ends with the trace, so the axis does not run on past the data.
            fig.add_vrect(
                x0=start / 1000, x1=min(start + rtt, end_us) / 1000, fillcolor=_BAND_COLOUR, line_width=0, layer="below"
            )
        band_note = f"; shaded: alternate round trips of {duration(rtt)} from the SYN"
    if flight is not None:
        fig.add_vline(
            x=flight.cutoff_us / 1000,
            line={"color": FIRST_FLIGHT_COLOUR, "width": 1, "dash": "dash"},
            annotation={"text": "first-flight cutoff", "font": {"size": 10, "color": FIRST_FLIGHT_COLOUR}},
            annotation_position="top left",
        )

    line = summary(trace, flight)
    heading = f"{title}<br><sup>{line}</sup>" if title else f"Time-sequence plot (receiver side)<br><sup>{line}</sup>"
    fig.update_layout(
        title={"text": heading, "x": 0.01, "xanchor": "left", "y": 0.97, "yanchor": "top", "font": {"size": 15}},
        height=560,
        margin={"l": 70, "r": 30, "t": 80, "b": 110},
        paper_bgcolor="white",
        plot_bgcolor="white",
        hoverlabel={"align": "left"},
        legend={"orientation": "h", "yanchor": "top", "y": -0.16, "xanchor": "left", "x": 0},
        font={"family": "system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif", "size": 12},
    )
    fig.update_xaxes(title_text=f"time since the SYN (ms){band_note}", gridcolor=_GRID, zerolinecolor="#c9d2dd")
    fig.update_yaxes(
        title_text="relative sequence number (bytes)",
        tickformat=",d",
        gridcolor=_GRID,
        zerolinecolor="#c9d2dd",
        rangemode="tozero",
    )
    return fig
