"""The origin's per-client budgets: per source address, open connections and two token buckets.

One bucket counts requests (``client_requests_per_s``, burst ``client_request_burst``), the
other response bytes (``client_bytes_per_s``; the bucket holds at least two objects of
``max_object_bytes`` so that any single object is servable).  The accept thread admits
connections, the workers charge response bytes and release connections, so the table has
its own lock.  Its size is bounded (:data:`MAX_CLIENT_BUDGETS`) so that an address scan
cannot grow it without limit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ._origin_config import OriginConfig

#: Client budgets kept at most (idle ones are forgotten first): bounded memory under address scans.
MAX_CLIENT_BUDGETS = 65536


@dataclass
class _ClientBudget:
    """Per source address: open connections and two token buckets (requests, response bytes)."""

    connections: int
    request_tokens: float
    byte_tokens: float
    updated: float


class ClientBudgets:
    """The budgets of every client address, under the limits of an :class:`OriginConfig`.

    The limits are read from ``config`` at each use (as the origin always did); only the byte
    bucket's size is fixed when the table is built.
    """

    def __init__(self, config: OriginConfig) -> None:
        self.config = config
        self.byte_burst = max(config.client_bytes_per_s, 2.0 * config.max_object_bytes)
        self._budgets: dict[str, _ClientBudget] = {}
        self._lock = threading.Lock()

    def admit(self, client: str) -> tuple[bool, bool]:
        """(admitted, rate limited) for a new connection from ``client``; counts it when admitted."""
        now = time.monotonic()
        config = self.config
        with self._lock:
            budget = self._budgets.get(client)
            if budget is None:
                if len(self._budgets) >= MAX_CLIENT_BUDGETS:
                    self._forget_idle(now)
                budget = _ClientBudget(0, float(config.client_request_burst), self.byte_burst, now)
                self._budgets[client] = budget
            self._refill(budget, now)
            if config.client_max_connections and budget.connections >= config.client_max_connections:
                return False, False
            budget.connections += 1
            rate_limited = False
            if config.client_requests_per_s > 0:
                if budget.request_tokens >= 1.0:
                    budget.request_tokens -= 1.0
                else:
                    rate_limited = True
            return True, rate_limited

    def take_request(self, client: str) -> bool:
        """Charge one more request on an open connection of ``client`` (HTTP/3 carries several on
        one connection); False when its request budget is spent."""
        return self.config.client_requests_per_s <= 0 or self._spend(client, "request_tokens", 1.0)

    def take_bytes(self, client: str, size: int) -> bool:
        """Charge ``size`` response bytes to ``client``; False when its byte budget cannot pay."""
        return self.config.client_bytes_per_s <= 0 or self._spend(client, "byte_tokens", float(size))

    def _spend(self, client: str, bucket: str, amount: float) -> bool:
        """Take ``amount`` from one of ``client``'s buckets (refilled first); a client without a
        budget (no connection admitted) pays nothing."""
        with self._lock:
            budget = self._budgets.get(client)
            if budget is None:
                return True
            self._refill(budget, time.monotonic())
            if getattr(budget, bucket) < amount:
                return False
            setattr(budget, bucket, getattr(budget, bucket) - amount)
            return True

    def release(self, client: str) -> None:
        """One (admitted) connection of ``client`` closed."""
        with self._lock:
            budget = self._budgets.get(client)
            if budget is not None and budget.connections > 0:
                budget.connections -= 1

    def _refill(self, budget: _ClientBudget, now: float) -> None:
        elapsed = max(0.0, now - budget.updated)
        budget.updated = now
        budget.request_tokens = min(
            float(self.config.client_request_burst), budget.request_tokens + elapsed * self.config.client_requests_per_s
        )
        budget.byte_tokens = min(self.byte_burst, budget.byte_tokens + elapsed * self.config.client_bytes_per_s)

    def _forget_idle(self, now: float) -> None:
        """Drop budgets without open connections, oldest first, until a quarter of the table is free."""
        idle = sorted((b.updated, c) for c, b in self._budgets.items() if b.connections == 0)
        for _, client in idle[: max(1, MAX_CLIENT_BUDGETS // 4)]:
            del self._budgets[client]
