"""Topology life cycle: initcwnd via routes, live link changes, the collector path, jitter,
drop-tail buffers, complete teardown and cleanup after a crashed owner."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from iwscope_lab.links import DirectionSpec, LinkSpec
from iwscope_lab.topology import STATE_ROOT, Host, Topology, cleanup

TwoHosts = Callable[..., Topology]
MEASURE = [sys.executable, "-m", "iwscope_lab._measure"]


def _leftovers(run_id: str, subnet: int | None, emulator_pids: list[int]) -> list[str]:
    """Everything of a run that still exists: namespaces, root devices/routes, processes, state."""
    found = []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in namespaces.splitlines() if line.startswith(f"{run_id}-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {line}" for line in links.splitlines() if f" {run_id}" in line]
    if subnet is not None:
        routes = subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True).stdout
        found += [f"route {line}" for line in routes.splitlines() if f"10.{subnet}." in line]
        rules = subprocess.run(["ip", "rule", "show"], capture_output=True, text=True).stdout
        found += [f"rule {line}" for line in rules.splitlines() if f"10.{subnet}." in line]
    for pid in emulator_pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(f"process {pid}")
    if (STATE_ROOT / run_id).exists():
        found.append(f"state {STATE_ROOT / run_id}")
    return found


def _initcwnd_after_accept(topo: Topology, port: int) -> int:
    server = topo.popen("origin", MEASURE + ["initcwnd-server", str(port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    assert "listening" in server.stdout.readline()
    topo.run(
        "probe",
        [sys.executable, "-c", f"import socket; socket.create_connection(('{topo.host('origin').address}', {port})).close()"],
        check=True,
        timeout=20,
    )
    out, _ = server.communicate(timeout=20)
    return int(json.loads(out.strip().splitlines()[-1])["snd_cwnd"])


def test_route_initcwnd_is_the_servers_snd_cwnd_after_accept(two_hosts: TwoHosts) -> None:
    topo = two_hosts(LinkSpec.symmetric(rate_bps=10e6, rtt_ms=20))
    assert _initcwnd_after_accept(topo, 7201) == 10  # Linux default IW10
    topo.set_route("origin", initcwnd=3)
    assert _initcwnd_after_accept(topo, 7202) == 3
    topo.set_route("origin", initcwnd=32)
    assert _initcwnd_after_accept(topo, 7203) == 32
    topo.set_route("origin", initrwnd=40)  # merged: initcwnd stays
    routes = topo.run("origin", ["ip", "route", "show", "default"], capture_output=True, text=True).stdout
    assert "initcwnd 32" in routes and "initrwnd 40" in routes
    assert _initcwnd_after_accept(topo, 7204) == 32
    topo.set_route("origin", initcwnd=0)  # back to the kernel default
    assert _initcwnd_after_accept(topo, 7205) == 10
    with pytest.raises(ValueError, match="initcwnd"):
        topo.set_route("origin", initcwnd=-1)


def test_every_host_reaches_the_collector_address(two_hosts: TwoHosts) -> None:
    topo = two_hosts(LinkSpec.symmetric(rate_bps=10e6, rtt_ms=30))
    listener = socket.create_server((topo.collector_address, 0))  # the lab's service address, not 0.0.0.0
    port = listener.getsockname()[1]
    peers: list[str] = []

    def serve() -> None:
        for _ in range(2):
            connection, address = listener.accept()
            peers.append(address[0])
            connection.sendall(b"hello")
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        for host in ("origin", "probe"):
            script = (
                f"import socket; s = socket.create_connection(('{topo.collector_address}', {port}), timeout=5);"
                "print(s.recv(10).decode())"
            )
            result = topo.run(host, [sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
            assert result.stdout.strip() == "hello", result.stderr
        thread.join(timeout=5)
    finally:
        listener.close()
    assert sorted(peers) == sorted([topo.host("origin").address, topo.host("probe").address])


def test_set_link_cuts_and_restores_live(two_hosts: TwoHosts) -> None:
    topo = two_hosts(LinkSpec.symmetric(rate_bps=10e6, rtt_ms=10))
    server = topo.popen("origin", MEASURE + ["accept-server", "7204"], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and "listening" in server.stdout.readline()
    connect = ["-c", f"import socket; socket.create_connection(('{topo.host('origin').address}', 7204), timeout=1.5)"]
    assert topo.run("probe", [sys.executable, *connect], capture_output=True, timeout=20).returncode == 0
    topo.set_link("probe", LinkSpec.symmetric(rate_bps=10e6, rtt_ms=10, loss=1.0))
    cut = topo.run("probe", [sys.executable, *connect], capture_output=True, text=True, timeout=20)
    assert cut.returncode != 0 and "timed out" in cut.stderr
    assert topo.link_stats("probe")["up"]["lost_packets"] >= 1
    topo.set_link("probe", LinkSpec.symmetric(rate_bps=10e6, rtt_ms=10))
    assert topo.run("probe", [sys.executable, *connect], capture_output=True, timeout=20).returncode == 0
    with pytest.raises(ValueError, match="loss"):
        topo.set_link("probe", LinkSpec.symmetric(loss=2.0))


def test_jitter_never_reorders_and_drop_tail_buffer_drops(two_hosts: TwoHosts) -> None:
    jittery = DirectionSpec(rate_bps=10e6, delay_ms=20, jitter_ms=8)
    topo = two_hosts(LinkSpec(down=jittery, up=jittery), trace=["probe"])
    script = textwrap.dedent("""
        import socket, struct, sys, time
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 7205)); s.settimeout(2)
        print('ready', flush=True)
        seen = []
        try:
            while True:
                seen.append(struct.unpack('!I', s.recv(64)[:4])[0])
        except socket.timeout:
            pass
        print(' '.join(map(str, seen)))
    """)
    sink = topo.popen("probe", [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
    sender = (
        f"import socket, struct, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for i in range(300):\n s.sendto(struct.pack('!I', i), ('{topo.host('probe').address}', 7205)); time.sleep(0.001)"
    )
    topo.run("origin", [sys.executable, "-c", sender], check=True, timeout=20)
    out, _ = sink.communicate(timeout=20)
    sequence = [int(x) for x in out.split()]
    assert sequence == list(range(300))  # nothing lost, nothing reordered despite 8 ms jitter
    time.sleep(1.2)  # the emulator flushes its trace every second
    delays = _trace_delays(topo.trace_path("probe"))
    assert len(delays) >= 300 and max(delays) - min(delays) > 8.0  # the jitter is real
    # A 10-packet drop-tail buffer at 1 Mbit/s: a burst of 100 datagrams loses about 90.
    topo.set_link(
        "probe",
        LinkSpec(down=DirectionSpec(rate_bps=1e6, delay_ms=5, buffer_packets=10), up=DirectionSpec(rate_bps=1e6, delay_ms=5)),
    )
    before = topo.link_stats("probe")["down"]
    burst = (
        f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for i in range(100):\n s.sendto(bytes(1000), ('{topo.host('probe').address}', 7206))"
    )
    topo.run("origin", [sys.executable, "-c", burst], check=True, timeout=20)
    time.sleep(0.3)
    after = topo.link_stats("probe")["down"]
    dropped = after["queue_drop_packets"] - before["queue_drop_packets"]
    delivered = after["delivered_packets"] - before["delivered_packets"]
    assert dropped + delivered == 100
    assert 85 <= dropped <= 90, (dropped, delivered)


def _trace_delays(path: Path) -> list[float]:
    """One-way times (ms) enqueue -> deliver of the down direction, from the packet trace."""
    enqueued: list[float] = []
    delivered: list[float] = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[1] == "down":
            (enqueued if parts[3] == "enqueue" else delivered if parts[3] == "deliver" else []).append(float(parts[0]))
    return [(d - e) * 1000 for e, d in zip(enqueued, delivered, strict=False)]


def test_up_is_idempotent_and_teardown_leaves_nothing(run_id: str) -> None:
    hosts = [Host("origin", role="origin"), Host("probe", link=LinkSpec.symmetric(rate_bps=5e6, rtt_ms=40))]
    topo = Topology(run_id, hosts)
    try:
        topo.up()
        first = (topo.subnet, topo.emulator_pid("probe"))
        topo.up()  # same object: no-op
        again = Topology(
            run_id, [Host("origin", role="origin"), Host("probe", link=LinkSpec.symmetric(rate_bps=5e6, rtt_ms=40))]
        ).up()
        assert (again.subnet, again.emulator_pid("probe")) == first  # another object adopts the run
        server = topo.popen("origin", ["sleep", "600"])
        pids = [topo.emulator_pid("origin"), topo.emulator_pid("probe"), server.pid]
        subnet = topo.subnet
        assert _leftovers(run_id, subnet, pids)  # the check sees a live run
    finally:
        topo.down()
    assert _leftovers(run_id, subnet, pids) == []


def test_cleanup_after_owner_is_killed(run_id: str, tmp_path: Path) -> None:
    owner_script = tmp_path / "owner.py"
    owner_script.write_text(
        textwrap.dedent(f"""
        import time
        from iwscope_lab.topology import Host, LinkSpec, Topology
        topo = Topology({run_id!r}, [Host("origin", role="origin"),
                                     Host("probe", link=LinkSpec.symmetric(rate_bps=1e6, rtt_ms=100))]).up()
        topo.popen("probe", ["sleep", "600"])
        print(topo.subnet, topo.emulator_pid("origin"), topo.emulator_pid("probe"), flush=True)
        time.sleep(600)
    """)
    )
    owner = subprocess.Popen([sys.executable, str(owner_script)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        subnet_text, *pid_texts = owner.stdout.readline().split()
        subnet, pids = int(subnet_text), [int(p) for p in pid_texts]
        # A live owner: cleanup leaves the run alone.
        assert run_id not in cleanup()
        assert len(_leftovers(run_id, subnet, pids)) >= 5
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        removed = subprocess.run(
            [str(Path(sys.executable).with_name("iwscope")), "lab", "cleanup"], capture_output=True, text=True, timeout=60
        )
        assert removed.returncode == 0, removed.stderr
        assert run_id in removed.stdout
        assert _leftovers(run_id, subnet, pids) == []
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.communicate()
        cleanup_state = STATE_ROOT / run_id / "state.json"
        if cleanup_state.exists():  # the test failed half-way: remove the run anyway
            from iwscope_lab.runstate import cleanup_run, read_state

            state = read_state(STATE_ROOT / run_id)
            if state:
                cleanup_run(state)
    assert not os.path.exists(STATE_ROOT / run_id)
