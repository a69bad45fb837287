"""The instrumented origin: one listener per arm (IW policy), per-connection server measurements.

Arms (:mod:`iwprobe._arms`): ``N`` (IW N), ``Np`` (IW N, first window spread over the RTT,
:mod:`iwprobe._pacing`) and ``learned`` (the window the last connection to the client's
prefix ended with, :mod:`iwprobe._learned`).  How the IW is applied (:mod:`iwprobe._routes`):
each listener carries an ``SO_MARK``; an ``ip rule`` sends its traffic to a table whose
routes carry the arm's ``initcwnd``; the kernel reads it when the connection is established.
The origin reads ``snd_cwnd`` right after ``accept``, compares it with what the policy
intended (N, or the learned value for the client's prefix) and flags a mismatch on the
observation.

What the origin measures per connection (the IW10 paper's server-side latency): from the
moment the request is completely read until the last response byte is acknowledged,
found by polling ``TCP_INFO`` every ``poll_interval_s`` until ``unacked == 0`` and
``notsent_bytes == 0``.  It also keeps the time ``send`` returned (first byte written),
and ``TCP_INFO`` at the end.

Concurrency is bounded: one accept thread multiplexes all listeners with ``selectors``
and hands each connection to a fixed pool of worker threads; when all workers are busy
and the backlog queue is full, new connections are closed at once.  Slow clients time out
(``request_timeout_s``).  Bodies are slices of one shared read-only pattern buffer, and
header and body go to the kernel in one ``sendmsg`` call (scatter/gather, like writev).
"""

from __future__ import annotations

import json
import logging
import queue
import re
import selectors
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

from . import __version__, wire
from ._arms import LEARNED_CAP_IW, Arm, parse_arms
from ._caps import CAP_NET_ADMIN, drop_capability
from ._echo import EchoServer
from ._learned import LearnedWindows
from ._pacing import send_all, send_paced
from ._routes import DEFAULT_INITRWND, DEFAULT_MARK_BASE, DEFAULT_TABLE_BASE, RoutePlan
from ._spool import Spool, SpoolFull
from ._tcpinfo import read_tcp_info

log = logging.getLogger("iwprobe.origin")

SO_MARK = getattr(socket, "SO_MARK", 36)
#: Assumed MSS for sizing the send buffer when the real one is not known yet.
_ASSUMED_MSS = 1460
_REQUEST_LINE = re.compile(rb"^(GET) (\S+) HTTP/1\.[01]$")


def _env_number(name: str, default: int) -> int:
    """An integer limit from the environment (``name``), or ``default``; a bad value is an error."""
    import os

    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(float(text))
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


# ----------------------------------------------------------------------------- server
@dataclass
class OriginConfig:
    bind: str = "0.0.0.0"
    #: Arm labels (``"10"``, ``"10p"``, ``"learned"``) or plain IWs; see :mod:`iwprobe._arms`.
    arms: Sequence[Union[int, str, Arm]] = (3, 10, 16, 32)
    base_port: int = 8000
    max_object_bytes: int = wire.MAX_OBJECT_BYTES
    workers: int = 32
    queue_size: int = 128
    request_timeout_s: float = 10.0
    ack_timeout_s: float = 60.0
    poll_interval_s: float = 0.0005
    #: Fixed send buffer in bytes; 0 keeps the kernel's autotuning (recommended).
    sndbuf_bytes: int = 0
    mark_base: int = DEFAULT_MARK_BASE
    set_marks: bool = True
    origin_id: str = ""
    #: The learned arm: table of its per-prefix routes, window cap, forgetting time, and whether
    #: to install routes at all (False in tests without CAP_NET_ADMIN).
    table_base: int = DEFAULT_TABLE_BASE
    learned_cap_iw: int = LEARNED_CAP_IW
    learned_ttl_s: float = 600.0
    learned_routes: bool = True
    initrwnd: int = DEFAULT_INITRWND
    #: TCP congestion control of every connection (``TCP_CONGESTION`` on the listeners, inherited
    #: by accepted sockets), e.g. ``cubic``; empty keeps the host's default (which varies: CUBIC
    #: on a fresh Debian, BBR on some hosts; BBR paces everything after the first 10 segments).
    congestion_control: str = ""
    #: Serve the interactive flow's UDP echo on ``base_port`` (see :mod:`iwprobe._echo`).
    echo: bool = True
    # Per-client limits (per source address).  The defaults leave room for an offered-load round
    # (up to 256 trials in flight from one probe) and for a 100 Mbit/s probe fetching back to
    # back; the environment variables below override them (the CLI has no flags for them yet).
    #: Connections still sending their request head (read by the accept thread); beyond: closed at once.
    max_pending: int = field(default_factory=lambda: _env_number("IWPROBE_ORIGIN_MAX_PENDING", 1024))
    #: Open connections per client address (head being read, queued or served); beyond: closed at accept.
    client_max_connections: int = field(default_factory=lambda: _env_number("IWPROBE_ORIGIN_CLIENT_CONNECTIONS", 512))
    #: Requests per second per client address (token bucket; 0 = no limit); beyond: 429.
    client_requests_per_s: float = field(default_factory=lambda: float(_env_number("IWPROBE_ORIGIN_CLIENT_RPS", 1000)))
    client_request_burst: int = field(default_factory=lambda: _env_number("IWPROBE_ORIGIN_CLIENT_BURST", 2000))
    #: Response bytes per second per client address (0 = no limit); beyond: 429.  The bucket holds
    #: at least two objects of ``max_object_bytes`` so that any single object is servable.
    client_bytes_per_s: float = field(default_factory=lambda: float(
        _env_number("IWPROBE_ORIGIN_CLIENT_BYTES_PER_S", 64 * 1024 * 1024)))

    def policies(self) -> List[Arm]:
        return parse_arms(list(self.arms))

    def port(self, arm: Union[int, str, Arm]) -> int:
        """The listening port of an arm (a plain IW ``N`` is ``base_port + N``)."""
        return (arm if isinstance(arm, Arm) else parse_arms([arm])[0]).port(self.base_port)


@dataclass
class _Connection:
    sock: socket.socket
    client_addr: str
    arm: Arm
    port: int
    snd_cwnd_at_accept: int
    #: The initial window the arm's policy meant this connection to start with.
    intended_iw: int
    #: The RTT the handshake measured (µs), for spreading a paced arm's first window.
    handshake_rtt_us: int
    mss: int
    accepted_ns: int
    #: Set by the accept thread once the request head is read and routed.
    status: int = 0
    size: int = 0
    trial_id: Optional[str] = None
    reason: str = ""
    request_ns: int = 0
    request_at: str = ""


@dataclass
class _Pending:
    """A connection whose request head is still arriving (read non-blocking by the accept thread)."""

    conn: _Connection
    deadline: float
    rate_limited: bool
    buffer: bytearray = field(default_factory=bytearray)


@dataclass
class _ClientBudget:
    """Per source address: open connections and two token buckets (requests, response bytes)."""

    connections: int
    request_tokens: float
    byte_tokens: float
    updated: float


#: Largest request head accepted (bytes); a longer one is answered 431.
MAX_HEAD_BYTES = 16 * 1024
#: Client budgets kept at most (idle ones are forgotten first): bounded memory under address scans.
MAX_CLIENT_BUDGETS = 65536


@dataclass
class OriginStats:
    connections: int = 0
    shed: int = 0
    rate_limited: int = 0
    observations: int = 0
    dropped_observations: int = 0
    errors: Dict[str, int] = field(default_factory=dict)


class Origin:
    """Serves ``GET /obj/<bytes>`` on one port per arm and records observations."""

    def __init__(self, config: OriginConfig, spool: Optional[Spool] = None) -> None:
        self.arms = config.policies()  # ValueError on a bad label, an IW out of range, or none
        self.config = config
        learned = [arm for arm in self.arms if arm.policy == "learned"]
        self.learned: Optional[LearnedWindows] = None
        if learned:
            plan = RoutePlan(self.arms, mark_base=config.mark_base, table_base=config.table_base)
            self.learned = LearnedWindows(plan.table(learned[0]), learned[0].iw,
                                          max(learned[0].iw, config.learned_cap_iw), ttl_s=config.learned_ttl_s,
                                          initrwnd=config.initrwnd, apply_routes=config.learned_routes)
        self.spool = spool
        self.stats = OriginStats()
        self._pattern = bytes(range(256)) * ((config.max_object_bytes + 255) // 256)
        self._pattern_view = memoryview(self._pattern)
        self._listeners: Dict[Arm, Tuple[socket.socket, int]] = {}
        self.echo: Optional[EchoServer] = None
        self._queue: "queue.Queue[Optional[_Connection]]" = queue.Queue(maxsize=config.queue_size)
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._stats_lock = threading.Lock()
        self._sndbuf_warned: Set[str] = set()
        self._budgets: "Dict[str, _ClientBudget]" = {}
        self._budget_lock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        #: Set by drop_net_admin(): every origin thread drops CAP_NET_ADMIN at its next wake-up.
        self._drop_caps = threading.Event()
        self._caps_dropped = threading.Semaphore(0)
        self._all_threads_dropped = False
        self._byte_burst = max(config.client_bytes_per_s, 2.0 * config.max_object_bytes)

    # -- lifecycle
    def start(self) -> None:
        for arm in self.arms:
            self._listeners[arm] = (self._listen(arm), arm.port(self.config.base_port))
        if self.config.echo:
            self.echo = EchoServer(self.config.bind, self.config.base_port)
            self.echo.start()
        if self.learned is not None:
            # Started before the origin drops CAP_NET_ADMIN: the one thread that keeps it.
            self.learned.start()
        self._threads.append(threading.Thread(target=self._accept_loop, name="origin-accept", daemon=True))
        for index in range(self.config.workers):
            self._threads.append(threading.Thread(target=self._worker, name=f"origin-worker-{index}", daemon=True))
        for thread in self._threads:
            thread.start()
        log.info("origin %s serving arms %s on %s ports %s", __version__, [a.label for a in self.arms],
                 self.config.bind, [p for _, p in self._listeners.values()])

    def stop(self) -> None:
        self._stop.set()
        for _ in range(self.config.workers):
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break
        for thread in self._threads:
            thread.join(timeout=5)
        for sock, _ in self._listeners.values():
            sock.close()
        for pending in list(self._pending.values()):
            pending.conn.sock.close()
        self._pending.clear()
        if self.learned is not None:
            self.learned.close()
        if self.echo is not None:
            self.echo.stop()

    def drop_net_admin(self, wait_s: float = 2.0) -> bool:
        """Drop CAP_NET_ADMIN in the calling thread and every origin thread (capabilities are
        per thread).  The listeners already carry their ``SO_MARK`` and accepted sockets inherit
        it, so serving needs the capability no more.  True when every origin thread confirmed."""
        drop_capability(CAP_NET_ADMIN)
        if self._drop_caps.is_set():
            return self._all_threads_dropped  # asked before (e.g. by the CLI, then serve_forever)
        self._drop_caps.set()
        deadline = time.monotonic() + wait_s
        for _ in self._threads:
            if not self._caps_dropped.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
        self._all_threads_dropped = True
        return True

    def _drop_caps_if_asked(self, done: bool) -> bool:
        if done or not self._drop_caps.is_set():
            return done
        drop_capability(CAP_NET_ADMIN)
        self._caps_dropped.release()
        return True

    def _listen(self, arm: Arm) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.config.bind else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.config.set_marks:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_MARK, self.config.mark_base + arm.slot)
            except PermissionError as error:
                sock.close()
                raise PermissionError(f"setting SO_MARK needs CAP_NET_ADMIN: {error}") from None
        # Accepted sockets inherit a fixed SO_SNDBUF *and lose send-buffer autotuning*, which
        # caps the window (e.g. 512 KB: 20 Mbit/s at 200 ms).  By default the kernel sizes
        # the buffer itself when the connection is established (tcp_init_buffer_space ->
        # tcp_sndbuf_expand, from snd_cwnd = initcwnd), which always holds IW x MSS; a fixed
        # size is set only when asked for, and never below IW x MSS.
        if self.config.sndbuf_bytes:
            largest_iw = self.config.learned_cap_iw if arm.policy == "learned" else arm.iw
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(self.config.sndbuf_bytes, 2 * largest_iw * _ASSUMED_MSS))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.config.congestion_control:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, self.config.congestion_control.encode("ascii"))
            except OSError as error:
                sock.close()
                raise ValueError(f"congestion control {self.config.congestion_control!r}: {error}") from None
        sock.bind((self.config.bind, arm.port(self.config.base_port)))
        sock.listen(1024)
        sock.setblocking(False)
        return sock

    # -- accept and request heads (one thread, non-blocking)
    def _accept_loop(self) -> None:
        selector = selectors.DefaultSelector()
        for arm, (sock, port) in self._listeners.items():
            selector.register(sock, selectors.EVENT_READ, (arm, port))
        caps_dropped = False
        while not self._stop.is_set():
            caps_dropped = self._drop_caps_if_asked(caps_dropped)
            for key, _ in selector.select(timeout=0.1):
                if isinstance(key.data, _Pending):
                    self._read_pending(selector, key.data)
                else:
                    arm, port = key.data
                    self._accept_ready(selector, key.fileobj, arm, port)  # type: ignore[arg-type]
            self._expire_pending(selector)
        selector.close()

    def _accept_ready(self, selector: selectors.BaseSelector, listener: socket.socket, arm: Arm, port: int) -> None:
        """Accept every waiting connection of one listener (bounded by the per-client and pending limits)."""
        for _ in range(256):
            try:
                conn, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                log.warning("accept on port %d failed: %s", port, error)
                return
            accepted_ns = time.monotonic_ns()
            with self._stats_lock:
                self.stats.connections += 1
            client = str(address[0])
            admitted, rate_limited = self._admit(client)
            if not admitted or len(self._pending) >= self.config.max_pending:
                if admitted:
                    self._release(client)
                with self._stats_lock:
                    self.stats.shed += 1
                conn.close()
                continue
            intended = self.learned.intended(client) if arm.policy == "learned" and self.learned else arm.iw
            accept_info: Dict[str, int] = {}
            try:
                accept_info = read_tcp_info(conn)
                self._check_sndbuf(conn, arm, intended, accept_info.get("snd_mss", _ASSUMED_MSS))
            except OSError:
                pass
            conn.setblocking(False)
            pending = _Pending(_Connection(conn, client, arm, port, accept_info.get("snd_cwnd", 0), intended,
                                           accept_info.get("rtt", 0), accept_info.get("snd_mss", 0), accepted_ns),
                               time.monotonic() + self.config.request_timeout_s, rate_limited)
            self._pending[conn.fileno()] = pending
            selector.register(conn, selectors.EVENT_READ, pending)

    def _admit(self, client: str) -> Tuple[bool, bool]:
        """(admitted, rate limited) for a new connection from ``client``; counts it when admitted."""
        now = time.monotonic()
        config = self.config
        with self._budget_lock:
            budget = self._budgets.get(client)
            if budget is None:
                if len(self._budgets) >= MAX_CLIENT_BUDGETS:
                    self._forget_idle_budgets(now)
                budget = _ClientBudget(0, float(config.client_request_burst), self._byte_burst, now)
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

    def _refill(self, budget: _ClientBudget, now: float) -> None:
        elapsed = max(0.0, now - budget.updated)
        budget.updated = now
        budget.request_tokens = min(float(self.config.client_request_burst),
                                    budget.request_tokens + elapsed * self.config.client_requests_per_s)
        budget.byte_tokens = min(self._byte_burst, budget.byte_tokens + elapsed * self.config.client_bytes_per_s)

    def _forget_idle_budgets(self, now: float) -> None:
        """Drop budgets without open connections, oldest first, until a quarter of the table is free."""
        idle = sorted((b.updated, c) for c, b in self._budgets.items() if b.connections == 0)
        for _, client in idle[:max(1, MAX_CLIENT_BUDGETS // 4)]:
            del self._budgets[client]

    def _take_bytes(self, client: str, size: int) -> bool:
        """Charge ``size`` response bytes to ``client``; False when its byte budget cannot pay."""
        if self.config.client_bytes_per_s <= 0:
            return True
        with self._budget_lock:
            budget = self._budgets.get(client)
            if budget is None:
                return True
            self._refill(budget, time.monotonic())
            if budget.byte_tokens < size:
                return False
            budget.byte_tokens -= size
            return True

    def _release(self, client: str) -> None:
        with self._budget_lock:
            budget = self._budgets.get(client)
            if budget is not None and budget.connections > 0:
                budget.connections -= 1

    def _close(self, conn: _Connection) -> None:
        conn.sock.close()
        self._release(conn.client_addr)

    def _drop_pending(self, selector: selectors.BaseSelector, pending: _Pending, error: str) -> None:
        self._pending.pop(pending.conn.sock.fileno(), None)
        try:
            selector.unregister(pending.conn.sock)
        except (KeyError, ValueError):
            pass
        self._close(pending.conn)
        if error:
            self._count(error)

    def _expire_pending(self, selector: selectors.BaseSelector) -> None:
        """Close connections that did not send a whole request head in ``request_timeout_s`` (slowloris)."""
        now = time.monotonic()
        for pending in [p for p in self._pending.values() if p.deadline <= now]:
            self._drop_pending(selector, pending, "timeout")

    def _read_pending(self, selector: selectors.BaseSelector, pending: _Pending) -> None:
        conn = pending.conn
        try:
            chunk = conn.sock.recv(8192)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._drop_pending(selector, pending, type(error).__name__)
            return
        if not chunk:
            self._drop_pending(selector, pending, "closed_before_request")
            return
        pending.buffer += chunk
        head_end = pending.buffer.find(b"\r\n\r\n")
        verdict: Optional[Tuple[int, str]] = None
        if head_end > MAX_HEAD_BYTES:
            verdict = (431, f"request head larger than {MAX_HEAD_BYTES} bytes\n")
        elif head_end < 0:
            if len(pending.buffer) > MAX_HEAD_BYTES:
                verdict = (431, f"request head larger than {MAX_HEAD_BYTES} bytes\n")
            elif not _could_be_request(bytes(pending.buffer[:64])):
                verdict = (400, "not an HTTP request: only GET /obj/<bytes>\n")
            else:
                return  # wait for more (until the deadline)
        self._pending.pop(conn.sock.fileno(), None)
        selector.unregister(conn.sock)
        conn.request_ns = time.monotonic_ns()
        conn.request_at = wire.utc_timestamp()
        if verdict is not None:
            conn.status, conn.reason = verdict
        else:
            conn.status, conn.size, conn.trial_id, conn.reason = self._route(bytes(pending.buffer[:head_end]))
            if pending.rate_limited:
                conn.status, conn.size, conn.reason = 429, 0, "too many requests from this address\n"
            elif conn.status == 200 and not self._take_bytes(conn.client_addr, conn.size):
                conn.status, conn.size, conn.reason = 429, 0, "byte rate limit of this address reached\n"
        if conn.status == 429:
            with self._stats_lock:
                self.stats.rate_limited += 1
        try:
            self._queue.put_nowait(conn)
        except queue.Full:
            with self._stats_lock:
                self.stats.shed += 1
            self._close(conn)

    def _check_sndbuf(self, conn: socket.socket, arm: Arm, iw: int, mss: int) -> None:
        """Warn (once per arm) when the send buffer cannot hold the whole initial window."""
        if arm.label in self._sndbuf_warned:
            return
        sndbuf = conn.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        if sndbuf < iw * mss:
            self._sndbuf_warned.add(arm.label)
            log.warning("arm %s: send buffer %d bytes < IW x MSS = %d; the first flight will be cut short "
                        "(raise net.ipv4.tcp_wmem or --sndbuf)", arm.label, sndbuf, iw * mss)

    # -- per connection
    def _worker(self) -> None:
        caps_dropped = False
        while not self._stop.is_set():
            caps_dropped = self._drop_caps_if_asked(caps_dropped)
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                return
            try:
                self._serve(item)
            except Exception:  # one bad connection must not kill a worker
                log.exception("serving %s on port %d failed", item.client_addr, item.port)
            finally:
                self._close(item)

    def _serve(self, conn: _Connection) -> None:
        """Send the routed answer (the head was read by the accept thread) and measure it."""
        sock = conn.sock
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        status, size, trial_id, reason = conn.status, conn.size, conn.trial_id, conn.reason
        request_ns, request_at = conn.request_ns, conn.request_at
        body = self._pattern_view[:size] if status == 200 else reason.encode("ascii")
        extra = "Retry-After: 1\r\n" if status == 429 else ""
        header = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: "
                  f"{'application/octet-stream' if status == 200 else 'text/plain'}\r\n"
                  f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\nServer: iwprobe\r\n\r\n").encode("ascii")
        try:
            sock.settimeout(self.config.ack_timeout_s)
            if conn.arm.paced and status == 200:
                send_paced(sock, header, body, conn.arm.iw, conn.handshake_rtt_us, conn.mss)
            else:
                send_all(sock, header, body)
        except OSError as error:
            self._count(type(error).__name__)
            return
        first_byte_us = (time.monotonic_ns() - request_ns) // 1000
        latency_us, info = self._wait_acked(sock, request_ns)
        if self.learned is not None and conn.arm.policy == "learned" and latency_us is not None and status == 200:
            self.learned.observe(conn.client_addr, info)
        if status >= 400:
            _linger(sock)
        if trial_id is None:
            return
        observation = wire.OriginObservation(
            trial_id=trial_id, origin_id=self.config.origin_id or "00000000-0000-0000-0000-000000000000",
            arm_iw=conn.intended_iw, arm=conn.arm.label, port=conn.port, client_addr=conn.client_addr[:64],
            object_size=size if status == 200 else 0, request_at=request_at,
            first_byte_us=first_byte_us, response_latency_us=latency_us,
            snd_cwnd_at_accept=conn.snd_cwnd_at_accept,
            cwnd_mismatch=conn.snd_cwnd_at_accept != conn.intended_iw,
            rwnd_limited=info.get("rwnd_limited", 0) > 0,
            peer_rwnd=info.get("snd_wnd"),
            http_status=status, error_kind=None if status == 200 else "http_status",
            tcp_info=info)
        if latency_us is None and status == 200:
            observation.error_kind = "timeout"
        self._record(observation)

    def _route(self, head: bytes) -> Tuple[int, int, Optional[str], str]:
        """(status, object size, trial id, reason) for a request head."""
        lines = head.split(b"\r\n")
        trial_id: Optional[str] = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == wire.TRIAL_HEADER.lower().encode("ascii"):
                try:
                    trial_id = str(uuid.UUID(value.strip().decode("ascii")))
                except (ValueError, UnicodeDecodeError):
                    trial_id = None
        match = _REQUEST_LINE.match(lines[0])
        if not match:
            return 400, 0, trial_id, "bad request line\n"
        path = match.group(2).decode("latin-1")
        if not path.startswith(wire.OBJECT_PATH_PREFIX):
            return 404, 0, trial_id, "not found: only /obj/<bytes>\n"
        digits = path[len(wire.OBJECT_PATH_PREFIX):]
        if not digits.isdigit() or len(digits) > 12:
            return 400, 0, trial_id, "object size must be a decimal number of bytes\n"
        size = int(digits)
        if size > self.config.max_object_bytes:
            return 413, 0, trial_id, f"object larger than {self.config.max_object_bytes} bytes\n"
        return 200, size, trial_id, ""

    def _wait_acked(self, sock: socket.socket, request_ns: int) -> Tuple[Optional[int], Dict[str, int]]:
        """Poll TCP_INFO until everything sent is acknowledged; (latency µs or None, tcp_info)."""
        deadline_ns = request_ns + int(self.config.ack_timeout_s * 1e9)
        info: Dict[str, int] = {}
        while True:
            try:
                info = read_tcp_info(sock)
            except OSError:
                return None, info
            now_ns = time.monotonic_ns()
            if info.get("unacked", 0) == 0 and info.get("notsent_bytes", 0) == 0:
                return (now_ns - request_ns) // 1000, info
            if now_ns >= deadline_ns or self._stop.is_set():
                return None, info
            time.sleep(self.config.poll_interval_s)

    def _record(self, observation: wire.OriginObservation) -> None:
        with self._stats_lock:
            self.stats.observations += 1
        if self.spool is None:
            # Without a collector (``--no-upload``) observations go to stdout as JSON lines.
            line = json.dumps(wire.to_dict(observation), separators=(",", ":"))
            with self._stats_lock:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            return
        try:
            self.spool.add("observation", observation.trial_id, wire.to_dict(observation))
        except SpoolFull:
            with self._stats_lock:
                self.stats.dropped_observations += 1

    def _count(self, what: str) -> None:
        with self._stats_lock:
            self.stats.errors[what] = self.stats.errors.get(what, 0) + 1


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large",
            429: "Too Many Requests", 431: "Request Header Fields Too Large"}


def _could_be_request(start: bytes) -> bool:
    """False as soon as the first bytes cannot begin ``GET <path> HTTP/1.x`` (non-HTTP garbage)."""
    if not b"GET ".startswith(start[:4]):
        return False
    line_end = start.find(b"\n")
    if line_end < 0:
        return True
    return _REQUEST_LINE.match(start[:line_end].rstrip(b"\r")) is not None


def _linger(sock: socket.socket, limit_s: float = 0.5, limit_bytes: int = 65536) -> None:
    """Half-close and discard what the client still sends (briefly), so that closing with unread
    bytes does not reset the connection before the client has read an error answer."""
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + limit_s
        drained = 0
        while drained < limit_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            sock.settimeout(remaining)
            chunk = sock.recv(8192)
            if not chunk:
                return
            drained += len(chunk)
    except OSError:
        return


def serve_forever(origin: Origin, stop: threading.Event) -> None:
    """Drop CAP_NET_ADMIN (routes and listener marks are set), then log statistics every minute
    until ``stop``; then stop the (started) origin."""
    if origin.drop_net_admin():
        log.info("dropped CAP_NET_ADMIN in the origin's threads")
    else:
        log.warning("not every origin thread confirmed dropping CAP_NET_ADMIN")
    try:
        while not stop.wait(60):
            stats = origin.stats
            log.info("origin: %d connections, %d shed, %d rate-limited, %d observations, %d dropped, errors %s",
                     stats.connections, stats.shed, stats.rate_limited, stats.observations,
                     stats.dropped_observations, stats.errors)
    finally:
        origin.stop()
