"""What ``iwprobe tap`` costs the web server it measures (the real-users work): requests/s with and without it.

Two namespaces over a veth pair (no link emulator: nginx, not a user-space emulator, must be
the bottleneck).  Debian's nginx (one worker, pinned to CPU 0, ``sendfile``, no access log)
serves a ``--size`` (10 KB) file in the server namespace; ``wrk`` (Debian's, one thread pinned to
CPU 1, ``--connections`` 50) loads it from the client namespace (the pinning narrows the blocks'
spread on this 2-core box; the agent may run on either CPU) for blocks of ``--block-s`` seconds.  Blocks alternate between the
agent off and on (``off, on`` then ``on, off``, ``--pairs`` times), so both see the same machine;
the agent runs a study that treats *every* client (IW 32: every SYN marked, every connection
policy-routed) with its capture on (``--no-capture``: destroy notifications only) and its
default budgets (the capture in windows above 1,000 server packets/s, 50 measured closes/s;
``--agent-args`` to measure others).
Three loads:

* ``keepalive``: wrk's default (HTTP/1.1 keep-alive: 50 connections, millions of requests);
* ``keepalive100``: a new connection every 100 requests (nginx's ``keepalive_requests 100``,
  its default before 1.19.10): ~500 connections/s;
* ``close``: ``Connection: close``, a new TCP connection per request (~19,000/s) -- the
  agent's worst case (a destroy notification, an arm lookup and a followed handshake per
  request; above its budget the agent listens part of each second, :mod:`iwprobe._tap_budget`).

Every block follows ``--warmup-s`` (5) seconds of the same load, and an "on" block's agent starts
before them: what is measured is the agent's steady state on a busy server (its budgets adapt
within seconds), not its first seconds.  The agent runs
at ``--nice`` 10, as its systemd unit does: under saturation the web server goes first, and what
the agent then misses is counted (``tap_notifications_lost``: kernel buffer overruns), never traffic.

``--component none`` switches nothing on in either block (an A/A test: the bench's own noise);
``--rate N`` replaces wrk at saturation by h2load at a fixed N connections/s and compares CPU 0's
time per request instead (``--steer`` puts the server's receive work on CPU 0 too).

Reported per load: requests/s of every block, the ratio within each pair of adjacent blocks (the
box drifts by +-10 % over minutes; neighbours share the drift), their geometric mean with a
bootstrap 95 % interval, the ratio of the medians (on / off), wrk's errors
(connect, read, write, timeout, non-2xx: 0 expected), the agent's CPU (``/proc/<pid>/stat``)
per 10,000 connections it saw (its own count, ``tap-status.json``), nginx's CPU per block, and
the load average.  Run as root: ``.venv/bin/python bench/bench_tap.py``; writes
``bench/results/tap-cost-<date>[-<n>].json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PORT = 8080
TICKS = os.sysconf("SC_CLK_TCK")
#: Every client treated (IW 32): every SYN marked, every connection policy-routed.
STUDY = {
    "campaign_id": 1,
    "name": "bench",
    "arms": [{"arm": "32", "share_bp": 10000}],
    "ports": [PORT],
    "prefix_v4": 24,
    "prefix_v6": 48,
    "assignment_seed": 1,
    "starts_at": "",
    "ends_at": "",
    "sample_share": 0.0,
    "flush_interval_s": 5,
}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / TICKS


def _cpu0_busy_s() -> float:
    """CPU 0's busy seconds (user, nice, system, irq, softirq) since boot."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu0 "):
            fields = [int(value) for value in line.split()[1:]]
            return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / TICKS
    raise RuntimeError("no cpu0 in /proc/stat")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return found


class Bench:
    def __init__(self, work: Path, size: int, steer: bool = False) -> None:
        suffix = secrets.token_hex(2)
        self.server, self.client = f"iwb{suffix}s", f"iwb{suffix}c"
        self.work = work
        self.server_address, self.client_address = "10.219.7.1", "10.219.7.2"
        _ip("netns", "add", self.server)
        _ip("netns", "add", self.client)
        _ip("link", "add", f"iwb{suffix}a", "type", "veth", "peer", "name", f"iwb{suffix}b")
        for namespace, device, address in (
            (self.server, f"iwb{suffix}a", self.server_address),
            (self.client, f"iwb{suffix}b", self.client_address),
        ):
            _ip("link", "set", device, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", device)
            _ip("-n", namespace, "link", "set", device, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip(
                "-n",
                namespace,
                "route",
                "add",
                "default",
                "via",
                self.client_address if namespace == self.server else self.server_address,
            )
        subprocess.run(
            ["ip", "netns", "exec", self.client, "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535"], check=True
        )
        if steer:
            # A veth delivers a packet on the *sender's* CPU: without steering, the server's
            # receive work (TCP, nftables, routing) runs on wrk's CPU.  RPS puts each side's
            # receive work on its own CPU (the server's on nginx's CPU 0), as on a real server.
            for namespace, device, cpus in ((self.server, f"iwb{suffix}a", "1"), (self.client, f"iwb{suffix}b", "2")):
                subprocess.run(
                    ["ip", "netns", "exec", namespace, "sh", "-c", f"echo {cpus} > /sys/class/net/{device}/queues/rx-0/rps_cpus"],
                    check=True,
                )
        # Connection: close leaves a TIME_WAIT socket per request on the server; tens of
        # thousands of them slowed later blocks by a quarter whatever the agent did.  A small
        # table keeps every block on the same footing.
        subprocess.run(["ip", "netns", "exec", self.server, "sysctl", "-qw", "net.ipv4.tcp_max_tw_buckets=4096"], check=True)
        (work / "www").mkdir(parents=True, exist_ok=True)
        (work / "www" / "object").write_bytes(secrets.token_bytes(size))
        for path in (work, work / "www", work / "www" / "object"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        (work / "nginx.conf").write_text(f"""
daemon off;
worker_processes 1;
worker_cpu_affinity 01;
pid {work}/nginx.pid;
error_log {work}/error.log;
user www-data;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    sendfile on;
    keepalive_requests 1000000;
    client_body_temp_path {work}/tmp;
    server {{
        listen {self.server_address}:{PORT}; root {work}/www;
        # nginx's own default before 1.19.10: a new connection every 100 requests.
        location /k100/ {{ alias {work}/www/; keepalive_requests 100; }}
    }}
}}
""")
        self.nginx = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.server,
                shutil.which("nginx") or "/usr/sbin/nginx",
                "-p",
                f"{work}/",
                "-c",
                str(work / "nginx.conf"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
        self.tap: subprocess.Popen[bytes] | None = None
        #: Extra ``iwprobe tap run`` options (``--agent-args``), e.g. other budgets.
        self.agent_args: list[str] = []
        #: Run the agent on the server's CPU 0 (``--rate``: all its CPU is charged to the server).
        self.pin_agent = False

    def nginx_cpu_s(self) -> float:
        return sum(_cpu_s(pid) for pid in [self.nginx.pid, *self._nginx_pids()])

    def _nginx_pids(self) -> list[int]:
        pids = []
        for child in _children(self.nginx.pid):  # ip netns exec -> nginx master -> worker
            pids += [child, *_children(child)]
        return pids

    def start_tap(self, capture: bool, nice: int = 10) -> None:
        (self.work / "study.json").write_text(json.dumps(STUDY))
        command = [
            "ip",
            "netns",
            "exec",
            self.server,
            *(["taskset", "-c", "0"] if self.pin_agent else []),
            "nice",
            "-n",
            str(nice),
            sys.executable,
            "-m",
            "iwprobe",
            "--log-level",
            "WARNING",
            "tap",
            "run",
            "--state-dir",
            str(self.work / "state"),
            "--study",
            str(self.work / "study.json"),
        ]
        with open(self.work / "tap.log", "ab") as log:
            self.tap = subprocess.Popen(command + ([] if capture else ["--no-capture"]) + self.agent_args, stderr=log)
        deadline = time.monotonic() + 15
        while not self._arms_installed():
            if time.monotonic() > deadline:
                raise RuntimeError("the tap did not install its arms: " + (self.work / "tap.log").read_text()[-2000:])
            time.sleep(0.1)
        time.sleep(0.5)

    def _arms_installed(self) -> bool:
        """The agent's arms hold a lease (``tap status``: nftables or BPF alike)."""
        shown = subprocess.run(
            ["ip", "netns", "exec", self.server, sys.executable, "-m", "iwprobe", "tap", "status", "--json"]
            + ["--state-dir", str(self.work / "state")],
            capture_output=True,
            text=True,
        )
        return shown.returncode == 0 and bool(json.loads(shown.stdout).get("lease_remaining_s"))

    def install_arms(self, install: bool) -> None:
        """The study's arms alone (``--component arms``): installed with a long lease, no agent."""
        record = self.work / "arms-only" / "tap-installed.json"
        code = (
            f"import json\nfrom iwprobe import wire\nfrom iwprobe._collector import from_dict\n"
            f"from iwprobe._tap_rules import TapPlan, install\n"
            f"install(TapPlan.from_study(from_dict(wire.PassiveStudy, json.loads({json.dumps(json.dumps(STUDY))})),"
            f" lease_s=3600), {str(record)!r})"
            if install
            else f"from iwprobe._tap_rules import remove\nremove({str(record)!r})"
        )
        subprocess.run(["ip", "netns", "exec", self.server, sys.executable, "-c", code], check=True)

    def tap_pid(self) -> int:
        assert self.tap is not None
        children = _children(self.tap.pid)
        return children[0] if children else self.tap.pid

    def stop_tap(self) -> dict[str, Any]:
        assert self.tap is not None
        self.tap.send_signal(signal.SIGTERM)
        self.tap.wait(timeout=30)
        self.tap = None
        return dict(json.loads((self.work / "state" / "tap-status.json").read_text()))

    def wrk(self, seconds: float, connections: int, load: str) -> dict[str, Any]:
        path = "/k100/object" if load == "keepalive100" else "/object"
        command = [
            "ip",
            "netns",
            "exec",
            self.client,
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds:g}s",
            *(["-H", "Connection: close"] if load == "close" else []),
            f"http://{self.server_address}:{PORT}{path}",
        ]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
        requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
        errors = {kind: int(count) for kind, count in re.findall(r"(connect|read|write|timeout) (\d+)", output)}
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
        errors["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
        return {"rps": rps, "requests": requests, "errors": errors}

    def fixed_rate(self, seconds: float, rate_per_s: int, load: str) -> dict[str, Any]:
        """``--rate``: h2load opens ``rate_per_s`` connections a second (one request each) for
        ``seconds``; the server's CPU (CPU 0: nginx, its receive work with ``--steer``, and the
        agent, pinned there too) per request is the cost, free of the saturation's noise."""
        total = int(rate_per_s * seconds)
        period_s = 0.01
        command = [
            "ip", "netns", "exec", self.client, "taskset", "-c", "1", "h2load", "--h1",
            "-n", str(total), "-c", str(total),
            "-r", str(max(1, round(rate_per_s * period_s))), "--rate-period", f"{round(period_s * 1000)}ms",
            f"http://{self.server_address}:{PORT}{'/k100/object' if load == 'keepalive100' else '/object'}",
        ]  # fmt: skip
        busy0 = _cpu0_busy_s()
        started = time.monotonic()
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        elapsed = time.monotonic() - started
        busy = _cpu0_busy_s() - busy0
        done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", output)
        assert done is not None, output[-2000:]
        requests, succeeded = int(done.group(1)), int(done.group(2))
        return {
            "rps": requests / elapsed,
            "requests": requests,
            "errors": {"failed": requests - succeeded},
            "cpu0_busy_s": round(busy, 3),
            "cpu0_us_per_request": round(1e6 * busy / max(1, requests), 2),
        }

    def close(self) -> None:
        if self.tap is not None:
            self.stop_tap()
        self.nginx.send_signal(signal.SIGQUIT)
        try:
            self.nginx.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.nginx.kill()
        for namespace in (self.server, self.client):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(value) for value in values))


def _bootstrap_ci(values: list[float], draws: int = 10_000) -> list[float]:
    rng = random.Random(33)
    means = sorted(_geomean(rng.choices(values, k=len(values))) for _ in range(draws))
    return [round(means[int(0.025 * draws)], 4), round(means[int(0.975 * draws) - 1], 4)]


def run(bench: Bench, load: str, args: argparse.Namespace) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []

    def drive(seconds: float) -> dict[str, Any]:
        return bench.fixed_rate(seconds, args.rate, load) if args.rate else bench.wrk(seconds, args.connections, load)

    for pair in range(args.pairs):
        for state in ("off", "on") if pair % 2 == 0 else ("on", "off"):
            if state == "on" and args.component == "arms":
                bench.install_arms(True)
                time.sleep(1.0)
            elif state == "on" and args.component == "agent":
                bench.start_tap(args.capture, args.nice)
            # Both states warm up under the same load: the agent starts on a server already busy
            # (as it would in production) and what is measured is its steady state there, not its
            # first seconds (the capture's first window, the budgets' first estimates).
            drive(args.warmup_s)
            if state == "on" and args.component == "agent":
                tap_cpu0 = _cpu_s(bench.tap_pid())
            nginx_cpu0 = bench.nginx_cpu_s()
            load0 = os.getloadavg()[0]
            result = drive(args.block_s)
            result.update(state=state, nginx_cpu_s=round(bench.nginx_cpu_s() - nginx_cpu0, 2), load=round(load0, 2))
            if state == "on" and args.component == "arms":
                bench.install_arms(False)
            elif state == "on" and args.component == "agent":
                result["tap_cpu_s"] = round(_cpu_s(bench.tap_pid()) - tap_cpu0, 2)
                status = bench.stop_tap()
                result["tap_connections_seen"] = status["connections_seen"]
                if load == "close":  # a request = a connection: what the agent missed (blocks' edges aside)
                    result["tap_connections_missed"] = max(0, result["requests"] - status["connections_seen"])
                result["tap_connections_captured"] = status["connections_captured"]
                result["tap_notifications_lost"] = status["notifications_lost"]
                result["tap_capture_share"] = status["capture_share"]
                result["tap_closes_share"] = status.get("closes_share", 1.0)
                result["tap_unmeasured"] = status.get("unmeasured", 0)
            blocks.append(result)
            print(
                f"  {load} {state}: {result['rps']:,.0f} req/s errors {result['errors']} "
                + (
                    f"tap {result['tap_cpu_s']} s CPU, {result['tap_connections_seen']} connections"
                    if "tap_cpu_s" in result
                    else ""
                ),
                flush=True,
            )
    off = [block["rps"] for block in blocks if block["state"] == "off"]
    on = [block["rps"] for block in blocks if block["state"] == "on"]
    # The box drifts by +-10 % over minutes; adjacent blocks share the drift: the ratio within
    # each pair, their geometric mean and a bootstrap 95 % interval over the pairs.
    # With --rate the ratio is of the requests/s CPU 0 could serve: the inverse of its CPU per
    # request (the load is fixed, so requests/s says nothing); both ratios on the same basis.
    served_off, served_on = off, on
    if args.rate:
        served_off = [1e6 / block["cpu0_us_per_request"] for block in blocks if block["state"] == "off"]
        served_on = [1e6 / block["cpu0_us_per_request"] for block in blocks if block["state"] == "on"]
    pair_ratios = [served_on[index] / served_off[index] for index in range(len(served_on))]
    on_blocks = [block for block in blocks if block["state"] == "on" and "tap_cpu_s" in block]
    seen = sum(block["tap_connections_seen"] for block in on_blocks)
    return {
        "load": load,
        "blocks": blocks,
        "rps_off": off,
        "rps_on": on,
        "notifications_lost": sum(block["tap_notifications_lost"] for block in on_blocks),
        "ratio_of": "requests/s CPU 0 could serve (1 / CPU per request)" if args.rate else "requests/s",
        "ratio_of_medians": round(statistics.median(served_on) / statistics.median(served_off), 4),
        "pair_ratios": [round(ratio, 4) for ratio in pair_ratios],
        "pair_ratio_geomean": round(_geomean(pair_ratios), 4),
        "pair_ratio_ci95": _bootstrap_ci(pair_ratios),
        # The spread of one pair's log ratio: the noise a pair carries (``--component none``
        # measures it with nothing switched on).
        "pair_log_ratio_sd": round(statistics.stdev(math.log(ratio) for ratio in pair_ratios), 4)
        if len(pair_ratios) > 1
        else None,
        "errors": sum(sum(block["errors"].values()) for block in blocks),
        "tap_cpu_s_per_10k_connections": round(10_000 * sum(block["tap_cpu_s"] for block in on_blocks) / seen, 3)
        if seen
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-s", type=float, default=8.0)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--loads", default="keepalive,keepalive100,close")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="seconds the agent runs before a block")
    parser.add_argument("--nice", type=int, default=10, help="the agent's niceness (the systemd unit's Nice=10)")
    parser.add_argument("--no-capture", dest="capture", action="store_false")
    parser.add_argument("--agent-args", default="", help="extra `iwprobe tap run` options, e.g. '--closes-per-s 250'")
    parser.add_argument(
        "--component",
        choices=("agent", "arms", "none"),
        default="agent",
        help="arms: the study's nftables rule, ip rules and sysctl alone, no agent process; "
        "none: nothing in the 'on' blocks either (the bench's own noise: what a cost of 0 looks like)",
    )
    parser.add_argument(
        "--rate",
        type=int,
        default=0,
        help="connections/s at a fixed rate (h2load, one request each) instead of wrk at saturation: "
        "the ratio is then of CPU 0's time per request (nginx, its receive work with --steer, the agent pinned there)",
    )
    parser.add_argument(
        "--steer",
        action="store_true",
        help="RPS: each namespace's receive work on its own CPU (the server's on nginx's CPU 0)",
    )
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (namespaces, nftables)")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="iwscope-tap-bench-") as temporary:
        work = Path(temporary)
        work.chmod(0o755)
        bench = Bench(work, args.size, steer=args.steer)
        bench.agent_args = args.agent_args.split()
        bench.pin_agent = bool(args.rate)
        if args.rate:  # h2load closes first: its TIME_WAIT ports are reused, or they run out
            subprocess.run(["ip", "netns", "exec", bench.client, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"], check=True)
        try:
            results = [run(bench, load, args) for load in args.loads.split(",")]
        finally:
            bench.close()
    report = {
        "bench": "tap-cost",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "component": args.component,
        "steer": args.steer,
        "rate": args.rate,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=RESULTS.parent).stdout.strip(),
        "agent_args": args.agent_args,
        "capture": args.capture,
        "nice": args.nice,
        "warmup_s": args.warmup_s,
        "block_s": args.block_s,
        "pairs": args.pairs,
        "connections": args.connections,
        "size": args.size,
        "loadavg_end": os.getloadavg(),
        "results": results,
    }
    for result in results:
        print(
            f"{result['load']}: on/off pairs {result['pair_ratio_geomean']:.3f} {result['pair_ratio_ci95']}, "
            f"medians {result['ratio_of_medians']:.3f} (off {result['rps_off']}, on "
            f"{result['rps_on']}), errors {result['errors']}, tap CPU {result['tap_cpu_s_per_10k_connections']} s "
            f"per 10,000 connections"
        )
    RESULTS.mkdir(exist_ok=True)
    stem = f"tap-cost{('-' + args.tag) if args.tag else ''}-{time.strftime('%Y%m%d')}"
    path = RESULTS / f"{stem}.json"
    index = 2
    while path.exists():
        path = RESULTS / f"{stem}-{index}.json"
        index += 1
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
