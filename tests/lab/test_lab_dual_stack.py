"""Dual-stack lab runs: every host gets an IPv6 ULA address next to its IPv4 one, and the
emulated link (delay, rate) and the route metrics apply to IPv6 traffic as they do to IPv4.

Real namespaces, TUN links and iwemu processes; nothing mocked."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest

from iwscope_lab.links import LinkSpec
from iwscope_lab.scenarios import ScenarioError, load_scenario
from iwscope_lab.topology import STATE_ROOT, Host, Topology

RTT_MS = 80.0

#: In a host's namespace: accept connections on [::]:PORT, print the peer and snd_cwnd of each.
ACCEPT_V6 = """
import json, socket, sys
from iwprobe import read_tcp_info
server = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("::", int(sys.argv[1])))
server.listen(64)
print("listening", flush=True)
while True:
    connection, peer = server.accept()
    print(json.dumps({"peer": peer[0], "snd_cwnd": read_tcp_info(connection)["snd_cwnd"]}), flush=True)
    connection.close()
"""

#: Handshake RTTs (ms, as the kernel measured them) of COUNT connections to HOST PORT.
HANDSHAKES = """
import json, socket, sys, time
from iwprobe import read_tcp_info
rtts = []
for _ in range(int(sys.argv[3])):
    client = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    rtts.append(read_tcp_info(client)["rtt"] / 1000)
    client.close()
    time.sleep(0.05)
print(json.dumps(rtts))
"""

#: Send as fast as possible to the first client on [::]:PORT for SECONDS.
BULK_SERVER = """
import socket, sys, time
server = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("::", int(sys.argv[1])))
server.listen(1)
print("listening", flush=True)
connection, _ = server.accept()
deadline = time.monotonic() + float(sys.argv[2])
try:
    while time.monotonic() < deadline:
        connection.send(b"\\0" * 65536)
except OSError:
    pass
connection.close()
"""

#: Receive from HOST PORT until closed; print the goodput (bit/s) from second 1 to the end.
BULK_CLIENT = """
import json, socket, sys, time
client = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
mss = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
started = time.monotonic()
marks = []
received = 0
while True:
    data = client.recv(1 << 20)
    if not data:
        break
    received += len(data)
    marks.append((time.monotonic() - started, received))
after = [(t, n) for t, n in marks if t >= 1.0]
(t0, n0), (t1, n1) = after[0], after[-1]
print(json.dumps({"goodput_bps": (n1 - n0) * 8 / (t1 - t0), "mss": mss}))
"""


def _start(topo: Topology, host: str, script: str, *args: str) -> subprocess.Popen[str]:
    process = topo.popen(host, [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "listening"
    return process


def _run(topo: Topology, host: str, script: str, *args: str) -> object:
    outcome = topo.run(host, [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60)
    assert outcome.returncode == 0, outcome.stderr
    return json.loads(outcome.stdout)


def _dual_stack(run_id: str, link: LinkSpec) -> Topology:
    return Topology(
        run_id,
        [Host("origin", role="origin", link=LinkSpec.symmetric()), Host("probe", role="probe", region="test", link=link)],
        dual_stack=True,
    )


def test_dual_stack_hosts_talk_ipv6_across_the_emulated_link(run_id: str) -> None:
    topo = _dual_stack(run_id, LinkSpec.symmetric(rate_bps=10e6, rtt_ms=RTT_MS))
    with topo:
        origin, probe = topo.host("origin"), topo.host("probe")
        prefix = ipaddress.ip_network(topo.prefix6 or "")
        assert prefix.prefixlen == 48 and prefix.is_private
        assert {ipaddress.ip_address(h.address6) in prefix for h in (origin, probe)} == {True}
        assert origin.address6 != probe.address6 and origin.address.startswith("10.")
        shown = topo.run("probe", ["ip", "-6", "addr", "show", "dev", probe.device], capture_output=True, text=True).stdout
        assert f"{probe.address6} peer {probe.core_address6}" in shown and "tentative" not in shown
        status = topo.status()
        assert status["dual_stack"] and status["subnet6"] == str(prefix)
        assert {h["name"]: h["address6"] for h in status["hosts"]} == {"origin": origin.address6, "probe": probe.address6}
        state = json.loads((STATE_ROOT / run_id / "state.json").read_text())
        assert state["dual_stack"] and [h["address6"] for h in state["hosts"]] == [origin.address6, probe.address6]
        # IPv6 is on for the hosts, but nothing asks for routers on the emulated links.
        sysctl = topo.run(
            "probe",
            [
                "cat",
                "/proc/sys/net/ipv6/conf/all/disable_ipv6",
                f"/proc/sys/net/ipv6/conf/{probe.device}/router_solicitations",
                f"/proc/sys/net/ipv6/conf/{probe.device}/accept_dad",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert sysctl[:2] == ["0", "0"] and int(sysctl[2]) <= 0, sysctl  # accept_dad -1: off (the kernel's, NOARP)

        # Delay: the handshake RTT over IPv6 is the configured one (the first connection of a
        # fresh namespace pays one-off costs: the minimum of the rest is the path's).
        server = _start(topo, "origin", ACCEPT_V6, "7301")
        rtts = _run(topo, "probe", HANDSHAKES, origin.address6, "7301", "6")
        assert isinstance(rtts, list)
        print(f"IPv6 handshake RTTs {rtts} ms on a {RTT_MS} ms path")
        assert RTT_MS <= min(rtts[1:]) <= RTT_MS * 1.05 + 2, rtts
        # The route metrics apply to the IPv6 default route too.
        topo.set_route("origin", initcwnd=3)
        _run(topo, "probe", HANDSHAKES, origin.address6, "7301", "1")
        assert server.stdout is not None
        accepted = [json.loads(server.stdout.readline()) for _ in range(7)]
        server.kill()
        server.wait(timeout=10)
        assert {entry["peer"] for entry in accepted} == {probe.address6}
        assert [entry["snd_cwnd"] for entry in accepted] == [10] * 6 + [3], accepted
        routes = topo.run("origin", ["ip", "-6", "route", "show", "default"], capture_output=True, text=True).stdout
        assert f"via {origin.core_address6}" in routes and "initcwnd 3" in routes
        # Both directions of the probe's emulator carried the IPv6 packets.
        stats = topo.link_stats("probe")
        assert stats["up"]["rx_ipv6_packets"] >= 7 * 2 and stats["down"]["rx_ipv6_packets"] >= 7 * 2, stats

        # Rate: a bulk IPv6 transfer runs at the link rate less the headers (40-byte IPv6
        # header, 20 TCP, 12 timestamps: a 1500-byte packet carries 1428 payload bytes).
        bulk = _start(topo, "origin", BULK_SERVER, "7302", "4")
        result = _run(topo, "probe", BULK_CLIENT, origin.address6, "7302")
        bulk.wait(timeout=20)
        assert isinstance(result, dict)
        payload_bps = 10e6 * 1428 / 1500
        print(
            f"IPv6 goodput {result['goodput_bps'] / 1e6:.3f} Mbit/s (payload rate {payload_bps / 1e6:.3f}), MSS {result['mss']}"
        )
        assert result["mss"] == 1428
        assert 0.92 * payload_bps <= result["goodput_bps"] <= 1.02 * payload_bps, result
    leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{run_id}-" not in leftover and not (STATE_ROOT / run_id).exists()


def test_single_stack_runs_keep_ipv6_off(run_id: str) -> None:
    topo = Topology(run_id, [Host("origin", role="origin"), Host("probe", link=LinkSpec.symmetric(rtt_ms=10))])
    with topo:
        assert topo.host("probe").address6 == "" and topo.prefix6 is None and not topo.status(counters=False)["dual_stack"]
        disabled = topo.run("probe", ["cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6"], capture_output=True, text=True)
        assert disabled.stdout.strip() == "1"
        attached = Topology.attach(run_id)
        assert not attached.dual_stack


def test_dual_stack_scenario_and_attach(run_id: str, tmp_path: Path) -> None:
    scenario = load_scenario("dual-stack")
    assert scenario.dual_stack
    [path] = scenario.path_summary()
    assert path["rtt_ms"] == 200 and path["rate_bps"] == 100e6
    assert not load_scenario("avgdc").dual_stack
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndual_stack: perhaps\nhosts: [{name: o, role: origin}, {name: p}]\n")
    with pytest.raises(ScenarioError, match="dual_stack"):
        load_scenario(bad)
    topo = Topology.from_scenario("dual-stack", run_id=run_id)
    with topo:
        assert topo.dual_stack and topo.host("probe1").address6
        attached = Topology.attach(run_id)  # e.g. `iwscope lab status` in another process
        assert attached.dual_stack and attached.host("probe1").address6 == topo.host("probe1").address6
        assert attached.host("probe1").core_address6 == topo.host("probe1").core_address6
