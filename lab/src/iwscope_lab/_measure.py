"""Traffic end points for the self-test, run inside a host's namespace.

``python -m iwscope_lab._measure MODE ...`` prints one JSON object on stdout (servers first
print ``{"listening": port}`` once ready).  Standard library only (and iwprobe's TCP_INFO
parser, itself stdlib only), so it starts fast.

Modes:
  accept-server PORT             accept and close connections until killed
  handshakes HOST PORT COUNT GAP time COUNT TCP handshakes, GAP seconds apart
  bulk-server PORT SECONDS       accept one connection, send as fast as possible for SECONDS
  bulk-client HOST PORT SECONDS  receive for SECONDS; report (time, bytes) progress and MSS
  udp-sink PORT SECONDS          count datagrams (sequence numbers) for SECONDS
  udp-source HOST PORT COUNT PPS send COUNT numbered datagrams at about PPS per second
  initcwnd-server PORT           accept one connection, report TCP_INFO snd_cwnd right away
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

from iwprobe import read_tcp_info

#: Small datagrams so that the loss count gets many samples even at 56 kbit/s.
UDP_PAYLOAD = 32


def _listen(port: int) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(1024)
    print(json.dumps({"listening": server.getsockname()[1]}), flush=True)
    return server


def accept_server(port: int) -> None:
    """Accept and keep connections (closing would send a FIN that could queue on a slow link
    in front of the next handshake; the client resets them instead)."""
    server = _listen(port)
    held = []
    while True:
        connection, _ = server.accept()
        held.append(connection)
        if len(held) > 200:
            held.pop(0).close()


def handshakes(host: str, port: int, count: int, gap_s: float) -> None:
    """Handshake RTT as the kernel measured it (TCP_INFO rtt right after connect, in us from
    the SYN's send time: immune to this process being descheduled) and connect() wall time."""
    kernel_ms = []
    wall_ms = []
    # One extra handshake first, not reported: the first connection of a fresh namespace pays
    # one-off costs (route and socket code paths cold, emulator pages faulted in) that are
    # not part of the path being measured.
    for index in range(count + 1):
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        started = time.perf_counter()
        client.connect((host, port))
        wall_time_ms = (time.perf_counter() - started) * 1000.0
        info = read_tcp_info(client)
        if index > 0:
            wall_ms.append(wall_time_ms)
            kernel_ms.append(info["rtt"] / 1000.0)
        # Close with a RST (linger 0): no FIN exchange to queue in front of the next SYN.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        time.sleep(gap_s)
    print(json.dumps({"samples_ms": kernel_ms, "wall_ms": wall_ms}))


def bulk_server(port: int, seconds: float) -> None:
    server = _listen(port)
    connection, _ = server.accept()
    chunk = b"\0" * 65536
    deadline = time.monotonic() + seconds
    sent = 0
    try:
        while time.monotonic() < deadline:
            sent += connection.send(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    info = read_tcp_info(connection)
    connection.close()
    print(json.dumps({"sent": sent, "total_retrans": info.get("total_retrans"), "snd_mss": info.get("snd_mss")}))


def bulk_client(host: str, port: int, seconds: float) -> None:
    client = socket.create_connection((host, port), timeout=10)
    started = time.monotonic()
    deadline = started + seconds
    progress: list[tuple[float, int]] = []
    received = 0
    client.settimeout(0.5)
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        try:
            data = client.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            break
        received += len(data)
        progress.append((time.monotonic() - started, received))
    info = read_tcp_info(client)
    client.close()
    # Thin the progress log: at most ~4000 points, always keeping the last one.
    step = max(1, len(progress) // 4000)
    thinned = progress[::step]
    if progress and thinned[-1] != progress[-1]:
        thinned.append(progress[-1])
    print(json.dumps({"received": received, "progress": thinned, "rcv_mss": info.get("rcv_mss"), "rtt_us": info.get("rtt")}))


def udp_sink(port: int, seconds: float) -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sink.bind(("0.0.0.0", port))
    print(json.dumps({"listening": sink.getsockname()[1]}), flush=True)
    seen: set[int] = set()
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        sink.settimeout(remaining)
        try:
            data = sink.recv(2048)
        except TimeoutError:
            break
        if data == b"END":
            break
        seen.add(struct.unpack_from("!I", data)[0])
    # Lengths of runs of consecutive missing sequence numbers (below the highest one seen).
    runs: list[int] = []
    current = 0
    for sequence in range(max(seen) + 1 if seen else 0):
        if sequence in seen:
            if current:
                runs.append(current)
            current = 0
        else:
            current += 1
    print(json.dumps({"received": len(seen), "loss_runs": runs}))


def udp_source(host: str, port: int, count: int, per_second: float) -> None:
    source = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    source.connect((host, port))
    padding = b"\0" * (UDP_PAYLOAD - 4)
    started = time.monotonic()
    errors = 0
    for sequence in range(count):
        due = started + sequence / per_second
        delay = due - time.monotonic()
        if delay > 0.001:
            time.sleep(delay)
        try:
            source.send(struct.pack("!I", sequence) + padding)
        except OSError:
            errors += 1
    print(json.dumps({"sent": count, "send_errors": errors, "seconds": time.monotonic() - started}))


def initcwnd_server(port: int) -> None:
    server = _listen(port)
    connection, _ = server.accept()
    info = read_tcp_info(connection)
    connection.close()
    print(json.dumps({"snd_cwnd": info.get("snd_cwnd"), "snd_mss": info.get("snd_mss")}))


def main(argv: list[str]) -> None:
    mode, args = argv[0], argv[1:]
    if mode == "accept-server":
        accept_server(int(args[0]))
    elif mode == "handshakes":
        handshakes(args[0], int(args[1]), int(args[2]), float(args[3]))
    elif mode == "bulk-server":
        bulk_server(int(args[0]), float(args[1]))
    elif mode == "bulk-client":
        bulk_client(args[0], int(args[1]), float(args[2]))
    elif mode == "udp-sink":
        udp_sink(int(args[0]), float(args[1]))
    elif mode == "udp-source":
        udp_source(args[0], int(args[1]), int(args[2]), float(args[3]))
    elif mode == "initcwnd-server":
        initcwnd_server(int(args[0]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
