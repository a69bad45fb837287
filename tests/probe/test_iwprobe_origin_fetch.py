"""Origin and fetch over real kernel sockets in network namespaces (no link emulation).

The timing claims (IW10 vs IW3 on a 200 ms path) are in test_iwprobe_lab_e2e.py; here: per-arm
initial windows, the HTTP surface, error kinds, route setup idempotency.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from iwprobe_testkit import PYTHON, NetnsPair, fetch_json, origin_process, read_observations

from iwprobe import wire
from iwprobe._fetch import fetch
from iwprobe._routes import RoutePlan, route_commands

ARMS = [3, 10, 16, 32]
BASE_PORT = 8100


@pytest.fixture()
def origin(netns_pair: NetnsPair) -> Iterator[subprocess.Popen]:
    with origin_process(
        netns_pair, ARMS, BASE_PORT, "--max-object-bytes", "1000000", "--request-timeout", "1.5", "--workers", "4"
    ) as process:
        yield process


def test_each_arm_starts_with_its_initial_window(netns_pair: NetnsPair, origin: subprocess.Popen) -> None:
    trials = {}
    for iw in ARMS:
        trial = fetch_json(netns_pair, f"http://{netns_pair.origin_address}:{BASE_PORT + iw}/obj/30000")
        assert trial["error_kind"] is None and trial["http_status"] == 200
        assert trial["bytes_received"] > 30000
        trials[trial["trial_id"]] = iw
    observations = read_observations(origin, len(ARMS))
    for observation in observations:
        iw = trials[observation["trial_id"]]
        assert observation["arm_iw"] == iw
        assert observation["snd_cwnd_at_accept"] == iw
        assert observation["cwnd_mismatch"] is False
        assert observation["object_size"] == 30000
        assert observation["response_latency_us"] >= observation["first_byte_us"] > 0
        assert observation["tcp_info"]["bytes_acked"] >= 30000
        assert observation["tcp_info"]["unacked"] == 0
        assert observation["rwnd_limited"] is False
        assert observation["peer_rwnd"] == observation["tcp_info"]["snd_wnd"]
    no_metrics = netns_pair.run(netns_pair.origin_ns, ["sysctl", "-n", "net.ipv4.tcp_no_metrics_save"])
    assert no_metrics.stdout.strip() == "1"
    # The kernel's send-buffer autotuning held every arm's whole initial window (IW 32 too).
    assert all(o["tcp_info"]["sndbuf_limited"] == 0 for o in observations)


def test_http_surface_and_bounds(netns_pair: NetnsPair, origin: subprocess.Popen) -> None:
    base = f"http://{netns_pair.origin_address}:{BASE_PORT + 10}"
    missing = fetch_json(netns_pair, base + "/nope")
    assert missing["http_status"] == 404 and missing["error_kind"] == "http_status"
    too_big = fetch_json(netns_pair, base + "/obj/1000001")
    assert too_big["http_status"] == 413
    bad = fetch_json(netns_pair, base + "/obj/12abc")
    assert bad["http_status"] == 400
    # The body is deterministic: the same bytes twice, and exactly the requested length.
    script = (
        "import socket,sys\n"
        f"def get():\n s=socket.create_connection(({netns_pair.origin_address!r},{BASE_PORT + 3}))\n"
        " s.sendall(b'GET /obj/5000 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        " d=b''\n while True:\n  c=s.recv(65536)\n  if not c: break\n  d+=c\n return d\n"
        "a,b=get(),get()\nh,_,body=a.partition(b'\\r\\n\\r\\n')\n"
        "assert a==b, 'body differs'\nassert len(body)==5000, len(body)\n"
        "assert b'Connection: close' in h\nassert body[:4]==bytes([0,1,2,3])\nprint('ok')"
    )
    outcome = netns_pair.run(netns_pair.probe_ns, [PYTHON, "-c", script])
    assert outcome.stdout.strip() == "ok", outcome.stderr
    # A client that never sends its request is cut off after --request-timeout (1.5 s).
    slow = (
        "import socket,time\n"
        f"s=socket.create_connection(({netns_pair.origin_address!r},{BASE_PORT + 3}))\n"
        "t=time.monotonic(); s.settimeout(10); d=s.recv(10); print(round(time.monotonic()-t,2), len(d))"
    )
    outcome = netns_pair.run(netns_pair.probe_ns, [PYTHON, "-c", slow])
    waited, received = outcome.stdout.split()
    assert 1.0 <= float(waited) < 5.0 and received == "0"
    # Three error responses carried a trial id: they are observed with their status.
    statuses = sorted(observation["http_status"] for observation in read_observations(origin, 3))
    assert statuses == [400, 404, 413]


def test_route_setup_is_idempotent(netns_pair: NetnsPair) -> None:
    for _ in range(2):
        outcome = netns_pair.run(netns_pair.origin_ns, [PYTHON, "-m", "iwprobe", "origin", "setup-routes", "--arms", "3,10"])
        assert outcome.returncode == 0, outcome.stderr
    rules = netns_pair.run(netns_pair.origin_ns, ["ip", "rule", "show"]).stdout
    assert rules.count("lookup 21003") == 1 and rules.count("lookup 21010") == 1
    table = netns_pair.run(netns_pair.origin_ns, ["ip", "route", "show", "table", "21010"]).stdout
    assert "initcwnd 10" in table and "initrwnd 64" in table and "default via" in table
    printed = netns_pair.run(
        netns_pair.origin_ns, [PYTHON, "-m", "iwprobe", "origin", "setup-routes", "--print-routes", "--arms", "16"]
    )
    assert "ip -4 rule add priority 9016 fwmark 0x1f010 lookup 21016" in printed.stdout
    assert "lookup 21016" not in netns_pair.run(netns_pair.origin_ns, ["ip", "rule", "show"]).stdout


def test_route_commands_copy_every_main_route() -> None:
    routes = ["default via 192.0.2.1 dev eth0 proto dhcp metric 100", "192.0.2.0/24 dev eth0 scope link"]
    commands = [" ".join(command) for command in route_commands(RoutePlan([10], initrwnd=40), routes)]
    assert commands == [
        "ip -4 route flush table 21010",
        "ip -4 route replace default via 192.0.2.1 dev eth0 proto dhcp metric 100 table 21010 initcwnd 10 initrwnd 40",
        "ip -4 route replace 192.0.2.0/24 dev eth0 scope link table 21010 initcwnd 10 initrwnd 40",
        "ip -4 rule add priority 9010 fwmark 0x1f00a lookup 21010",
    ]


# ---------------------------------------------------------------- fetch error kinds
def _serve_once(behaviour: str) -> int:
    """A one-shot local server misbehaving on purpose; returns its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)
        if behaviour == "short":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 100)
        elif behaviour == "garbage":
            conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")
        elif behaviour == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        elif behaviour == "silent":
            time.sleep(2.0)
        conn.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


@pytest.mark.parametrize(
    "behaviour, kind", [("short", "short_body"), ("garbage", "protocol"), ("reset", "reset"), ("silent", "timeout")]
)
def test_fetch_records_errors_as_trials(behaviour: str, kind: str) -> None:
    port = _serve_once(behaviour)
    result = fetch(f"http://127.0.0.1:{port}/obj/5000", wire.new_id(), timeout_s=0.8)
    assert result.error_kind == kind, result.error_detail
    assert result.connect_us is not None and result.error_detail
    record = result.to_trial(wire.new_id(), wire.new_id(), None, None, 0, 10, 5000)
    assert record.error_kind == kind and len(record.error_detail or "") <= 500


def test_fetch_refused_and_dns_errors() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    refused = fetch(f"http://127.0.0.1:{port}/obj/1")
    assert refused.error_kind == "refused" and refused.connect_us is None
    unresolvable = fetch("http://no-such-host.invalid:80/obj/1")
    assert unresolvable.error_kind == "dns" and unresolvable.dns_us is None
