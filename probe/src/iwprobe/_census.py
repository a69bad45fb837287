"""The IW census of one server: ``iwprobe census URL [--json]``.

A few fresh connections to ``URL``, each captured and its initial window inferred
(:mod:`iwprobe._iwinfer`); the answer is what they agree on:

* ``ok`` when at least one connection determined the IW and every determined one agrees
  (``connections_ok`` says how many), and no lower bound exceeds it;
* else ``lower_bound``: the largest lower bound any connection proved;
* else ``undetermined`` (determined values that disagree count here: ``reason`` =
  ``inconsistent``, e.g. servers behind one name with different IWs).

The object should be large enough to outlast the window (64 segments of 1,460 bytes are 93 KB):
the census asks for its first ``range_bytes`` only (``Range``).  When the answer is only a
lower bound because the flight ended inside the window (a small object; over HTTPS, the TLS
handshake's first flight, after which the server waits for the client) or because the probe's
own receive window (64 KB in a Linux client's first window) cut it, the census repeats with a
smaller MSS announced in its SYN (:data:`SMALLER_MSS`), the technique of Rüth et al. (IMC
2017): the server's IW is counted in segments, so the same bytes then fill more of them (a
16 KB certificate chain at MSS 128 is 128 segments).  The first ``ok`` ends the ladder; else
the largest lower bound stands.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from . import wire
from ._census_quic import QuicCensus, format_quic_census, h3_port, quic_census
from ._fetch import FetchResult, client_context, fetch
from ._quic_records import QUIC_TLS_VERSION

#: Bytes asked for per connection (``Range: bytes=0-...``).
DEFAULT_RANGE_BYTES = 256 * 1024
DEFAULT_CONNECTIONS = 3
#: MSS values announced, in turn, while the answer is a lower bound the flight's length or the
#: probe's receive window set (:data:`RETRY_REASONS`); 88 is Linux's smallest.
SMALLER_MSS = (536, 256, 128, 88)
#: Lower-bound reasons a smaller MSS can lift (not ``bottleneck`` or ``paused``: those are the path's).
RETRY_REASONS = frozenset({"receive_window", "object_ended", "client_data"})


@dataclass
class CensusResult:
    """The census of one URL (the ``--json`` object)."""

    url: str
    measured_at: str
    status: str
    iw_segments: Optional[int] = None
    iw_bytes: Optional[int] = None
    mss: Optional[int] = None
    reason: str = ""
    connections: int = 0
    connections_ok: int = 0
    rtt_ms: Optional[float] = None
    family: str = ""
    tls_version: str = ""
    http_status: Optional[int] = None
    error: str = ""
    #: The MSS the probe announced (None: its interface's), raised in turn when its own
    #: receive window limited the flight (:data:`SMALLER_MSS`).
    announced_mss: Optional[int] = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    #: The server's ``Alt-Svc`` (where it offers HTTP/3) and, when measured, the QUIC census of
    #: the same server (:class:`iwprobe._census_quic.QuicCensus`).
    alt_svc: str = ""
    quic: Optional[QuicCensus] = None

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__.items())
        data["quic"] = self.quic.to_dict() if self.quic is not None else None
        return data


def _attempt(result: FetchResult) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "error_kind": result.error_kind,
        "http_status": result.http_status,
        "bytes_received": result.bytes_received,
    }
    if result.iw is not None:
        entry.update(result.iw.to_dict())
    return entry


def combine(url: str, results: list[FetchResult], measured_at: str) -> CensusResult:
    """The census answer from the connections' results (see the module docstring)."""
    census = CensusResult(url=url, measured_at=measured_at, status="undetermined", connections=len(results))
    census.attempts = [_attempt(result) for result in results]
    unavailable = next((result.iw_unavailable for result in results if result.iw_unavailable), "")
    if unavailable:
        census.error = unavailable
        census.reason = "no_capture"
        return census
    done = [result for result in results if result.iw is not None]
    if results:
        last = results[-1]
        census.family, census.tls_version, census.http_status = last.family, last.tls_version, last.http_status
        census.alt_svc = next((r.alt_svc for r in results if r.alt_svc), "")
        census.error = "; ".join(sorted({f"{r.error_kind}: {r.error_detail}" for r in results if r.error_kind}))[:500]
    rtts = [r.iw.rtt_us for r in done if r.iw is not None and r.iw.rtt_us]
    census.rtt_ms = round(min(rtts) / 1000, 3) if rtts else None
    inferences = [r.iw for r in done if r.iw is not None]
    mss_values = [i.mss for i in inferences if i.mss]
    census.mss = max(mss_values) if mss_values else None
    determined = [i for i in inferences if i.status == "ok"]
    bounds = [i for i in inferences if i.status == "lower_bound"]
    census.connections_ok = len(determined)
    best_bound = max(bounds, key=lambda i: i.iw_segments or 0, default=None)
    if determined:
        values = Counter(i.iw_segments for i in determined)
        if len(values) == 1 and (best_bound is None or (best_bound.iw_segments or 0) <= (determined[0].iw_segments or 0)):
            census.status, census.iw_segments = "ok", determined[0].iw_segments
            census.iw_bytes = max(i.iw_bytes or 0 for i in determined)
            return census
        census.reason = "inconsistent"
        return census
    if best_bound is not None:
        census.status, census.iw_segments, census.iw_bytes = "lower_bound", best_bound.iw_segments, best_bound.iw_bytes
        census.reason = best_bound.reason
        return census
    if all(result.error_kind and result.bytes_received == 0 for result in results):
        census.reason = "fetch_failed"  # ``error`` says how
        return census
    reasons = Counter(i.reason for i in inferences if i.reason)
    census.reason = reasons.most_common(1)[0][0] if reasons else "no_data"
    return census


def census(
    url: str,
    connections: int = DEFAULT_CONNECTIONS,
    range_bytes: Optional[int] = DEFAULT_RANGE_BYTES,
    announce_mss: Optional[int] = None,
    family: str = "",
    tls_context: Optional[ssl.SSLContext] = None,
    timeout_s: float = 30.0,
    quic: str = "no",
    ca_file: Optional[str] = None,
    insecure: bool = False,
) -> CensusResult:
    """Measure the IW of the server at ``url`` over ``connections`` fresh connections.

    ``quic``: ``"no"`` (the default) never measures HTTP/3; ``"auto"`` (``iwprobe census``'s
    default, and a census campaign's where the probe has ``iwprobe[quic]``: its answer is a
    record of its own, :func:`quic_to_record`) also measures the server's HTTP/3 window when its
    ``Alt-Svc`` offers one (an ``https`` URL); ``"only"``
    measures HTTP/3 on the URL's own port and not TCP.  ``ca_file``/``insecure`` are QUIC's
    certificate checks (``tls_context`` is TCP's).
    """
    if quic == "only":
        only = CensusResult(url=url, measured_at=wire.utc_timestamp(), status="undetermined")
        only.quic = quic_census(
            url, connections=max(1, connections), ca_file=ca_file, insecure=insecure, timeout_s=min(timeout_s, 10.0)
        )
        return only
    measured_at = wire.utc_timestamp()
    scheme = urllib.parse.urlsplit(url).scheme
    context = tls_context if tls_context is not None or scheme != "https" else client_context()
    ladder = [announce_mss] if announce_mss is not None else [None, *SMALLER_MSS]
    answer: Optional[CensusResult] = None
    for mss in ladder:
        results = []
        for _ in range(max(1, connections)):
            result = fetch(
                url,
                timeout_s=timeout_s,
                tls_context=context,
                family=family,
                infer_iw=True,
                announce_mss=mss,
                range_bytes=range_bytes,
            )
            results.append(result)
            if result.iw_unavailable:
                break
        step = combine(url, results, measured_at)
        step.announced_mss = mss
        if answer is None or _better(step, answer):
            answer = step
        if step.status == "ok" or step.reason not in RETRY_REASONS:
            break
    assert answer is not None
    parts = urllib.parse.urlsplit(url)
    port = h3_port(answer.alt_svc, parts.hostname or "") if scheme == "https" else None
    if quic == "auto" and port is not None:
        answer.quic = quic_census(
            url, port, max(1, connections), ca_file=ca_file, insecure=insecure, timeout_s=min(timeout_s, 10.0)
        )
    return answer


def to_record(result: CensusResult, probe_id: str, campaign_id: Optional[int], round_number: int) -> wire.CensusRecord:
    """The census answer as the record a probe uploads (wire v5)."""
    return wire.CensusRecord(
        census_id=wire.new_id(),
        probe_id=probe_id,
        campaign_id=campaign_id,
        round=round_number,
        url=result.url,
        measured_at=result.measured_at,
        status=result.status,
        iw_segments=result.iw_segments if result.status != "undetermined" else None,
        iw_bytes=result.iw_bytes if result.status != "undetermined" else None,
        mss=result.mss,
        reason=result.reason[: wire.MAX_IW_REASON_CHARS],
        connections=result.connections,
        connections_ok=result.connections_ok,
        announced_mss=result.announced_mss,
        rtt_us=None if result.rtt_ms is None else int(result.rtt_ms * 1000),
        family=result.family,
        tls_version=result.tls_version[: wire.MAX_TLS_VERSION_CHARS],
        http_status=result.http_status,
        error_detail=result.error[:500] or None,
    )


def quic_to_record(
    result: CensusResult, probe_id: str, campaign_id: Optional[int], round_number: int
) -> Optional[wire.CensusRecord]:
    """The HTTP/3 answer of the same census (``result.quic``) as a record of its own (wire v9,
    ``protocol`` ``quic``: packets for segments, the datagram size for the MSS); ``None`` when
    HTTP/3 was not measured."""
    quic = result.quic
    if quic is None:
        return None
    determined = quic.status != "undetermined"
    return replace(
        to_record(result, probe_id, campaign_id, round_number),
        status=quic.status,
        iw_segments=quic.iw_packets if determined else None,
        iw_bytes=quic.iw_bytes if determined else None,
        mss=quic.max_datagram_size,
        reason=quic.reason[: wire.MAX_IW_REASON_CHARS],
        connections=quic.connections,
        connections_ok=quic.connections_ok,
        announced_mss=None,
        rtt_us=None if quic.rtt_ms is None else int(quic.rtt_ms * 1000),
        tls_version=QUIC_TLS_VERSION,
        http_status=quic.http_status,
        error_detail=quic.error[:500] or None,
        protocol="quic",
    )


def _better(candidate: CensusResult, kept: CensusResult) -> bool:
    """Whether a rung of the MSS ladder says more than the answer kept so far: ``ok`` over
    anything else, then the larger lower bound."""
    rank = {"ok": 2, "lower_bound": 1, "undetermined": 0}
    if rank.get(candidate.status, 0) != rank.get(kept.status, 0):
        return rank.get(candidate.status, 0) > rank.get(kept.status, 0)
    return (candidate.iw_segments or 0) > (kept.iw_segments or 0)


def format_census(result: CensusResult) -> str:
    """The human-readable answer of ``iwprobe census``."""
    if result.status == "ok":
        head = f"IW {result.iw_segments} segments ({result.iw_bytes} bytes, MSS {result.mss})"
    elif result.status == "lower_bound":
        head = f"IW >= {result.iw_segments} segments ({result.iw_bytes} bytes, MSS {result.mss}): {result.reason}"
    else:
        head = f"IW undetermined: {result.reason}"
    lines = [
        f"{result.url}: {head}",
        f"  connections {result.connections}, determined {result.connections_ok}, "
        f"RTT {result.rtt_ms if result.rtt_ms is not None else '-'} ms, {result.family or '-'}"
        f"{', ' + result.tls_version if result.tls_version else ''}",
    ]
    if result.error:
        lines.append(f"  error: {result.error}")
    if result.quic is not None:
        lines.append(format_quic_census(result.quic))
    return "\n".join(lines)
