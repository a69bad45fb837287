"""Self-test of the link emulator: configured vs measured RTT, delivered rate and loss.

A two-host topology: ``origin`` behind an unlimited zero-delay link and ``probe`` behind the
link under test.  Three phases, each with real kernel sockets in the namespaces:

* RTT: many TCP handshakes probe -> origin on an idle, loss-free link, timed by the kernel
  (``tcpi_rtt`` right after connect: SYN sent -> SYN-ACK received, microseconds, not
  disturbed by the measuring process being descheduled; connect()'s wall time is reported
  too).  Expected value = configured RTT + serialisation of the 60-byte SYN (up) and
  SYN-ACK (down).
* Rate: one TCP bulk transfer origin -> probe on a loss-free link with an unlimited buffer,
  after a warm-up.  Measured twice: the emulator's delivered IP bytes per second (its own
  counters, packet-aligned; this is the figure checked against the 2 % target) and the
  receiver's goodput converted to IP bytes (x (MSS + 52) / MSS), which is lower when TCP
  wastes capacity (at 56 kbit/s a 10-segment initial window takes 2 s to drain and the 1 s
  initial RTO fires: spurious retransmissions).
* Loss: numbered UDP datagrams origin -> probe paced below the link rate; the count of lost
  ones is checked against the exact binomial 99 % interval of the configured loss.

Also reports the emulator's CPU use during the rate phase (utime + stime from /proc).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .links import LinkSpec
from .topology import Host, Topology

#: IPv4 + TCP headers with the timestamp option: a 1448-byte payload fills a 1500-byte packet.
TCP_IP_HEADER_BYTES = 52
#: A SYN or SYN-ACK with MSS, SACK-permitted, timestamps and window scale options.
SYN_BYTES = 60
UDP_IP_HEADER_BYTES = 28
UDP_PAYLOAD_BYTES = 32
DELAY_TARGET_MS = 1.0
RATE_TARGET = 0.02


@dataclass
class SelftestConfig:
    rtt_ms: float = 70.0
    rate_bps: float = 1_200_000.0
    loss: float = 0.0
    #: Length of the rate measurement window (after the warm-up).
    duration_s: float = 5.0
    handshakes: int = 50
    #: Datagrams for the loss phase (None: as many as fit in ``duration_s``, 2000..20000).
    loss_packets: int | None = None
    run_id: str | None = None


def _python() -> list[str]:
    return [sys.executable, "-m", "iwscope_lab._measure"]


def _start_server(topo: Topology, host: str, args: list[str]) -> subprocess.Popen[str]:
    process = topo.popen(host, _python() + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"server {args[0]} in {host} did not start: {process.stderr.read() if process.stderr else ''}")
    return process


def _finish(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"measurement process failed ({process.returncode}): {err.strip()}")
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


def _run(topo: Topology, host: str, args: list[str], timeout: float) -> dict[str, Any]:
    result = topo.run(host, _python() + args, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{args[0]} in {host} failed: {result.stderr.strip()}")
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def serialisation_ms(size_bytes: int, rate_bps: float | None) -> float:
    return 0.0 if not rate_bps else size_bytes * 8.0 / rate_bps * 1000.0


def expected_handshake_ms(topo: Topology, client: str, server: str) -> float:
    """Propagation RTT of both access links plus serialisation of SYN (up) and SYN-ACK (down)."""
    total = 0.0
    for name in (client, server):
        link = topo.host(name).link
        total += link.rtt_ms
        # SYN crosses the client's up and the server's down; the SYN-ACK the reverse.
        total += serialisation_ms(SYN_BYTES, link.up.rate_bps) + serialisation_ms(SYN_BYTES, link.down.rate_bps)
    return total


def measure_rtt(topo: Topology, client: str, server: str, count: int, port: int = 7101) -> dict[str, Any]:
    """TCP handshake times client -> server compared with the expected value."""
    expected = expected_handshake_ms(topo, client, server)
    # Leave the link idle between handshakes: the ACK and RST of one (about 100 bytes up)
    # must be serialised before the next SYN, or the SYN queues behind them.
    rates = [r for h in (client, server) for r in (topo.host(h).link.up.rate_bps, topo.host(h).link.down.rate_bps) if r]
    gap_s = 0.005 + (4 * SYN_BYTES * 8 / min(rates) if rates else 0.0)
    process = _start_server(topo, server, ["accept-server", str(port)])
    timing_before = emulator_timing(topo)
    try:
        answer = _run(
            topo,
            client,
            ["handshakes", topo.host(server).address, str(port), str(count), str(gap_s)],
            timeout=count * (expected / 1000.0 + gap_s + 0.05) + 30,
        )
    finally:
        process.kill()
        process.communicate()
    timing_after = emulator_timing(topo)
    samples = answer["samples_ms"]
    errors = [abs(sample - expected) for sample in samples]
    wall = answer["wall_ms"]
    # Packets the emulators themselves sent more than 1 ms late during this phase: on a
    # shared machine (PREEMPT_NONE kernel) a busy neighbour can hold a CPU for tens of ms.
    late_packets = timing_after["late_over_1ms"] - timing_before["late_over_1ms"]
    return {
        "expected_ms": expected,
        "samples": len(samples),
        "p50_ms": _percentile(samples, 0.5),
        "p99_ms": _percentile(samples, 0.99),
        "min_ms": min(samples),
        "max_ms": max(samples),
        "p50_error_ms": _percentile(errors, 0.5),
        "p99_error_ms": _percentile(errors, 0.99),
        "connect_wall_p50_ms": _percentile(wall, 0.5),
        "connect_wall_p99_ms": _percentile(wall, 0.99),
        "emulator_late_over_1ms": late_packets,
        "samples_ms": samples,
    }


def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_rate(
    topo: Topology, sender: str, receiver: str, seconds: float, warmup_s: float | None = None, port: int = 7102
) -> dict[str, Any]:
    """Delivered rate of one TCP bulk transfer sender -> receiver (the receiver's down direction)."""
    link = topo.host(receiver).link
    rtt_s = (link.rtt_ms + topo.host(sender).link.rtt_ms) / 1000.0
    if warmup_s is None:
        warmup_s = max(0.7, 8 * rtt_s)
    total = warmup_s + seconds
    emulator_pid = topo.emulator_pid(receiver)
    server = _start_server(topo, sender, ["bulk-server", str(port), str(total + 2)])
    client = topo.popen(
        receiver,
        _python() + ["bulk-client", topo.host(sender).address, str(port), str(total)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = time.monotonic()
        time.sleep(warmup_s)
        stats_start = topo.link_stats(receiver)
        cpu_start, wall_start = _cpu_seconds(emulator_pid), time.monotonic()
        time.sleep(max(0.1, started + total - 0.2 - time.monotonic()))
        stats_end = topo.link_stats(receiver)
        cpu_end, wall_end = _cpu_seconds(emulator_pid), time.monotonic()
        client_result = _finish(client, timeout=total + 30)
    finally:
        for process in (client, server):
            if process.poll() is None:
                process.kill()
            process.communicate()
    down_start, down_end = stats_start["down"], stats_end["down"]
    # Packet-aligned: the bytes delivered after the first sample's last delivery, up to and
    # including the second sample's last delivery, over the time between those deliveries
    # (exact even when the window holds only a few dozen packets, as at 56 kbit/s).
    # The emulator's accuracy is its rate while it had something to send: over the span less
    # the time its serialiser sat idle between packets (a sender or receiver starved of CPU on
    # a busy box leaves gaps that are no error of the link; the busy share says how many).
    span_ns = max(1, down_end["last_deliver_ns"] - down_start["last_deliver_ns"])
    idle_ns = min(span_ns - 1, max(0, down_end["idle_ns"] - down_start["idle_ns"]))
    delivered_bits = (down_end["delivered_bytes"] - down_start["delivered_bytes"]) * 8
    emulator_bps = delivered_bits * 1e9 / (span_ns - idle_ns)
    delivered_bps = delivered_bits * 1e9 / span_ns
    progress = [(t, b) for t, b in client_result["progress"] if t >= warmup_s]
    goodput_bps = math.nan
    if len(progress) >= 2 and progress[-1][0] > progress[0][0]:
        goodput_bps = (progress[-1][1] - progress[0][1]) * 8 / (progress[-1][0] - progress[0][0])
    mss = client_result.get("rcv_mss") or 1448
    goodput_as_ip_bps = goodput_bps * (mss + TCP_IP_HEADER_BYTES) / mss
    configured = link.down.rate_bps
    result: dict[str, Any] = {
        "configured_bps": configured,
        "emulator_delivered_bps": emulator_bps,
        "delivered_bps": delivered_bps,
        "link_busy_share": 1.0 - idle_ns / span_ns,
        "goodput_bps": goodput_bps,
        "goodput_as_ip_bps": goodput_as_ip_bps,
        "mss": mss,
        "warmup_s": warmup_s,
        "window_s": seconds,
        "received_bytes": client_result["received"],
        "emulator_cpu_percent": 100.0 * (cpu_end - cpu_start) / (wall_end - wall_start),
        "queue_drops": down_end["queue_drop_packets"] - down_start["queue_drop_packets"],
        "delivered_packets": down_end["delivered_packets"] - down_start["delivered_packets"],
    }
    if configured:
        result["emulator_error"] = emulator_bps / configured - 1.0
        # TCP's own count of what arrived against the emulator's count over the same time.
        result["goodput_error"] = goodput_as_ip_bps / delivered_bps - 1.0
    return result


def binomial_interval(trials: int, probability: float, confidence: float = 0.99) -> tuple[int, int]:
    """Central ``confidence`` interval of a Binomial(trials, probability) count (exact quantiles)."""
    if probability <= 0.0:
        return 0, 0
    if probability >= 1.0:
        return trials, trials
    tail = (1.0 - confidence) / 2.0
    log_p, log_q = math.log(probability), math.log1p(-probability)
    cumulative = 0.0
    low = None
    for k in range(trials + 1):
        log_pmf = math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + k * log_p + (trials - k) * log_q
        cumulative += math.exp(log_pmf)
        if low is None and cumulative >= tail:
            low = k
        if cumulative >= 1.0 - tail:
            return low if low is not None else k, k
    return low if low is not None else trials, trials


def measure_loss(
    topo: Topology, sender: str, receiver: str, packets: int, per_second: float | None = None, port: int = 7103
) -> dict[str, Any]:
    """Numbered UDP datagrams sender -> receiver; lost count vs the binomial 99 % interval."""
    link = topo.host(receiver).link
    configured = link.down.loss
    rate = link.down.rate_bps or 1e9
    if per_second is None:
        per_second = min(8000.0, 0.5 * rate / ((UDP_PAYLOAD_BYTES + UDP_IP_HEADER_BYTES) * 8))
    send_s = packets / per_second
    rtt_s = (link.rtt_ms + topo.host(sender).link.rtt_ms) / 1000.0
    stats_start = topo.link_stats(receiver)["down"]
    sink = _start_server(topo, receiver, ["udp-sink", str(port), str(send_s + rtt_s + 2.0)])
    try:
        source = _run(
            topo,
            sender,
            ["udp-source", topo.host(receiver).address, str(port), str(packets), str(per_second)],
            timeout=send_s + 30,
        )
        sink_result = _finish(sink, timeout=send_s + rtt_s + 30)
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.communicate()
    stats_end = topo.link_stats(receiver)["down"]
    lost = packets - sink_result["received"]
    low, high = binomial_interval(packets, configured)
    emulator_rx = stats_end["rx_packets"] - stats_start["rx_packets"]
    emulator_lost = stats_end["lost_packets"] - stats_start["lost_packets"]
    return {
        "configured": configured,
        "sent": packets,
        "send_errors": source["send_errors"],
        "received": sink_result["received"],
        "lost": lost,
        "measured": lost / packets,
        "interval_99": [low, high],
        "within_interval": low <= lost <= high,
        "emulator_rx_packets": emulator_rx,
        "emulator_lost_packets": emulator_lost,
        "per_second": per_second,
        "loss_bursts": len(sink_result["loss_runs"]),
        "mean_burst_packets": (
            sum(sink_result["loss_runs"]) / len(sink_result["loss_runs"]) if sink_result["loss_runs"] else 0.0
        ),
    }


def emulator_timing(topo: Topology) -> dict[str, Any]:
    """The emulators' own timing error over the run: how late packets left vs their schedule."""
    delivered = late_sum = over_100us = over_1ms = 0
    late_max = 0
    for host in topo.hosts:
        stats = topo.link_stats(host.name)
        for direction in ("down", "up"):
            counters = stats[direction]
            delivered += counters["delivered_packets"]
            late_sum += counters["late_sum_ns"]
            over_100us += counters["late_over_100us"]
            over_1ms += counters["late_over_1ms"]
            late_max = max(late_max, counters["late_max_ns"])
    return {
        "packets": delivered,
        "late_mean_us": late_sum / max(1, delivered) / 1000.0,
        "late_max_ms": late_max / 1e6,
        "late_over_100us": over_100us,
        "late_over_1ms": over_1ms,
        "late_over_1ms_fraction": over_1ms / max(1, delivered),
    }


def run_selftest(config: SelftestConfig) -> dict[str, Any]:
    """Build the two-host topology, run the three phases, tear down; returns every figure."""
    link_under_test = LinkSpec.symmetric(rate_bps=config.rate_bps, rtt_ms=config.rtt_ms, loss=config.loss)
    clean_link = LinkSpec.symmetric(rate_bps=config.rate_bps, rtt_ms=config.rtt_ms, loss=0.0)
    topo = Topology(
        config.run_id,
        [
            Host("origin", role="origin", link=LinkSpec.symmetric()),
            Host("probe", role="probe", link=clean_link),
        ],
    )
    report: dict[str, Any] = {"configured": asdict(config), "run_id": topo.run_id}
    with topo:
        report["rtt"] = measure_rtt(topo, "probe", "origin", config.handshakes)
        report["rate"] = measure_rate(topo, "origin", "probe", config.duration_s)
        topo.set_link("probe", link_under_test)
        packets = config.loss_packets
        if packets is None:
            per_second = min(8000.0, 0.5 * config.rate_bps / ((UDP_PAYLOAD_BYTES + UDP_IP_HEADER_BYTES) * 8))
            packets = int(max(2000, min(20000, per_second * config.duration_s)))
        report["loss"] = measure_loss(topo, "origin", "probe", packets)
        report["emulator_timing"] = emulator_timing(topo)
    report["checks"] = {
        "rtt_p99_error_within_1ms": report["rtt"]["p99_error_ms"] <= DELAY_TARGET_MS,
        "rate_within_2pct": abs(report["rate"].get("emulator_error", 0.0)) <= RATE_TARGET,
        "loss_within_99pct_interval": report["loss"]["within_interval"],
    }
    return report
