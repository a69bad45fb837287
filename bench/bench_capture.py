"""The IW capture's and the traces' cost to the probe: CPU per 1,000 trials, peak RSS, inference time.

A lab ``Topology``: a server (Python's ``http.server``, zero-delay link) and a probe behind a
``--rtt-ms`` (20) / 100 Mbit/s link, the server's route at ``initcwnd 10``.  Three probe worker
processes in the probe's namespace fetch the same ``--size`` (30 KB) object with
``iwprobe._fetch.fetch``: one plain (``infer_iw=False``), one with the capture and inference
(``infer_iw=True``), one traced (the capture, and every trial kept as a trace the way a traced
round's are: built, serialised, spooled).  The parent hands them blocks of ``--block``
fetches in turn (plain, capture, traced, plain, ...), so all see the same load on this shared machine; each worker
measures its own ``getrusage`` (user + sys) around its blocks only, and reports its peak RSS
(``ru_maxrss``) at the end.  The capture worker also times, per trial, reading and parsing the
captured packets (``ConnectionCapture.read``) and the inference itself (``infer``) by wrapping
the real functions, and opening and closing the capture socket: closing an ``AF_PACKET``
socket waits for an RCU grace period (``synchronize_net``), wall time after the trial's own
timings, not CPU.

Not in the probe's own CPU: the kernel's work on *incoming* packets (the capture's filter, the
copy of each kept packet's headers to its queue) runs where the packet is received -- on the
lab path inside the link emulator's ``write()`` to the probe's TUN device, on a real host in
the NIC's softirq.  The emulator of the probe's link is therefore measured per block too
(``/proc/<pid>/stat``): its extra CPU in capture blocks is that receive-side share.

Run as root: ``.venv/bin/python bench/bench_capture.py [--trials 1000]``; prints a summary with
the load average and writes ``bench/results/capture-cost-<date>[-<n>].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

RESULTS = Path(__file__).resolve().parent / "results"
#: ``traced``: the capture, and each trial kept as a trace the way ``iwprobe run`` keeps a traced
#: round's (wire v7: built, serialised and spooled as a ``trace`` record).
MODES = ("plain", "capture", "traced")
IW = 10


# --- worker (runs in the probe namespace) ---------------------------------------------------


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def trace_keeper(mode: str) -> Any:
    """For ``traced``: what the agent does with a traced trial's fetch (build the trace, spool
    it as a ``TraceRecord``), into a spool of its own; else None."""
    if mode != "traced":
        return None
    from iwprobe import wire
    from iwprobe._spool import Spool
    from iwprobe._trace import trace_of

    spool = Spool(os.path.join(tempfile.mkdtemp(prefix="bench-trace-spool-"), "spool.sqlite"))

    def keep(result: Any) -> None:
        trial_id = wire.new_id()
        record = wire.TraceRecord(trial_id, "receiver", result.started_at, trace_of(result).to_dict())
        spool.add("trace", f"{trial_id}:receiver", wire.to_dict(record))

    return keep


def worker(mode: str, url: str) -> None:
    """Fetch blocks of ``url`` on command (``run N`` on stdin), one JSON line per block."""
    from iwprobe import _fetch
    from iwprobe._capture import ConnectionCapture

    infer_iw = mode != "plain"
    keep_trace = trace_keeper(mode)
    read_ns: list[int] = []
    infer_ns: list[int] = []
    open_ns: list[int] = []
    close_ns: list[int] = []
    packets: list[int] = []
    real_infer = _fetch.infer
    real_read = ConnectionCapture.read
    real_init = ConnectionCapture.__init__
    real_close = ConnectionCapture.close

    def timed_infer(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter_ns()
        try:
            return real_infer(*args, **kwargs)
        finally:
            infer_ns.append(time.perf_counter_ns() - started)

    def timed_read(self: ConnectionCapture) -> Any:
        started = time.perf_counter_ns()
        try:
            return real_read(self)
        finally:
            read_ns.append(time.perf_counter_ns() - started)
            packets.append(len(self.packets))

    def timed_init(self: ConnectionCapture, local_port: int) -> None:
        started = time.perf_counter_ns()
        try:
            real_init(self, local_port)
        finally:
            open_ns.append(time.perf_counter_ns() - started)

    def timed_close(self: ConnectionCapture) -> None:
        started = time.perf_counter_ns()
        try:
            real_close(self)
        finally:
            close_ns.append(time.perf_counter_ns() - started)

    _fetch.infer = timed_infer  # type: ignore[assignment]
    ConnectionCapture.read = timed_read  # type: ignore[method-assign]
    ConnectionCapture.__init__ = timed_init  # type: ignore[method-assign]
    ConnectionCapture.close = timed_close  # type: ignore[method-assign]
    _fetch.fetch(url, infer_iw=infer_iw)  # warm-up: imports, first connection
    for kept in (read_ns, infer_ns, packets, open_ns, close_ns):
        kept.clear()
    for line in sys.stdin:
        command = line.split()
        if command[0] != "run":
            break
        statuses: Counter[str] = Counter()
        totals: list[int] = []
        errors = 0
        cpu_before, wall_before = _cpu_s(), time.monotonic()
        for _ in range(int(command[1])):
            result = _fetch.fetch(url, infer_iw=infer_iw)
            if keep_trace is not None:
                keep_trace(result)
            if result.error_kind:
                errors += 1
            elif result.total_us is not None:
                totals.append(result.total_us)
            if result.iw is not None:
                statuses[f"{result.iw.status}:{result.iw.iw_segments}:{result.iw.reason}"] += 1
            elif infer_iw:
                statuses[f"none:{result.iw_unavailable[:60]}"] += 1
        print(
            json.dumps(
                {
                    "cpu_s": _cpu_s() - cpu_before,
                    "wall_s": time.monotonic() - wall_before,
                    "trials": int(command[1]),
                    "errors": errors,
                    "total_us": totals,
                    "statuses": dict(statuses),
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "read_ns": read_ns,
                "infer_ns": infer_ns,
                "packets": packets,
                "open_ns": open_ns,
                "close_ns": close_ns,
            }
        ),
        flush=True,
    )


# --- parent ---------------------------------------------------------------------------------


def _process_cpu_s(pid: int) -> float:
    """utime + stime of a process (``/proc/<pid>/stat``), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _command(process: subprocess.Popen[str], line: str) -> dict[str, Any]:
    stdin: IO[str] | None = process.stdin
    stdout: IO[str] | None = process.stdout
    assert stdin is not None and stdout is not None
    stdin.write(line + "\n")
    stdin.flush()
    answer = stdout.readline()
    if not answer:
        raise RuntimeError(f"the worker exited ({process.wait()})")
    result: dict[str, Any] = json.loads(answer)
    return result


def _ms(values: list[int], scale: float) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered) / scale, 3),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))] / scale, 3),
        "max": round(ordered[-1] / scale, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="fetches per mode")
    parser.add_argument("--block", type=int, default=50, help="fetches per block (modes alternate)")
    parser.add_argument("--size", type=int, default=30_000, help="object bytes")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0

    from iwscope_lab.topology import Host, LinkSpec, Topology, stop_processes

    hosts = [
        Host("server", link=LinkSpec.symmetric(rate_bps=100e6, rtt_ms=0.0)),
        Host("probe", link=LinkSpec.symmetric(rate_bps=100e6, rtt_ms=args.rtt_ms)),
    ]
    load_before = os.getloadavg()
    started = time.monotonic()
    blocks: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    finals: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-capture-") as scratch, Topology(None, hosts) as topo:
        www = Path(scratch)
        (www / "object").write_bytes(os.urandom(args.size))
        os.chmod(www, 0o755)
        address = topo.host("server").address
        topo.set_route("server", initcwnd=IW)
        server = topo.popen(
            "server",
            [sys.executable, "-m", "http.server", "--bind", address, "8080", "--directory", str(www)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        workers: dict[str, subprocess.Popen[str]] = {}
        try:
            topo.wait_listening("server", address, [8080])
            url = f"http://{address}:8080/object"
            for mode in MODES:
                workers[mode] = topo.popen(
                    "probe",
                    [sys.executable, __file__, "--worker", mode, url],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            emulator = topo.emulator_pid("probe")
            done = 0
            while done < args.trials:
                size = min(args.block, args.trials - done)
                for mode in MODES:
                    emulator_before = _process_cpu_s(emulator)
                    block = _command(workers[mode], f"run {size}")
                    block["emulator_cpu_s"] = _process_cpu_s(emulator) - emulator_before
                    blocks[mode].append(block)
                done += size
                print(f"  {done}/{args.trials} per mode", end="\r", file=sys.stderr, flush=True)
            print(file=sys.stderr)
            for mode in MODES:
                finals[mode] = _command(workers[mode], "quit")
        finally:
            stop_processes([*workers.values(), server])
    load_after = os.getloadavg()

    per_mode: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        trials = sum(block["trials"] for block in blocks[mode])
        cpu = sum(block["cpu_s"] for block in blocks[mode])
        emulator_cpu = sum(block["emulator_cpu_s"] for block in blocks[mode])
        totals = [value for block in blocks[mode] for value in block["total_us"]]
        statuses: Counter[str] = Counter()
        for block in blocks[mode]:
            statuses.update(block["statuses"])
        per_mode[mode] = {
            "trials": trials,
            "errors": sum(block["errors"] for block in blocks[mode]),
            "cpu_s": round(cpu, 3),
            "cpu_s_per_1000_trials": round(cpu / trials * 1000, 3),
            "emulator_cpu_s_per_1000_trials": round(emulator_cpu / trials * 1000, 3),
            "block_cpu_s_per_1000": [round(block["cpu_s"] / block["trials"] * 1000, 2) for block in blocks[mode]],
            "wall_s": round(sum(block["wall_s"] for block in blocks[mode]), 1),
            "peak_rss_kb": finals[mode]["maxrss_kb"],
            "total_ms": _ms(totals, 1000),
            "inference": dict(statuses),
        }
    capture = finals["capture"]
    per_mode["capture"].update(
        {
            "read_and_parse_ms": _ms(capture["read_ns"], 1e6),
            "infer_ms": _ms(capture["infer_ns"], 1e6),
            "open_ms": _ms(capture["open_ns"], 1e6),
            "close_ms_wall": _ms(capture["close_ns"], 1e6),
            "packets_per_trial": _ms(capture["packets"], 1),
        }
    )
    plain, captured, traced = per_mode["plain"], per_mode["capture"], per_mode["traced"]
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "setup": {
            "rtt_ms": args.rtt_ms,
            "rate_bps": 100e6,
            "server": "python http.server",
            "initcwnd": IW,
            "object_bytes": args.size,
            "trials_per_mode": args.trials,
            "block": args.block,
            "cpus": os.cpu_count(),
        },
        "load_avg_before": [round(value, 2) for value in load_before],
        "load_avg_after": [round(value, 2) for value in load_after],
        "wall_s": round(time.monotonic() - started, 1),
        "modes": per_mode,
        "capture_extra": {
            "cpu_s_per_1000_trials": round(captured["cpu_s_per_1000_trials"] - plain["cpu_s_per_1000_trials"], 3),
            "cpu_ratio": round(captured["cpu_s_per_1000_trials"] / plain["cpu_s_per_1000_trials"], 3),
            "emulator_cpu_s_per_1000_trials": round(
                captured["emulator_cpu_s_per_1000_trials"] - plain["emulator_cpu_s_per_1000_trials"], 3
            ),
            "peak_rss_kb": captured["peak_rss_kb"] - plain["peak_rss_kb"],
        },
        # what keeping every trial's trace adds to the capture (same blocks, same load)
        "trace_extra": {
            "cpu_s_per_1000_trials": round(traced["cpu_s_per_1000_trials"] - captured["cpu_s_per_1000_trials"], 3),
            "cpu_ratio_to_capture": round(traced["cpu_s_per_1000_trials"] / captured["cpu_s_per_1000_trials"], 3),
            "peak_rss_kb": traced["peak_rss_kb"] - captured["peak_rss_kb"],
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"capture-cost-{time.strftime('%Y%m%d')}.json"
    run = 1
    while path.exists():  # a day's earlier runs are kept
        run += 1
        path = RESULTS / f"capture-cost-{time.strftime('%Y%m%d')}-{run}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"capture cost, {args.trials} fetches per mode of {args.size} bytes at {args.rtt_ms:g} ms RTT "
        f"(load {load_before[0]:.2f} -> {load_after[0]:.2f}, {os.cpu_count()} CPUs):"
    )
    for mode in MODES:
        row = per_mode[mode]
        print(
            f"  {mode:8} CPU {row['cpu_s_per_1000_trials']:.2f} s / 1,000 trials, peak RSS "
            f"{row['peak_rss_kb'] / 1024:.1f} MB, total median {row['total_ms'].get('median')} ms, "
            f"errors {row['errors']} (link emulator {row['emulator_cpu_s_per_1000_trials']:.2f} s / 1,000)"
        )
    print(
        f"  capture: +{report['capture_extra']['cpu_s_per_1000_trials']:.2f} s CPU / 1,000 trials "
        f"(x{report['capture_extra']['cpu_ratio']}), +{report['capture_extra']['peak_rss_kb']} kB RSS; "
        f"read+parse median {captured['read_and_parse_ms'].get('median')} ms, infer median "
        f"{captured['infer_ms'].get('median')} ms, {captured['packets_per_trial'].get('median')} packets, "
        f"open {captured['open_ms'].get('median')} ms, close {captured['close_ms_wall'].get('median')} ms (wall); "
        f"inference {captured['inference']}"
    )
    print(
        f"  trace kept: +{report['trace_extra']['cpu_s_per_1000_trials']:.2f} s CPU / 1,000 trials over the capture "
        f"(x{report['trace_extra']['cpu_ratio_to_capture']}), +{report['trace_extra']['peak_rss_kb']} kB RSS"
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
