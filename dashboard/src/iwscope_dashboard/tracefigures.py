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

The plot's pieces (:func:`split_data`, :func:`data_markers`, :func:`ack_lines`,
:func:`add_round_trips`, :func:`add_cutoff`, :func:`style_time_sequence`) also draw the Trials
page's inspector (:mod:`iwscope_dashboard.trialfigures`: a stored trial with its twins overlaid),
so both figures read a trace the same way.  A trace's directions are the client's whichever end
captured it (the origin flips its own, ``iwprobe._origin_trace``): the data is always incoming.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def data_indexes(trace: Mapping[str, Any]) -> list[int]:
    """The indexes of the data packets: a payload, server to client (``outgoing`` 0)."""
    outgoing, length = trace["outgoing"], trace["length"]
    return [i for i in range(len(length)) if not outgoing[i] and length[i] > 0]


def ack_indexes(trace: Mapping[str, Any]) -> list[int]:
    """The indexes of the client's ACKs (``outgoing`` 1; its SYN left out)."""
    outgoing, flags = trace["outgoing"], trace["flags"]
    return [i for i in range(len(flags)) if outgoing[i] and flags[i] & _ACK and not flags[i] & _SYN]


def first_flight(trace: Mapping[str, Any]) -> FirstFlight | None:
    """The first flight the probe wrote into the trace (the IW inference's own split, made on
    the captured packets): the first ``packets`` received data packets.  None when
    the probe found none (no handshake, data or RTT)."""
    summary = trace.get("first_flight")
    if not isinstance(summary, Mapping):
        return None
    received = data_indexes(trace)
    return FirstFlight(
        indexes=tuple(received[: int(summary["packets"])]),
        mss=int(summary["mss"]),
        rtt_us=int(summary["rtt_us"]),
        cutoff_us=int(summary["cutoff_us"]),
        segments=int(summary["segments"]),
        payload_bytes=int(summary["bytes"]),
    )


def split_data(trace: Mapping[str, Any], flight: FirstFlight | None) -> dict[str, list[int]]:
    """The data packets by what the plot marks them as: ``first flight`` (the inference's split),
    ``data`` (later) and ``retransmission`` (a packet whose end is not above the highest end
    seen before it, wherever it falls: its byte range was already seen)."""
    seq, length = trace["seq"], trace["length"]
    in_flight = set(flight.indexes) if flight is not None else set()
    groups: dict[str, list[int]] = {"first flight": [], "data": [], "retransmission": []}
    highest: int | None = None
    for i in data_indexes(trace):
        end = seq[i] + length[i]
        if highest is not None and end <= highest:
            groups["retransmission"].append(i)
        else:
            groups["first flight" if i in in_flight else "data"].append(i)
        highest = end if highest is None else max(highest, end)
    return groups


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


def data_markers(
    trace: Mapping[str, Any],
    indexes: Sequence[int],
    name: str,
    *,
    colour: str,
    symbol: str = "circle",
    size: float = 6,
    outline: str | None = None,
    opacity: float = 1.0,
    group: str | None = None,
) -> go.Scatter:
    """One marker per data packet of ``indexes`` at (ms since the SYN, the end of its bytes:
    ``seq + length``, the sequence number the client's ACK of it carries); the hover names the
    byte range, the length and the flags."""
    t_us, seq, length, flags = trace["t_us"], trace["seq"], trace["length"], trace["flags"]
    marker: dict[str, Any] = {"color": colour, "size": size, "symbol": symbol, "opacity": opacity}
    if outline is not None:
        marker["line"] = {"color": outline, "width": 1.5}
    return go.Scatter(
        name=name,
        legendgroup=group,
        x=[t_us[i] / 1000 for i in indexes],
        y=[seq[i] + length[i] for i in indexes],
        mode="markers",
        marker=marker,
        customdata=[[seq[i], seq[i] + length[i] - 1, length[i], flag_names(flags[i])] for i in indexes],
        hovertemplate=(
            f"<b>{name}</b><br>%{{x:.3f}} ms<br>bytes %{{customdata[0]:,}}-%{{customdata[1]:,}}"
            " (%{customdata[2]:,} B)<br>%{customdata[3]}<extra></extra>"
        ),
    )


def ack_lines(
    trace: Mapping[str, Any],
    *,
    ack_name: str = "ACK",
    window_name: str = "receive window (ack + window)",
    group: str | None = None,
) -> list[go.Scatter]:
    """The client's ACKs and the receive window it offered (``ack + window``: the highest
    sequence number the server may send) as steps; what a flight waits for and what caps it."""
    t_us, ack, window = trace["t_us"], trace["ack"], trace["window"]
    acks = ack_indexes(trace)
    return [
        go.Scatter(
            name=ack_name,
            legendgroup=group,
            x=[t_us[i] / 1000 for i in acks],
            y=[ack[i] for i in acks],
            mode="lines",
            line={"color": ACK_COLOUR, "width": 1.5, "shape": "hv"},
            hovertemplate="<b>ACK</b><br>%{x:.3f} ms<br>ack %{y:,}<extra></extra>",
        ),
        go.Scatter(
            name=window_name,
            legendgroup=group,
            x=[t_us[i] / 1000 for i in acks],
            y=[ack[i] + window[i] for i in acks],
            mode="lines",
            line={"color": WINDOW_COLOUR, "width": 1.2, "shape": "hv", "dash": "dot"},
            customdata=[window[i] for i in acks],
            hovertemplate="<b>receive window</b><br>%{x:.3f} ms<br>up to %{y:,} (window %{customdata:,} B)<extra></extra>",
        ),
    ]


def add_round_trips(fig: go.Figure, rtt_us: int | None, end_us: int) -> str:
    """Shade alternate round trips of ``rtt_us`` from the SYN (time 0) to ``end_us`` -- when
    there are at most :data:`MAX_BANDS` of them -- and return the x axis title's note on them
    (empty when none are drawn)."""
    if not rtt_us or end_us <= 0 or -(-end_us // rtt_us) > MAX_BANDS:
        return ""
    for start in range(0, end_us, 2 * rtt_us):
        # The last band ends with the data, so the axis does not run on past it.
        fig.add_vrect(x0=start / 1000, x1=min(start + rtt_us, end_us) / 1000, fillcolor=_BAND_COLOUR, line_width=0, layer="below")
    return f"; shaded: alternate round trips of {duration(rtt_us)} from time 0"


def add_cutoff(fig: go.Figure, flight: FirstFlight) -> None:
    """The first flight's cutoff: a dashed vertical line where the inference split the data."""
    fig.add_vline(
        x=flight.cutoff_us / 1000,
        line={"color": FIRST_FLIGHT_COLOUR, "width": 1, "dash": "dash"},
        annotation={"text": "first-flight cutoff", "font": {"size": 10, "color": FIRST_FLIGHT_COLOUR}},
        annotation_position="top left",
    )


def style_time_sequence(
    fig: go.Figure,
    heading: str,
    band_note: str,
    *,
    height: int = 560,
    top: int = 80,
    bottom: int = 110,
    legend_y: float = -0.16,
    zero: str = "the SYN",
) -> go.Figure:
    """The time-sequence plots' look: the title (a summary under it), the legend below the plot
    (clear of the title however many traces; ``legend_y`` of the plot's height under it, in a
    ``bottom`` margin of that many pixels, clear of the axis title), ms across (since ``zero``),
    bytes up."""
    fig.update_layout(
        title={"text": heading, "x": 0.01, "xanchor": "left", "y": 0.97, "yanchor": "top", "font": {"size": 15}},
        height=height,
        margin={"l": 70, "r": 30, "t": top, "b": bottom},
        paper_bgcolor="white",
        plot_bgcolor="white",
        hoverlabel={"align": "left"},
        legend={"orientation": "h", "yanchor": "top", "y": legend_y, "xanchor": "left", "x": 0},
        font={"family": "system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif", "size": 12},
    )
    fig.update_xaxes(title_text=f"time since {zero} (ms){band_note}", gridcolor=_GRID, zerolinecolor="#c9d2dd")
    fig.update_yaxes(
        title_text="relative sequence number (bytes)",
        tickformat=",d",
        gridcolor=_GRID,
        zerolinecolor="#c9d2dd",
        rangemode="tozero",
    )
    return fig


def time_sequence_figure(trace: Mapping[str, Any], title: str = "") -> go.Figure:
    """The time-sequence plot of one trace dict (``ValueError`` for a malformed one).

    Traces, in this order: ``first flight`` (data before the inference's cutoff), ``data``
    (later data), ``retransmission`` (:func:`split_data`), ``ACK`` (the probe's
    acknowledgements, a step line) and ``receive window`` (``ack + window`` of the probe's ACKs,
    a step line); empty ones are kept, so the legend always reads the same.  Shapes: alternate
    round trips of the inference's RTT from the SYN to the last packet (when at most
    :data:`MAX_BANDS`), and the first flight's cutoff.  The trial inspector's figure
    (:func:`iwscope_dashboard.trialfigures.trial_figure`) is drawn with the same pieces."""
    check_trace(dict(trace))
    flight = first_flight(trace)
    fig = go.Figure()
    colours = {"first flight": FIRST_FLIGHT_COLOUR, "data": DATA_COLOUR, "retransmission": RETRANSMISSION_COLOUR}
    for name, indexes in split_data(trace, flight).items():
        retransmission = name == "retransmission"
        fig.add_trace(
            data_markers(
                trace,
                indexes,
                name,
                colour=colours[name],
                symbol="x" if retransmission else "circle",
                size=7 if retransmission else 6,
            )
        )
    fig.add_traces(ack_lines(trace))
    rtt = flight.rtt_us if flight is not None else trace.get("min_rtt_us")
    band_note = add_round_trips(fig, rtt, max(trace["t_us"], default=0))
    if flight is not None:
        add_cutoff(fig, flight)
    line = summary(trace, flight)
    heading = f"{title}<br><sup>{line}</sup>" if title else f"Time-sequence plot (receiver side)<br><sup>{line}</sup>"
    return style_time_sequence(fig, heading, band_note)
