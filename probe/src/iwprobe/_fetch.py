"""One measured HTTP/1.1 fetch over a fresh TCP connection (the probe's trial).

Durations come from ``time.monotonic_ns`` (immune to wall-clock steps); the start instant
is wall-clock UTC.  Every failure becomes a trial with an ``error_kind`` instead of an
exception.

SYN retransmissions: right after ``connect`` returns we read the client's ``TCP_INFO``.
Linux counts a retransmitted SYN in ``tcpi_total_retrans`` (``tcp_retransmit_skb``) and,
since 6.7, as an RTO in ``tcpi_total_rto``; we take the larger of the two.  On kernels that
report neither, a connect that took longer than the 1 s initial RTO counts as one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Optional

from . import wire
from ._capture import CaptureUnavailable, ConnectionCapture, Packet
from ._iwinfer import Inference, infer
from ._tcpinfo import read_tcp_info

_MAX_HEADER_BYTES = 64 * 1024
_RECV_BYTES = 256 * 1024
#: Linux's initial retransmission timeout for a SYN (RFC 6298), microseconds.
INITIAL_RTO_US = 1_000_000


@dataclass
class FetchResult:
    """What one fetch measured; :meth:`to_trial` turns it into a wire record."""

    url: str
    started_at: str
    dns_us: Optional[int] = None
    connect_us: Optional[int] = None
    ttfb_us: Optional[int] = None
    total_us: Optional[int] = None
    bytes_received: int = 0
    body_bytes: int = 0
    http_status: Optional[int] = None
    error_kind: Optional[str] = None
    error_detail: Optional[str] = None
    syn_retrans: int = 0
    tcp_info: dict[str, int] = field(default_factory=dict)
    #: HTTPS: the TLS version and TCP established -> handshake complete (µs).
    tls_version: str = ""
    tls_handshake_us: Optional[int] = None
    #: ``"ipv4"`` or ``"ipv6"`` once an address was chosen.
    family: str = ""
    #: Per recv, when asked for (calibration): (microseconds since connect, cumulative bytes
    #: the application read, cumulative data segments the kernel received: ``tcpi_data_segs_in``).
    #: The segment count follows arrivals; the bytes read jump when a retransmission fills a
    #: hole and releases the out-of-order queue, or when the reader falls behind.
    progress: list[tuple[int, int, int]] = field(default_factory=list)
    #: The server's initial window inferred from the probe's capture (``infer_iw=True``);
    #: None when not asked for or when the capture could not be opened (``iw_unavailable``).
    iw: Optional[Inference] = None
    iw_unavailable: str = ""
    #: The response's ``Alt-Svc`` header ("" if none): where the server offers HTTP/3.
    alt_svc: str = ""
    #: The connection's captured packets, both directions, in capture order (``infer_iw``),
    #: and how many the capture's kernel queue dropped (``iwprobe fetch --trace`` keeps both).
    packets: list[Packet] = field(default_factory=list)
    capture_dropped: int = 0

    def to_trial(
        self,
        trial_id: str,
        probe_id: str,
        campaign_id: Optional[int],
        origin_id: Optional[str],
        round_number: int,
        arm_iw: int,
        object_size: int,
    ) -> wire.TrialRecord:
        return wire.TrialRecord(
            trial_id=trial_id,
            probe_id=probe_id,
            campaign_id=campaign_id,
            origin_id=origin_id,
            round=round_number,
            arm_iw=arm_iw,
            object_size=object_size,
            url=self.url,
            started_at=self.started_at,
            dns_us=self.dns_us,
            connect_us=self.connect_us,
            ttfb_us=self.ttfb_us,
            total_us=self.total_us,
            bytes_received=self.bytes_received,
            http_status=self.http_status,
            error_kind=self.error_kind,
            error_detail=self.error_detail[:500] if self.error_detail else None,
            syn_retrans=self.syn_retrans,
            tcp_info=dict(self.tcp_info),
            tls_version=self.tls_version,
            tls_handshake_us=self.tls_handshake_us,
            family=self.family,
            client_iw=None if self.iw is None else self.iw.to_wire(),
        )


class _TrialError(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


#: ``family`` argument of :func:`fetch` -> address family to resolve.
_FAMILIES = {"": socket.AF_UNSPEC, "ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}


def object_url(host: str, port: int, size: int, tls: bool = False) -> str:
    """URL of a sized object on an origin listener."""
    literal = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{'https' if tls else 'http'}://{literal}:{port}{wire.OBJECT_PATH_PREFIX}{size}"


def client_context(ca_file: Optional[str] = None, verify: bool = True) -> ssl.SSLContext:
    """The probe's TLS context: TLS 1.2 and 1.3, the system's CAs or ``ca_file``; no session
    resumption (every trial is a full handshake: the probe never offers a ticket)."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    return context


def fetch(
    url: str,
    trial_id: Optional[str] = None,
    probe_id: Optional[str] = None,
    connect_timeout_s: float = 10.0,
    timeout_s: float = 60.0,
    record_progress: bool = False,
    tls_context: Optional[ssl.SSLContext] = None,
    family: str = "",
    infer_iw: bool = False,
    announce_mss: Optional[int] = None,
    range_bytes: Optional[int] = None,
    trace: bool = False,
) -> FetchResult:
    """Fetch ``url`` once over a new connection and measure it; never raises for network errors.

    ``https://`` URLs shake hands with ``tls_context`` (default: :func:`client_context`) and
    record the handshake's time; ``family`` (``"ipv4"``/``"ipv6"``) restricts name resolution.
    ``infer_iw`` captures the connection's packets (``AF_PACKET``, root) and infers the
    server's initial window (:mod:`iwprobe._iwinfer`) into ``result.iw``; ``announce_mss``
    sets the MSS the probe's SYN announces (``TCP_MAXSEG``: a small one makes a small object
    fill a large window); ``range_bytes`` asks for the object's first bytes only (``Range``)
    and stops reading after them (a 206 answer counts as success)."""
    result = FetchResult(url=url, started_at=wire.utc_timestamp())
    start_ns = time.monotonic_ns()
    sock: Optional[socket.socket] = None
    capture: Optional[ConnectionCapture] = None
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _TrialError("other", f"only http:// and https:// URLs with a host are supported: {url!r}")
        if family not in _FAMILIES:
            raise _TrialError("other", f"family must be one of {sorted(_FAMILIES)}, got {family!r}")
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # -- DNS
        try:
            ipaddress.ip_address(host)
            literal = True
        except ValueError:
            literal = False
        try:
            infos = socket.getaddrinfo(host, port, _FAMILIES[family], type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        except socket.gaierror as error:
            raise _TrialError("dns", f"{host}: {error}") from None
        result.dns_us = 0 if literal else (time.monotonic_ns() - start_ns) // 1000
        address_family, socktype, proto, _, address = infos[0]
        result.family = "ipv6" if address_family == socket.AF_INET6 else "ipv4"
        # -- connect
        sock = socket.socket(address_family, socktype, proto)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if announce_mss is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, announce_mss)
        if infer_iw:
            sock.bind(("::", 0) if address_family == socket.AF_INET6 else ("0.0.0.0", 0))
            try:
                capture = ConnectionCapture(sock.getsockname()[1])
            except CaptureUnavailable as error:
                result.iw_unavailable = str(error)
        sock.settimeout(connect_timeout_s)
        connect_start_ns = time.monotonic_ns()
        try:
            sock.connect(address)
        except socket.timeout:
            raise _TrialError("timeout", f"connect to {address} timed out after {connect_timeout_s} s") from None
        except ConnectionRefusedError as error:
            raise _TrialError("refused", f"{address}: {error}") from None
        except ConnectionResetError as error:
            raise _TrialError("reset", f"{address}: {error}") from None
        connected_ns = time.monotonic_ns()
        result.connect_us = (connected_ns - connect_start_ns) // 1000
        result.syn_retrans = _syn_retransmissions(read_tcp_info(sock), result.connect_us)
        if parts.scheme == "https":
            sock = _tls_handshake(
                sock, host, tls_context or client_context(), result, connected_ns, start_ns + int(timeout_s * 1e9)
            )
        # -- request
        headers = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}", "User-Agent: iwprobe", "Accept: */*", "Connection: close"]
        if trial_id:
            headers.append(f"{wire.TRIAL_HEADER}: {trial_id}")
        if probe_id:
            headers.append(f"{wire.PROBE_HEADER}: {probe_id}")
        if trace:  # the origin keeps its own side of a traced trial
            headers.append(f"{wire.TRACE_HEADER}: 1")
        if range_bytes is not None:
            headers.append(f"Range: bytes=0-{range_bytes - 1}")
        request = ("\r\n".join(headers) + "\r\n\r\n").encode("ascii")
        deadline_ns = start_ns + int(timeout_s * 1e9)
        _settimeout(sock, deadline_ns)
        try:
            sock.sendall(request)
            _read_response(sock, result, connected_ns, start_ns, deadline_ns, record_progress, range_bytes)
        except socket.timeout:
            raise _TrialError(
                "timeout", f"no complete response within {timeout_s} s ({result.bytes_received} bytes received)"
            ) from None
        except ConnectionResetError as error:
            raise _TrialError("reset", str(error)) from None
        except ConnectionRefusedError as error:
            raise _TrialError("refused", str(error)) from None
    except _TrialError as error:
        result.error_kind = error.kind
        result.error_detail = error.detail[:500]
    except OSError as error:
        result.error_kind = "other"
        result.error_detail = f"{type(error).__name__}: {error}"[:500]
    finally:
        if sock is not None:
            with contextlib.suppress(OSError):
                result.tcp_info = read_tcp_info(sock)
            sock.close()
        if capture is not None:
            try:
                result.packets = capture.read()
                result.capture_dropped = capture.dropped()
                result.iw = infer(
                    result.packets,
                    rcv_mss=result.tcp_info.get("rcv_mss"),
                    dropped=result.capture_dropped,
                    min_rtt_us=result.tcp_info.get("min_rtt"),
                )
            finally:
                capture.close()
    return result


def _tls_handshake(
    sock: socket.socket, host: str, context: ssl.SSLContext, result: FetchResult, connected_ns: int, deadline_ns: int
) -> ssl.SSLSocket:
    """The TLS handshake over the connected ``sock``, timed from ``connected_ns``."""
    tls = context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    try:
        _settimeout(tls, deadline_ns)
        tls.do_handshake()
    except socket.timeout:
        tls.close()
        raise _TrialError("timeout", "TLS handshake did not complete in time") from None
    except ssl.SSLError as error:
        tls.close()
        raise _TrialError("tls", f"TLS handshake failed: {error}") from None
    except OSError:
        tls.close()
        raise
    result.tls_handshake_us = (time.monotonic_ns() - connected_ns) // 1000
    result.tls_version = tls.version() or ""
    return tls


def _settimeout(sock: socket.socket, deadline_ns: int) -> None:
    remaining = (deadline_ns - time.monotonic_ns()) / 1e9
    if remaining <= 0:
        raise socket.timeout("deadline passed")
    sock.settimeout(remaining)


def _read_response(
    sock: socket.socket,
    result: FetchResult,
    connected_ns: int,
    start_ns: int,
    deadline_ns: int,
    record_progress: bool,
    range_bytes: Optional[int] = None,
) -> None:
    buffer = bytearray()
    header_end = -1
    content_length: Optional[int] = None
    body_received = 0
    while True:
        _settimeout(sock, deadline_ns)
        chunk = sock.recv(_RECV_BYTES)
        now_ns = time.monotonic_ns()
        if chunk and result.ttfb_us is None:
            result.ttfb_us = (now_ns - connected_ns) // 1000
        if not chunk:
            break
        result.bytes_received += len(chunk)
        if record_progress:
            segments = read_tcp_info(sock).get("data_segs_in", 0)
            result.progress.append(((time.monotonic_ns() - connected_ns) // 1000, result.bytes_received, segments))
        if header_end < 0:
            buffer += chunk
            header_end = buffer.find(b"\r\n\r\n")
            if header_end < 0:
                if len(buffer) > _MAX_HEADER_BYTES:
                    raise _TrialError("protocol", "response header longer than 64 KiB")
                continue
            result.http_status, content_length, result.alt_svc = _parse_head(bytes(buffer[:header_end]))
            body_received = len(buffer) - header_end - 4
            buffer = bytearray()
        else:
            body_received += len(chunk)
        if (content_length is not None and body_received >= content_length) or (
            range_bytes is not None and header_end >= 0 and body_received >= range_bytes
        ):
            result.total_us = (now_ns - start_ns) // 1000
            break
    result.body_bytes = body_received
    if header_end < 0:
        raise _TrialError(
            "short_body" if result.bytes_received else "protocol",
            f"connection closed after {result.bytes_received} bytes, before the response header ended",
        )
    if content_length is None:
        result.total_us = (time.monotonic_ns() - start_ns) // 1000
    elif body_received < content_length and not (range_bytes is not None and body_received >= range_bytes):
        raise _TrialError("short_body", f"connection closed after {body_received} of {content_length} body bytes")
    if result.http_status != 200 and not (range_bytes is not None and result.http_status == 206):
        raise _TrialError("http_status", f"HTTP status {result.http_status}")


def _parse_head(head: bytes) -> tuple[int, Optional[int], str]:
    """(status, Content-Length, Alt-Svc) of a response head."""
    lines = head.split(b"\r\n")
    status_line = lines[0].decode("latin-1")
    pieces = status_line.split(" ", 2)
    if len(pieces) < 2 or not pieces[0].startswith("HTTP/1.") or not pieces[1].isdigit():
        raise _TrialError("protocol", f"not an HTTP/1.x status line: {status_line[:100]!r}")
    status = int(pieces[1])
    content_length: Optional[int] = None
    alt_svc = ""
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "alt-svc":
            alt_svc = value.strip()[:500]
        if name.strip().lower() == "content-length":
            try:
                content_length = int(value.strip())
            except ValueError:
                raise _TrialError("protocol", f"bad Content-Length {value.strip()[:50]!r}") from None
    return status, content_length, alt_svc


def _syn_retransmissions(info: dict[str, int], connect_us: int) -> int:
    counted = max(info.get("total_retrans", 0), info.get("total_rto", 0))
    if "total_rto" not in info and "total_retrans" not in info and connect_us > INITIAL_RTO_US:
        return 1
    return counted


def format_curl_style(result: FetchResult) -> str:
    """Human-readable summary like ``curl -w`` for ``iwprobe fetch``."""

    def ms(value: Optional[int]) -> str:
        return "-" if value is None else f"{value / 1000:.3f} ms"

    info = result.tcp_info
    lines = [
        f"url:            {result.url}",
        f"started_at:     {result.started_at}",
        f"http_status:    {result.http_status if result.http_status is not None else '-'}",
        f"time_dns:       {ms(result.dns_us)}",
        f"time_connect:   {ms(result.connect_us)}",
        f"time_tls:       {ms(result.tls_handshake_us)}{' ' + result.tls_version if result.tls_version else ''}",
        f"time_ttfb:      {ms(result.ttfb_us)}",
        f"time_total:     {ms(result.total_us)}",
        f"bytes:          {result.bytes_received} (body {result.body_bytes})",
        f"syn_retrans:    {result.syn_retrans}",
        f"rtt/min_rtt:    {ms(info.get('rtt'))} / {ms(info.get('min_rtt'))}",
        f"total_retrans:  {info.get('total_retrans', '-')}",
        f"rcv_mss:        {info.get('rcv_mss', '-')}",
    ]
    if result.error_kind:
        lines.append(f"error:          {result.error_kind}: {result.error_detail}")
    return "\n".join(lines)
