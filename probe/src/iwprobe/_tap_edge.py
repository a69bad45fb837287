"""Edge side of a passive study: whose connection it was (without saying), which arm, and the sums.

A busy server closes thousands of connections a second; what leaves it is

* :class:`wire.PassiveAggregate` s: per arm x region x RTT / bandwidth / BDP bucket x size octave
  x bias x cluster x hour, mergeable sums and a sparse latency histogram (the collector's bin
  layout), flushed every ``flush_interval_s``;
* a sampled share of :class:`wire.PassiveConnection` records (``sample_share``).

Client addresses never leave the server (:class:`PrefixKeyer`): a connection names its client
by the HMAC-SHA256 of its /24 (/48), keyed with a secret generated on the server and kept in
its state directory (mode 0600), cut to 64 bits; the collector cannot reverse it (it never
has the key: a /24's hash is not a brute-force of 2**24 away), and ``cluster`` (that hash mod
:data:`~iwprobe.wire.PASSIVE_CLUSTER_GROUPS`) keeps a prefix's connections together for the
collector's intervals.  The region comes from the operator's prefix map (:class:`RegionMap`).
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import ipaddress
import os
import random
import secrets
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from . import wire
from ._jhash import jhash_bucket
from ._passive_capture import FirstResponse
from ._sockdiag import ClosedConnection
from ._tap_rules import ArmRange
from ._tcpinfo import FieldReader

KEY_FILE = "tap-prefix.key"
#: What every closed connection's aggregate needs of its final TCP_INFO.
_SUMMARY = FieldReader(("min_rtt", "delivery_rate", "bytes_acked", "data_segs_out", "total_retrans", "bytes_retrans"))
_MAPPED_V4 = bytes(10) + b"\xff\xff"
#: TCP_INFO fields a raw connection record keeps (the rest is sampled away).
RECORD_TCP_INFO = (
    "state",
    "ca_state",
    "rto",
    "snd_mss",
    "rcv_mss",
    "pmtu",
    "rtt",
    "rttvar",
    "min_rtt",
    "snd_ssthresh",
    "snd_cwnd",
    "advmss",
    "total_retrans",
    "bytes_acked",
    "bytes_received",
    "segs_out",
    "segs_in",
    "data_segs_out",
    "data_segs_in",
    "delivery_rate",
    "busy_time",
    "rwnd_limited",
    "sndbuf_limited",
    "bytes_sent",
    "bytes_retrans",
    "dsack_dups",
    "snd_wnd",
    "total_rto",
    "total_rto_recoveries",
    "delivery_rate_app_limited",
)


def client_bytes(family: int, address: str) -> bytes:
    """The client's address as the packets carry it (an IPv4-mapped IPv6 address as IPv4)."""
    packed = socket.inet_pton(family, address)
    if len(packed) == 16 and packed[:12] == _MAPPED_V4:
        return packed[12:]
    return packed


def _prefix_bytes(packed: bytes, bits: int) -> bytes:
    """The first ``bits`` bits of an address, as nftables' raw payload ``@nh,OFF,bits`` loads
    them into its register: whole bytes, the last one's low bits cleared."""
    whole, rest = divmod(bits, 8)
    prefix = packed[:whole]
    if rest:
        prefix += bytes((packed[whole] & (0xFF << (8 - rest)) & 0xFF,))
    return prefix


class PrefixKeyer:
    """Keyed, truncated prefix hashes; the key never leaves the server."""

    def __init__(self, key: bytes, prefix_v4: int, prefix_v6: int) -> None:
        if len(key) < 32:
            raise ValueError("the prefix key must hold at least 32 bytes")
        self._key = key
        self.prefix_v4 = prefix_v4
        self.prefix_v6 = prefix_v6

    @staticmethod
    def load_key(directory: str) -> bytes:
        """The server's prefix key, created (0600) on first use."""
        path = os.path.join(directory, KEY_FILE)
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            key = secrets.token_bytes(32)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(key)
            return key

    def prefix(self, packed: bytes) -> bytes:
        return _prefix_bytes(packed, self.prefix_v4 if len(packed) == 4 else self.prefix_v6)

    def hash(self, prefix: bytes) -> tuple[str, int]:
        """(64-bit hex of the keyed prefix hash, its cluster)."""
        digest = hmac.new(self._key, bytes((len(prefix),)) + prefix, hashlib.sha256).digest()
        return digest[:8].hex(), int.from_bytes(digest[:8], "big") % wire.PASSIVE_CLUSTER_GROUPS


class RegionMap:
    """The operator's prefix map: CSV lines ``prefix,region[,country]`` (``#`` comments);
    the longest matching prefix wins.  Empty: every client's region is ``""`` (unknown)."""

    def __init__(self, entries: list[tuple[str, str, str]] = ()) -> None:  # type: ignore[assignment]
        self._networks: list[tuple[Any, str, str]] = []
        for prefix, region, country in entries:
            network = ipaddress.ip_network(prefix.strip(), strict=False)
            country = country.strip().upper()
            if country and (len(country) != 2 or not country.isalpha()):
                raise ValueError(f"country {country!r}: a two-letter ISO code")
            self._networks.append((network, region.strip()[:64], country))
        self._networks.sort(key=lambda item: -item[0].prefixlen)
        self._cache: dict[bytes, tuple[str, str]] = {}

    @classmethod
    def from_csv(cls, path: str) -> RegionMap:
        entries: list[tuple[str, str, str]] = []
        with open(path, encoding="utf-8", newline="") as handle:
            for number, row in enumerate(csv.reader(handle), 1):
                if not row or row[0].strip().startswith("#"):
                    continue
                if len(row) < 2:
                    raise ValueError(f"{path}:{number}: expected prefix,region[,country]")
                entries.append((row[0], row[1], row[2] if len(row) > 2 else ""))
        return cls(entries)

    def lookup(self, prefix: bytes, packed: bytes) -> tuple[str, str]:
        """(region, country) of a client (cached per hashed prefix: one lookup per user)."""
        cached = self._cache.get(prefix)
        if cached is None:
            address = ipaddress.ip_address(packed)
            cached = next(
                (
                    (region, country)
                    for network, region, country in self._networks
                    if address.version == network.version and address in network
                ),
                ("", ""),
            )
            if len(self._cache) < 1_000_000:
                self._cache[prefix] = cached
        return cached


@dataclass
class Assignment:
    """The arms in force (one phase of a study) and how to find a prefix's arm."""

    study: wire.PassiveStudy
    ranges: list[ArmRange]
    #: IW of the default arm (the server's own, as its main routes say; None: unknown).
    default_iw: Optional[int]

    @property
    def treated_share_bp(self) -> int:
        return sum(arm.share_bp for arm in self.ranges if arm.slot)

    #: Arms already looked up, per prefix (the hash in Python costs microseconds).
    _arms: dict[bytes, ArmRange] = field(default_factory=dict, repr=False, compare=False)

    def arm_of(self, prefix: bytes) -> ArmRange:
        found = self._arms.get(prefix)
        if found is not None:
            return found
        bucket = jhash_bucket(prefix, self.study.assignment_seed, wire.PASSIVE_SHARE_SCALE)
        for arm in self.ranges:
            if arm.low <= bucket <= arm.high:
                if len(self._arms) >= 1_000_000:
                    self._arms.clear()
                self._arms[prefix] = arm
                return arm
        raise LookupError(f"bucket {bucket} in no arm")  # the ranges cover every bucket


@dataclass
class Measured:
    """One closed connection with everything the edge knows of it."""

    closed: ClosedConnection
    first: Optional[FirstResponse]
    arm: ArmRange
    arm_iw: Optional[int]
    region: str
    country: str
    client_prefix: str
    cluster: int
    family: str


def _bias(measured: Measured) -> tuple[bool, bool]:
    """(SYN or SYN-ACK repeated, first flight limited by the client's receive window)."""
    first = measured.first
    if first is None:
        return False, False
    limited = False
    if first.client_rwnd_bytes is not None and measured.arm_iw is not None:
        limited = first.client_rwnd_bytes < measured.arm_iw * (first.mss or 1460)
    return first.syn_retrans, limited


class EdgeAggregator:
    """Sums per key since the last flush; thread-safe (the measuring thread adds, the
    control thread flushes)."""

    def __init__(self, server_id: str, rng: Optional[random.Random] = None) -> None:
        self.server_id = server_id
        self._sums: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._samples: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._hour: tuple[int, str] = (-1, "")

    def add(self, measured: Measured, study: wire.PassiveStudy, treated_share_bp: int) -> None:
        min_rtt, delivery_rate, bytes_acked, data_segs_out, retrans, bytes_retrans = _SUMMARY.read(measured.closed.info_raw)
        first = measured.first
        latency = first.response_latency_us if first is not None else None
        size = first.response_bytes if first is not None and first.response_bytes is not None else bytes_acked
        rate_bps = (delivery_rate or 0) * 8 or None
        bdp = (min_rtt / 1e6) * (rate_bps / 8) if min_rtt and rate_bps else None
        syn_retrans, rwnd_limited = _bias(measured)
        hour_index = measured.closed.closed_ns // 3_600_000_000_000
        if hour_index != self._hour[0]:
            self._hour = (hour_index, wire.utc_timestamp(_hour_of(measured.closed.closed_ns)))
        hour = self._hour[1]
        key = (
            study.campaign_id,
            study.phase,
            hour,
            measured.arm.arm,
            measured.arm_iw,
            treated_share_bp,
            measured.family,
            measured.region,
            measured.cluster,
            wire.bucket_index(min_rtt / 1000 if min_rtt else None, wire.PASSIVE_RTT_EDGES_MS),
            wire.bucket_index(rate_bps, wire.PASSIVE_BANDWIDTH_EDGES_BPS),
            wire.bucket_index(bdp, wire.PASSIVE_BDP_EDGES_BYTES),
            wire.size_octave(size),
            syn_retrans or rwnd_limited,
        )
        retrans = retrans or 0
        with self._lock:
            sums = self._sums.get(key)
            if sums is None:
                sums = self._sums[key] = {
                    "connections": 0,
                    "responses": 0,
                    "latency_sum_us": 0,
                    "hist": {},
                    "retrans_connections": 0,
                    "data_segs_out": 0,
                    "total_retrans": 0,
                    "bytes_acked": 0,
                    "bytes_retrans": 0,
                    "syn_retrans": 0,
                    "rwnd_limited": 0,
                    "reused_after_idle": 0,
                    "tls": 0,
                }
            sums["connections"] += 1
            if latency is not None:
                sums["responses"] += 1
                sums["latency_sum_us"] += latency
                hist = sums["hist"]
                bin_index = wire.hist_bin(latency)
                hist[bin_index] = hist.get(bin_index, 0) + 1
            sums["retrans_connections"] += retrans > 0
            sums["data_segs_out"] += data_segs_out or 0
            sums["total_retrans"] += retrans
            sums["bytes_acked"] += bytes_acked or 0
            sums["bytes_retrans"] += bytes_retrans or 0
            sums["syn_retrans"] += syn_retrans
            sums["rwnd_limited"] += rwnd_limited
            sums["reused_after_idle"] += bool(first is not None and first.reused_after_idle)
            sums["tls"] += bool(first is not None and first.tls)
            if study.sample_share > 0 and self._rng.random() < study.sample_share:
                self._samples.append(self._record(measured, study, treated_share_bp, syn_retrans, rwnd_limited))

    def _record(
        self, measured: Measured, study: wire.PassiveStudy, treated_share_bp: int, syn_retrans: bool, rwnd_limited: bool
    ) -> dict[str, Any]:
        info = measured.closed.tcp_info
        first = measured.first
        record = wire.PassiveConnection(
            record_id=wire.new_id(),
            server_id=self.server_id,
            campaign_id=study.campaign_id,
            phase=study.phase,
            closed_at=wire.utc_timestamp(_datetime(measured.closed.closed_ns)),
            arm=measured.arm.arm,
            arm_iw=measured.arm_iw,
            treated_share_bp=treated_share_bp,
            family=measured.family,
            port_kind="user",
            port=measured.closed.local_port,
            region=measured.region,
            country=measured.country,
            client_prefix=measured.client_prefix,
            cluster=measured.cluster,
            tcp_info={name: info[name] for name in RECORD_TCP_INFO if name in info},
            captured=first is not None,
            syn_retrans=syn_retrans,
            rwnd_limited=rwnd_limited,
        )
        if first is not None:
            for name in (
                "tls",
                "response_latency_us",
                "response_bytes",
                "handshake_us",
                "first_flight_segments",
                "first_flight_bytes",
                "handshake_rtt_us",
                "client_rwnd_bytes",
                "exchanges",
            ):
                setattr(record, name, getattr(first, name))
            record.reused_after_idle = first.reused_after_idle
        return wire.to_dict(record)

    def flush(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(aggregates, sampled connection records) since the last flush, as wire dicts."""
        with self._lock:
            sums, self._sums = self._sums, {}
            samples, self._samples = self._samples, []
        aggregates = []
        for key, values in sums.items():
            (campaign_id, phase, hour, arm, arm_iw, treated, family, region, cluster, rtt, bandwidth, bdp, octave, biased) = key
            hist = values.pop("hist")
            aggregates.append(
                wire.to_dict(
                    wire.PassiveAggregate(
                        aggregate_id=wire.new_id(),
                        server_id=self.server_id,
                        campaign_id=campaign_id,
                        phase=phase,
                        hour=hour,
                        arm=arm,
                        arm_iw=arm_iw,
                        treated_share_bp=treated,
                        family=family,
                        port_kind="user",
                        region=region,
                        cluster=cluster,
                        rtt_bucket=rtt,
                        bandwidth_bucket=bandwidth,
                        bdp_bucket=bdp,
                        size_octave=octave,
                        biased=biased,
                        latency_hist=[[b, n] for b, n in sorted(hist.items())],
                        **values,
                    )
                )
            )
        return aggregates, samples

    def pending(self) -> int:
        with self._lock:
            return len(self._sums) + len(self._samples)


def _datetime(time_ns: int) -> Any:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(time_ns / 1e9, _dt.timezone.utc)


def _hour_of(time_ns: int) -> Any:
    return _datetime(time_ns).replace(minute=0, second=0, microsecond=0)
