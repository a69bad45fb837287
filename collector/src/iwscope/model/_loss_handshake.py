"""The simulated connection's base (:func:`iwscope.model.simulate_connection`): its
parameters, the link's drops, and the handshake and request up to the server reading it.

The classes stack, one module each: :class:`_Handshake` here, the sender's data path
(:mod:`iwscope.model._loss_sender`), loss recovery (:mod:`iwscope.model._loss_recovery`),
and the event loop with the ACK processing (:mod:`iwscope.model._loss_connection`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Collection

from iwscope.model._loss_types import (
    _MAX_EVENTS,
    _RTO,
    _TLP,
    RTO_MAX_S,
    SYN_BYTES,
    SYNACK_TIMER_FIRST,
    TIMER_MIN_S,
    CongestionControl,
    Drop,
    _ser,
)
from iwscope.model._slowstart import HEADER_BYTES, HTTP_REQUEST_BYTES, INITIAL_RTO_S, RTO_MIN_S, rto_after_handshake_s

_Push = Callable[[float, int, float], None]


class _Handshake:
    """One connection's parameters and counters, the link's drops, and :meth:`handshake`."""

    def __init__(
        self,
        *,
        size: int,
        iw: int,
        rtt_s: float,
        rate_bps: float | None,
        up_rate_bps: float | None,
        loss_down: float,
        loss_up: float,
        mss: int,
        header_bytes: int,
        rwnd_segments: int | None,
        cc: CongestionControl,
        tlp: bool,
        rack: bool,
        rng: random.Random,
        drops: Collection[Drop],
    ) -> None:
        self.size, self.iw, self.rtt = size, iw, rtt_s
        self.down, self.up = rate_bps, up_rate_bps
        self.loss_down, self.loss_up = loss_down, loss_up
        self.rwnd, self.cc, self.use_tlp, self.use_rack = rwnd_segments, cc, tlp, rack
        self.rng, self.drops = rng, drops
        self.one_way = rtt_s / 2.0
        self.ack_delay = _ser(HEADER_BYTES, up_rate_bps) + self.one_way
        total = size + header_bytes
        self.n = max(1, math.ceil(total / mss))
        self.ser_seg = [_ser(min(mss, total - i * mss) + HEADER_BYTES, rate_bps) for i in range(self.n)]
        self.dropped = 0
        self.syn_tx = self.request_tx = 0
        self.data_retransmits = self.loss_probes = self.rtos = self.recoveries = 0
        self.handshake_acks = 0
        self.server_iw = iw
        self.handshake_rtt = self.connect = self.request_read = 0.0
        self.synack_retransmits = 0
        self.srtt = self.mdev = self.rttvar = self.mdev_max = self.min_rtt = self.rto = 0.0
        self.rtt_seq = 0

    def _lost(self, kind: str, index: int, transmission: int, downstream: bool) -> bool:
        p = self.loss_down if downstream else self.loss_up
        if (self.drops and (kind, index, transmission) in self.drops) or (p > 0.0 and self.rng.random() < p):
            self.dropped += 1
            return True
        return False

    # --- handshake and request -------------------------------------------------------------

    def handshake(self) -> None:
        """SYN, SYN-ACK, ACK and request until the server reads the request (client clock)."""
        ow, up = self.one_way, self.up
        syn_up = _ser(SYN_BYTES, up) + ow
        connect0 = _ser(SYN_BYTES, up) + _ser(SYN_BYTES, self.down) + self.rtt  # predict's connect
        synack_down = _ser(SYN_BYTES, self.down) + ow
        ack_up = _ser(HEADER_BYTES, up) + ow
        request_up = _ser(HTTP_REQUEST_BYTES + HEADER_BYTES, up) + ow
        # (time, order, kind, value, other, number)
        events: list[tuple[float, int, int, float, float, int]] = []
        order = itertools.count()
        syn_timer, at_server_syn, synack_timer, at_client_synack, at_server_ack, at_server_request, request_timer = range(7)

        def push(t: float, kind: int, value: float = 0.0, other: float = 0.0, number: int = 0) -> None:
            heapq.heappush(events, (t, next(order), kind, value, other, number))

        def send_syn(t: float) -> None:
            self.syn_tx += 1
            if not self._lost("syn", 0, self.syn_tx - 1, False):
                push(t + syn_up, at_server_syn, t)

        synack_sent: list[float] = []
        server_ts_recent = 0.0  # send time of the latest SYN the server heard
        synack_gen = num_timeout = 0

        def send_synack(t: float, answering_syn: float | None) -> None:
            synack_sent.append(t)
            if self._lost("synack", 0, len(synack_sent) - 1, True):
                return
            arrival = answering_syn + connect0 if answering_syn is not None else t + synack_down
            push(arrival, at_client_synack, t, server_ts_recent, len(synack_sent) - 1)

        def arm_synack_timer(t: float) -> None:
            nonlocal synack_gen
            synack_gen += 1
            tie = -1e-6 if self.rng.random() < SYNACK_TIMER_FIRST else 1e-6
            push(t + min(INITIAL_RTO_S * 2**num_timeout, RTO_MAX_S) + tie, synack_timer, number=synack_gen)

        syn_rto, syn_gen = INITIAL_RTO_S, 0
        server_state = 0  # 0 nothing, 1 SYN_RECV, 2 established
        connect: float | None = None
        client_ts_recent = 0.0  # send time of the latest SYN-ACK the client heard
        request_sent = client_srtt = client_rto = 0.0
        request_gen = 0
        send_syn(0.0)
        push(syn_rto, syn_timer, number=syn_gen)
        for _ in range(_MAX_EVENTS):
            now, _order, kind, value, other, number = heapq.heappop(events)
            if kind == syn_timer:
                if number == syn_gen and connect is None:
                    send_syn(now)
                    syn_rto = min(2 * syn_rto, RTO_MAX_S)
                    syn_gen += 1
                    push(now + syn_rto, syn_timer, number=syn_gen)
            elif kind == at_server_syn:
                server_ts_recent = value
                if server_state == 0:
                    server_state = 1
                    send_synack(now, value)
                    arm_synack_timer(now)
                elif server_state == 1:  # a retransmitted SYN: answered at once, the timer pushed back
                    send_synack(now, value)
                    arm_synack_timer(now)
            elif kind == synack_timer:
                if number == synack_gen and server_state == 1:
                    num_timeout += 1
                    send_synack(now, None)
                    arm_synack_timer(now)
            elif kind == at_client_synack:
                client_ts_recent = value
                if connect is None:
                    connect = now
                    client_srtt = now - other
                    client_rto = rto_after_handshake_s(client_srtt)
                    request_sent = now
                    self._send_handshake_ack(now, ack_up, push, at_server_ack, client_ts_recent)
                    self._send_request(now, request_up, push, at_server_request, client_ts_recent)
                    request_gen += 1
                    pto = min(2 * client_srtt + RTO_MIN_S, client_rto)
                    push(now + pto, request_timer, value=float(_TLP), number=request_gen)
                else:  # a duplicate SYN-ACK: the client acknowledges it again
                    self._send_handshake_ack(now, ack_up, push, at_server_ack, client_ts_recent)
            elif kind == request_timer:
                if number == request_gen:
                    self._send_request(now, request_up, push, at_server_request, client_ts_recent)
                    request_gen += 1
                    if value == _TLP:
                        push(max(request_sent + client_rto, now + TIMER_MIN_S), request_timer, float(_RTO), number=request_gen)
                    else:
                        client_rto = min(2 * client_rto, RTO_MAX_S)
                        push(now + client_rto, request_timer, float(_RTO), number=request_gen)
            elif kind in (at_server_ack, at_server_request):
                if server_state == 1:
                    server_state = 2
                    retransmitted = len(synack_sent) - 1
                    echoes_first = value == synack_sent[0]
                    self.server_iw = 1 if retransmitted > 1 and num_timeout > 0 and not echoes_first else self.iw
                    self.handshake_rtt = now - (synack_sent[0] if retransmitted == 0 else value)
                if kind == at_server_request and server_state == 2:
                    assert connect is not None
                    self.connect, self.request_read = connect, now
                    self.synack_retransmits = len(synack_sent) - 1
                    return
        raise RuntimeError("the handshake did not finish")

    def _send_handshake_ack(self, now: float, trip: float, push: _Push, kind: int, echo: float) -> None:
        self.handshake_acks += 1
        if not self._lost("handshake_ack", 0, self.handshake_acks - 1, False):
            push(now + trip, kind, echo)

    def _send_request(self, now: float, trip: float, push: _Push, kind: int, echo: float) -> None:
        self.request_tx += 1
        if not self._lost("request", 0, self.request_tx - 1, False):
            push(now + trip, kind, echo)
