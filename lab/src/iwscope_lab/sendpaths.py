"""Seed 002's writev vs sendfile, in the lab (``iwscope lab reproduce --only seed002-send``).

The seed: "on Linux, with Nagle and cork switched off, writev tends to send fewer and larger
segments, which is great for TSO, while sendfile prefers smaller segments", shown as two sender
plots of a 50 KB object at 33 ms.  Here one probe 33 ms from the origin fetches 50 KB at IW 10
with every trial traced at both ends, once per *condition*: the origin's send path
(``iwprobe origin --send-path``: ``writev``, ``sendfile``, ``mss-writes``) x the origin
device's segmentation offload (GSO on or off, :meth:`Topology.set_offload`).  Per condition:
the segments the sender's capture saw (data packets per trial, how many were full-sized,
smaller, or larger than the MSS, and the size of the first one: a head sent alone), the
observations' own ``send_path`` / ``segmentation_offload`` (what the origin says it did), and
the latency at the receiver (the trials' total, mean with its 95 % interval).

What this kernel does instead of the seed's NIC: the lab's TUN devices have no TSO, so a
capture at the sender sees what leaves the device -- MSS-sized packets whether GSO is on or
off (GSO cuts before the capture).  The difference the seed saw in *sizes* therefore shows on
the emulated path only where the application's writes make it (a head sent alone by
``sendfile``, one segment per write with ``mss-writes``).  The seed's super-segments need a
device that offloads: :func:`offload_segments` serves the same object over a veth pair (TSO on
by default, like the seed's NIC; no emulated delay) to Debian's ``curl`` while Debian's
``tcpdump`` captures the sender's device, once per send path with TSO on and off -- what TCP
handed the device, as the seed's sender plot showed it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import text

from iwprobe import wire
from iwscope.analysis.stats import mean_interval
from iwscope_lab._netns import LabError, ip
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.hostspec import probes_per_rtt
from iwscope_lab.links import LinkSpec
from iwscope_lab.pcap import read_pcap
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host, Topology, stop_processes

#: The key of this experiment in ``iwscope lab reproduce`` (``--only seed002-send``).
SEND_PATHS_KEY = "seed002-send"
RTT_MS = 33
SIZE = 50_000
IW = 10
RATE_BPS = 100e6
#: (send path, GSO on) per condition, the seed's pair first.
CONDITIONS: tuple[tuple[str, bool], ...] = (
    ("writev", True),
    ("sendfile", True),
    ("mss-writes", True),
    ("writev", False),
    ("sendfile", False),
)
REPETITIONS = 10
QUICK_REPETITIONS = 5
#: Fewest trials a latency interval is given from.
MIN_TRIALS = 3
#: A first data segment this small is the response head sent alone (an object's head is ~120 B).
HEAD_ALONE_BYTES = 300


@dataclass
class SenderSegments:
    """What the sender's captures of one condition's trials saw of the data it sent."""

    traces: int
    #: Data packets per trace (median), and the MSS they were cut to (the commonest size).
    packets_per_trial: float | None
    mss: int | None
    full: int
    smaller: int
    larger: int
    largest: int | None
    #: Traces whose first data packet carried the head alone (< :data:`HEAD_ALONE_BYTES`).
    head_alone: int
    #: The five most common sizes and their counts.
    common_sizes: list[tuple[int, int]] = field(default_factory=list)


def sender_segments(traces: list[dict[str, Any]]) -> SenderSegments:
    """Count the server's data packets of sender-side traces by size (``outgoing`` is the
    client's direction on both sides of a trace: the server's packets are the others)."""
    per_trace = [
        [length for out, length in zip(trace["outgoing"], trace["length"], strict=True) if not out and length] for trace in traces
    ]
    sizes = Counter(length for lengths in per_trace for length in lengths)
    mss = max(sizes.items(), key=lambda item: (item[1], item[0]))[0] if sizes else None  # commonest; a tie: the larger
    return SenderSegments(
        traces=len(traces),
        packets_per_trial=statistics.median(len(lengths) for lengths in per_trace) if per_trace else None,
        mss=mss,
        full=sizes[mss] if mss else 0,
        smaller=sum(count for size, count in sizes.items() if mss and size < mss),
        larger=sum(count for size, count in sizes.items() if mss and size > mss),
        largest=max(sizes) if sizes else None,
        head_alone=sum(1 for lengths in per_trace if lengths and lengths[0] < HEAD_ALONE_BYTES),
        common_sizes=sizes.most_common(5),
    )


@dataclass
class SendPathPoint:
    """One condition: what the origin did, what the sender's capture saw, what the receiver waited."""

    send_path: str
    gso: bool
    campaign_id: int
    trials: int
    latency_mean_ms: float | None
    latency_low_ms: float | None
    latency_high_ms: float | None
    latency_median_ms: float | None
    #: The observations' own account: {send_path/segmentation_offload: count}.
    reported: dict[str, int]
    segments: SenderSegments
    note: str = ""


def topology(run_id: str | None = None) -> Topology:
    """One origin on a fast link, one probe :data:`RTT_MS` away."""
    hosts = [Host("origin", role="origin", region="lab", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0))]
    hosts += probes_per_rtt((RTT_MS,), RATE_BPS, "lab-seed002")
    return Topology(run_id, hosts, scenario="reproduce:seed002-send")


def measure(session: Any, campaign_id: int, send_path: str, gso: bool) -> SendPathPoint:
    """The condition's point from its campaign's trials, observations and sender traces."""
    from iwscope.traces.services import decode_trace

    trials = session.execute(
        text("SELECT trial_id, total_us FROM trials WHERE campaign_id = :c AND error_kind IS NULL AND object_size = :s"),
        {"c": campaign_id, "s": SIZE},
    ).all()
    reported = session.execute(
        text(
            "SELECT o.send_path || '/' || o.segmentation_offload AS how, count(*) AS n FROM origin_observations o "
            "JOIN trials t ON t.trial_id = o.trial_id WHERE t.campaign_id = :c GROUP BY 1"
        ),
        {"c": campaign_id},
    ).all()
    bodies = session.execute(
        text(
            "SELECT tt.body FROM trial_traces tt JOIN trials t ON t.trial_id = tt.trial_id "
            "WHERE t.campaign_id = :c AND tt.side = 'sender'"
        ),
        {"c": campaign_id},
    ).all()
    latencies = [row.total_us / 1000 for row in trials]
    interval = mean_interval(latencies) if len(latencies) >= MIN_TRIALS else None
    return SendPathPoint(
        send_path=send_path,
        gso=gso,
        campaign_id=campaign_id,
        trials=len(latencies),
        latency_mean_ms=statistics.fmean(latencies) if interval else None,
        latency_low_ms=interval[0] if interval else None,
        latency_high_ms=interval[1] if interval else None,
        latency_median_ms=statistics.median(latencies) if latencies else None,
        reported={row.how: int(row.n) for row in reported},
        segments=sender_segments([decode_trace(bytes(row.body)) for row in bodies]),
        note="" if interval else f"n too small ({len(latencies)} trials)",
    )


def run_send_paths(
    stack: Stack, *, quick: bool, console: Console | None = None, show_progress: bool = True
) -> list[SendPathPoint]:
    """One traced campaign per condition in one topology; the points in :data:`CONDITIONS` order."""
    console = console or Console(stderr=True)
    points: list[SendPathPoint] = []
    with topology() as topo:
        for send_path, gso in CONDITIONS:
            topo.set_offload("origin", gso)
            plan = CampaignPlan(
                f"reproduce seed 002 send paths: {send_path}, GSO {'on' if gso else 'off'}",
                arms=(IW,),
                sizes=(SIZE,),
                repetitions=QUICK_REPETITIONS if quick else REPETITIONS,
                calibrate=False,
                trace_share=1.0,
                send_path=send_path,
            )
            console.print(f"[bold]Seed 002 send paths[/]: {plan.name}")
            outcome = LabCampaign(topo, stack, plan, console=console).run(show_progress=show_progress)
            with stack.session() as session:
                points.append(measure(session, outcome.campaign_id, send_path, gso))
    return points


def reproduce_send_paths(stack: Stack, *, quick: bool, show_progress: bool = True) -> dict[str, Any]:
    """The experiment for ``iwscope lab reproduce``: JSON-ready summary."""
    points = run_send_paths(stack, quick=quick, show_progress=show_progress)
    offload = offload_segments()
    return {
        "title": f"Send paths at the sender, {SIZE // 1000} KB at {RTT_MS} ms, IW {IW} (seed 002: writev vs sendfile)",
        "metric": "sender: outgoing data packets its capture saw per trial; receiver: client total latency",
        "points": [asdict(point) for point in points],
        "offload_title": f"What TCP hands an offloading device: {SIZE // 1000} KB over veth, TSO on and off (curl, tcpdump)",
        "offload": [asdict(run) for run in offload],
    }


@dataclass
class OffloadRun:
    """One send path with TSO on or off on the veth pair: what TCP handed the sender's device."""

    send_path: str
    tso: bool
    #: The observations' own ``send_path/segmentation_offload`` (all the same, or several).
    reported: list[str]
    responses: int
    #: Every response arrived whole (``curl``'s byte count).
    intact: bool
    #: Data packets per response at the sender's device (median), the first response's sizes in
    #: capture order, the largest packet of any response.
    packets_per_response: float | None
    first_sizes: list[int]
    largest: int | None
    #: The MSS the client announced (the size every packet on the wire is cut to).
    client_mss: int | None


#: The veth experiment's addresses and port (a /30 of TEST-NET-2, in namespaces of their own).
_VETH_ORIGIN, _VETH_CLIENT, _VETH_BASE_PORT = "198.51.100.1", "198.51.100.2", 8800


def offload_segments(
    send_paths: tuple[str, ...] = ("writev", "sendfile", "mss-writes"), *, fetches: int = 3, size: int = SIZE
) -> list[OffloadRun]:
    """Serve ``size`` bytes by each send path over a veth pair with TSO on, then off; per
    path x TSO, ``fetches`` responses fetched by ``curl`` and captured by ``tcpdump`` on the
    origin's device (root; namespaces of their own, removed on the way out)."""
    for tool in ("curl", "tcpdump", "ethtool"):
        if shutil.which(tool) is None:
            raise LabError(f"the send-path experiment needs {tool} (make setup installs it)")
    tag = secrets.token_hex(3)
    origin_ns, client_ns, device = f"iwsp{tag}o", f"iwsp{tag}c", f"iwsp{tag}"
    runs: list[OffloadRun] = []
    with tempfile.TemporaryDirectory(prefix="iwscope-sendpaths-") as work:
        try:
            ip(["netns", "add", origin_ns])
            ip(["netns", "add", client_ns])
            ip(["link", "add", device, "netns", origin_ns, "type", "veth", "peer", "name", f"{device}c", "netns", client_ns])
            ip(["addr", "add", f"{_VETH_ORIGIN}/30", "dev", device], namespace=origin_ns)
            ip(["link", "set", device, "up"], namespace=origin_ns)
            ip(["addr", "add", f"{_VETH_CLIENT}/30", "dev", f"{device}c"], namespace=client_ns)
            ip(["link", "set", f"{device}c", "up"], namespace=client_ns)
            for send_path in send_paths:
                runs += _serve_and_capture(Path(work), origin_ns, client_ns, device, send_path, fetches, size)
        finally:
            for namespace in (origin_ns, client_ns):
                subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    return runs


def _in(namespace: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", namespace, *argv]


def _serve_and_capture(
    work: Path, origin_ns: str, client_ns: str, device: str, send_path: str, fetches: int, size: int
) -> list[OffloadRun]:
    """One origin with ``send_path``; a capture of ``fetches`` responses with TSO on, then off."""
    from iwprobe._offload import CACHE_S

    port = _VETH_BASE_PORT + IW
    observations = work / f"{send_path}.jsonl"
    with observations.open("wb") as out, (work / f"{send_path}.log").open("wb") as log:
        origin = subprocess.Popen(
            _in(origin_ns, sys.executable, "-m", "iwprobe", "origin", "--no-upload", "--no-echo", "--bind", _VETH_ORIGIN)
            + ["--arms", str(IW), "--base-port", str(_VETH_BASE_PORT), "--send-path", send_path],
            stdout=out,
            stderr=log,
        )
        try:
            _wait_serving(client_ns, port, origin)
            runs = []
            for tso in (True, False):
                state = "on" if tso else "off"
                subprocess.run(
                    _in(origin_ns, "ethtool", "-K", device, "tso", state, "gso", state), check=True, capture_output=True
                )
                time.sleep(CACHE_S)  # the origin reads the device's offload at most this stale
                done = len(observations.read_bytes().splitlines())
                pcap = work / f"{send_path}-{state}.pcap"
                received = _captured_fetches(origin_ns, client_ns, device, port, pcap, fetches, size)
                runs.append(_offload_run(send_path, tso, pcap, port, received, size, _reported(observations, done)))
            return runs
        finally:
            stop_processes([origin])


def _wait_serving(client_ns: str, port: int, origin: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if origin.poll() is not None:
            raise LabError(f"the origin exited ({origin.returncode}) before serving")
        probe = subprocess.run(
            _in(client_ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://{_VETH_ORIGIN}:{port}/obj/1"),
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.stdout.strip() == "200":
            return
        time.sleep(0.2)
    raise LabError(f"the origin did not answer on port {port} within {timeout_s:.0f} s")


def _captured_fetches(origin_ns: str, client_ns: str, device: str, port: int, pcap: Path, fetches: int, size: int) -> list[int]:
    """Bytes ``curl`` received per fetch while ``tcpdump`` wrote the origin's device to ``pcap``."""
    capture = subprocess.Popen(
        _in(origin_ns, "tcpdump", "-i", device, "--immediate-mode", "-U", "-s", "128", "-w", str(pcap), "tcp", "port", str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert capture.stderr is not None
        os.set_blocking(capture.stderr.fileno(), True)
        started = capture.stderr.readline()  # "listening on ...": the capture is on
        if b"listening" not in started:
            raise LabError(f"tcpdump did not start: {started.decode(errors='replace').strip()}")
        received = []
        for _ in range(fetches):
            answer = subprocess.run(
                _in(client_ns, "curl", "-s", "-o", "/dev/null", "-w", "%{size_download}")
                + ["-H", f"{wire.TRIAL_HEADER}: {uuid.uuid4()}", f"http://{_VETH_ORIGIN}:{port}/obj/{size}"],
                capture_output=True,
                text=True,
                check=True,
            )
            received.append(int(answer.stdout.strip() or 0))
        time.sleep(0.3)  # the last ACKs into the capture
        return received
    finally:
        stop_processes([capture])  # tcpdump writes out what it holds on SIGTERM too
        if capture.stderr is not None:
            capture.stderr.close()


def _reported(observations: Path, skip: int) -> list[str]:
    """``send_path/segmentation_offload`` of the observations after the first ``skip``."""
    lines = observations.read_text(encoding="utf-8").splitlines()[skip:]
    return sorted({f"{record['send_path']}/{record['segmentation_offload']}" for record in map(json.loads, lines)})


def _offload_run(
    send_path: str, tso: bool, pcap: Path, port: int, received: list[int], size: int, reported: list[str]
) -> OffloadRun:
    packets = read_pcap(pcap)
    by_connection: dict[int, list[int]] = {}
    client_mss: int | None = None
    for packet in packets:
        if packet.sport == port and packet.payload:
            by_connection.setdefault(packet.dport, []).append(packet.payload)
        elif packet.dport == port and packet.mss_option is not None:
            client_mss = packet.mss_option
    responses = list(by_connection.values())
    return OffloadRun(
        send_path=send_path,
        tso=tso,
        reported=reported,
        responses=len(responses),
        intact=len(received) > 0 and all(count == size for count in received),
        packets_per_response=statistics.median(len(sizes) for sizes in responses) if responses else None,
        first_sizes=responses[0] if responses else [],
        largest=max(max(sizes) for sizes in responses) if responses else None,
        client_mss=client_mss,
    )


def send_paths_markdown(summary: dict[str, Any]) -> list[str]:
    """The report's table: one row per condition."""
    lines = [
        f"## {summary['title']}",
        "",
        "| send path | GSO | origin says | trials | latency (mean, 95 % CI) | median | data packets / trial "
        "| full / smaller / larger | head alone | common sizes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for point in summary["points"]:
        segments = point["segments"]
        latency = (
            f"{point['latency_mean_ms']:.1f} ms [{point['latency_low_ms']:.1f}, {point['latency_high_ms']:.1f}]"
            if point["latency_mean_ms"] is not None
            else point["note"]
        )
        median = f"{point['latency_median_ms']:.1f} ms" if point["latency_median_ms"] is not None else "-"
        reported = ", ".join(f"{how} x{count}" for how, count in sorted(point["reported"].items()))
        sizes = ", ".join(f"{size} B x{count}" for size, count in segments["common_sizes"])
        per_trial = f"{segments['packets_per_trial']:g}" if segments["packets_per_trial"] is not None else "-"
        lines.append(
            f"| {point['send_path']} | {'on' if point['gso'] else 'off'} | {reported} | {point['trials']} | {latency} "
            f"| {median} | {per_trial} | {segments['full']} / {segments['smaller']} / {segments['larger']} "
            f"| {segments['head_alone']} of {segments['traces']} | {sizes} |"
        )
    lines += ["", f"### {summary['offload_title']}", ""] if summary.get("offload") else []
    lines += offload_markdown(summary.get("offload", []))
    return [*lines, ""]


def offload_markdown(runs: list[dict[str, Any]]) -> list[str]:
    """The veth table: per send path and TSO state, the packets the sender's device was handed."""
    if not runs:
        return []
    lines = [
        "| send path | TSO | origin says | responses | whole | packets / response | first response's packets (B) | largest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        sizes = ", ".join(f"{size:,}" for size in run["first_sizes"][:8]) + (", ..." if len(run["first_sizes"]) > 8 else "")
        per = f"{run['packets_per_response']:g}" if run["packets_per_response"] is not None else "-"
        largest = f"{run['largest']:,} B" if run["largest"] is not None else "-"
        lines.append(
            f"| {run['send_path']} | {'on' if run['tso'] else 'off'} | {', '.join(run['reported'])} | {run['responses']} "
            f"| {'yes' if run['intact'] else 'NO'} | {per} | {sizes} | {largest} |"
        )
    return lines


def send_paths_html(summary: dict[str, Any]) -> str:
    """The report's section: the same table in HTML."""
    import html

    def table(lines: list[str]) -> str:
        header = "".join(f"<th>{html.escape(cell.strip())}</th>" for cell in lines[0].strip("|").split("|"))
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell.strip())}</td>" for cell in line.strip("|").split("|")) + "</tr>"
            for line in lines[2:]
        )
        return f"<table><tr>{header}</tr>{rows}</table>"

    points = send_paths_markdown({**summary, "offload": []})[2:-1]
    section = f"<h2>{html.escape(summary['title'])}</h2>{table(points)}"
    if summary.get("offload"):
        section += f"<h3>{html.escape(summary['offload_title'])}</h3>{table(offload_markdown(summary['offload']))}"
    return section
