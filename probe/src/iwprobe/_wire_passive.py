"""Wire v6: passive measurement of real users on an operator's own web server (``iwprobe tap``).

Part of the wire format (:mod:`iwprobe.wire` re-exports every public name here; the JSON
Schema in ``wire.schema.json`` has a ``$defs`` entry per dataclass).  It follows the IETF 78
design of the IW10 authors: one server serves different initial windows to different clients
at the same time, chosen by a keyed hash of the client's prefix, and every connection is
measured where it ends -- from the kernel's destroy notification (final ``TCP_INFO``) and,
for a share of connections, from the packet headers (the first response's latency).

What crosses the network (the conventions of :mod:`iwprobe.wire` hold):

* the server enrolls (:class:`ServerEnrollRequest`, a token of kind ``server``) and polls its
  configuration (:class:`ServerConfig`): the study it is part of, if any (:class:`PassiveStudy`:
  arms with their shares of clients, the ports, the prefix lengths, the assignment seed, the
  time box);
* it uploads :class:`PassiveBatch` es: mergeable aggregates per arm x region x bucket x hour
  x cluster (:class:`PassiveAggregate`) and a sampled share of raw connection records
  (:class:`PassiveConnection`).

Client addresses never leave the server: a record names a client only by ``client_prefix``,
the keyed hash (HMAC-SHA256 with a secret that stays on the server) of its /24 or /48, and by
``cluster``, that hash modulo :data:`PASSIVE_CLUSTER_GROUPS` (the unit the collector's
intervals resample, so connections of one prefix always fall together).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional

#: API paths (under :data:`iwprobe.wire.API_PREFIX`).
SERVER_ENROLL_PATH = "/api/v1/servers/enroll"
SERVER_CONFIG_PATH = "/api/v1/servers/{server_id}/config"
PASSIVE_BATCH_PATH = "/api/v1/passive/batch"

#: The arm that leaves a client's connections to the server's own configuration.
DEFAULT_ARM = "default"
#: Syntax of a passive arm label: ``default`` or an IW in segments.
PASSIVE_ARM_PATTERN = r"^(?:default|[0-9]{1,3})$"
#: Largest IW a passive arm may set (segments).
MAX_PASSIVE_IW = 256
#: Shares of clients are given in basis points of this many hash buckets (0.01 % steps).
PASSIVE_SHARE_SCALE = 10_000
#: Clients are grouped by their keyed prefix hash into this many clusters; intervals resample
#: whole clusters (each a union of prefixes), never single connections.
PASSIVE_CLUSTER_GROUPS = 32
#: Prefix lengths a study may hash (one user stays in one arm): IPv4 /16../24, IPv6 /32../64.
PASSIVE_PREFIX_V4_RANGE = (16, 24)
PASSIVE_PREFIX_V6_RANGE = (32, 64)
DEFAULT_PREFIX_V4 = 24
DEFAULT_PREFIX_V6 = 48
#: Where a connection came in: ``user`` (the server's own ports, real users).
PASSIVE_PORT_KINDS = ("user",)
#: Hex digits of a client prefix hash (64 bits).
CLIENT_PREFIX_HEX_CHARS = 16
#: Most arms one study has, and most ports it splits.
MAX_PASSIVE_ARMS = 8
MAX_PASSIVE_PORTS = 16

#: Upper edges of the RTT, bandwidth and BDP buckets an aggregate is keyed by (Figure 5 of
#: Dukkipati et al. 2010; bucket ``i`` is ``(edge[i-1], edge[i]]``, the last has no upper
#: edge; ``-1``: unknown).  The collector's analysis buckets are these.
PASSIVE_RTT_EDGES_MS: tuple[float, ...] = (20, 50, 100, 200, 500, 1000, 3000)
PASSIVE_BANDWIDTH_EDGES_BPS: tuple[float, ...] = (56e3, 256e3, 512e3, 1e6, 3e6, 5e6, 10e6, 20e6, 50e6)
PASSIVE_BDP_EDGES_BYTES: tuple[float, ...] = (1000, 5000, 10000, 50000, 100000)
#: Latency histograms: bin ``i`` covers ``[MIN * RATIO**i, MIN * RATIO**(i+1))`` microseconds,
#: below ``MIN`` in bin 0, above the last edge in the last bin (the collector's layout).
HIST_MIN_US = 10.0
HIST_RATIO = 1.02
HIST_BINS = 1000
#: Largest octave of a size (``2**k <= bytes < 2**(k+1)``); ``-1``: unknown.
MAX_SIZE_OCTAVE = 40


@dataclass
class PassiveArm:
    """One arm of a passive study: ``arm`` (``default`` or an IW) for ``share_bp`` of clients."""

    #: :data:`DEFAULT_ARM` or the IW in segments as text (``"16"``).
    arm: str
    #: Share of client prefixes, in 1/:data:`PASSIVE_SHARE_SCALE` (500 = 5 %).
    share_bp: int


@dataclass
class PassiveStudy:
    """The study a server takes part in, as the collector configures it (a passive campaign)."""

    campaign_id: int
    name: str
    #: The arms and their shares (summing to :data:`PASSIVE_SHARE_SCALE`); a client prefix's
    #: hash bucket picks one.  Treated arms take the top of the bucket range in this order, so
    #: growing a share moves prefixes from the default arm only.
    arms: list[PassiveArm]
    #: The server's TCP ports whose connections are split (e.g. 80, 443).
    ports: list[int]
    #: Prefix lengths hashed (one user stays in one arm).
    prefix_v4: int
    prefix_v6: int
    #: Seed of the assignment hash (the kernel's ``jhash`` of the prefix): the same seed gives
    #: the same assignment, and it is not guessable without it.
    assignment_seed: int
    starts_at: str
    ends_at: str
    #: Share of connections uploaded as raw records (the rest only in aggregates).
    sample_share: float
    #: Seconds between uploads of aggregates.
    flush_interval_s: int = 60
    #: Increases with every change of the arms or shares (a share sweep); records carry it.
    phase: int = 0


@dataclass
class ServerConfig:
    """The collector's answer to :data:`SERVER_CONFIG_PATH` (``ETag`` / 304 as schedules)."""

    wire_version: int
    server_id: str
    generated_at: str
    poll_after_s: float
    #: The study in force now; ``None``: none (the agent removes its arms).
    study: Optional[PassiveStudy] = None


@dataclass
class ServerEnrollRequest:
    """A server (an ``iwprobe tap`` agent) joining: where it is and which ports it serves."""

    name: str
    #: Where the server is (its data centre or region).
    region: str
    #: TCP ports of the web server (80, 443, ...).
    ports: list[int] = field(default_factory=list)
    version: str = ""
    #: Kernel release (``uname -r``): what the arms rely on.
    kernel: str = ""


@dataclass
class PassiveAggregate:
    """Mergeable sums over the connections of one key that closed in one hour.

    Key: ``campaign_id`` x ``phase`` x ``hour`` x ``arm`` x ``family`` x ``port_kind`` x
    ``region`` x ``cluster`` x ``rtt_bucket`` x ``bandwidth_bucket`` x ``bdp_bucket`` x
    ``size_octave`` x ``biased``.  One key may arrive in several records (one per upload
    interval); the collector adds them up."""

    aggregate_id: str
    server_id: str
    campaign_id: int
    phase: int
    #: Start of the UTC hour the connections closed in.
    hour: str
    arm: str
    #: The IW the arm gave (``default``: the server's own, as its routes say; ``None``: unknown).
    arm_iw: Optional[int]
    #: The treated arms' total share when these connections were assigned (basis points).
    treated_share_bp: int
    family: str
    port_kind: str
    #: The client's region (the operator's prefix map or the offline database); ``""``: unknown.
    region: str
    cluster: int
    rtt_bucket: int
    bandwidth_bucket: int
    bdp_bucket: int
    size_octave: int
    #: Whether a bias flag is set on these connections (SYN or SYN-ACK retransmitted, first
    #: flight limited by the client's receive window).
    biased: bool
    #: Connections closed.
    connections: int
    #: Of them, connections whose first response was measured (captured).
    responses: int
    #: Sum of their first-response latencies, and their histogram (``[[bin, count], ...]``).
    latency_sum_us: int
    latency_hist: list[list[int]] = field(default_factory=list)
    #: Connections with any retransmission; segments sent and retransmitted; bytes.
    retrans_connections: int = 0
    data_segs_out: int = 0
    total_retrans: int = 0
    bytes_acked: int = 0
    bytes_retrans: int = 0
    #: Bias flags counted (a connection may have several).
    syn_retrans: int = 0
    rwnd_limited: int = 0
    reused_after_idle: int = 0
    #: Connections that spoke TLS (first payload a TLS handshake record).
    tls: int = 0


@dataclass
class PassiveConnection:
    """One connection, sampled: its final ``TCP_INFO`` and what its headers showed."""

    record_id: str
    server_id: str
    campaign_id: int
    phase: int
    closed_at: str
    arm: str
    arm_iw: Optional[int]
    treated_share_bp: int
    family: str
    port_kind: str
    #: The server's port.
    port: int
    region: str
    #: ISO country code where known, else ``""``.
    country: str
    #: Keyed hash of the client's prefix (:data:`CLIENT_PREFIX_HEX_CHARS` hex digits).
    client_prefix: str
    cluster: int
    #: Final ``TCP_INFO`` of the server's socket (see :data:`iwprobe.wire.TCP_INFO_FIELDS`).
    tcp_info: dict[str, int] = field(default_factory=dict)
    #: Whether its headers were captured (the fields below are ``None`` otherwise).
    captured: bool = False
    tls: Optional[bool] = None
    #: Request's first byte in -> last byte of the first response acknowledged, µs (HTTPS:
    #: the first request after the handshake).
    response_latency_us: Optional[int] = None
    #: Payload bytes of the first response.
    response_bytes: Optional[int] = None
    #: HTTPS: ClientHello in -> the server's handshake flight acknowledged, µs.
    handshake_us: Optional[int] = None
    #: Segments and bytes the server sent of the first flight that carried data before the
    #: client acknowledged any of it (the window the arm gave, as sent).
    first_flight_segments: Optional[int] = None
    first_flight_bytes: Optional[int] = None
    #: SYN-ACK -> the client's ACK, µs (the handshake RTT).
    handshake_rtt_us: Optional[int] = None
    #: The client's receive window at the handshake, bytes (scaled).
    client_rwnd_bytes: Optional[int] = None
    #: Bias flags.
    syn_retrans: bool = False
    rwnd_limited: bool = False
    reused_after_idle: bool = False
    #: Request/response exchanges seen (keep-alive reuse).
    exchanges: Optional[int] = None


@dataclass
class ServerHeartbeat:
    """A server's state, folded into its uploads."""

    version: str
    uptime_s: float
    #: ``on`` (arms installed), ``off`` (none), or ``error: ...``.
    arms_state: str
    #: Connections seen closing on the study's ports, and of them captured.
    connections_seen: int
    connections_captured: int
    #: Destroy notifications the kernel dropped (socket buffer overrun) and packets the
    #: capture dropped: measurement lost, never traffic.
    notifications_lost: int
    packets_dropped: int
    #: Share of connections the capture follows now (it adapts to the packet rate).
    capture_share: float
    spool_backlog: int
    spool_bytes: int
    #: Share of each second the agent listened for closes: below 1 it was over its budget
    #: (``--closes-per-s``) and measured a sample in time of the connections.
    closes_share: float = 1.0


@dataclass
class PassiveBatch:
    """What a server uploads to :data:`PASSIVE_BATCH_PATH`; all-or-nothing, idempotent."""

    wire_version: int
    batch_id: str
    server_id: str
    sent_at: str
    aggregates: list[PassiveAggregate] = field(default_factory=list)
    connections: list[PassiveConnection] = field(default_factory=list)
    heartbeat: Optional[ServerHeartbeat] = None


def bucket_index(value: Optional[float], edges: tuple[float, ...]) -> int:
    """The bucket of ``value`` for upper ``edges`` (``(lower, upper]``, first from 0); -1: unknown."""
    if value is None or value < 0:
        return -1
    return bisect.bisect_left(edges, value)


def size_octave(size: Optional[int]) -> int:
    """``k`` with ``2**k <= size < 2**(k+1)`` (0 for 0 or 1 byte); -1: unknown."""
    if size is None or size < 0:
        return -1
    return min(MAX_SIZE_OCTAVE, max(0, size.bit_length() - 1))


def hist_bin(latency_us: float) -> int:
    """The latency histogram bin of ``latency_us`` (see :data:`HIST_MIN_US`)."""
    import math

    if latency_us < HIST_MIN_US:
        return 0
    index = int(math.log(latency_us / HIST_MIN_US) / math.log(HIST_RATIO))
    return min(HIST_BINS - 1, index)


__all__ = [
    "SERVER_ENROLL_PATH",
    "SERVER_CONFIG_PATH",
    "PASSIVE_BATCH_PATH",
    "DEFAULT_ARM",
    "PASSIVE_ARM_PATTERN",
    "MAX_PASSIVE_IW",
    "PASSIVE_SHARE_SCALE",
    "PASSIVE_CLUSTER_GROUPS",
    "PASSIVE_PREFIX_V4_RANGE",
    "PASSIVE_PREFIX_V6_RANGE",
    "DEFAULT_PREFIX_V4",
    "DEFAULT_PREFIX_V6",
    "PASSIVE_PORT_KINDS",
    "CLIENT_PREFIX_HEX_CHARS",
    "MAX_PASSIVE_ARMS",
    "MAX_PASSIVE_PORTS",
    "PASSIVE_RTT_EDGES_MS",
    "PASSIVE_BANDWIDTH_EDGES_BPS",
    "PASSIVE_BDP_EDGES_BYTES",
    "HIST_MIN_US",
    "HIST_RATIO",
    "HIST_BINS",
    "MAX_SIZE_OCTAVE",
    "PassiveArm",
    "PassiveStudy",
    "ServerConfig",
    "ServerEnrollRequest",
    "PassiveAggregate",
    "PassiveConnection",
    "ServerHeartbeat",
    "PassiveBatch",
    "bucket_index",
    "size_octave",
    "hist_bin",
]
