"""What the origin's network device does with TCP's large sends (wire v8 ``segmentation_offload``).

With TSO the device cuts TCP's super-segments (up to 64 KB) into MSS-sized packets, so a
capture at the sender sees the super-segments; with GSO only, the kernel cuts them just
before the device; with neither, TCP sends MSS-sized packets.  The seed notes that TSO is "a
form of bufferbloat": a first window leaves as one burst either way, but how it is cut
changes what a sender-side trace shows.  Every observation says which it was, read from the
device holding the connection's local address with the ``SIOCETHTOOL`` ioctl (``ETHTOOL_GTSO``,
``ETHTOOL_GGSO``; no privilege needed), cached for :data:`CACHE_S` so that a lab toggling
offload between phases is seen.

Which device: the one holding the local address (``ip -o addr``).  On a host that routes a
connection out of another device than the one holding its address this names the wrong one;
the lab and a usual server hold their address on the egress device.
"""

from __future__ import annotations

import array
import fcntl
import ipaddress
import socket
import struct
import subprocess
import threading
import time
from typing import Optional

SIOCETHTOOL = 0x8946
ETHTOOL_GTSO = 0x0000001E
ETHTOOL_GGSO = 0x00000023
#: How long a device's offload state and the address map are trusted (s).
CACHE_S = 1.0


def device_offload(device: str) -> str:
    """``tso``, ``gso`` or ``off`` for ``device``; empty when it cannot be read."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            tso = _ethtool_value(sock, device, ETHTOOL_GTSO)
            gso = _ethtool_value(sock, device, ETHTOOL_GGSO)
    except (OSError, ValueError):
        return ""
    return "tso" if tso else "gso" if gso else "off"


def _ethtool_value(sock: socket.socket, device: str, command: int) -> int:
    value = array.array("I", [command, 0])  # struct ethtool_value {u32 cmd; u32 data}
    address, _ = value.buffer_info()
    request = struct.pack("16sP", device.encode()[:15], address).ljust(40, b"\0")  # struct ifreq
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request)
    return int(value[1])


def address_devices() -> dict[str, str]:
    """Every local address (normalised text) and the device holding it, from ``ip -o addr``."""
    try:
        shown = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    devices: dict[str, str] = {}
    for line in shown.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("inet", "inet6"):
            try:
                address = ipaddress.ip_address(fields[3].split("/")[0])
            except ValueError:
                continue
            devices[str(address)] = fields[1].split("@")[0]
    return devices


class OffloadCache:
    """``segmentation_offload`` of a connection by its local address (thread-safe, cached)."""

    def __init__(self, cache_s: float = CACHE_S) -> None:
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._devices: dict[str, str] = {}
        self._devices_at = float("-inf")
        self._states: dict[str, tuple[str, float]] = {}

    def of_local(self, local_addr: str) -> str:
        """The offload of the device holding ``local_addr`` (an IPv4-mapped address counts
        as its IPv4 one); empty when not known."""
        try:
            address = ipaddress.ip_address(local_addr.split("%")[0])
        except ValueError:
            return ""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        now = time.monotonic()
        with self._lock:
            device = self._device(str(address), now)
            if device is None:
                return ""
            state, at = self._states.get(device, ("", float("-inf")))
            if now - at >= self.cache_s:
                state = device_offload(device)
                self._states[device] = (state, now)
            return state

    def _device(self, address: str, now: float) -> Optional[str]:
        device = self._devices.get(address)
        if (device is None and now - self._devices_at >= self.cache_s) or now - self._devices_at >= 60:
            self._devices, self._devices_at = address_devices(), now
            device = self._devices.get(address)
        return device


__all__ = ["OffloadCache", "device_offload", "address_devices"]
