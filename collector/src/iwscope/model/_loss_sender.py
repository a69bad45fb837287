"""The sender's data path of the simulated connection: its state, transmitting, sending what cwnd
allows (lost segments first), arming the RTO and the loss probe, and the RTT estimator.
"""

from __future__ import annotations

import heapq
import itertools
import math

from iwscope.model._loss_handshake import _Handshake
from iwscope.model._loss_types import _DATA, _NO_TIMER, _OPEN, _RECOVERY, _REO, _RTO, _TLP, RTO_MAX_S, TIMER_MIN_S
from iwscope.model._slowstart import RTO_MIN_S


class _Sender(_Handshake):
    """The sender: :meth:`_start_sender` at the request read, then :meth:`_send` on every ACK."""

    def _start_sender(self) -> None:
        """The sender's state when the response starts (time 0), the event queue with it."""
        n = self.n
        self.events: list[tuple[float, int, int, int, float, int, int, float, bool, int]] = []
        self.order = itertools.count()
        self.xmit = [0.0] * n
        self.tx_count = [0] * n
        self.lost = bytearray(n)
        self.retrans = bytearray(n)  # retransmitted and neither acknowledged nor marked lost again
        self.ever_retrans = bytearray(n)
        self.sacked = 0  # bit mask
        self.snd_una = self.snd_nxt = 0
        self.sacked_out = self.lost_out = self.retrans_out = 0
        self.cwnd = self.server_iw
        self.cwnd_cnt = 0
        self.ssthresh = math.inf
        self.prior_cwnd = self.cwnd
        self.prior_ssthresh = math.inf
        self.state = _OPEN
        self.high_seq = 0
        self.prr_delivered = self.prr_out = 0
        self.conservation = False
        self.bbr_prev_state = _OPEN
        self.recovery_start = 0.0
        self.undo_marker = False
        self.retrans_stamp: float | None = None
        self.tlp_high: int | None = None
        self.tlp_retrans = False
        self.rack_rtt = 0.0
        self.rack_xmit = -1.0
        self.rack_seg = -1
        self.rwnd_edge = n if self.rwnd is None else self.rwnd
        self.link_free = 0.0
        self.timer_kind, self.timer_at = _NO_TIMER, math.inf
        self._first_rtt(self.handshake_rtt)

    def _transmit(self, i: int, now: float) -> None:
        self.xmit[i] = now
        tx = self.tx_count[i]
        self.tx_count[i] = tx + 1
        if self._lost("data", i, tx, True):
            return
        start = max(now, self.link_free)
        self.link_free = start + self.ser_seg[i]
        arrive = self.link_free + self.one_way
        heapq.heappush(self.events, (arrive, next(self.order), _DATA, i, now, 0, 0, 0.0, False, 0))

    def _inflight(self) -> int:
        return (self.snd_nxt - self.snd_una) - (self.sacked_out + self.lost_out) + self.retrans_out

    # --- sending -------------------------------------------------------------------------

    def _send(self, now: float, prior_packets: int) -> None:
        """Lost segments first, then new data, while cwnd allows (``tcp_xmit_retransmit_queue``,
        ``tcp_write_xmit``)."""
        inflight = self._inflight()
        if self.lost_out > 0:
            for i in range(self.snd_una, self.snd_nxt):
                if inflight >= self.cwnd:
                    break
                if self.lost[i] and not self.retrans[i]:
                    self._retransmit(i, now)
                    inflight += 1
                    if i == self.snd_una and self.timer_kind != _REO:
                        self._rearm_rto(now)
        sent = 0
        limit = min(self.n, self.rwnd_edge)
        while self.snd_nxt < limit and inflight < self.cwnd:
            self._new_segment(now)
            inflight += 1
            sent += 1
        if sent:
            if prior_packets == 0 or self.timer_kind == _TLP:
                self._rearm_rto(now)
            self._schedule_tlp(now, advancing=False)

    def _new_segment(self, now: float) -> None:
        self._transmit(self.snd_nxt, now)
        self.snd_nxt += 1
        if self.state == _RECOVERY:
            self.prr_out += 1

    def _retransmit(self, i: int, now: float) -> None:
        self._transmit(i, now)
        self.data_retransmits += 1
        if not self.retrans[i]:
            self.retrans[i] = 1
            self.retrans_out += 1
        self.ever_retrans[i] = 1
        if self.retrans_stamp is None:
            self.retrans_stamp = now
        if self.state == _RECOVERY:
            self.prr_out += 1

    # --- arming the timers -------------------------------------------------------------

    def _rearm_rto(self, now: float) -> None:
        if self.snd_nxt == self.snd_una:
            self.timer_kind, self.timer_at = _NO_TIMER, math.inf
            return
        # after a loss probe or a reordering timer: from the head's send time, as tcp_rearm_rto does
        head_based = self.timer_kind in (_TLP, _REO)
        at = max(self.xmit[self.snd_una] + self.rto, now + 1e-6) if head_based else now + self.rto
        self.timer_kind, self.timer_at = _RTO, at

    def _schedule_tlp(self, now: float, advancing: bool) -> bool:
        packets_out = self.snd_nxt - self.snd_una
        if not self.use_tlp or not packets_out or self.state != _OPEN or self.sacked_out or self.lost_out or self.retrans_out:
            return False
        timeout = 2 * self.srtt + (RTO_MIN_S if packets_out == 1 else TIMER_MIN_S)
        rto_delta = self.rto if advancing else self.xmit[self.snd_una] + self.rto - now
        if rto_delta > 0:
            timeout = min(timeout, rto_delta)
        self.timer_kind, self.timer_at = _TLP, now + timeout
        return True

    # --- RTT estimator (tcp_rtt_estimator, tcp_set_rto) ------------------------------------

    def _first_rtt(self, m: float) -> None:
        self.srtt = m
        self.mdev = 2 * m
        self.rttvar = max(self.mdev, RTO_MIN_S)
        self.mdev_max = self.rttvar
        self.rtt_seq = 0
        self.min_rtt = m
        self.rto = min(self.srtt + self.rttvar, RTO_MAX_S)

    def _rtt_sample(self, m: float) -> None:
        self.min_rtt = min(self.min_rtt, m)
        err = m - self.srtt
        self.srtt += err / 8
        if err < 0:
            err = -err - self.mdev / 4
            if err > 0:
                err /= 8
        else:
            err -= self.mdev / 4
        self.mdev += err
        if self.mdev > self.mdev_max:
            self.mdev_max = self.mdev
            if self.mdev_max > self.rttvar:
                self.rttvar = self.mdev_max
        if self.snd_una > self.rtt_seq:
            if self.mdev_max < self.rttvar:
                self.rttvar -= (self.rttvar - self.mdev_max) / 4
            self.rtt_seq = self.snd_nxt
            self.mdev_max = RTO_MIN_S
        self.rto = min(self.srtt + self.rttvar, RTO_MAX_S)
