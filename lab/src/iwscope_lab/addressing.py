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
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from ._netns import LabError, ip
from .runstate import list_runs

__all__ = ["SUBNET_OCTETS", "ULA_BASE", "allocate_subnet", "host_addresses", "host_addresses6", "prefix6",
           "ipv6_available"]

#: Second octet range for per-run /16 subnets under 10.0.0.0/8.
SUBNET_OCTETS = range(64, 250)
#: The first 32 bits of every run's IPv6 /48 (``fd`` + global ID bytes 0x69 0x77 0x73, "iws").
ULA_BASE = "fd69:7773"


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
