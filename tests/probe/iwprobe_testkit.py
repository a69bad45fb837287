"""Fixtures of the iwprobe tests: network namespaces joined by a veth pair.

Names carry the prefix ``iwt`` and a random suffix and are always removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from testkit import stop_process

from iwscope_lab.service_address import SERVICE_ADDRESS

PYTHON = sys.executable


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class NetnsPair:
    """An origin namespace and a probe namespace on one /24 over a veth pair."""

    origin_ns: str
    probe_ns: str
    origin_address: str
    probe_address: str

    def exec_args(self, namespace: str, command: list[str]) -> list[str]:
        return ["ip", "netns", "exec", namespace, *command]

    def run(self, namespace: str, command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 120)
        return subprocess.run(self.exec_args(namespace, command), **kwargs)  # type: ignore[call-overload]

    def popen(self, namespace: str, command: list[str], **kwargs: object) -> subprocess.Popen:
        return subprocess.Popen(self.exec_args(namespace, command), **kwargs)  # type: ignore[call-overload]


@pytest.fixture()
def netns_pair() -> Iterator[NetnsPair]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    with make_netns_pair() as pair:
        yield pair


@contextlib.contextmanager
def make_netns_pair() -> Iterator[NetnsPair]:
    """The :func:`netns_pair` fixture's namespaces, for fixtures of a wider scope (removed on exit)."""
    suffix = secrets.token_hex(3)
    origin_ns, probe_ns = f"iwt{suffix}o", f"iwt{suffix}p"
    veth_o, veth_p = f"iwt{suffix}a", f"iwt{suffix}b"
    octet = 1 + secrets.randbelow(250)
    pair = NetnsPair(origin_ns, probe_ns, f"10.213.{octet}.1", f"10.213.{octet}.2")
    try:
        _ip("netns", "add", origin_ns)
        _ip("netns", "add", probe_ns)
        _ip("link", "add", veth_o, "type", "veth", "peer", "name", veth_p)
        _ip("link", "set", veth_o, "netns", origin_ns)
        _ip("link", "set", veth_p, "netns", probe_ns)
        for namespace, device, address in ((origin_ns, veth_o, pair.origin_address), (probe_ns, veth_p, pair.probe_address)):
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", device)
            _ip("-n", namespace, "link", "set", device, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            # A default route so the origin's route copies include one (like a real host).
            _ip(
                "-n",
                namespace,
                "route",
                "add",
                "default",
                "via",
                pair.probe_address if namespace == origin_ns else pair.origin_address,
            )
        yield pair
    finally:
        for namespace in (origin_ns, probe_ns):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def wait_for_port(pair: NetnsPair, namespace: str, address: str, port: int, timeout_s: float = 10.0) -> None:
    """Block until something listens on address:port inside the namespace."""
    deadline = time.monotonic() + timeout_s
    probe = f"import socket,sys\ns=socket.socket()\ns.settimeout(0.5)\nsys.exit(s.connect_ex(({address!r},{port})))"
    while time.monotonic() < deadline:
        if pair.run(namespace, [PYTHON, "-c", probe]).returncode == 0:
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {address}:{port} in {namespace}")


@dataclass
class FleetNet(NetnsPair):
    """A :class:`NetnsPair` whose namespaces also reach the root namespace (the collector).

    Each namespace gets a second veth into the root namespace on its own /30, and a route
    over it to the lab's service address, where the test API listens (it does not listen on
    every interface); no forwarding is enabled anywhere.  ``collector_from[ns]`` is the
    address the collector has from that namespace.
    """

    collector_from: dict = None  # type: ignore[assignment]

    def collector_url(self, namespace: str, port: int) -> str:
        return f"http://{self.collector_from[namespace]}:{port}"


@pytest.fixture()
def fleet_net(netns_pair: NetnsPair) -> Iterator[FleetNet]:
    with make_fleet_net(netns_pair) as net:
        yield net


@contextlib.contextmanager
def make_fleet_net(netns_pair: NetnsPair) -> Iterator[FleetNet]:
    """The :func:`fleet_net` fixture's links into the root namespace, for fixtures of a wider
    scope (removed on exit)."""
    suffix = netns_pair.origin_ns[3:-1]
    octet = 1 + secrets.randbelow(250)
    links = []
    collector_from = {}
    try:
        for index, namespace in enumerate((netns_pair.origin_ns, netns_pair.probe_ns)):
            root_dev, ns_dev = f"iwt{suffix}r{index}", f"iwt{suffix}n{index}"
            root_address, ns_address = f"10.214.{octet}.{4 * index + 1}", f"10.214.{octet}.{4 * index + 2}"
            _ip("link", "add", root_dev, "type", "veth", "peer", "name", ns_dev)
            links.append(root_dev)
            _ip("link", "set", ns_dev, "netns", namespace)
            _ip("addr", "add", f"{root_address}/30", "dev", root_dev)
            _ip("link", "set", root_dev, "up")
            _ip("-n", namespace, "addr", "add", f"{ns_address}/30", "dev", ns_dev)
            _ip("-n", namespace, "link", "set", ns_dev, "up")
            _ip("-n", namespace, "route", "add", f"{SERVICE_ADDRESS}/32", "via", root_address, "dev", ns_dev)
            collector_from[namespace] = SERVICE_ADDRESS
        yield FleetNet(
            netns_pair.origin_ns, netns_pair.probe_ns, netns_pair.origin_address, netns_pair.probe_address, collector_from
        )
    finally:
        for device in links:
            subprocess.run(["ip", "link", "del", device], capture_output=True)


def read_observations(process: subprocess.Popen, count: int, timeout_s: float = 10.0) -> list[dict]:
    """Read ``count`` observation lines from the origin's stdout."""
    assert process.stdout is not None
    found: list[dict] = []
    deadline = time.monotonic() + timeout_s

    def reader() -> None:
        while len(found) < count:
            line = process.stdout.readline()  # type: ignore[union-attr]
            if not line:
                return
            found.append(json.loads(line))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    assert len(found) == count, f"expected {count} observations, got {len(found)}"
    return found


def fetch_json(pair: NetnsPair, url: str, *extra: str) -> dict:
    outcome = pair.run(pair.probe_ns, [PYTHON, "-m", "iwprobe", "fetch", url, "--json", *extra])
    assert outcome.stdout, outcome.stderr
    return json.loads(outcome.stdout)


@contextlib.contextmanager
def origin_process(pair: NetnsPair, arms: Sequence[int], base_port: int, *options: str) -> Iterator[subprocess.Popen]:
    """A collector-less ``iwprobe origin`` in the pair's origin namespace (routes installed
    first) bound to its address, observations on stdout; stopped afterwards."""
    labels = ",".join(str(iw) for iw in arms)
    setup = pair.run(pair.origin_ns, [PYTHON, "-m", "iwprobe", "origin", "setup-routes", "--arms", labels])
    assert setup.returncode == 0, setup.stderr
    process = pair.popen(
        pair.origin_ns,
        [
            PYTHON,
            "-m",
            "iwprobe",
            "--log-level",
            "WARNING",
            "origin",
            "--no-upload",
            "--arms",
            labels,
            "--base-port",
            str(base_port),
            "--bind",
            pair.origin_address,
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(pair, pair.probe_ns, pair.origin_address, base_port + max(arms))
        yield process
    finally:
        stop_process(process, timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
