"""Loss recovery of the simulated connection: the loss probe, the RTO and the reordering timer
firing, RACK's detection, entering recovery and undoing it, and the congestion window (PRR,
Reno/CUBIC's growth, BBR's conservation and restore).
"""

from __future__ import annotations

import math

from iwscope.model._loss_sender import _Sender
from iwscope.model._loss_types import (
    _LOSS,
    _OPEN,
    _RECOVERY,
    _REO,
    _RTO,
    _TLP,
    BBR_CWND_MIN,
    CUBIC_BETA,
    DUPTHRESH,
    RTO_MAX_S,
    TIMER_MIN_S,
)


class _Recovery(_Sender):
    """What the sender does when a timer fires or a loss is found."""

    # --- the timers firing -------------------------------------------------------------

    def _loss_probe(self, now: float) -> None:
        """``tcp_send_loss_probe``: new data if the window allows, else the last segment again."""
        if self.tlp_high is None:
            if self.snd_nxt < min(self.n, self.rwnd_edge):
                self._new_segment(now)
                self.tlp_retrans = False
            else:
                last = self.snd_nxt - 1
                while last > self.snd_una and self.sacked >> last & 1:
                    last -= 1
                self._retransmit(last, now)
                self.tlp_retrans = True
            self.loss_probes += 1
            self.tlp_high = self.snd_nxt
        self.timer_kind = _TLP
        self._rearm_rto(now)

    def _rto(self, now: float) -> None:
        """``tcp_retransmit_timer``: enter Loss, resend the head, back the timer off."""
        if self.snd_nxt == self.snd_una:
            return
        self.rtos += 1
        if self.state == _OPEN:
            self.prior_ssthresh, self.prior_cwnd = self.ssthresh, self.cwnd
            self.ssthresh = self._cc_ssthresh()
            self.undo_marker = True
        # tcp_timeout_mark_lost: the head, and what RACK's clock says has had time to arrive
        for i in range(self.snd_una, self.snd_nxt):
            if self.sacked >> i & 1:
                continue
            if i != self.snd_una and self.use_rack and self.xmit[i] + self.rack_rtt - now > 0:
                continue
            if self.retrans[i]:
                self.retrans[i] = 0
                self.retrans_out -= 1
            if not self.lost[i]:
                self.lost[i] = 1
                self.lost_out += 1
        self.cwnd = self._inflight() + 1
        self.cwnd_cnt = 0
        self.high_seq = self.snd_nxt
        self.state = _LOSS
        self.conservation = False
        self.tlp_high = None
        self._retransmit(self.snd_una, now)
        self.rto = min(2 * self.rto, RTO_MAX_S)
        self.timer_kind, self.timer_at = _RTO, now + self.rto

    def _reorder_timeout(self, now: float) -> None:
        """``tcp_rack_reo_timeout``: mark what is now overdue, recover, resend."""
        if self._rack_detect(now, rearm=False):
            if self.state == _OPEN:
                self._enter_recovery(now)
                if self.cc != "bbr":
                    self._prr(1, 0, False)
            self.timer_kind = _REO
            self._send(now, prior_packets=self.snd_nxt - self.snd_una)
        if self.timer_kind != _RTO:
            self.timer_kind = _REO
            self._rearm_rto(now)

    # --- loss detection and recovery -----------------------------------------------------

    def _rack_detect(self, now: float, rearm: bool = True) -> int:
        """RACK (``tcp_rack_detect_loss``): a segment sent before the most recently sent
        delivered one is lost once ``rack_rtt + reo_wnd`` has passed since it was sent."""
        if not self.use_rack and self.sacked_out < DUPTHRESH and self.state == _OPEN:
            return 0
        in_recovery = self.state != _OPEN or self.sacked_out >= DUPTHRESH
        reo_wnd = 0.0 if in_recovery else min(self.min_rtt / 4, self.srtt)
        newly_lost = 0
        wait = 0.0
        for i in range(self.snd_una, self.snd_nxt):
            if self.sacked >> i & 1 or (self.lost[i] and not self.retrans[i]):
                continue
            x = self.xmit[i]
            if not (self.rack_xmit > x or (self.rack_xmit == x and self.rack_seg > i)):
                continue
            remaining = x + self.rack_rtt + reo_wnd - now
            if remaining <= 0:
                if self.retrans[i]:
                    self.retrans[i] = 0
                    self.retrans_out -= 1
                self.lost[i] = 1
                self.lost_out += 1
                newly_lost += 1
            else:
                wait = max(wait, remaining)
        if wait > 0 and rearm:
            self.timer_kind, self.timer_at = _REO, now + wait + TIMER_MIN_S
        return newly_lost

    def _enter_recovery(self, now: float) -> None:
        self.recoveries += 1
        self.prior_ssthresh = self.ssthresh
        self.prior_cwnd = self.cwnd
        self.ssthresh = self._cc_ssthresh()
        self.high_seq = self.snd_nxt
        self.tlp_high = None
        self.cwnd_cnt = 0
        self.prr_delivered = self.prr_out = 0
        self.undo_marker = True
        self.state = _RECOVERY
        self.recovery_start = now

    def _cc_ssthresh(self) -> float:
        if self.cc == "reno":
            return float(max(self.cwnd >> 1, 2))
        if self.cc == "cubic":
            return float(max(int(self.cwnd * CUBIC_BETA), 2))
        return math.inf

    def _reduce_cwnd(self) -> None:
        """A loss probe repaired a loss: CWR, cwnd down to ssthresh at once."""
        self.ssthresh = self._cc_ssthresh()
        if self.ssthresh < math.inf:
            self.cwnd = int(self.ssthresh)

    def _undo(self) -> None:
        for i in range(self.snd_una, self.snd_nxt):
            self.lost[i] = 0
        self.lost_out = 0
        self.cwnd = max(self.cwnd, self.prior_cwnd)
        self.ssthresh = max(self.ssthresh, self.prior_ssthresh)
        self.undo_marker = False
        self.state = _OPEN

    def _prr(self, delivered: int, newly_lost: int, una_advanced: bool) -> None:
        """Proportional Rate Reduction (``tcp_cwnd_reduction``)."""
        if delivered <= 0:
            return
        self.prr_delivered += delivered
        inflight = self._inflight()
        ssthresh = int(self.ssthresh)
        delta = ssthresh - inflight
        if delta < 0:
            sndcnt = (ssthresh * self.prr_delivered + self.prior_cwnd - 1) // self.prior_cwnd - self.prr_out
        else:
            sndcnt = max(self.prr_delivered - self.prr_out, delivered)
            if una_advanced and not newly_lost:
                sndcnt += 1
            sndcnt = min(delta, sndcnt)
        sndcnt = max(sndcnt, 0 if self.prr_out else 1)
        self.cwnd = inflight + sndcnt

    def _cong_avoid(self, acked: int) -> None:
        """Slow start up to ssthresh, then one segment per window (``tcp_reno_cong_avoid``)."""
        if self.cwnd < self.ssthresh:
            grown = int(min(self.cwnd + acked, self.ssthresh))
            acked -= grown - self.cwnd
            self.cwnd = grown
            if acked <= 0:
                return
        self.cwnd_cnt += acked
        if self.cwnd_cnt >= self.cwnd:
            self.cwnd, self.cwnd_cnt = self.cwnd + self.cwnd_cnt // self.cwnd, self.cwnd_cnt % self.cwnd

    def _bbr_cwnd(self, delivered: int, newly_lost: int) -> None:
        """BBR's window on loss (``bbr_set_cwnd``, ``bbr_set_cwnd_to_recover_or_restore``)."""
        if not delivered:
            return
        cwnd = self.cwnd
        if newly_lost:
            cwnd = max(cwnd - newly_lost, 1)
        prev, self.bbr_prev_state = self.bbr_prev_state, self.state
        if self.state == _RECOVERY and prev != _RECOVERY:
            self.conservation = True
            cwnd = self._inflight() + delivered
        elif prev != _OPEN and self.state == _OPEN:
            cwnd = max(cwnd, self.prior_cwnd)
            self.conservation = False
        elif self.conservation and self.rack_xmit >= self.recovery_start:
            self.conservation = False  # a round has passed since recovery began
        if self.conservation:
            self.cwnd = max(cwnd, self._inflight() + delivered)
            return
        self.cwnd = max(cwnd + delivered, BBR_CWND_MIN)
