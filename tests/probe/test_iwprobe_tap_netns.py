"""``iwprobe tap`` against the kernel, in two namespaces over a veth pair (root).

A web server nobody here wrote (Python's ``http.server``) in the server namespace, 120 client
addresses in 120 /24s in the client namespace.  Read independently of the agent (``ss -tie``
in the server namespace), every connection's mark and window at accept must be the arm the
study's keyed hash gives its prefix; the agent's records must name the same arms; a
``kill -9`` of the agent must stop the arms within the lease; ``disable`` must leave nothing.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from iwprobe_testkit import NetnsPair, wait_for_port
from testkit import stop_process

from iwprobe import wire
from iwprobe._tap_edge import Assignment, PrefixKeyer
from iwprobe._tap_rules import TapPlan

PORT = 8088
CLIENTS = 120
LEASE_S = 3.0
IWPROBE = [sys.executable, "-m", "iwprobe", "--log-level", "INFO", "tap"]
HOLD = """
import socket, sys, time
addresses, port, server, per = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
held = []
for address in addresses:
    for _ in range(per):
        s = socket.socket(); s.bind((address, 0)); s.connect((server, port)); held.append(s)
print("held", flush=True)
sys.stdin.readline()
for s in held:
    s.sendall(b"GET /object HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
for s in held:
    while s.recv(65536):
        pass
    s.close()
print("done", flush=True)
"""
#: Python's http.server, without the reverse lookup of its address in ``server_bind`` (no DNS
#: server is reachable from the namespace, and the lookup's timeouts delay the listen by ~10 s).
SERVE = """
import functools, http.server, socketserver, sys
class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 1024
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])
Server((sys.argv[1], int(sys.argv[2])), handler).serve_forever()
"""
CONNECT_ONE = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.connect((sys.argv[2], int(sys.argv[3])))
print(s.getsockname()[1], flush=True); time.sleep(float(sys.argv[4]))
"""


def _client_addresses(pair: NetnsPair) -> list[str]:
    addresses = [f"10.216.{index}.2" for index in range(1, CLIENTS + 1)]
    device = pair.run(pair.probe_ns, ["ip", "-o", "link", "show", "type", "veth"]).stdout.split(":")[1].strip()
    device = device.split("@")[0]
    batch = "\n".join(f"address add {address}/32 dev {device}" for address in addresses) + "\n"
    subprocess.run(["ip", "-n", pair.probe_ns, "-batch", "-"], input=batch, text=True, check=True)
    subprocess.run(["ip", "-n", pair.origin_ns, "route", "add", "10.216.0.0/16", "via", pair.probe_address], check=True)
    return addresses


def _sockets(pair: NetnsPair) -> list[tuple[str, int, int | None, int]]:
    """(client address, client port, mark or None, cwnd) of the server's established connections."""
    shown = pair.run(pair.origin_ns, ["ss", "-tieHn", "state", "established", f"( sport = :{PORT} )"]).stdout
    found = []
    for entry in re.split(r"\n(?=\S)", shown.strip()):
        peer = re.search(r"\s(10\.216\.\d+\.\d+):(\d+)\s", entry)
        cwnd = re.search(r"\bcwnd:(\d+)", entry)
        if peer and cwnd:
            mark = re.search(r"fwmark:(0x[0-9a-f]+)", entry)
            found.append((peer.group(1), int(peer.group(2)), int(mark.group(1), 16) if mark else None, int(cwnd.group(1))))
    return found


def _nft_table_exists(pair: NetnsPair) -> bool:
    return pair.run(pair.origin_ns, ["nft", "list", "table", "inet", "iwscope_tap"]).returncode == 0


def _tap_status(pair: NetnsPair, tmp_path: Path) -> dict[str, Any]:
    shown = pair.run(pair.origin_ns, [*IWPROBE, "status", "--json", "--state-dir", str(tmp_path / "state")])
    return dict(json.loads(shown.stdout)) if shown.returncode == 0 else {}


def _in_force(pair: NetnsPair, tmp_path: Path) -> bool:
    """The arms hold a lease (``tap status``: the nft set's element or the BPF lease map)."""
    return bool(_tap_status(pair, tmp_path).get("lease_remaining_s"))


def _wait(condition: Any, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - start


def _study(seed: int) -> wire.PassiveStudy:
    return wire.PassiveStudy(
        campaign_id=1,
        name="netns",
        ports=[PORT],
        prefix_v4=24,
        prefix_v6=48,
        arms=[wire.PassiveArm("default", 5000), wire.PassiveArm("3", 2500), wire.PassiveArm("32", 2500)],
        assignment_seed=seed,
        starts_at="",
        ends_at="",
        sample_share=1.0,
        flush_interval_s=1,
    )


@pytest.fixture()
def served(netns_pair: NetnsPair, tmp_path: Path) -> Any:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "object").write_bytes(secrets.token_bytes(30_000))
    addresses = _client_addresses(netns_pair)
    server = netns_pair.popen(
        netns_pair.origin_ns,
        [sys.executable, "-c", SERVE, netns_pair.origin_address, str(PORT), str(tmp_path / "www")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(netns_pair, netns_pair.probe_ns, netns_pair.origin_address, PORT)
        yield addresses
    finally:
        stop_process(server, timeout=5)


def _start_tap(pair: NetnsPair, tmp_path: Path, study: wire.PassiveStudy, method: str) -> subprocess.Popen[Any]:
    (tmp_path / "study.json").write_text(json.dumps(wire.to_dict(study)))
    with open(tmp_path / "tap.log", "ab") as log:
        process = pair.popen(
            pair.origin_ns,
            [
                *IWPROBE,
                "run",
                "--state-dir",
                str(tmp_path / "state"),
                "--study",
                str(tmp_path / "study.json"),
                "--output",
                str(tmp_path / "out.jsonl"),
                "--lease",
                str(LEASE_S),
                "--capture-start-share",
                "1",
                "--arms",
                method,
            ],
            stderr=log,
        )
    _wait(lambda: _in_force(pair, tmp_path), 15, "the arms")
    assert _tap_status(pair, tmp_path)["installed"]["method"] == method
    # The capture opens once the agent knows the server's packet rate (its first second).
    _wait(lambda: _status(tmp_path).get("capture_share") == 1.0, 15, "the capture")
    return process


def _status(tmp_path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((tmp_path / "state" / "tap-status.json").read_text()))
    except (OSError, ValueError):
        return {}


@pytest.mark.parametrize("method", ["nft", "bpf"])
def test_every_connection_starts_with_its_prefixs_arm_and_the_agent_records_it(
    netns_pair: NetnsPair, served: list[str], tmp_path: Path, method: str
) -> None:
    study = _study(secrets.randbits(32))
    plan = TapPlan.from_study(study)
    assignment = Assignment(study, plan.arms, 10)
    keyer = PrefixKeyer(bytes(32), 24, 48)
    expected = {address: assignment.arm_of(keyer.prefix(socket.inet_aton(address))) for address in served}
    tap = _start_tap(netns_pair, tmp_path, study, method)
    clients = netns_pair.popen(
        netns_pair.probe_ns,
        [sys.executable, "-c", HOLD, ",".join(served), str(PORT), netns_pair.origin_address, "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert clients.stdout is not None and clients.stdout.readline().strip() == "held"
        _wait(lambda: len(_sockets(netns_pair)) == 2 * CLIENTS, 10, "every connection accepted")
        seen = _sockets(netns_pair)
        by_arm: dict[str, int] = {}
        for address, _, mark, cwnd in seen:
            arm = expected[address]
            by_arm[arm.arm] = by_arm.get(arm.arm, 0) + 1
            # nft marks the treated arms' connections; the BPF program sets no mark
            assert mark == (plan.mark(arm) if arm.slot and method == "nft" else None), address
            assert cwnd == (arm.iw or 10), address  # the default arm: the kernel's IW 10 (no initcwnd here)
        # Shares: 120 prefixes, 2 connections each; each arm within 4 binomial sigmas of its share.
        for arm in plan.arms:
            share = arm.share_bp / wire.PASSIVE_SHARE_SCALE
            prefixes = by_arm.get(arm.arm, 0) / 2
            assert abs(prefixes - CLIENTS * share) <= 4 * (CLIENTS * share * (1 - share)) ** 0.5, (arm.arm, by_arm)
        assert clients.stdin is not None
        clients.stdin.write("go\n")
        clients.stdin.flush()
        assert clients.stdout.readline().strip() == "done"

        def records() -> list[dict[str, Any]]:
            path = tmp_path / "out.jsonl"
            if not path.exists():
                return []
            # Whole lines only: the agent may be writing the last one (a clean-clone run read half of it).
            return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line]

        _wait(
            lambda: sum(r["connections"] for r in records() if r["kind"] == "aggregate") >= 2 * CLIENTS,
            15,
            "the aggregates of every connection",
        )
    finally:
        stop_process(clients, timeout=5)
        for stream in (clients.stdin, clients.stdout):
            if stream is not None:
                stream.close()
        stop_process(tap, timeout=10)
    found = records()
    connections = [record for record in found if record["kind"] == "connection"]
    assert len(connections) == 2 * CLIENTS and sum(r["connections"] for r in found if r["kind"] == "aggregate") == 2 * CLIENTS
    arms_by_key: dict[tuple[str, int], str] = {}
    for address, port, _, _ in seen:
        arms_by_key[(expected[address].arm, port)] = expected[address].arm
    for record in connections:
        assert record["arm"] in {arm.arm for arm in plan.arms}
        assert record["captured"] and record["response_bytes"] and record["response_latency_us"] >= 0
        assert record["tcp_info"]["bytes_acked"] >= 30_000
    assert _status(tmp_path)["arms_method"] == method  # the status names how the arms were set
    recorded = sorted(record["arm"] for record in connections)
    assert recorded == sorted(expected[address].arm for address, _, _, _ in seen)
    # Stopped by SIGTERM: nothing of the arms is left, the sysctl is back.
    assert not _nft_table_exists(netns_pair) and not _in_force(netns_pair, tmp_path)
    rules = netns_pair.run(netns_pair.origin_ns, ["ip", "rule", "show"]).stdout
    assert "fwmark" not in rules, rules
    assert netns_pair.run(netns_pair.origin_ns, ["sysctl", "-n", "net.ipv4.tcp_fwmark_accept"]).stdout.strip() == "0"


def _cwnd_from(pair: NetnsPair, address: str) -> int:
    """The window at accept of one fresh connection from ``address``."""
    process = pair.popen(
        pair.probe_ns,
        [sys.executable, "-c", CONNECT_ONE, address, pair.origin_address, str(PORT), "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        for _ in range(100):
            for peer, peer_port, _, cwnd in _sockets(pair):
                if peer == address and peer_port == port:
                    return cwnd
            time.sleep(0.02)
        raise AssertionError(f"the connection from {address}:{port} was not seen")
    finally:
        stop_process(process, timeout=5)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.parametrize("method", ["nft", "bpf"])
def test_arms_lapse_within_the_lease_after_kill_9_and_disable_removes_everything(
    netns_pair: NetnsPair, served: list[str], tmp_path: Path, method: str
) -> None:
    study = _study(secrets.randbits(32))
    study.arms = [wire.PassiveArm("32", 10000)]  # every client treated: any address shows it
    address = served[0]
    tap = _start_tap(netns_pair, tmp_path, study, method)
    assert _cwnd_from(netns_pair, address) == 32
    tap.kill()
    tap.wait()
    killed = time.monotonic()
    while _cwnd_from(netns_pair, address) != 10:
        # nft: the kernel lets the lease element expire; bpf: the link dies with the agent's fds
        assert time.monotonic() - killed < (LEASE_S + 3 if method == "nft" else 1.0), "the arms outlived their agent"
    lapsed_s = time.monotonic() - killed
    print(f"{method} arms lapsed {lapsed_s:.2f} s after kill -9 (lease {LEASE_S} s)")
    if method == "nft":
        assert _nft_table_exists(netns_pair)  # inert until removed
    disabled = netns_pair.run(netns_pair.origin_ns, [*IWPROBE, "disable", "--state-dir", str(tmp_path / "state")])
    assert disabled.returncode == 0, disabled.stdout + disabled.stderr
    if method == "nft":
        assert "nft table inet iwscope_tap" in disabled.stdout, disabled.stdout
    assert not _nft_table_exists(netns_pair) and not (tmp_path / "state" / "tap-installed.json").exists()
    assert "fwmark" not in netns_pair.run(netns_pair.origin_ns, ["ip", "rule", "show"]).stdout
    assert "fwmark" not in netns_pair.run(netns_pair.origin_ns, ["ip", "-6", "rule", "show"]).stdout
    assert netns_pair.run(netns_pair.origin_ns, ["sysctl", "-n", "net.ipv4.tcp_fwmark_accept"]).stdout.strip() == "0"
    # Disabled sticks: a new agent installs nothing until enable.
    process = netns_pair.popen(
        netns_pair.origin_ns,
        [
            *IWPROBE,
            "run",
            "--state-dir",
            str(tmp_path / "state"),
            "--study",
            str(tmp_path / "study.json"),
            "--lease",
            str(LEASE_S),
            "--arms",
            method,
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(2.0)
        assert not _in_force(netns_pair, tmp_path)
        assert _cwnd_from(netns_pair, address) == 10
        enabled = netns_pair.run(netns_pair.origin_ns, [*IWPROBE, "enable", "--state-dir", str(tmp_path / "state")])
        assert enabled.returncode == 0
        _wait(lambda: _in_force(netns_pair, tmp_path), 10, "the arms after enable")
        assert _cwnd_from(netns_pair, address) == 32
        disabled_at = time.monotonic()
        disabled = netns_pair.run(netns_pair.origin_ns, [*IWPROBE, "disable", "--state-dir", str(tmp_path / "state")])
        assert disabled.returncode == 0
        if method == "bpf":
            # the lease ended through the map's id, before the agent even saw the marker
            assert "lease" in disabled.stdout, disabled.stdout
            assert _cwnd_from(netns_pair, address) == 10
            print(f"bpf arms off {time.monotonic() - disabled_at:.2f} s after disable")
        assert time.monotonic() - disabled_at < 5 and not _nft_table_exists(netns_pair)
        time.sleep(1.5)
        assert not _in_force(netns_pair, tmp_path)  # the running agent keeps them off
        assert _cwnd_from(netns_pair, address) == 10
    finally:
        stop_process(process, timeout=10)


#: In the server namespace: the BPF arms of a study (read from stdin), a dual-stack listener, and
#: per accepted connection its client address and the window ``TCP_INFO`` gives at accept.
BPF_SERVER = """
import json, socket, sys
from iwprobe import wire
from iwprobe._collector import from_dict
from iwprobe._tap_bpf import BpfArms
from iwprobe._tap_rules import TapPlan
from iwprobe._tcpinfo import parse_tcp_info
study = from_dict(wire.PassiveStudy, json.loads(sys.argv[1]))
arms = BpfArms()
arms.install(TapPlan.from_study(study, lease_s=60), sys.argv[2])
listener = socket.socket(socket.AF_INET6)
listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
listener.bind(("::", int(sys.argv[3])))
listener.listen(512)
print("ready", flush=True)
for _ in range(int(sys.argv[4])):
    connection, peer = listener.accept()
    info = parse_tcp_info(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256))
    print(peer[0], info["snd_cwnd"], flush=True)
    connection.close()
"""


def test_the_bpf_program_hashes_ipv6_prefixes_and_ipv4_mapped_clients_as_nftables_does(
    netns_pair: NetnsPair, tmp_path: Path
) -> None:
    """The program's own jhash of an IPv6 /48 and of an IPv4 client seen on a dual-stack socket
    (``::ffff:a.b.c.d``, hashed as its /24) gives the arm Python's jhash gives."""
    pair = netns_pair
    device = pair.run(pair.probe_ns, ["ip", "-o", "link", "show", "type", "veth"]).stdout.split(":")[1].strip().split("@")[0]
    origin_device = pair.run(pair.origin_ns, ["ip", "-o", "link", "show", "type", "veth"]).stdout.split(":")[1]
    origin_device = origin_device.strip().split("@")[0]
    v6 = [f"fd00:216:{index:x}::2" for index in range(1, 41)]
    v4 = [f"10.216.{index}.2" for index in range(1, 41)]
    commands = [f"address add fd00:213::2/64 dev {device} nodad"]
    commands += [f"address add {address}/128 dev {device} nodad" for address in v6]
    commands += [f"address add {address}/32 dev {device}" for address in v4]
    subprocess.run(["ip", "-n", pair.probe_ns, "-batch", "-"], input="\n".join(commands) + "\n", text=True, check=True)
    for command in (
        ["address", "add", "fd00:213::1/64", "dev", origin_device, "nodad"],
        ["-6", "route", "add", "fd00:216::/32", "via", "fd00:213::2"],
        ["route", "add", "10.216.0.0/16", "via", pair.probe_address],
    ):
        subprocess.run(["ip", "-n", pair.origin_ns, *command], check=True)
    study = _study(secrets.randbits(32))
    plan = TapPlan.from_study(study)
    assignment = Assignment(study, plan.arms, 10)
    keyer = PrefixKeyer(bytes(32), 24, 48)
    expected = {address: assignment.arm_of(keyer.prefix(socket.inet_pton(socket.AF_INET6, address))) for address in v6}
    expected.update({address: assignment.arm_of(keyer.prefix(socket.inet_aton(address))) for address in v4})
    server = pair.popen(
        pair.origin_ns,
        [sys.executable, "-c", BPF_SERVER, json.dumps(wire.to_dict(study)), str(tmp_path / "installed.json"), str(PORT), "80"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        connect = (
            "import socket, sys\n"
            "for address in sys.argv[1].split(','):\n"
            "    family = socket.AF_INET6 if ':' in address else socket.AF_INET\n"
            "    target = sys.argv[2] if family == socket.AF_INET6 else sys.argv[3]\n"
            "    s = socket.socket(family); s.bind((address, 0)); s.connect((target, int(sys.argv[4]))); s.recv(1)\n"
        )
        pair.run(pair.probe_ns, [sys.executable, "-c", connect, ",".join(v6 + v4), "fd00:213::1", pair.origin_address, str(PORT)])
        seen = dict(line.split() for line in server.stdout.read().splitlines())
    finally:
        stop_process(server, timeout=5)
        if server.stdout is not None:
            server.stdout.close()
    assert len(seen) == 80
    arms = {arm.arm for arm in expected.values()}
    assert {"default", "3", "32"} <= arms  # every arm met, both families
    for address, arm in expected.items():
        shown = address if ":" in address else f"::ffff:{address}"
        assert int(seen[shown]) == (arm.iw or 10), (address, arm.arm)
