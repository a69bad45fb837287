"""The agent's budget for destroy notifications: it listens part of each second when closes are many.

A destroy notification costs the *server*, not only the agent: while any socket of the network
namespace listens to the destroy groups, the kernel builds a ``TCP_INFO`` message for every TCP
socket it frees, on the CPU that freed it (measured on this project's bench, one nginx core at
19,000 connections/s: 12 % of its requests/s with a filter that rejects every message, 17 % with
the agent reading them; ``bench/bench_tap.py``).  Nothing the agent does after the fact makes that
cheaper, so above ``budget`` closes/s it *stops listening* for part of every period
(:meth:`iwprobe._sockdiag.DestroyListener.listen`): the kernel then builds nothing.

The connections measured are those that close while the agent listens: a sample in time, the
same for every arm (an arm is a function of the client's prefix, the listening window of the
clock), so the comparison between arms keeps its balance; the totals are estimated
(:attr:`DutyCycle.unmeasured`) and the share measured is reported in the heartbeat
(``closes_share``).
"""

from __future__ import annotations

import random

#: Closes per second the agent measures at most by default (every connection below it): 180,000
#: connections an hour on a busy server.  With 1,000 (and the capture's 20,000 packets/s) the
#: agent cost a one-core nginx at one connection per request 6 % [3, 8] of its requests/s; with
#: 50 and 1,000, 1.7 % pooled there (4-5 % in a later hour) and nothing this box can resolve at
#: keep-alive loads (docs/probe.md, ``bench/bench_tap.py``).
DEFAULT_CLOSES_PER_S = 50
#: The listening window repeats every period; the agent listens ``share`` of it.
PERIOD_S = 1.0
#: The least share of each period the capture is open (10 ms of every second's worth).
MIN_SHARE = 0.01
#: The least share of each period the agent listens for closes (2 ms of every second): at 19,000
#: closes/s that is ~40 a second, near the default budget of 50.  A floor of 1 % there measured
#: ~190 closes/s, four times the budget; with 0.2 % the agent's CPU per 5-s block at 19,000
#: closes/s fell from 0.06 to 0.02 s (median; docs/probe.md).
MIN_LISTEN_SHARE = 0.002
#: Weight of the newest second in the smoothed close rate.
SMOOTHING = 0.5


class DutyCycle:
    """When to listen, from the close rate seen while listening (pure: the caller gives the time)."""

    def __init__(self, budget_per_s: float, now: float) -> None:
        #: Closes per second to measure at most; ``0``: no limit (listen always).
        self.budget_per_s = budget_per_s
        self.share = 1.0
        self.rate_per_s = 0.0
        #: Closes not measured (estimated from the rate while listening).
        self.unmeasured = 0.0
        self._period_start = now
        self._window_start = now
        self._listened_s = 0.0
        self._closes = 0
        self._last = now
        self._listening = True

    def listening(self, now: float) -> bool:
        """Whether to listen at ``now`` (the first ``share`` of each period)."""
        if now - self._period_start >= PERIOD_S:
            self._period_start += PERIOD_S * int((now - self._period_start) // PERIOD_S)
        return self.share >= 1.0 or now - self._period_start < self.share * PERIOD_S

    def next_change_s(self, now: float) -> float:
        """Seconds until :meth:`listening` may change (a poll timeout)."""
        if self.share >= 1.0:
            return PERIOD_S
        into = now - self._period_start
        edge = self.share * PERIOD_S
        return max(0.001, (edge - into) if into < edge else (PERIOD_S - into))

    def account(self, now: float, listening: bool, closes: int) -> None:
        """Time since the last call was spent listening or not; ``closes`` arrived meanwhile."""
        elapsed = max(0.0, now - self._last)
        if self._listening:
            self._listened_s += elapsed
        else:
            self.unmeasured += self.rate_per_s * elapsed
        self._closes += closes
        self._last = now
        self._listening = listening

    def adapt(self, now: float) -> float:
        """Once a second: the close rate while listening and the share to listen next."""
        if now - self._window_start < PERIOD_S:
            return self.share
        if self._listened_s > 0.0:
            rate = self._closes / self._listened_s
            self.rate_per_s = rate if self.rate_per_s == 0.0 else SMOOTHING * rate + (1 - SMOOTHING) * self.rate_per_s
        if self.budget_per_s > 0 and self.rate_per_s > self.budget_per_s:
            self.share = max(MIN_LISTEN_SHARE, self.budget_per_s / self.rate_per_s)
        else:
            self.share = 1.0
        self._window_start, self._listened_s, self._closes = now, 0.0, 0
        return self.share


#: The server's packets per second (all interfaces, both directions) the capture may sit on
#: by default.  An ``AF_PACKET`` socket costs every packet the host sends (the kernel clones it
#: before any filter runs): 5 % of a one-core nginx at ~200,000 packets/s with a filter that
#: keeps nothing (``bench/bench_tap.py``).  Above the budget the capture is open in windows
#: (1,000, not 20,000: see :data:`DEFAULT_CLOSES_PER_S`).
DEFAULT_CAPTURE_TRAFFIC_PPS = 1_000
#: A window admits new connections (SYNs) this long, then follows them this long more (a first
#: response slower than the tail is not measured), then the capture closes.
ADMIT_S = 5.0
TAIL_S = 10.0


class CaptureWindows:
    """When the first-response capture is open, from the server's packet rate (pure, like
    :class:`DutyCycle`): open ``share = budget / rate`` of the time, in windows of
    :data:`ADMIT_S` + :data:`TAIL_S` seconds; connections are sampled by when they start, which
    is the same for every arm."""

    def __init__(self, budget_pps: float, now: float) -> None:
        #: Server packets/s the capture may sit on; ``0``: no limit (always open).
        self.budget_pps = budget_pps
        self.share = 1.0
        self.rate_pps = 0.0
        self._rng = random.Random()
        #: Until the first rate is known the capture stays closed (a busy server would otherwise
        #: pay a whole window at every start); without a budget it is open at once.
        self._known = budget_pps <= 0
        self._opened = now
        self._closes_at = float("inf")
        self._reopens_at = now

    @property
    def known(self) -> bool:
        """Whether the server's packet rate is known (before, the capture stays closed)."""
        return self._known

    @property
    def limited(self) -> bool:
        """Whether there is a budget at all (without one the rate is not even read)."""
        return self.budget_pps > 0

    def _open_share(self) -> float:
        if self.budget_pps <= 0 or self.rate_pps <= self.budget_pps:
            return 1.0
        return max(MIN_SHARE, self.budget_pps / self.rate_pps)

    @property
    def admitting_share(self) -> float:
        """Share of time new connections are admitted in the long run: 0 until the rate is
        known, 1 below the budget, else the open share's admitting part."""
        if not self._known:
            return 0.0
        return 1.0 if self.share >= 1.0 else self.share * ADMIT_S / (ADMIT_S + TAIL_S)

    def observe(self, now: float, rate_pps: float) -> None:
        """Once a second: the server's packet rate."""
        self.rate_pps = rate_pps if self.rate_pps == 0.0 else SMOOTHING * rate_pps + (1 - SMOOTHING) * self.rate_pps
        share = self._open_share()
        if share >= 1.0:
            self._closes_at = float("inf")
        elif not self._known or self.share >= 1.0 or self._closes_at == float("inf"):
            # Over the budget from now on: admit no new connection, follow those admitted (if
            # the capture was open) for the tail, and open the first window at a random point
            # of the cycle: any stretch of time is then in a window with the same chance, ``share``.
            tail = TAIL_S if self._known else 0.0
            self._opened, self._closes_at = now - ADMIT_S, now + tail
            self._reopens_at = now + tail + self._rng.uniform(0.0, (ADMIT_S + TAIL_S) / share)
        self._known = True
        self.share = share

    def state(self, now: float) -> str:
        """``admit`` (follow new connections), ``follow`` (only those admitted) or ``closed``."""
        if not self._known:
            return "closed"
        if self._closes_at == float("inf"):
            return "admit"
        if now >= self._reopens_at:
            self._opened, self._closes_at = now, now + ADMIT_S + TAIL_S
            self._reopens_at = now + (ADMIT_S + TAIL_S) / max(self.share, MIN_SHARE)
        if now < self._opened + ADMIT_S:
            return "admit"
        return "follow" if now < self._closes_at else "closed"
