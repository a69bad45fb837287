"""The instrumented origin: one listener per arm (IW policy), per-connection server measurements.

Arms (:mod:`iwprobe._arms`): ``N`` (IW N), ``Np`` (IW N, first window spread over the RTT,
:mod:`iwprobe._pacing`) and ``learned`` (the window the last connection to the client's
prefix ended with, :mod:`iwprobe._learned`).  How the IW is applied (:mod:`iwprobe._routes`):
each listener carries an ``SO_MARK``; an ``ip rule`` sends its traffic to a table whose
routes carry the arm's ``initcwnd``; the kernel reads it when the connection is established.
The origin reads ``snd_cwnd`` right after ``accept``, compares it with what the policy
intended (N, or the learned value for the client's prefix) and flags a mismatch on the
observation.

What the origin measures per connection (the IW10 paper's server-side latency, from the
request completely read until the last response byte is acknowledged) and the observation
it reports: :mod:`iwprobe._measure`.

Concurrency is bounded: one accept thread multiplexes all listeners with ``selectors``
and hands each connection to a fixed pool of worker threads; when all workers are busy
and the backlog queue is full, new connections are closed at once.  Slow clients time out
(``request_timeout_s``), and each client address has a budget of connections, requests and
response bytes (:mod:`iwprobe._budgets`).  Bodies are slices of one shared read-only pattern
buffer, and header and body go to the kernel in one ``sendmsg`` call (scatter/gather, like
writev), or by the send path the origin was told to use (:mod:`iwprobe._sendpath`: sendfile, a
write per MSS); every observation says the path it took and the device's segmentation offload
(:mod:`iwprobe._offload`).

The pieces: :mod:`iwprobe._origin_config` (:class:`OriginConfig`), :mod:`iwprobe._http`
(request heads and answers), :mod:`iwprobe._budgets`, :mod:`iwprobe._measure`,
:mod:`iwprobe._routes` (the arms' initial windows) and :mod:`iwprobe._caps`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import selectors
import socket
import ssl
import sys
import threading
import time
from typing import Any, Optional

from . import __version__, wire
from ._arms import Arm
from ._budgets import MAX_CLIENT_BUDGETS, ClientBudgets
from ._caps import CAP_NET_ADMIN, drop_capability
from ._capture import ConnectionCapture
from ._echo import EchoServer
from ._http import MAX_HEAD_BYTES, could_be_request, linger, object_pattern, response_head, route_request, wants_trace
from ._learned import LearnedWindows
from ._measure import Connection, build_observation, wait_acked
from ._offload import OffloadCache
from ._origin_config import OriginConfig
from ._origin_state import OriginStats, PendingHead, connection_family
from ._origin_trace import open_capture, trace_record
from ._pacing import send_paced
from ._routes import RoutePlan, missing_rule_families
from ._sendpath import SEND_PATH_CHOICES, BodyFile, send_response
from ._spool import Spool, SpoolFull
from ._tcpinfo import read_tcp_info
from ._tls import TlsStream, client_hello_state, handshake, server_context

# What ``from iwprobe._origin import ...`` has always offered (``OriginConfig`` and the limits now
# live in their own modules; the CLI and tests import them from here).
__all__ = ["Origin", "OriginConfig", "OriginStats", "serve_forever", "MAX_HEAD_BYTES", "MAX_CLIENT_BUDGETS", "SO_MARK"]

log = logging.getLogger("iwprobe.origin")

SO_MARK = getattr(socket, "SO_MARK", 36)
#: Assumed MSS for sizing the send buffer when the real one is not known yet.
_ASSUMED_MSS = 1460


class Origin:
    """Serves ``GET /obj/<bytes>`` on one port per arm and records observations."""

    def __init__(self, config: OriginConfig, spool: Optional[Spool] = None) -> None:
        self.arms = config.policies()  # ValueError on a bad label, an IW out of range, or none
        if config.send_path not in SEND_PATH_CHOICES:
            raise ValueError(f"send path must be one of {', '.join(SEND_PATH_CHOICES)}, not {config.send_path!r}")
        self.config = config
        learned = [arm for arm in self.arms if arm.policy == "learned"]
        self.learned: Optional[LearnedWindows] = None
        if learned:
            plan = RoutePlan(self.arms, mark_base=config.mark_base, table_base=config.table_base)
            self.learned = LearnedWindows(
                plan.table(learned[0]),
                learned[0].iw,
                max(learned[0].iw, config.learned_cap_iw),
                ttl_s=config.learned_ttl_s,
                initrwnd=config.initrwnd,
                apply_routes=config.learned_routes,
            )
        self.spool = spool
        self.stats = OriginStats()
        self._pattern = object_pattern(config.max_object_bytes)
        self._pattern_view = memoryview(self._pattern)
        self._body_file = BodyFile(self._pattern) if config.send_path == "sendfile" else None
        self._offload = OffloadCache()
        self.addresses = config.addresses()
        if bool(config.tls_cert) != bool(config.tls_key):
            raise ValueError("HTTPS needs both a certificate chain and its key")
        self.tls_context = server_context(config.tls_cert, config.tls_key) if config.tls_cert else None
        #: (socket, arm, port) per arm and address.
        self._listeners: list[tuple[socket.socket, Arm, int]] = []
        self.echoes: list[EchoServer] = []
        #: Families this origin listens in whose arm rules were missing at start (``_check_rules``).
        self.missing_rules: list[str] = []
        self._queue: queue.Queue[Optional[Connection]] = queue.Queue(maxsize=config.queue_size)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stats_lock = threading.Lock()
        self._sndbuf_warned: set[str] = set()
        self._budgets = ClientBudgets(config)
        self._pending: dict[int, PendingHead] = {}
        #: Set by drop_net_admin(): every origin thread drops CAP_NET_ADMIN at its next wake-up.
        self._drop_caps = threading.Event()
        self._caps_dropped = threading.Semaphore(0)
        self._all_threads_dropped = False

    # -- lifecycle
    def start(self) -> None:
        for address in self.addresses:
            for arm in self.arms:
                self._listeners.append((self._listen(arm, address), arm, arm.port(self.config.base_port)))
        self.missing_rules = self._check_rules()
        if self.config.echo:
            for address in self.addresses:
                echo = EchoServer(address, self.config.base_port)
                echo.start()
                self.echoes.append(echo)
        if self.learned is not None:
            # Started before the origin drops CAP_NET_ADMIN: the one thread that keeps it.
            self.learned.start()
        self._threads.append(threading.Thread(target=self._accept_loop, name="origin-accept", daemon=True))
        for index in range(self.config.workers):
            self._threads.append(threading.Thread(target=self._worker, name=f"origin-worker-{index}", daemon=True))
        for thread in self._threads:
            thread.start()
        log.info(
            "origin %s serving arms %s over %s on %s ports %s",
            __version__,
            [a.label for a in self.arms],
            "HTTPS" if self.tls_context else "HTTP",
            self.addresses,
            sorted({port for _, _, port in self._listeners}),
        )

    @property
    def echo(self) -> Optional[EchoServer]:
        """The echo service of the first address (``None`` without one)."""
        return self.echoes[0] if self.echoes else None

    @property
    def budgets(self) -> ClientBudgets:
        """The per-client budgets, shared with the HTTP/3 listeners (``iwprobe origin --quic``)."""
        return self._budgets

    def _check_rules(self) -> list[str]:
        """The families this origin listens in whose arm rules are missing (every connection
        of theirs starts with the route's default window: its observations say
        ``cwnd_mismatch``); logged loudly."""
        if not self.config.set_marks:
            return []
        listened = {"ipv6" if ":" in address else "ipv4" for address in self.addresses}
        if "::" in self.addresses:
            listened.add("ipv4")  # "::" serves IPv4-mapped clients too
        plan = RoutePlan(self.arms, mark_base=self.config.mark_base, table_base=self.config.table_base)
        missing = [family for family in missing_rule_families(plan) if family in listened]
        for family in missing:
            log.warning(
                "!!! %s: the arms' fwmark rules are missing (run `iwprobe origin setup-routes` or "
                "--setup-routes): %s connections get the default initial window, whatever their arm !!!",
                family,
                family,
            )
        return missing

    def stop(self) -> None:
        self._stop.set()
        for _ in range(self.config.workers):
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break
        for thread in self._threads:
            thread.join(timeout=5)
        for sock, _, _ in self._listeners:
            sock.close()
        for pending in list(self._pending.values()):
            pending.conn.sock.close()
        self._pending.clear()
        if self.learned is not None:
            self.learned.close()
        for echo in self.echoes:
            echo.stop()
        if self._body_file is not None:
            self._body_file.close()

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

    def _listen(self, arm: Arm, address: str) -> socket.socket:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and address != "::":
            # one family per socket: "::" alone keeps serving IPv4-mapped clients too
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
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
        sock.bind((address, arm.port(self.config.base_port)))
        sock.listen(1024)
        sock.setblocking(False)
        return sock

    # -- accept and request heads (one thread, non-blocking)
    def _accept_loop(self) -> None:
        selector = selectors.DefaultSelector()
        for sock, arm, port in self._listeners:
            selector.register(sock, selectors.EVENT_READ, (arm, port))
        caps_dropped = False
        while not self._stop.is_set():
            caps_dropped = self._drop_caps_if_asked(caps_dropped)
            for key, _ in selector.select(timeout=0.1):
                if isinstance(key.data, PendingHead):
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
            admitted, rate_limited = self._budgets.admit(client)
            if not admitted or len(self._pending) >= self.config.max_pending:
                if admitted:
                    self._budgets.release(client)
                with self._stats_lock:
                    self.stats.shed += 1
                conn.close()
                continue
            intended = self.learned.intended(client) if arm.policy == "learned" and self.learned else arm.iw
            accept_info: dict[str, int] = {}
            try:
                accept_info = read_tcp_info(conn)
                self._check_sndbuf(conn, arm, intended, accept_info.get("snd_mss", _ASSUMED_MSS))
            except OSError:
                pass
            conn.setblocking(False)
            pending = PendingHead(
                Connection(
                    conn,
                    client,
                    arm,
                    port,
                    accept_info.get("snd_cwnd", 0),
                    intended,
                    accept_info.get("rtt", 0),
                    accept_info.get("snd_mss", 0),
                    accepted_ns,
                    family=connection_family(listener, client),
                    rate_limited=rate_limited,
                    client_port=int(address[1]),
                ),
                time.monotonic() + self.config.request_timeout_s,
            )
            self._pending[conn.fileno()] = pending
            selector.register(conn, selectors.EVENT_READ, pending)

    def _close(self, conn: Connection) -> None:
        conn.sock.close()
        self._budgets.release(conn.client_addr)

    def _drop_pending(self, selector: selectors.BaseSelector, pending: PendingHead, error: str) -> None:
        self._pending.pop(pending.conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(pending.conn.sock)
        self._close(pending.conn)
        if error:
            self._count(error)

    def _expire_pending(self, selector: selectors.BaseSelector) -> None:
        """Close connections that did not send a whole request head in ``request_timeout_s`` (slowloris)."""
        now = time.monotonic()
        for pending in [p for p in self._pending.values() if p.deadline <= now]:
            self._drop_pending(selector, pending, "timeout")

    def _read_pending(self, selector: selectors.BaseSelector, pending: PendingHead) -> None:
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
        if self.tls_context is not None:
            self._hello_read(selector, pending)
            return
        head_end = pending.buffer.find(b"\r\n\r\n")
        verdict: Optional[tuple[int, str]] = None
        if head_end > MAX_HEAD_BYTES:
            verdict = (431, f"request head larger than {MAX_HEAD_BYTES} bytes\n")
        elif head_end < 0:
            if len(pending.buffer) > MAX_HEAD_BYTES:
                verdict = (431, f"request head larger than {MAX_HEAD_BYTES} bytes\n")
            elif not could_be_request(bytes(pending.buffer[:64])):
                verdict = (400, "not an HTTP request: only GET /obj/<bytes>\n")
            else:
                return  # wait for more (until the deadline)
        self._pending.pop(conn.sock.fileno(), None)
        selector.unregister(conn.sock)
        self._route(conn, bytes(pending.buffer[:head_end]), verdict)
        self._enqueue(conn)

    def _hello_read(self, selector: selectors.BaseSelector, pending: PendingHead) -> None:
        """HTTPS: queue the connection once its whole ClientHello is in (the worker shakes hands)."""
        state = client_hello_state(bytes(pending.buffer))
        if state is None:
            return  # wait for more (until the deadline)
        if state != "complete":
            self._drop_pending(selector, pending, state)
            return
        conn = pending.conn
        self._pending.pop(conn.sock.fileno(), None)
        selector.unregister(conn.sock)
        conn.hello_ns = time.monotonic_ns()
        conn.client_hello = bytes(pending.buffer)
        self._enqueue(conn)

    def _enqueue(self, conn: Connection) -> None:
        """Hand a connection to the workers; shed it when they are all busy and the queue is full."""
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
            log.warning(
                "arm %s: send buffer %d bytes < IW x MSS = %d; the first flight will be cut short "
                "(raise net.ipv4.tcp_wmem or --sndbuf)",
                arm.label,
                sndbuf,
                iw * mss,
            )

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

    def _serve(self, conn: Connection) -> None:
        """Send the routed answer (the head was read by the accept thread; over HTTPS the
        worker shakes hands and reads it first) and measure it."""
        sock = conn.sock
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = None
        if conn.client_hello is not None:
            stream = self._tls_request(conn)
            if stream is None:
                return
        status, size, trial_id = conn.status, conn.size, conn.trial_id
        body = self._pattern_view[:size] if status == 200 else conn.reason.encode("ascii")
        quic = self.config.quic and conn.client_hello is not None and conn.arm.policy != "learned"
        header = response_head(status, len(body), f'h3=":{conn.arm.port(self.config.base_port)}"' if quic else "")
        capture = self._trace_capture(conn) if conn.trace and trial_id is not None and status == 200 else None
        try:
            self._respond(conn, stream, header, body, capture)
        finally:
            if capture is not None:
                capture.close()

    def _respond(
        self, conn: Connection, stream: Optional[TlsStream], header: bytes, body: Any, capture: Optional[ConnectionCapture]
    ) -> None:
        """Send the answer, wait until it is acknowledged, record the observation (and the
        trace, when one was asked for and ``capture`` is open)."""
        sock, status, trial_id, request_ns = conn.sock, conn.status, conn.trial_id, conn.request_ns
        try:
            sock.settimeout(self.config.ack_timeout_s)
            if stream is not None:  # the records of head and body, written as one response
                header, body = b"", memoryview(stream.encrypt(header, body))
            if conn.arm.paced and status == 200:
                send_paced(sock, header, body, conn.arm.iw, conn.handshake_rtt_us, conn.mss)
                conn.send_path = "paced"
            else:
                conn.send_path = send_response(
                    sock,
                    self.config.send_path,
                    header,
                    body,
                    mss=conn.mss,
                    body_file=self._body_file,
                    plain_body=stream is None and status == 200,
                )
            conn.segmentation_offload = self._offload.of_local(sock.getsockname()[0])
        except OSError as error:
            self._count(type(error).__name__)
            return
        first_byte_us = (time.monotonic_ns() - request_ns) // 1000
        latency_us, info = wait_acked(sock, request_ns, self.config.ack_timeout_s, self.config.poll_interval_s, self._stop)
        if self.learned is not None and conn.arm.policy == "learned" and latency_us is not None and status == 200:
            self.learned.observe(conn.client_addr, info)
        if status >= 400:
            linger(sock)
        if trial_id is None:
            return
        self.record(build_observation(conn, trial_id, self.config.origin_id, first_byte_us, latency_us, info))
        if capture is not None:
            self._record_trace(conn, trial_id, capture, info)

    def _trace_capture(self, conn: Connection) -> Optional[ConnectionCapture]:
        """:func:`iwprobe._origin_trace.open_capture` when uploads are on (counted when not root)."""
        if self.spool is None:
            return None
        capture = open_capture(conn)
        if capture is None:
            self._count("trace_capture_unavailable")
        return capture

    def _record_trace(self, conn: Connection, trial_id: str, capture: ConnectionCapture, info: dict[str, int]) -> None:
        assert self.spool is not None
        try:
            self.spool.add("trace", f"{trial_id}:sender", trace_record(conn, trial_id, capture, info))
        except SpoolFull:
            self._count("trace_spool_full")

    def _tls_request(self, conn: Connection) -> Optional[TlsStream]:
        """HTTPS: the handshake (measured on ``conn.tls``), then the request head read and
        routed as the accept thread does for HTTP; ``None`` when it went wrong (counted)."""
        assert self.tls_context is not None and conn.client_hello is not None
        stream = TlsStream(self.tls_context, conn.sock)
        conn.tls = handshake(
            stream, conn.client_hello, conn.hello_ns, self.config.request_timeout_s, self.config.poll_interval_s, self._stop
        )
        if conn.tls.error:
            self._count(f"tls_handshake_{conn.tls.error}")
            return None
        deadline_ns = conn.hello_ns + int(self.config.request_timeout_s * 1e9)
        verdict: Optional[tuple[int, str]] = None
        try:
            head = stream.read_head(MAX_HEAD_BYTES, deadline_ns)
        except ValueError:
            verdict, head = (431, f"request head larger than {MAX_HEAD_BYTES} bytes\n"), b""
        except (OSError, ssl.SSLError) as error:
            self._count(f"tls_{type(error).__name__}")
            return None
        if head is None:
            self._count("closed_before_request")
            return None
        self._route(conn, head, verdict)
        return stream

    def _route(self, conn: Connection, head: bytes, verdict: Optional[tuple[int, str]]) -> None:
        """The request is read (now): route its head, or answer ``verdict`` (a bad head); then
        the client's budgets (a 429 when its rate or byte budget is spent)."""
        conn.request_ns = time.monotonic_ns()
        conn.request_at = wire.utc_timestamp()
        if verdict is not None:
            conn.status, conn.reason = verdict
        else:
            conn.status, conn.size, conn.trial_id, conn.reason = route_request(head, self.config.max_object_bytes)
            conn.trace = wants_trace(head)
            if conn.rate_limited:
                conn.status, conn.size, conn.reason = 429, 0, "too many requests from this address\n"
            elif conn.status == 200 and not self._budgets.take_bytes(conn.client_addr, conn.size):
                conn.status, conn.size, conn.reason = 429, 0, "byte rate limit of this address reached\n"
        if conn.status == 429:
            with self._stats_lock:
                self.stats.rate_limited += 1

    def record(self, observation: wire.OriginObservation) -> None:
        """Spool an observation for the collector (stdout without one); any thread may call it,
        the HTTP/3 listeners' included."""
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
            log.info(
                "origin: %d connections, %d shed, %d rate-limited, %d observations, %d dropped, errors %s",
                stats.connections,
                stats.shed,
                stats.rate_limited,
                stats.observations,
                stats.dropped_observations,
                stats.errors,
            )
    finally:
        origin.stop()
