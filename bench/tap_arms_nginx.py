"""Arms on stock nginx, read independently of the agent (the real-users work's first must-show).

The ``passive`` scenario (220 user addresses, each in its own /24, behind six regional links)
with Debian's nginx on its ``server`` host and ``iwprobe tap`` beside it (standalone, a study
file: ``default`` 90 %, IW 16 5 %, IW 32 5 %, a random seed).  Then:

1. **Arms at accept.** Every user address opens ``--per-address`` connections (alternately to
   nginx's HTTP and HTTPS ports) and holds them; ``ss -tie`` in the server's namespace gives
   each connection's ``cwnd`` and mark at accept.  Each must equal its prefix's arm (the
   kernel's ``jhash`` recomputed here with the study's seed; the default arm is the kernel's
   IW 10).  A connection whose SYN or SYN-ACK was retransmitted starts at 1 (RFC 6298) and is
   counted apart (``ss`` shows its retransmission).  The arms' shares of prefixes are compared
   with the configured ones (binomial standard errors).
2. **kill -9 and disable.** The agent is killed; a fresh connection from a treated prefix is
   opened every 0.2 s until its window is the default one: the time the arms outlived the
   agent (bounded by the lease, ``--lease``).  Then ``iwprobe tap cleanup``; the agent is
   started again and ``iwprobe tap disable`` is timed the same way.
3. **No failed request while arms come and go.** With a study treating every prefix (IW 32),
   ``wrk`` (HTTP/1.1, ``Connection: close``: every request a new connection) and then ``h2load``
   (HTTP/2 over TLS) load nginx from a user host while the arms are removed and installed
   again every ``--churn-s`` seconds (``disable`` / ``enable``); both report their failures.

Run as root: ``.venv/bin/python bench/tap_arms_nginx.py``; writes
``bench/results/tap-arms-nginx-<date>[-<n>].json``.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from iwprobe import wire
from iwprobe._tap_edge import Assignment, PrefixKeyer
from iwprobe._tap_rules import TapPlan
from iwscope_lab.topology import Topology
from iwscope_lab.webserver import NginxOptions, start_nginx

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_IW = 10
#: One thread per address (connects of all addresses at once: nginx closes a connection that sends
#: no request within 60 s, and 1,100 connects in a row over a 1.2 s path would take longer).
HOLD = """
import socket, sys, threading
addresses, server, ports, per = sys.argv[1].split(","), sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
held, lock = [], threading.Lock()
def connect(address):
    for index in range(per):
        s = socket.socket(); s.settimeout(30); s.bind((address, 0))
        try:
            s.connect((server, int(ports[index % len(ports)])))
            with lock:
                held.append(s)
        except OSError as error:
            print("failed", address, error, flush=True)
threads = [threading.Thread(target=connect, args=(address,)) for address in addresses]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("held", len(held), flush=True)
sys.stdin.readline()
"""
ONE = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.connect((sys.argv[2], int(sys.argv[3])))
print(s.getsockname()[1], flush=True); time.sleep(2)
"""


def _study(arms: list[tuple[str, int]], ports: list[int], seed: int) -> wire.PassiveStudy:
    return wire.PassiveStudy(
        campaign_id=1,
        name="arms check",
        arms=[wire.PassiveArm(a, s) for a, s in arms],
        ports=ports,
        prefix_v4=24,
        prefix_v6=48,
        assignment_seed=seed,
        starts_at="",
        ends_at="",
        sample_share=0.0,
        flush_interval_s=30,
    )


class Check:
    def __init__(self, topology: Topology, work: Path, lease_s: float, arms: str) -> None:
        self.topology = topology
        self.work = work
        self.lease_s = lease_s
        self.arms = arms
        self.web = start_nginx(topology, "server", options=NginxOptions(access_log=False, keepalive_timeout_s=120))
        self.ports = [self.web.http_port, self.web.https_port]
        self.tap: subprocess.Popen[bytes] | None = None

    def tap_command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "iwprobe", "--log-level", "WARNING", "tap", *args, "--state-dir", str(self.work / "state")]

    def start_tap(self, study: wire.PassiveStudy) -> None:
        (self.work / "study.json").write_text(json.dumps(wire.to_dict(study)))
        with open(self.work / "tap.log", "ab") as log:
            self.tap = self.topology.popen(
                "server",
                self.tap_command(
                    "run", "--study", str(self.work / "study.json"), "--lease", f"{self.lease_s:g}", "--arms", self.arms
                ),
                stderr=log,
            )
        self.wait(lambda: self.installed(), 20, "arms")

    def installed(self) -> bool:
        """The arms hold a lease (``tap status``: nftables or BPF alike)."""
        shown = self.topology.run("server", self.tap_command("status", "--json"), capture_output=True, text=True)
        return shown.returncode == 0 and bool(json.loads(shown.stdout).get("lease_remaining_s"))

    @staticmethod
    def wait(condition: Any, timeout_s: float, what: str) -> float:
        start = time.monotonic()
        while not condition():
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"waiting for {what}")
            time.sleep(0.05)
        return time.monotonic() - start

    def sockets(self) -> list[dict[str, Any]]:
        ports = " or ".join(f"sport = :{port}" for port in self.ports)
        shown = self.topology.run(
            "server", ["ss", "-tieHn", "state", "established", f"( {ports} )"], capture_output=True, text=True
        ).stdout
        found = []
        for entry in re.split(r"\n(?=\S)", shown.strip()):
            # Recv-Q, Send-Q, the local address:port, the peer's.
            peer = re.match(r"\s*\d+\s+\d+\s+\S+:\d+\s+(\d+\.\d+\.\d+\.\d+):(\d+)\s", entry)
            cwnd = re.search(r"\bcwnd:(\d+)", entry)
            if not peer or not cwnd:
                continue
            mark = re.search(r"fwmark:(0x[0-9a-f]+)", entry)
            retrans = re.search(r"\bretrans:\d+/(\d+)", entry)
            found.append(
                {
                    "address": peer.group(1),
                    "port": int(peer.group(2)),
                    "cwnd": int(cwnd.group(1)),
                    "mark": int(mark.group(1), 16) if mark else 0,
                    "retrans": int(retrans.group(1)) if retrans else 0,
                }
            )
        return found

    def fresh_cwnd(self, host: str, address: str) -> int:
        process = self.topology.popen(
            host, [sys.executable, "-c", ONE, address, self.web.address, str(self.ports[0])], stdout=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None
            port = int(process.stdout.readline())
            for _ in range(100):
                for entry in self.sockets():
                    if entry["address"] == address and entry["port"] == port:
                        return int(entry["cwnd"])
                time.sleep(0.02)
            raise RuntimeError(f"connection from {address}:{port} not seen")
        finally:
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()

    def stop_tap(self, signum: int = signal.SIGTERM) -> None:
        if self.tap is not None and self.tap.poll() is None:
            self.tap.send_signal(signum)
            self.tap.wait(timeout=30)
        self.tap = None


def arms_at_accept(check: Check, per_address: int, seed: int) -> dict[str, Any]:
    study = _study([("default", 9000), ("16", 500), ("32", 500)], check.ports, seed)
    plan = TapPlan.from_study(study)
    assignment = Assignment(study, plan.arms, DEFAULT_IW)
    keyer = PrefixKeyer(bytes(32), 24, 48)
    check.start_tap(study)
    holders = []
    users = {host.name: host.user_addresses for host in check.topology.hosts_by_role("users")}
    expected = {
        address: assignment.arm_of(keyer.prefix(socket.inet_aton(address)))
        for addresses in users.values()
        for address in addresses
    }
    for host, addresses in users.items():
        holders.append(
            check.topology.popen(
                host,
                [
                    sys.executable,
                    "-c",
                    HOLD,
                    ",".join(addresses),
                    check.web.address,
                    ",".join(map(str, check.ports)),
                    str(per_address),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    failed_connects = 0
    for holder in holders:
        assert holder.stdout is not None
        for line in holder.stdout:
            if line.startswith("held"):
                break
            failed_connects += 1
    time.sleep(1.0)
    seen = [entry for entry in check.sockets() if entry["address"] in expected]
    outcome: dict[str, Any] = {
        "connections": len(seen),
        "addresses": len({e["address"] for e in seen}),
        "failed_connects": failed_connects,
        "equal": 0,
        "syn_retransmitted": 0,
        "different": [],
        "per_arm": {},
    }
    for entry in seen:
        arm = expected[entry["address"]]
        want = arm.iw or DEFAULT_IW
        mark_ok = entry["mark"] == (plan.mark(arm) if arm.slot and check.arms == "nft" else 0)  # bpf sets no mark
        if entry["cwnd"] == want and mark_ok:
            outcome["equal"] += 1
        elif entry["retrans"] and entry["cwnd"] == 1:
            outcome["syn_retransmitted"] += 1
        else:
            outcome["different"].append({**entry, "arm": arm.arm})
        per = outcome["per_arm"].setdefault(arm.arm, {"connections": 0, "prefixes": set()})
        per["connections"] += 1
        per["prefixes"].add(entry["address"])
    prefixes = len(expected)
    for arm in plan.arms:
        per = outcome["per_arm"].setdefault(arm.arm, {"connections": 0, "prefixes": set()})
        share = arm.share_bp / wire.PASSIVE_SHARE_SCALE
        count = len(per.pop("prefixes"))
        sigma = (prefixes * share * (1 - share)) ** 0.5
        per.update(
            prefixes=count,
            expected=round(prefixes * share, 1),
            sigma=round(sigma, 2),
            z=round((count - prefixes * share) / sigma, 2) if sigma else 0.0,
        )
    for holder in holders:
        holder.kill()
        holder.wait()
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()
    outcome["treated_address"] = next(address for address, arm in expected.items() if arm.arm == "32")
    outcome["treated_host"] = next(host for host, addresses in users.items() if outcome["treated_address"] in addresses)
    return outcome


def restore_times(check: Check, host: str, address: str) -> dict[str, Any]:
    assert check.fresh_cwnd(host, address) == 32
    check.stop_tap(signal.SIGKILL)
    killed = time.monotonic()
    while check.fresh_cwnd(host, address) != DEFAULT_IW:
        time.sleep(0.2)
    after_kill = time.monotonic() - killed
    cleanup = check.topology.run("server", check.tap_command("cleanup"), capture_output=True, text=True)
    study = json.loads((check.work / "study.json").read_text())
    check.start_tap(wire.PassiveStudy(**{**study, "arms": [wire.PassiveArm(**arm) for arm in study["arms"]]}))
    assert check.fresh_cwnd(host, address) == 32
    started = time.monotonic()
    disabled = check.topology.run("server", check.tap_command("disable"), capture_output=True, text=True)
    cwnd = check.fresh_cwnd(host, address)
    after_disable = time.monotonic() - started
    check.topology.run("server", check.tap_command("enable"), capture_output=True)
    check.stop_tap()
    return {
        "lease_s": check.lease_s,
        "default_after_kill_9_s": round(after_kill, 2),
        "cleanup": cleanup.stdout.strip(),
        "disable": disabled.stdout.strip(),
        "default_after_disable_s": round(after_disable, 2),
        "cwnd_after_disable": cwnd,
    }


def churn(check: Check, seconds: float, churn_s: float, seed: int) -> dict[str, Any]:
    check.start_tap(_study([("32", 10000)], check.ports, seed))
    host = check.topology.hosts_by_role("users")[0].name
    stop = threading.Event()
    cycles = [0]

    def toggle() -> None:
        while not stop.wait(churn_s):
            check.topology.run("server", check.tap_command("disable"), capture_output=True)
            if stop.wait(churn_s):
                break
            check.topology.run("server", check.tap_command("enable"), capture_output=True)
            cycles[0] += 1

    thread = threading.Thread(target=toggle, daemon=True)
    thread.start()
    loads: dict[str, Any] = {}
    try:
        wrk = check.topology.run(
            host,
            [
                "wrk",
                "-t1",
                "-c20",
                f"-d{seconds:g}s",
                "-H",
                "Connection: close",
                check.web.url("h1", "/" + next(iter(check.web.site.objects)).lstrip("/")),
            ],
            capture_output=True,
            text=True,
        )
        loads["wrk"] = {
            "output": wrk.stdout.strip().splitlines()[-6:],
            "requests": int(re.search(r"(\d+) requests in", wrk.stdout).group(1)),  # type: ignore[union-attr]
            "errors": sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", wrk.stdout))
            + int((re.search(r"Non-2xx or 3xx responses: (\d+)", wrk.stdout) or [0, 0])[1]),
        }
        h2 = check.topology.run(
            host,
            [
                "h2load",
                "-D",
                f"{seconds:g}",
                "-c",
                "20",
                "-m",
                "4",
                check.web.url("h2", "/" + next(iter(check.web.site.objects)).lstrip("/")),
            ],
            capture_output=True,
            text=True,
        )
        requests = re.search(
            r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
            r"(\d+) errored, (\d+) timeout",
            h2.stdout,
        )
        loads["h2load"] = {
            "line": requests.group(0) if requests else h2.stdout[-500:],
            "succeeded": int(requests.group(4)) if requests else 0,
            "errors": sum(int(requests.group(i)) for i in (5, 6, 7)) if requests else -1,
        }
    finally:
        stop.set()
        thread.join()
        check.topology.run("server", check.tap_command("enable"), capture_output=True)
        check.stop_tap()
    loads["arm_cycles"] = cycles[0]
    return loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-address", type=int, default=5)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--churn-s", type=float, default=2.0)
    parser.add_argument("--load-s", type=float, default=30.0)
    parser.add_argument("--arms", choices=("nft", "bpf"), default="nft", help="the agent's --arms method")
    args = parser.parse_args()
    seed = secrets.randbits(32)
    report: dict[str, Any] = {
        "bench": "tap-arms-nginx",
        "arms": args.arms,
        "seed": seed,
        "measured_at": wire.utc_timestamp(),
    }
    with Topology.from_scenario("passive") as topology:
        work = topology.state_dir / "arms-check"
        work.mkdir(parents=True, exist_ok=True)
        check = Check(topology, work, args.lease, args.arms)
        try:
            report["arms_at_accept"] = accept = arms_at_accept(check, args.per_address, seed)
            print(json.dumps({k: v for k, v in accept.items() if k != "different"}, indent=1), flush=True)
            report["restore"] = restore_times(check, accept["treated_host"], accept["treated_address"])
            print(json.dumps(report["restore"], indent=1), flush=True)
            report["churn"] = churn(check, args.load_s, args.churn_s, seed)
            print(json.dumps(report["churn"], indent=1), flush=True)
        finally:
            check.stop_tap()
            check.web.stop()
    RESULTS.mkdir(exist_ok=True)
    stem = f"tap-arms-nginx{'-bpf' if args.arms == 'bpf' else ''}-{time.strftime('%Y%m%d')}"
    path = RESULTS / f"{stem}.json"
    index = 2
    while path.exists():
        path = RESULTS / f"{stem}-{index}.json"
        index += 1
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
