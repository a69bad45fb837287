"""The trial inspector's figure: one stored trial's packet trace with its twins' overlaid.

A campaign's round fetches the same object over the same path once per arm, at about the same
time: a trial's *twins* are the other arms' trials of its round (same campaign, probe, round and
object size), and a traced round traces them all (``CampaignSchedule.trace_share`` draws rounds,
not trials).  Drawn together, each aligned at its own SYN, they show what the initial window
changed -- the plot of the IW10 write-ups ("data transferred against time, one point per
segment, default vs IW10"): the larger window's bytes arriving a round trip or more earlier.

The input is the collector's ``TrialTracesOut`` (:func:`iwscope.traces.services.read_trial_traces`,
``GET /api/v1/trials/{id}/traces``) or anything of its shape (:class:`TrialTracesLike`): the figure
needs no database and not the collector's trace models, so ``iwscope trace plot``, the Trials page
and the tests give it what they have.  It is drawn with :mod:`iwscope_dashboard.tracefigures`'
pieces, so it reads a trace exactly as the single-trace plot does.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import plotly.graph_objects as go

from iwprobe.wire import check_trace
from iwscope_dashboard.figures import ARM_PALETTE
from iwscope_dashboard.tracefigures import (
    RETRANSMISSION_COLOUR,
    FirstFlight,
    ack_lines,
    add_cutoff,
    add_round_trips,
    data_markers,
    duration,
    first_flight,
    split_data,
    style_time_sequence,
    summary,
)

#: Where a stored trace was captured (``iwprobe.wire.TRACE_SIDES``): at the probe (the client)
#: or at the origin.  Both traces number and orient packets as the client does.
RECEIVER, SENDER = "receiver", "sender"

#: Why a trial has no trace, said wherever one is missing (the page, ``iwscope trace plot``).
NO_TRACE = (
    "its campaign's trace_share was 0 (or this round was not among the traced ones), "
    "or the probe could not capture (capturing needs root)"
)
#: The outline that marks a first flight's markers (the fill stays the arm's colour).
FLIGHT_OUTLINE = "#1b1b1b"
#: ``TCP_INFO`` fields in microseconds and in milliseconds (the kernel's units), for their table.
_MICROSECONDS = frozenset({"rto", "ato", "rtt", "rttvar", "min_rtt", "busy_time", "rwnd_limited", "sndbuf_limited"})
_MILLISECONDS = frozenset({"last_data_sent", "last_ack_sent", "last_data_recv", "last_ack_recv"})


class TraceLike(Protocol):
    """One trace of a trial (the collector's ``TraceOut``)."""

    @property
    def side(self) -> str: ...

    @property
    def trace(self) -> Mapping[str, Any]: ...


class TracedTrialLike(Protocol):
    """A trial with its traces (the collector's ``TracedTrialOut``): what the inspector shows."""

    @property
    def trial_id(self) -> uuid.UUID: ...

    @property
    def arm_iw(self) -> int: ...

    @property
    def arm(self) -> str: ...

    @property
    def object_size(self) -> int: ...

    @property
    def total_us(self) -> int | None: ...

    @property
    def ttfb_us(self) -> int | None: ...

    @property
    def error_kind(self) -> str | None: ...

    @property
    def client_iw_segments(self) -> int | None: ...

    @property
    def client_iw_status(self) -> str | None: ...

    @property
    def tcp_info(self) -> Mapping[str, int]: ...

    @property
    def traces(self) -> Sequence[TraceLike]: ...


class TrialTracesLike(Protocol):
    """A trial and its twins, ordered by ``arm_iw`` (the collector's ``TrialTracesOut``)."""

    @property
    def trial(self) -> TracedTrialLike: ...

    @property
    def twins(self) -> Sequence[TracedTrialLike]: ...


class NoTrace(ValueError):
    """The trial has no trace of the side asked for; the message says why (one line)."""


def arm_name(trial: TracedTrialLike) -> str:
    """``IW10``; a labelled arm (``10p``, ``learned``) as ``10p (IW10)``."""
    if not trial.arm or trial.arm == str(trial.arm_iw):
        return f"IW{trial.arm_iw}"
    return f"{trial.arm} (IW{trial.arm_iw})"


def latency(trial: TracedTrialLike) -> str:
    """The trial's total latency (the probe's: connect to last byte), or why there is none."""
    if trial.total_us is not None:
        return duration(trial.total_us)
    return f"failed ({trial.error_kind})" if trial.error_kind else "no total"


def trace_of(trial: TracedTrialLike, side: str = RECEIVER) -> Mapping[str, Any] | None:
    """The trial's trace captured at ``side``, if one was stored."""
    return next((stored.trace for stored in trial.traces if stored.side == side), None)


def no_trace_reason(trial: TracedTrialLike, side: str = RECEIVER) -> str:
    """One line saying why ``trial`` has no ``side`` trace to draw."""
    stored = sorted({stored.side for stored in trial.traces})
    if stored:
        return f"trial {trial.trial_id} has no {side} trace (stored: {', '.join(stored)})"
    return f"trial {trial.trial_id} has no packet trace: {NO_TRACE}"


def _flight_text(flight: FirstFlight) -> str:
    noun = "segment" if flight.segments == 1 else "segments"
    return f"{flight.segments} {noun} / {flight.payload_bytes:,} bytes"


def _trial_markers(trace: Mapping[str, Any], trial: TracedTrialLike, colour: str, *, main: bool, rank: int) -> list[go.Scatter]:
    """One trial's data packets in its arm's colour: later data as dots (named with the arm
    and the total latency), the first flight as outlined diamonds, retransmissions as red
    crosses outlined in the arm's colour (only when there are some)."""
    check_trace(dict(trace))
    arm = arm_name(trial)
    flight = first_flight(trace)
    groups = split_data(trace, flight)
    style: dict[str, Any] = {"size": 6 if main else 5, "opacity": 1.0 if main else 0.75, "group": str(trial.trial_id)}
    drawn = [
        data_markers(
            trace, groups["data"], f"{arm} · {latency(trial)}" + (" (this trial)" if main else ""), colour=colour, **style
        )
    ]
    if flight is not None:
        name = f"{arm} first flight: {_flight_text(flight)}"
        drawn.append(
            data_markers(trace, groups["first flight"], name, colour=colour, symbol="diamond", outline=FLIGHT_OUTLINE, **style)
        )
    if groups["retransmission"]:
        drawn.append(
            data_markers(
                trace,
                groups["retransmission"],
                f"{arm} retransmission",
                colour=RETRANSMISSION_COLOUR,
                symbol="x",
                outline=colour,
                **style,
            )
        )
    for number, scatter in enumerate(drawn):
        scatter.legendrank = rank * 10 + number
    return drawn


def trial_figure(traced: TrialTracesLike, side: str = RECEIVER, title: str = "") -> go.Figure:
    """The time-sequence plot of ``traced.trial`` with its twins overlaid, each at its own SYN.

    Per trial (one colour per arm, legend in arm order, the main trial on top): its data
    packets' ends (:func:`~iwscope_dashboard.tracefigures.data_markers`) named ``"<arm> ·
    <total latency>"`` (`` (this trial)`` for the main one), its first flight
    ``"<arm> first flight: N segments / B bytes"`` and, when there are any, its
    ``"<arm> retransmission"`` s.  For the main trial only: its client's ``ACK`` and ``receive
    window (ack + window)`` steps, the first flight's cutoff, and alternate round trips of its
    ``min_rtt_us`` (``TCP_INFO``; the inference's RTT without it) shaded from the SYN to the last
    packet of any trial.  A twin without a ``side`` trace is named under the title.  When the
    receive window was above every trial's data all along (it never limited the sender), the y
    axis ends just above the data and the subtitle says so: the markers keep the plot's height.

    :class:`NoTrace` when the trial has no ``side`` trace; ``ValueError`` for a malformed trace."""
    main = traced.trial
    trace = trace_of(main, side)
    if trace is None:
        raise NoTrace(no_trace_reason(main, side))
    ordered = sorted([main, *traced.twins], key=lambda trial: (trial.arm_iw, trial.arm))
    colours = {trial.trial_id: ARM_PALETTE[index % len(ARM_PALETTE)] for index, trial in enumerate(ordered)}
    ranks = {trial.trial_id: index for index, trial in enumerate(ordered)}
    fig = go.Figure()
    end_us = top = 0
    untraced: list[str] = []
    # Twins first, so the main trial's markers are drawn over theirs.
    for trial in [*traced.twins, main]:
        drawn = trace_of(trial, side)
        if drawn is None:
            untraced.append(arm_name(trial))
            continue
        markers = _trial_markers(drawn, trial, colours[trial.trial_id], main=trial is main, rank=ranks[trial.trial_id])
        fig.add_traces(markers)
        top = max([top, *(y for scatter in markers for y in scatter.y)])
        end_us = max(end_us, max(drawn["t_us"], default=0))
    lines = ack_lines(trace, ack_name=f"ACK ({arm_name(main)})", window_name=f"receive window ({arm_name(main)}: ack + window)")
    for number, line in enumerate(lines):
        line.legendrank = 10 * len(ordered) + number
    fig.add_traces(lines)
    flight = first_flight(trace)
    band_note = add_round_trips(fig, trace.get("min_rtt_us") or (flight.rtt_us if flight is not None else None), end_us)
    if flight is not None:
        add_cutoff(fig, flight)
    twins = "no twin" if not traced.twins else "twins " + ", ".join(arm_name(twin) for twin in traced.twins)
    heading = title or (
        f"Trial {str(main.trial_id)[:8]}: {arm_name(main)}, {main.object_size:,} bytes, {latency(main)}; {twins} ({side} side)"
    )
    notes = [f"not traced: {', '.join(untraced)}"] if untraced else []
    acks, window = lines[0].y or (), lines[1].y or ()
    top = max([top, *acks])
    # The data, not the window, sets the y axis when the window was above it all along: a
    # 64 KB initial window over a 15 KB object would squeeze every trial into the bottom quarter.
    clip = bool(top and window and min(window) > top)
    if clip:
        notes.append("receive window above the plot all along (never limiting; Autoscale shows it)")
    lines_under = "".join(f"<br><sup>{line}</sup>" for line in [summary(trace, flight), " · ".join(notes)] if line)
    # Taller than the single-trace plot: a third title line, and a legend of up to ~10 entries.
    # the origin's trace starts at its answer (it opens once the request is read): no SYN in it
    zero = "the SYN" if side == RECEIVER else "the origin's answer"
    style_time_sequence(fig, heading + lines_under, band_note, height=660, top=100, bottom=180, legend_y=-0.25, zero=zero)
    if clip:
        fig.update_yaxes(range=[0, top * 1.08], rangemode="normal")
    return fig


def trial_summary(traced: TrialTracesLike, side: str = RECEIVER) -> str:
    """One line on the trial: arm, size, total latency (and TTFB), its first flight (from the
    trace) and the probe's client-side IW inference."""
    trial = traced.trial
    total = f"total {latency(trial)}" + (f" (TTFB {duration(trial.ttfb_us)})" if trial.ttfb_us is not None else "")
    parts = [arm_name(trial), f"{trial.object_size:,} bytes", total]
    trace = trace_of(trial, side)
    flight = first_flight(trace) if trace is not None else None
    if flight is not None:
        parts.append(f"first flight {_flight_text(flight)}")
    else:
        parts.append("first flight not traced" if trace is None else "first flight unknown")
    if trial.client_iw_status:
        segments = "-" if trial.client_iw_segments is None else str(trial.client_iw_segments)
        parts.append(f"client IW {segments} segments ({trial.client_iw_status})")
    else:
        parts.append("client IW not inferred")
    return " · ".join(parts)


def twins_summary(traced: TrialTracesLike) -> str:
    """The twins' total latencies and each one's difference from this trial's."""
    if not traced.twins:
        return "No twins: no other arm's trial of this round (campaign, probe, round and size)."
    parts = []
    for twin in traced.twins:
        text = f"{arm_name(twin)} {latency(twin)}"
        if twin.total_us is not None and traced.trial.total_us is not None:
            difference = twin.total_us - traced.trial.total_us
            text += f" ({'+' if difference >= 0 else '-'}{duration(abs(difference))})"
        parts.append(text)
    return "Twins (total latency, and against this trial): " + ", ".join(parts)


def tcp_info_rows(tcp_info: Mapping[str, int]) -> list[tuple[str, str]]:
    """The probe's ``TCP_INFO`` after the fetch as (field, value) rows, fields in name order,
    times with the kernel's unit (µs, or ms for the ``last_*`` ages)."""
    rows = []
    for name in sorted(tcp_info):
        value = tcp_info[name]
        unit = " µs" if name in _MICROSECONDS else " ms" if name in _MILLISECONDS else ""
        rows.append((name, f"{value:,}{unit}"))
    return rows
