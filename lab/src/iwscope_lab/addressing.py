"""Addresses of a lab run: its IPv4 10.N.0.0/16 and, for dual-stack runs, its IPv6 ULA /48.

The run's subnet octet ``N`` is chosen under a lock among the values no other run's state
and no root-namespace route or address uses (:func:`allocate_subnet`).  The IPv6 prefix is
derived from the same ``N`` (``fd69:7773:N::/48``: ``fd`` + the global ID ``69 77 73``
("iws") ``00 NN``), so two live runs never share one either, and host ``i`` gets the same
numbering in both families:

==============  ==================  ====================
                IPv4                IPv6
==============  ==================  ====================
host i          ``10.N.i.2/32``     ``fd69:7773:N:i::2/128``
core side       ``10.N.i.1/32``     ``fd69:7773:N:i::1/128``
==============  ==================  ====================

Both are point-to-point (``peer``) addresses on the host's TUN link.  The IPv6 prefix is only
routed inside the run's namespaces (nothing is added to the root namespace for it).

User addresses (``Host.users``: many emulated clients behind one host's access link)
    A run whose hosts have users gets 1-4 consecutive /16s ``100.U.0.0/16`` of the RFC 6598
    shared address space 100.64.0.0/10 (``U`` in 64-127, chosen under the same lock among the
    values no other run's state holds: :func:`allocate_users_octets`), 256 users per /16.  Users
    are numbered run-wide in host order (``g`` = 0, 1, ...); user ``g`` of host ``i`` is
    ``100.(U + g // 256).(g % 256).i``: one /24 per user (the last octet names the lab host), so
    no two users share a /24 and none can collide with the lab's 10.N.0.0/16 runs or the service
    address 10.63.0.1.  In dual-stack runs user ``g`` also gets the /48
    ``fd75:7372:XXXX::/48`` (``XXXX`` = ``U * 256 + g`` in hex; ``fd`` + global ID ``75 73 72``,
    "usr") and the address ``fd75:7372:XXXX::i``.  The addresses sit on the host namespace's
    ``lo``; the core routes each host's range (:func:`covering_prefixes`) to that host's TUN
    link.  Nothing is added to the root namespace: user addresses only exist inside the run.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from ._netns import LabError, ip
from .runstate import list_runs

__all__ = [
    "SUBNET_OCTETS",
    "ULA_BASE",
    "allocate_subnet",
    "host_addresses",
    "host_addresses6",
    "prefix6",
    "ipv6_available",
    "USERS_SPACE",
    "USERS_OCTETS",
    "USERS_PER_OCTET",
    "MAX_USERS_PER_RUN",
    "USERS_ULA_BASE",
    "allocate_users_octets",
    "user_address",
    "user_address6",
    "covering_prefixes",
]

#: Second octet range for per-run /16 subnets under 10.0.0.0/8.
SUBNET_OCTETS = range(64, 250)
#: The first 32 bits of every run's IPv6 /48 (``fd`` + global ID bytes 0x69 0x77 0x73, "iws").
ULA_BASE = "fd69:7773"
#: Where user addresses come from (RFC 6598 shared address space, never a lab 10.N address).
USERS_SPACE = ipaddress.ip_network("100.64.0.0/10")
#: Second octets of the user /16s (the whole of 100.64.0.0/10).
USERS_OCTETS = range(64, 128)
#: Users per /16: one /24 each.
USERS_PER_OCTET = 256
#: At most four /16s per run.
MAX_USERS_PER_RUN = 4 * USERS_PER_OCTET
#: The first 32 bits of every user's IPv6 /48 (``fd`` + global ID bytes 0x75 0x73 0x72, "usr").
USERS_ULA_BASE = "fd75:7372"


def host_addresses(subnet: int, index: int) -> tuple[str, str]:
    """IPv4 (host, core side) addresses of host ``index`` in run subnet ``subnet``."""
    return f"10.{subnet}.{index}.2", f"10.{subnet}.{index}.1"


def prefix6(subnet: int) -> str:
    """The run's IPv6 ULA /48."""
    return f"{ULA_BASE}:{subnet:x}::/48"


def host_addresses6(subnet: int, index: int) -> tuple[str, str]:
    """IPv6 (host, core side) addresses of host ``index`` in run subnet ``subnet``."""
    return f"{ULA_BASE}:{subnet:x}:{index:x}::2", f"{ULA_BASE}:{subnet:x}:{index:x}::1"


def ipv6_available() -> bool:
    """Whether the kernel has IPv6 at all (a dual-stack run needs it in its namespaces)."""
    return Path("/proc/sys/net/ipv6").is_dir()


def allocate_subnet(run_id: str) -> int:
    """A free 10.N.0.0/16: not used by another run's state nor by any root route/address.

    Call it under the lab's allocation lock and record the result in the run's state before
    releasing it (:meth:`iwscope_lab.topology.Topology._build`)."""
    used: set[int] = set()
    for state in list_runs():
        if state.get("subnet") is not None and state["run_id"] != run_id:
            used.add(int(state["subnet"]))
    ten = ipaddress.ip_network("10.0.0.0/8")
    for args in (["-j", "route", "show", "table", "all"], ["-j", "addr", "show"]):
        for entry in json.loads(ip(["-4"] + args).stdout or "[]"):
            candidates = [entry.get("dst", "")] + [a.get("local", "") for a in entry.get("addr_info", [])]
            for candidate in candidates:
                try:
                    network = ipaddress.ip_network(candidate, strict=False)
                except ValueError:
                    continue
                if network.overlaps(ten) and network.prefixlen >= 16:
                    used.add(int(network.network_address.packed[1]))
                elif network.overlaps(ten) and network.prefixlen < 16 and network.prefixlen > 0:
                    raise LabError(f"root namespace route {candidate} covers the lab's 10.0.0.0/8 space")
    for octet in SUBNET_OCTETS:
        if octet not in used:
            return octet
    raise LabError("no free 10.N.0.0/16 subnet for a lab run")


def allocate_users_octets(run_id: str, users: int) -> list[int]:
    """Consecutive second octets ``U`` (in :data:`USERS_OCTETS`) for ``users`` user addresses, none
    held by another run's state (``users_octets``); [] for no users.

    Call it under the lab's allocation lock, like :func:`allocate_subnet`."""
    if users <= 0:
        return []
    if users > MAX_USERS_PER_RUN:
        raise LabError(f"{users} users: at most {MAX_USERS_PER_RUN} per run")
    needed = -(-users // USERS_PER_OCTET)
    used: set[int] = set()
    for state in list_runs():
        if state["run_id"] != run_id:
            used.update(int(octet) for octet in state.get("users_octets") or [])
    for start in USERS_OCTETS:
        block = range(start, start + needed)
        if block[-1] in USERS_OCTETS and not used.intersection(block):
            return list(block)
    raise LabError(f"no {needed} free /16s for user addresses in {USERS_SPACE} (other runs hold {sorted(used)})")


def user_address(first_octet: int, user: int, host_index: int) -> str:
    """IPv4 address of run-wide user ``user`` (0-based) of host ``host_index``: one /24 per user."""
    return f"100.{first_octet + user // USERS_PER_OCTET}.{user % USERS_PER_OCTET}.{host_index}"


def user_address6(first_octet: int, user: int, host_index: int) -> str:
    """IPv6 address of run-wide user ``user`` of host ``host_index``: one /48 per user."""
    return f"{USERS_ULA_BASE}:{first_octet * USERS_PER_OCTET + user:x}::{host_index:x}"


def covering_prefixes(addresses: list[str], prefixlen: int) -> list[str]:
    """The fewest prefixes covering exactly the consecutive ``/prefixlen`` networks from the first
    address's to the last address's (a host's users: their core routes)."""
    if not addresses:
        return []
    first = ipaddress.ip_network(f"{addresses[0]}/{prefixlen}", strict=False)
    last = ipaddress.ip_network(f"{addresses[-1]}/{prefixlen}", strict=False)
    return [str(net) for net in ipaddress.summarize_address_range(first.network_address, last.broadcast_address)]
