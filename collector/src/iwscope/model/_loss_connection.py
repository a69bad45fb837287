"""The simulated connection, whole: the response's event loop, the client's receiver, and the
server's processing of each ACK (SACK, RACK's clock, the RTT sample, the loss probe's outcome,
the Eifel undo, recovery's end and start, the congestion window), then the :class:`Trial`.
"""

from __future__ import annotations

import heapq
import math

from iwscope.model._loss_recovery import _Recovery
from iwscope.model._loss_types import _ACK, _DATA, _LOSS, _MAX_EVENTS, _NO_TIMER, _OPEN, _RECOVERY, _RTO, _TLP, Trial


class _Connection(_Recovery):
    """One connection, event by event: :meth:`handshake`, then :meth:`transfer`."""

    def transfer(self) -> None:
        """The response from the request read (time 0) to its last byte acknowledged."""
        n = self.n
        self._start_sender()
        # receiver
        self.rcv_mask = 0
        self.rcv_nxt = 0
        self.received = 0
        self.ts_recent = 0.0
        self.acks_sent = 0
        self.client_done: float | None = None
        self.server_done = 0.0

        self._send(0.0, prior_packets=0)
        events = self.events
        for _ in range(_MAX_EVENTS):
            if events and events[0][0] <= self.timer_at:
                now, _order, kind, seg, xmit, cum, mask, echo, dsack, edge = heapq.heappop(events)
                if kind == _DATA:
                    self._at_client(now, seg, xmit)
                else:
                    self._at_server(now, cum, mask, echo, dsack, edge)
                    if self.snd_una == n:
                        self.server_done = now
                        return
            elif self.timer_kind != _NO_TIMER:
                now, kind = self.timer_at, self.timer_kind
                self.timer_kind, self.timer_at = _NO_TIMER, math.inf
                if kind == _TLP:
                    self._loss_probe(now)
                elif kind == _RTO:
                    self._rto(now)
                else:
                    self._reorder_timeout(now)
            else:
                raise RuntimeError("the transfer stalled with nothing in flight")
        raise RuntimeError("the transfer did not finish")

    def _at_client(self, t: float, i: int, xmit: float) -> None:
        bit = 1 << i
        dsack = bool(self.rcv_mask & bit)
        if dsack:
            if i < self.rcv_nxt:  # the timestamp echo follows in-order and old segments only
                self.ts_recent = xmit
        else:
            self.rcv_mask |= bit
            self.received += 1
            if i == self.rcv_nxt:
                nxt = i + 1
                while self.rcv_mask >> nxt & 1:
                    nxt += 1
                self.rcv_nxt = nxt
                self.ts_recent = xmit
                if nxt == self.n and self.client_done is None:
                    self.client_done = t
        self.acks_sent += 1
        if self._lost("ack", self.acks_sent - 1, 0, False):
            return
        edge = self.n if self.rwnd is None else self.rcv_nxt + self.rwnd + 2 * self.received
        event = (t + self.ack_delay, next(self.order), _ACK, i, xmit, self.rcv_nxt, self.rcv_mask, self.ts_recent, dsack, edge)
        heapq.heappush(self.events, event)

    def _rack_advance(self, i: int, now: float) -> None:
        rtt = now - self.xmit[i]
        if self.ever_retrans[i] and rtt < self.min_rtt:
            return  # ambiguous: maybe the original was (S)ACKed
        self.rack_rtt = rtt
        if self.xmit[i] > self.rack_xmit or (self.xmit[i] == self.rack_xmit and i > self.rack_seg):
            self.rack_xmit, self.rack_seg = self.xmit[i], i

    def _at_server(self, now: float, cum: int, mask: int, echo: float, dsack: bool, edge: int) -> None:
        prior_una = self.snd_una
        self.rwnd_edge = max(self.rwnd_edge, edge)
        delivered = 0
        sack_rtt: float | None = None
        first_ackt: float | None = None
        retrans_acked = False
        rack_before = (self.rack_xmit, self.rack_seg, self.rack_rtt)
        new_sacks = mask & ~self.sacked & ~((1 << cum) - 1) & ((1 << self.snd_nxt) - 1)
        while new_sacks:
            low = new_sacks & -new_sacks
            new_sacks ^= low
            i = low.bit_length() - 1
            self.sacked |= low
            self.sacked_out += 1
            delivered += 1
            if self.lost[i]:
                self.lost[i] = 0
                self.lost_out -= 1
            if self.retrans[i]:
                self.retrans[i] = 0
                self.retrans_out -= 1
            if not self.ever_retrans[i] and sack_rtt is None:
                sack_rtt = now - self.xmit[i]
            self._rack_advance(i, now)
        if cum > self.snd_una:
            for i in range(self.snd_una, cum):
                if self.sacked >> i & 1:
                    self.sacked_out -= 1
                else:
                    delivered += 1
                    self._rack_advance(i, now)
                    if self.ever_retrans[i]:
                        retrans_acked = True
                    elif first_ackt is None:
                        first_ackt = self.xmit[i]
                if self.lost[i]:
                    self.lost[i] = 0
                    self.lost_out -= 1
                if self.retrans[i]:
                    self.retrans[i] = 0
                    self.retrans_out -= 1
            self.sacked &= ~((1 << cum) - 1)
            self.snd_una = cum
        advanced = cum > prior_una
        rack_advanced = (self.rack_xmit, self.rack_seg, self.rack_rtt) != rack_before
        # RTT: the oldest newly acknowledged original, else the first newly SACKed one, else the echo.
        if first_ackt is not None and not retrans_acked:
            self._rtt_sample(now - first_ackt)
        elif sack_rtt is not None:
            self._rtt_sample(sack_rtt)
        elif advanced:
            self._rtt_sample(now - echo)
        if self.tlp_high is not None and cum >= self.tlp_high:  # tcp_process_tlp_ack
            if not self.tlp_retrans or dsack:
                self.tlp_high = None
            elif cum > self.tlp_high:
                self._reduce_cwnd()
                self.tlp_high = None
            elif not advanced and not delivered:
                self.tlp_high = None
        if self.state == _LOSS and advanced and self.undo_marker and self.retrans_stamp is not None and echo < self.retrans_stamp:
            self._undo()  # Eifel: the ACK answers an original sent before the first retransmission
        # tcp_set_xmit_timer, before loss detection may set the reordering timer
        if advanced and not self._schedule_tlp(now, advancing=True):
            self._rearm_rto(now)
        # tcp_fastretrans_alert: leave recovery once high_seq is acknowledged, detect, enter.
        if self.state != _OPEN and self.snd_una >= self.high_seq:
            if self.state == _RECOVERY and self.cc != "bbr" and self.ssthresh < math.inf:
                self.cwnd = int(self.ssthresh)  # tcp_end_cwnd_reduction
            self.state = _OPEN
        newly_lost = 0
        if rack_advanced and (self.sacked_out or self.state != _OPEN or self.retrans_out):
            newly_lost = self._rack_detect(now)
        if self.state == _OPEN and self.lost_out:
            self._enter_recovery(now)
        if self.state == _OPEN and not self.retrans_out and not self.lost_out:
            self.retrans_stamp = None
        # congestion control (tcp_cong_control)
        if self.cc == "bbr":
            self._bbr_cwnd(delivered, newly_lost)
        elif self.state == _RECOVERY:
            self._prr(delivered, newly_lost, advanced)
        elif advanced:
            self._cong_avoid(delivered)
        self._send(now, prior_packets=self.snd_nxt - self.snd_una)

    def trial(self) -> Trial:
        assert self.client_done is not None
        return Trial(
            size=self.size,
            segments=self.n,
            server_latency_s=self.server_done,
            client_total_s=self.request_read + self.client_done,
            connect_s=self.connect,
            request_read_s=self.request_read,
            server_iw=self.server_iw,
            dropped=self.dropped,
            syn_retransmits=self.syn_tx - 1,
            synack_retransmits=self.synack_retransmits,
            request_retransmits=self.request_tx - 1,
            data_retransmits=self.data_retransmits,
            loss_probes=self.loss_probes,
            rtos=self.rtos,
            recoveries=self.recoveries,
        )
