"""HTTPS on TCP against HTTP/3 at the same initial window: same path, same object, paired; and
``iwscope lab reproduce --only quic`` (this comparison and the QUIC census of servers nobody
here set).

The origin (``iwprobe origin --quic``, CUBIC on TCP as the model assumes) serves one arm over
both; the probe fetches each object over a new TCP + TLS 1.3 connection and over a new QUIC
connection, in alternating order, and the saving of a pair is TCP's total time minus QUIC's
(both from the client's first packet to the response's last byte).

The model (:func:`iwscope.model.predict_quic_saving`) has no processing time, and the two stacks
differ in it: the kernel and OpenSSL against aioquic in Python (a handshake's cryptography and
tens of microseconds per datagram).  So every point is measured twice: on the emulated path and
on a zero-delay link between the same hosts, where the saving is the stacks' own difference in
time.  The prediction a point is judged against is the model's saving plus that zero-delay
saving, both of the same run.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from iwscope.analysis.stats import median_interval
from iwscope.model import predict_quic_saving, tls_first_flight_bytes

from .links import LinkSpec
from .quic import BASE_PORT, CENSUS_TARGETS, census_target_url, quic_lab, run_census
from .topology import Topology

QUIC_KEY = "quic"
#: The arm both protocols are compared at.
COMPARE_IW = 10

IWPROBE = [sys.executable, "-m", "iwprobe", "--log-level", "WARNING"]
SIZES = (1_000, 10_000, 30_000, 100_000)
RTTS_MS = (100.0, 200.0)
RATE_BPS = 100_000_000
PAIRS = 7
#: A point agrees with the model when the measured saving is within this share of the model's.
TOLERANCE = 0.10


@dataclass
class ComparePoint:
    """One size at one round trip: the pairs' totals (ms) and what they are judged against."""

    rtt_ms: float
    size: int
    #: (TCP total, QUIC total) per pair on the path, and on the zero-delay link.
    pairs: list[tuple[float, float]] = field(default_factory=list)
    zero_delay: list[tuple[float, float]] = field(default_factory=list)
    model_ms: float = 0.0

    @property
    def saving_ms(self) -> float:
        return statistics.median(tcp - quic for tcp, quic in self.pairs)

    @property
    def interval_ms(self) -> tuple[float, float] | None:
        return median_interval(sorted(tcp - quic for tcp, quic in self.pairs))

    @property
    def processing_ms(self) -> float:
        return statistics.median(tcp - quic for tcp, quic in self.zero_delay)

    @property
    def predicted_ms(self) -> float:
        return self.model_ms + self.processing_ms

    @property
    def error(self) -> float:
        """(measured - predicted) / the model's saving."""
        return (self.saving_ms - self.predicted_ms) / self.model_ms

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            saving_ms=self.saving_ms,
            interval_ms=self.interval_ms,
            processing_ms=self.processing_ms,
            predicted_ms=self.predicted_ms,
            error=self.error,
        )
        return data


def _total_ms(topo: Topology, url: str, ca_file: str, quic: bool) -> float:
    command = [*IWPROBE, "fetch", "--json", "--ca-file", ca_file, url]
    if quic:
        command.insert(len(IWPROBE) + 1, "--quic")
    outcome = topo.run("probe", command, capture_output=True, text=True, timeout=120)
    record = json.loads(outcome.stdout)
    if outcome.returncode != 0 or record.get("error_kind") or record.get("http_status") != 200:
        raise RuntimeError(f"{'QUIC' if quic else 'TCP'} fetch of {url} failed: {outcome.stdout[-500:]} {outcome.stderr[-500:]}")
    return float(record["total_us"]) / 1000.0


def _pairs(topo: Topology, url: str, ca_file: str, pairs: int) -> list[tuple[float, float]]:
    """``pairs`` paired fetches, TCP first in even pairs and QUIC first in odd ones."""
    measured = []
    for index in range(pairs):
        if index % 2 == 0:
            tcp = _total_ms(topo, url, ca_file, quic=False)
            quic = _total_ms(topo, url, ca_file, quic=True)
        else:
            quic = _total_ms(topo, url, ca_file, quic=True)
            tcp = _total_ms(topo, url, ca_file, quic=False)
        measured.append((tcp, quic))
    return measured


def compare(
    topo: Topology,
    address: str,
    port: int,
    ca_file: str,
    iw: int,
    tls_flight_bytes: int,
    *,
    sizes: tuple[int, ...] = SIZES,
    rtts_ms: tuple[float, ...] = RTTS_MS,
    rate_bps: float = RATE_BPS,
    pairs: int = PAIRS,
) -> list[ComparePoint]:
    """Every size at every round trip on the probe's link, each beside its zero-delay twin."""
    urls = {size: f"https://{address}:{port}/obj/{size}" for size in sizes}
    topo.set_link("probe", LinkSpec.symmetric(rate_bps=rate_bps, rtt_ms=0.0))
    zero = {size: _pairs(topo, urls[size], ca_file, pairs) for size in sizes}
    points = []
    for rtt_ms in rtts_ms:
        topo.set_link("probe", LinkSpec.symmetric(rate_bps=rate_bps, rtt_ms=rtt_ms))
        for size in sizes:
            model = 1000.0 * predict_quic_saving(size, iw, rtt_ms / 1000.0, rate_bps, tls_flight_bytes, tls_flight_bytes)
            point = ComparePoint(rtt_ms, size, _pairs(topo, urls[size], ca_file, pairs), zero[size], model)
            points.append(point)
    return points


def reproduce_quic(*, quick: bool, show_progress: bool = True) -> dict[str, Any]:
    """The QUIC section of ``iwscope lab reproduce``: the paired comparison (quick: 100 ms only,
    six pairs, the fewest a median's 95 % interval needs) and the census of every
    :data:`iwscope_lab.quic.CENSUS_TARGETS` entry, on a lab of its own (no campaign: QUIC trials
    are not on the wire yet)."""
    rtts = (100.0,) if quick else RTTS_MS
    pairs = 6 if quick else PAIRS
    with tempfile.TemporaryDirectory(prefix="iwscope-quic-") as work, quic_lab(Path(work), arms=(10, 32), rtt_ms=rtts[0]) as lab:
        flight = tls_first_flight_bytes(lab.chain.chain_der_bytes, certificates=len(lab.chain.certificates))
        if show_progress:
            print(
                f"quic: TCP against QUIC at IW {COMPARE_IW}, {len(SIZES)} sizes x {len(rtts)} RTTs x {pairs} pairs",
                file=sys.stderr,
            )
        points = compare(
            lab.topo, lab.address, BASE_PORT + COMPARE_IW, str(lab.ca_file()), COMPARE_IW, flight, rtts_ms=rtts, pairs=pairs
        )
        lab.topo.set_link("probe", LinkSpec.symmetric(rate_bps=RATE_BPS, rtt_ms=100.0))
        census = []
        for name, target, window, datagram in CENSUS_TARGETS:
            url, ca_file = census_target_url(lab, target)
            answer = run_census(lab, url, ca_file, "only")["quic"]
            census.append({"server": name, "url": url, "given_packets": window, "given_datagram": datagram, **answer})
    return {
        "title": f"HTTPS on TCP against HTTP/3 at IW {COMPARE_IW}, and the QUIC census (100 Mbit/s)",
        "metric": "client: first packet to the response's last byte; saving = TCP's total - QUIC's, median of the pairs",
        "tolerance": TOLERANCE,
        "points": [point.to_dict() for point in points],
        "census": census,
    }


__all__ = [
    "PAIRS",
    "QUIC_KEY",
    "RATE_BPS",
    "RTTS_MS",
    "SIZES",
    "TOLERANCE",
    "ComparePoint",
    "compare",
    "reproduce_quic",
]
