"""The TCP_INFO parser against the kernel's own view (``ss -ti``) of a live socket."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from iwprobe import _tcpinfo, wire

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


@pytest.fixture()
def connected_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    try:
        yield client, server
    finally:
        client.close()
        server.close()


def _ss_fields(local_port: int) -> dict[str, str]:
    output = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{local_port} )"], check=True, capture_output=True, text=True
    ).stdout
    fields: dict[str, str] = {}
    for token in output.split():
        if ":" in token and not re.match(r"^[\d.\[\]]+:\d+$", token):
            key, _, value = token.partition(":")
            fields[key] = value
    return fields


def test_field_names_and_offsets_match_the_kernel_header() -> None:
    names = [name for name, _, _ in _tcpinfo._LAYOUT]
    bitfields = ["snd_wscale", "rcv_wscale", "delivery_rate_app_limited", "fastopen_client_fail"]
    assert tuple(list(_tcpinfo._U8_FIELDS) + bitfields + names) == wire.TCP_INFO_FIELDS
    offsets = {name: offset for name, offset, _ in _tcpinfo._LAYOUT}
    # Offsets from include/uapi/linux/tcp.h (pahole on x86_64).
    assert offsets["rto"] == 8
    assert offsets["total_retrans"] == 100
    assert offsets["pacing_rate"] == 104
    assert offsets["segs_out"] == 136
    assert offsets["delivery_rate"] == 160
    assert offsets["delivered"] == 192
    assert offsets["bytes_sent"] == 200
    assert offsets["snd_wnd"] == 228
    assert offsets["total_rto"] == 240
    assert offsets["total_rto_time"] == 244
    assert _tcpinfo.KNOWN_SIZE == 248


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is not installed")
def test_parse_matches_ss_on_a_live_socket(connected_pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = connected_pair
    payload = b"x" * 200_000
    server.sendall(payload)
    received = 0
    while received < len(payload):
        received += len(client.recv(65536))
    client.sendall(b"thanks")
    assert server.recv(16) == b"thanks"
    time.sleep(0.3)  # let the last ACKs settle so both views see a quiet connection
    port = server.getsockname()[1]
    info = _tcpinfo.read_tcp_info(server)
    ss = _ss_fields(port)
    assert info["snd_cwnd"] == int(ss["cwnd"])
    assert info["snd_mss"] == int(ss["mss"])
    assert info["rcv_mss"] == int(ss["rcvmss"])
    assert info["bytes_sent"] == int(ss["bytes_sent"]) == len(payload)
    assert info["bytes_acked"] == int(ss["bytes_acked"])
    assert info["bytes_received"] == int(ss["bytes_received"]) == 6
    assert info["segs_out"] == int(ss["segs_out"])
    assert info["segs_in"] == int(ss["segs_in"])
    assert info["data_segs_out"] == int(ss["data_segs_out"])
    assert info["rcv_space"] == int(ss["rcv_space"])
    assert info["rto"] / 1000 == pytest.approx(float(ss["rto"]))
    rtt, rttvar = (float(v) for v in ss["rtt"].split("/"))
    assert info["rtt"] / 1000 == pytest.approx(rtt, abs=0.0015)
    assert info["rttvar"] / 1000 == pytest.approx(rttvar, abs=0.0015)
    assert info["min_rtt"] / 1000 == pytest.approx(float(ss["minrtt"]), abs=0.0015)
    snd_wscale, rcv_wscale = (int(v) for v in ss["wscale"].split(","))
    assert (info["snd_wscale"], info["rcv_wscale"]) == (snd_wscale, rcv_wscale)
    if "snd_wnd" in ss:
        assert info["snd_wnd"] == int(ss["snd_wnd"])
    assert info["unacked"] == 0 and info["notsent_bytes"] == 0
    assert info["state"] == 1  # TCP_ESTABLISHED


def test_shorter_structs_of_older_kernels_give_a_prefix(connected_pair: tuple[socket.socket, socket.socket]) -> None:
    client, _ = connected_pair
    raw = client.getsockopt(socket.IPPROTO_TCP, _tcpinfo.TCP_INFO, 512)
    full = _tcpinfo.parse_tcp_info(raw)
    linux_3_x = _tcpinfo.parse_tcp_info(raw[:104])  # up to total_retrans
    assert set(linux_3_x) == set(wire.TCP_INFO_FIELDS[: wire.TCP_INFO_FIELDS.index("total_retrans") + 1])
    assert all(linux_3_x[name] == full[name] for name in linux_3_x)
    cut_inside_a_u64 = _tcpinfo.parse_tcp_info(raw[:108])
    assert "pacing_rate" not in cut_inside_a_u64
    assert _tcpinfo.parse_tcp_info(b"") == {}
    # ~0ULL ("no limit", e.g. max_pacing_rate without SO_MAX_PACING_RATE) is left out.
    assert "max_pacing_rate" not in full
    # ~0U ("no sample yet", e.g. min_rtt of a connection that never got an RTT sample) too.
    no_sample = bytearray(raw)
    offset = next(offset for name, offset, _ in _tcpinfo._LAYOUT if name == "min_rtt")
    no_sample[offset : offset + 4] = b"\xff\xff\xff\xff"
    parsed = _tcpinfo.parse_tcp_info(bytes(no_sample))
    assert "min_rtt" not in parsed and parsed["notsent_bytes"] == full["notsent_bytes"]
    assert all(value < 2**63 for value in full.values())
    assert set(_tcpinfo.parse_tcp_info(raw[:7])) == {
        "state",
        "ca_state",
        "retransmits",
        "probes",
        "backoff",
        "options",
        "snd_wscale",
        "rcv_wscale",
    }
