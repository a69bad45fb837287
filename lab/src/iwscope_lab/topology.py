"""Lab topologies: hosts as network namespaces joined by emulated access links.

Layout of one run (``run_id`` such as ``iws3f2a`` or, in tests, ``iwt...``)::

    root namespace (collector stack on 127.0.0.1 and 10.63.0.1 on lo = Topology.collector_address)
      <run>r 10.N.0.1/30
        | veth (not emulated)
    <run>-core  10.N.0.2/30, ip_forward=1, route 10.63.0.1 via 10.N.0.1   core router
      <run>c<i> 10.N.i.1 peer 10.N.i.2  -- TUN --+
                                                 | iwemu process (the access link of host i)
    <run>-<host>  <run>h<i> 10.N.i.2 peer 10.N.i.1 -- TUN --+   default route via the TUN

A dual-stack run (``dual_stack=True``, scenario field ``dual_stack: true``) also gives every
host ``fd69:7773:N:i::2/128 peer fd69:7773:N:i::1`` and a ``::/0`` route over the same TUN
link, the core the ``::1`` side and IPv6 forwarding (addressing.py).  The collector path
stays IPv4 only.

Hosts with users (``Host(..., users=40)``, scenario field ``users: 40``) get that many extra
client addresses, each in a /24 of its own: user ``g`` of the run (numbered in host order) of
host ``i`` is ``100.(U + g // 256).(g % 256).i`` on the host namespace's ``lo``, where
``100.U.0.0/16`` (one to four consecutive /16s of 100.64.0.0/10, RFC 6598) is allocated per run
under the lab's lock; the core routes each host's range via that host's TUN link, so every
packet to or from a user address crosses the host's emulated link.  Dual-stack runs add one
IPv6 /48 per user, ``fd75:7372:XXXX::i`` (``XXXX`` = ``U * 256 + g``).  Nothing of it is in the
root namespace; it all goes with the run's namespaces (addressing.py, docs/lab.md).

Every path between two hosts crosses both hosts' access links and the core, so the probe ->
origin round trip is the sum of both access links' delays.  TUN links are layer 3: no ARP.
The emulators create the TUN devices (non-persistent: they vanish with the process).

State of every run lives in ``/run/iwscope-lab/<run>/state.json`` (written before anything
is created, updated as things are) so that :func:`cleanup` can remove what a crashed run
left behind (runstate.py; the process and namespace helpers are in _netns.py, the declared
host spec in hostspec.py).

Namespace settings (each namespace, see docs/lab.md):
``net.ipv4.tcp_no_metrics_save=1`` so one connection's ssthresh/RTT does not leak into the
next; IPv6 off (no router solicitations on the emulated links), or in dual-stack runs on with
DAD, router solicitations and router advertisements off (:data:`DUAL_STACK_SYSCTLS`: nothing
but the traffic under test crosses the links, and addresses are usable at once);
``tcp_slow_start_after_idle`` left at the kernel default (1, as on production servers) unless
``sysctls`` overrides it.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._netns import (
    LabError,
    control,
    emulator_path,
    existing_namespaces,
    ip,
    ip_batch,
    process_start_time,
    reap,
    spawn_emulator,
    sysctl,
    wait_emulator_ready,
)
from .addressing import (
    MAX_USERS_PER_RUN,
    SUBNET_OCTETS,
    allocate_subnet,
    allocate_users_octets,
    covering_prefixes,
    host_addresses,
    host_addresses6,
    ipv6_available,
    user_address,
    user_address6,
)
from .addressing import prefix6 as run_prefix6
from .hostspec import Host, PlacedHost
from .links import DirectionSpec, LinkSpec
from .runstate import RUN_ID_RE, STATE_ROOT, cleanup, cleanup_run, list_runs, read_state, run_healthy, run_is_stale
from .scenarios import load_scenario
from .service_address import SERVICE_ADDRESS
from .service_address import ensure as ensure_service_address

__all__ = [
    "Topology",
    "Host",
    "PlacedHost",
    "LinkSpec",
    "DirectionSpec",
    "LabError",
    "cleanup",
    "list_runs",
    "run_is_stale",
    "STATE_ROOT",
    "emulator_path",
    "SUBNET_OCTETS",
    "DEFAULT_SYSCTLS",
    "DUAL_STACK_SYSCTLS",
]

MAX_HOSTS = 250
DEFAULT_SYSCTLS: dict[str, str] = {
    "net.ipv4.tcp_no_metrics_save": "1",
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}
#: Applied over :data:`DEFAULT_SYSCTLS` in dual-stack runs, before the TUN devices exist (they
#: take the ``default`` values): IPv6 on, no duplicate address detection (the addresses are
#: also added ``nodad``), no router solicitations or advertisements on the emulated links.
#: With ``accept_dad`` or ``accept_ra`` 0, this kernel (6.18) refuses ``::/0 via <peer>`` on a
#: TUN device with "No route to host" although the peer's /128 route exists: the IPv6 default
#: routes are added ``onlink`` (the peer is on the point-to-point link by construction).
DUAL_STACK_SYSCTLS: dict[str, str] = {
    f"net.ipv6.conf.{scope}.{key}": value
    for key, value in (
        ("disable_ipv6", "0"),
        ("accept_dad", "0"),
        ("dad_transmits", "0"),
        ("router_solicitations", "0"),
        ("accept_ra", "0"),
    )
    for scope in ("all", "default")
}
MTU = 1500
EMULATOR_READY_TIMEOUT_S = 5.0
#: SCHED_FIFO priority of the emulators (0 = normal scheduling).  On a shared machine a
#: normally scheduled emulator is descheduled for tens of milliseconds at a time.
DEFAULT_EMULATOR_RT_PRIORITY = int(os.environ.get("IWSCOPE_LAB_RT_PRIORITY", "20"))


def stop_processes(processes: Iterable[subprocess.Popen[Any]], timeout_s: float = 10.0) -> None:
    """SIGTERM every process (e.g. started with :meth:`Topology.popen`), wait up to
    ``timeout_s`` for each, SIGKILL and reap what is left."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Topology:
    """A set of hosts, each a namespace ``<run>-<host>``, behind emulated links to a core.

    Use as a context manager, or call :meth:`up` and :meth:`down`.
    """

    def __init__(
        self,
        name: str | None = None,
        hosts: Sequence[Host] = (),
        *,
        sysctls: Mapping[str, str] | None = None,
        trace: bool | Iterable[str] = False,
        seed: int = 1,
        detached: bool = False,
        scenario: str | None = None,
        emulator_rt_priority: int = DEFAULT_EMULATOR_RT_PRIORITY,
        dual_stack: bool = False,
    ) -> None:
        run_id = name or f"iws{secrets.token_hex(3)}"
        if not RUN_ID_RE.match(run_id):
            run_id = f"iws{run_id}" if RUN_ID_RE.match(f"iws{run_id}") else run_id
        if not RUN_ID_RE.match(run_id):
            raise ValueError(f"run id {name!r}: expected 'iws' or 'iwt' + 1-8 of [a-z0-9]")
        if not hosts:
            raise ValueError("a topology needs at least one host")
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"at most {MAX_HOSTS} hosts per topology")
        names = [host.name for host in hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate host names: {', '.join(duplicates)}")
        if sum(host.users for host in hosts) > MAX_USERS_PER_RUN:
            raise ValueError(f"at most {MAX_USERS_PER_RUN} users per topology")
        self.run_id = run_id
        self.name = run_id
        self.scenario = scenario
        self.hosts: list[PlacedHost] = [
            PlacedHost(host, index, netns=f"{run_id}-{host.name}", device=f"{run_id}h{index}", core_device=f"{run_id}c{index}")
            for index, host in enumerate(hosts, start=1)
        ]
        self.dual_stack = dual_stack
        self.sysctls = {**DEFAULT_SYSCTLS, **(DUAL_STACK_SYSCTLS if dual_stack else {}), **(sysctls or {})}
        self.seed = seed
        self.detached = detached
        self.emulator_rt_priority = emulator_rt_priority
        if trace is True:
            self._traced = set(names)
        elif trace is False:
            self._traced = set()
        else:
            self._traced = set(trace)
        self.core_netns = f"{run_id}-core"
        self.root_device = f"{run_id}r"
        self.core_veth = f"{run_id}v"
        self.state_dir = STATE_ROOT / run_id
        self.subnet: int | None = None
        #: Second octets of the run's user /16s (100.U.0.0/16); [] without users.
        self.users_octets: list[int] = []
        self._emulators: dict[str, int] = {}
        self._children: list[subprocess.Popen[Any]] = []
        self._route_metrics: dict[str, dict[str, int]] = {}
        self._is_up = False

    # ----- public API -----

    @property
    def collector_address(self) -> str:
        """Where every host reaches the collector stack: the lab's service address in the root
        namespace (service_address.py), routed over this run's veth."""
        self._require_up()
        return SERVICE_ADDRESS

    @property
    def core_address(self) -> str:
        self._require_up()
        return f"10.{self.subnet}.0.2"

    @property
    def prefix6(self) -> str | None:
        """The run's IPv6 /48 in a dual-stack run, else None."""
        self._require_up()
        return run_prefix6(self.subnet) if self.dual_stack and self.subnet is not None else None

    def host(self, name: str) -> PlacedHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in topology {self.run_id} (hosts: {', '.join(h.name for h in self.hosts)})")

    def hosts_by_role(self, role: str) -> list[PlacedHost]:
        return [host for host in self.hosts if host.role == role]

    def user_addresses(self, host: str | None = None) -> list[str]:
        """The user addresses of ``host`` (every host's, in host order, when None)."""
        self._require_up()
        hosts = [self.host(host)] if host is not None else self.hosts
        return [address for placed in hosts for address in placed.user_addresses]

    def up(self) -> Topology:
        """Build everything; a no-op when already up (also when another process built this run)."""
        if self._is_up:
            return self
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        existing = read_state(self.state_dir)
        if existing is not None:
            if run_healthy(existing):
                wanted = {host.name: host.link for host in self.hosts}
                if not self._adopt(existing):
                    raise LabError(
                        f"run id {self.run_id} is in use by a live run with other hosts "
                        f"({', '.join(h['name'] for h in existing['hosts'])}); pick another run id"
                    )
                for name, link in wanted.items():
                    if self.host(name).link != link:
                        self.set_link(name, link)
                return self
            cleanup_run(existing)
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        self._is_up = True
        return self

    def down(self) -> None:
        """Remove every namespace, device, process and state file of this run."""
        state = read_state(self.state_dir) or self._state()
        for child in self._children:
            if child.poll() is None:
                child.kill()
            child.wait()
            for stream in (child.stdin, child.stdout, child.stderr):
                if stream is not None:
                    stream.close()
        self._children.clear()
        cleanup_run(state)
        for pid in self._emulators.values():
            reap(pid)
        self._emulators.clear()
        self._is_up = False

    def __enter__(self) -> Topology:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def run(self, host: str, cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``cmd`` inside ``host``'s namespace (``ip netns exec``)."""
        return subprocess.run(self._exec_prefix(host) + list(cmd), **kwargs)

    def popen(self, host: str, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``cmd`` inside ``host``'s namespace; it is killed by :meth:`down`."""
        process = subprocess.Popen(self._exec_prefix(host) + list(cmd), **kwargs)
        self._children.append(process)
        return process

    def wait_listening(
        self, host: str, address: str, ports: Sequence[int], timeout_s: float = 60.0, server: subprocess.Popen[Any] | None = None
    ) -> None:
        """Until every port of ``address`` accepts a connection from ``host``'s namespace (a
        server imports, loads its keys: seconds on a loaded box); ``TimeoutError`` after
        ``timeout_s``, or at once when ``server`` (its process) has exited."""
        connect = (
            "import socket, sys\nfor port in sys.argv[2:]:\n    socket.create_connection((sys.argv[1], int(port)), 1).close()"
        )
        deadline = time.monotonic() + timeout_s
        while self.run(host, [sys.executable, "-c", connect, address, *map(str, ports)], capture_output=True).returncode != 0:
            if (server is not None and server.poll() is not None) or time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {address} {list(ports)} (from {host})")
            time.sleep(0.2)

    def set_link(self, host: str, spec: LinkSpec) -> None:
        """Change a host's link parameters live (queued packets keep their schedule)."""
        self._require_up()
        target = self.host(host)
        answer = control(self._control_path(target), "set " + " ".join(spec.emulator_settings()))
        if answer.strip() != "ok":
            raise LabError(f"emulator of {host} refused the new link: {answer.strip()}")
        target.link = spec
        self._write_state()

    def set_offload(self, host: str, on: bool) -> None:
        """Segmentation offload of the host's device on or off (``ethtool -K``).

        The lab's TUN devices have no virtio-net header, so their hardware TSO is fixed off; the
        toggle that changes what TCP hands the device is GSO, the kernel's software TSO: with it
        on, TCP builds segments of up to 64 KB (sized by its TSO autosizing) that are cut to the
        MSS just before the device, as a TSO NIC would cut them; off, TCP sends MSS-sized
        packets.  Either way a capture on the device sees MSS-sized packets."""
        self._require_up()
        device = self.host(host).device
        state = "on" if on else "off"
        self.run(host, ["ethtool", "-K", device, "gso", state, "tso", state], check=True, capture_output=True)
        shown = self.run(host, ["ethtool", "-k", device], check=True, capture_output=True, text=True).stdout
        if f"generic-segmentation-offload: {state}" not in shown:
            raise LabError(f"ethtool could not set GSO {state} on {device}: {shown[:400]}")

    def set_route(self, host: str, *, initcwnd: int | None = None, initrwnd: int | None = None, mtu: int | None = None) -> None:
        """Set ``initcwnd`` / ``initrwnd`` (segments) and a locked path ``mtu`` (bytes: the
        host sends segments of ``mtu - 40`` bytes, less TCP options) on the host's default
        route (both default routes in a dual-stack run).

        None keeps the value set before (the metrics are merged), 0 removes it (kernel default).
        """
        self._require_up()
        target = self.host(host)
        metrics = self._route_metrics.setdefault(host, {})
        for name, value in (("initcwnd", initcwnd), ("initrwnd", initrwnd), ("mtu", mtu)):
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r}: expected a non-negative integer (segments)")
            if value == 0:
                metrics.pop(name, None)
            else:
                metrics[name] = value
        extra = [
            word
            for name, value in sorted(metrics.items())
            for word in ((name, "lock", str(value)) if name == "mtu" else (name, str(value)))
        ]
        ip(["route", "replace", "default", "via", target.core_address, "dev", target.device, *extra], namespace=target.netns)
        if self.dual_stack:
            ip(
                ["-6", "route", "replace", "::/0", "via", target.core_address6, "dev", target.device, "onlink", *extra],
                namespace=target.netns,
            )

    def link_stats(self, host: str) -> dict[str, Any]:
        """The emulator's configuration and counters (``down`` and ``up``) for a host's link."""
        self._require_up()
        stats: dict[str, Any] = json.loads(control(self._control_path(self.host(host)), "stats"))
        return stats

    def emulator_pid(self, host: str) -> int:
        self._require_up()
        return self._emulators[host]

    def trace_path(self, host: str) -> Path:
        return self.state_dir / f"trace-{host}.log"

    def status(self, *, counters: bool = True) -> dict[str, Any]:
        """Hosts (role, namespace, address), links (parameters, live counters)."""
        self._require_up()
        hosts = []
        for host in self.hosts:
            entry = host.describe()
            entry["emulator_pid"] = self.emulator_pid(host.name)
            if counters:
                try:
                    stats = self.link_stats(host.name)
                    entry["emulator_rt_priority"] = stats.get("rt_priority")
                    entry["counters"] = {
                        direction: {k: v for k, v in stats[direction].items() if k != "config"} for direction in ("down", "up")
                    }
                except OSError as exc:
                    entry["counters"] = {"error": f"emulator unreachable: {exc}"}
            hosts.append(entry)
        return {
            "run_id": self.run_id,
            "scenario": self.scenario,
            "collector_address": self.collector_address,
            "core_netns": self.core_netns,
            "subnet": f"10.{self.subnet}.0.0/16",
            "dual_stack": self.dual_stack,
            "subnet6": self.prefix6,
            "hosts": hosts,
        }

    @classmethod
    def from_scenario(
        cls, scenario: str, run_id: str | None = None, *, extra_hosts: Sequence[Host] = (), **kwargs: Any
    ) -> Topology:
        """A topology from a lab scenario YAML (a name from ``scenarios/`` or a path), with
        ``extra_hosts`` after the scenario's own."""
        loaded = load_scenario(scenario)
        kwargs.setdefault("dual_stack", loaded.dual_stack)
        return cls(run_id, [*loaded.hosts(), *extra_hosts], scenario=loaded.name, **kwargs)

    @classmethod
    def attach(cls, run_id: str) -> Topology:
        """The running topology ``run_id`` (built by another process, e.g. ``iwscope lab up``)."""
        state = read_state(STATE_ROOT / run_id)
        if state is None:
            raise LabError(f"no lab run {run_id!r} (state {STATE_ROOT / run_id / 'state.json'} missing)")
        hosts = []
        for entry in state["hosts"]:
            hosts.append(
                Host(
                    entry["name"],
                    role=entry["role"],
                    region=entry.get("region"),
                    link=LinkSpec.from_dict(entry["link"]),
                    labels=entry.get("labels") or {},
                    users=int(entry.get("users", 0)),
                )
            )
        topo = cls(
            run_id,
            hosts,
            sysctls=state.get("sysctls"),
            seed=state.get("seed", 1),
            detached=state.get("detached", False),
            scenario=state.get("scenario"),
            dual_stack=bool(state.get("dual_stack")),
        )
        if not run_healthy(state) or not topo._adopt(state):
            raise LabError(f"lab run {run_id!r} is broken (emulator or namespace gone): run `iwscope lab cleanup`")
        return topo

    # ----- internals -----

    def _require_up(self) -> None:
        if not self._is_up:
            raise LabError(f"topology {self.run_id} is not up")

    def _exec_prefix(self, host: str) -> list[str]:
        netns = self.core_netns if host == "core" else self.host(host).netns
        return ["ip", "netns", "exec", netns]

    def _control_path(self, host: PlacedHost) -> Path:
        return self.state_dir / f"emu-{host.name}.sock"

    def _state(self) -> dict[str, Any]:
        namespaces = [self.core_netns] + [host.netns for host in self.hosts]
        emulators = {}
        for name, pid in self._emulators.items():
            emulators[name] = {"pid": pid, "start_time": process_start_time(pid)}
        return {
            "run_id": self.run_id,
            "scenario": self.scenario,
            "owner_pid": os.getpid(),
            "owner_start_time": process_start_time(os.getpid()),
            "detached": self.detached,
            "created_at": time.time(),
            "subnet": self.subnet,
            "dual_stack": self.dual_stack,
            "subnet6": run_prefix6(self.subnet) if self.dual_stack and self.subnet is not None else None,
            "namespaces": namespaces,
            "root_devices": [self.root_device],
            "root_routes": [f"10.{self.subnet}.0.0/16"] if self.subnet is not None else [],
            "emulators": emulators,
            "sysctls": self.sysctls,
            "seed": self.seed,
            "hosts": [host.describe() for host in self.hosts],
        } | ({"users_octets": list(self.users_octets)} if self.users_octets else {})

    def _write_state(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = self._state()
        previous = read_state(self.state_dir)
        if previous:
            state["created_at"] = previous.get("created_at", state["created_at"])
        temporary = self.state_dir / "state.json.tmp"
        temporary.write_text(json.dumps(state, indent=2))
        temporary.replace(self.state_dir / "state.json")

    def _adopt(self, state: dict[str, Any]) -> bool:
        """Take over a healthy run described by ``state`` (same hosts); False if not possible."""
        if [h["name"] for h in state["hosts"]] != [h.name for h in self.hosts] or state.get("subnet") is None:
            return False
        if bool(state.get("dual_stack")) != self.dual_stack:
            return False
        if [int(h.get("users", 0)) for h in state["hosts"]] != [h.users for h in self.hosts]:
            return False
        self.subnet = int(state["subnet"])
        self.users_octets = [int(octet) for octet in state.get("users_octets") or []]
        self._place_users()
        for host, entry in zip(self.hosts, state["hosts"], strict=True):
            host.address = entry["address"]
            host.core_address = host_addresses(self.subnet, host.index)[1]
            if self.dual_stack:
                host.address6, host.core_address6 = host_addresses6(self.subnet, host.index)
            host.link = LinkSpec.from_dict(entry["link"])
        self._emulators = {name: int(info["pid"]) for name, info in state["emulators"].items()}
        self._is_up = True
        return True

    def _build(self) -> None:
        if self.dual_stack and not ipv6_available():
            raise LabError("a dual-stack run needs IPv6, but /proc/sys/net/ipv6 is missing (kernel without IPv6?)")
        lock_path = STATE_ROOT / ".allocate.lock"
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = allocate_subnet(self.run_id)
            self.users_octets = allocate_users_octets(self.run_id, sum(host.users for host in self.hosts))
            for host in self.hosts:
                host.address, host.core_address = host_addresses(self.subnet, host.index)
                if self.dual_stack:
                    host.address6, host.core_address6 = host_addresses6(self.subnet, host.index)
            self._place_users()
            self._write_state()  # before anything exists: a crash from here on is cleanable
        existing = existing_namespaces()
        for netns in [self.core_netns] + [host.netns for host in self.hosts]:
            if netns in existing:
                raise LabError(f"namespace {netns} already exists (another run?); run `iwscope lab cleanup`")
            ip(["netns", "add", netns])
            ip(["link", "set", "lo", "up"], namespace=netns)
            settings = {
                key: value
                for key, value in self.sysctls.items()
                if not key.startswith("net.ipv6.") or Path("/proc/sys/net/ipv6").exists()
            }
            if netns == self.core_netns:
                settings["net.ipv4.ip_forward"] = "1"
                if self.dual_stack:
                    settings["net.ipv6.conf.all.forwarding"] = "1"
            sysctl(netns, settings)
        # The collector path: a plain veth between the root namespace and the core.
        sub = self.subnet
        ip(["link", "add", self.root_device, "type", "veth", "peer", "name", self.core_veth, "netns", self.core_netns])
        disable_v6 = Path(f"/proc/sys/net/ipv6/conf/{self.root_device}/disable_ipv6")
        if disable_v6.exists():
            disable_v6.write_text("1")
        ip_batch(
            None,
            [
                f"addr add 10.{sub}.0.1/30 dev {self.root_device}",
                f"link set {self.root_device} up",
                f"route add 10.{sub}.0.0/16 via 10.{sub}.0.2 dev {self.root_device}",
            ],
        )
        ip_batch(
            self.core_netns,
            [
                f"addr add 10.{sub}.0.2/30 dev {self.core_veth}",
                f"link set {self.core_veth} up",
                f"route add {ensure_service_address()}/32 via 10.{sub}.0.1 dev {self.core_veth}",
            ],
        )
        if self.dual_stack:  # the collector path stays IPv4: nothing of IPv6 on the veth
            sysctl(self.core_netns, {f"net.ipv6.conf.{self.core_veth}.disable_ipv6": "1"})
        binary = str(emulator_path())
        for host in self.hosts:
            self._start_emulator(binary, host)
            self._write_state()
            host_lines = [
                f"link set {host.device} mtu {MTU} up",
                f"addr add {host.address}/32 peer {host.core_address} dev {host.device}",
                f"route add default via {host.core_address} dev {host.device}",
            ]
            core_lines = [
                f"link set {host.core_device} mtu {MTU} up",
                f"addr add {host.core_address}/32 peer {host.address} dev {host.core_device}",
            ]
            if self.dual_stack:  # "::/0", not "default": `ip -batch` lines take no -6
                host_lines += [
                    f"addr add {host.address6}/128 peer {host.core_address6}/128 dev {host.device} nodad",
                    f"route add ::/0 via {host.core_address6} dev {host.device} onlink",
                ]
                core_lines += [f"addr add {host.core_address6}/128 peer {host.address6}/128 dev {host.core_device} nodad"]
            host_lines += [f"addr add {address}/32 dev lo" for address in host.user_addresses]
            core_lines += [
                f"route add {prefix} via {host.address} dev {host.core_device}"
                for prefix in covering_prefixes(host.user_addresses, 24)
            ]
            host_lines += [f"addr add {address}/128 dev lo nodad" for address in host.user_addresses6]
            core_lines += [
                f"route add {prefix} via {host.address6} dev {host.core_device} onlink"
                for prefix in covering_prefixes(host.user_addresses6, 48)
            ]
            ip_batch(host.netns, host_lines)
            ip_batch(self.core_netns, core_lines)

    def _place_users(self) -> None:
        """Each host's user addresses from the run's user /16s (addressing.py)."""
        first = 0
        for host in self.hosts:
            users = range(first, first + host.users)
            host.user_addresses = [user_address(self.users_octets[0], user, host.index) for user in users]
            host.user_addresses6 = (
                [user_address6(self.users_octets[0], user, host.index) for user in users] if self.dual_stack else []
            )
            first += host.users

    def _start_emulator(self, binary: str, host: PlacedHost) -> None:
        """Spawn iwemu (its own session: it outlives a detached `lab up`) and wait for "ready"."""
        control_path = self._control_path(host)
        cmd = [
            binary,
            "--a-netns",
            f"/run/netns/{host.netns}",
            "--a-dev",
            host.device,
            "--b-netns",
            f"/run/netns/{self.core_netns}",
            "--b-dev",
            host.core_device,
            "--control",
            str(control_path),
            "--seed",
            str(self.seed * 1000 + host.index),
            "--rt-priority",
            str(self.emulator_rt_priority),
        ]
        if host.name in self._traced:
            cmd += ["--trace", str(self.trace_path(host.name))]
        cmd += host.link.emulator_settings()
        log_path = self.state_dir / f"emu-{host.name}.log"
        pid, read_fd = spawn_emulator(binary, cmd, log_path)
        self._emulators[host.name] = pid  # recorded first: down() reaps it if it never gets ready
        wait_emulator_ready(pid, read_fd, log_path, host.name, EMULATOR_READY_TIMEOUT_S)
