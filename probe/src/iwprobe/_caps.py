"""Dropping ``CAP_NET_ADMIN`` per thread (ctypes ``prctl`` + ``capset``; standard library only)."""

from __future__ import annotations

#: ``CAP_NET_ADMIN`` (linux/capability.h): needed for ``ip route/rule`` and ``SO_MARK`` only.
CAP_NET_ADMIN = 12
_PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_capability(capability: int) -> None:
    """Remove ``capability`` from the calling thread's bounding, effective, permitted and
    inheritable sets (``prctl(PR_CAPBSET_DROP)`` + ``capset``, through ctypes: standard library
    only).  Without the capability (not root) it is a no-op.  Capabilities are per thread:
    threads started afterwards inherit the reduced sets; running ones must drop their own."""
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    # Dropping from the bounding set needs CAP_SETPCAP; without it nothing can be regained anyway.
    libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)

    class _Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class _Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), f"capget: {os.strerror(ctypes.get_errno())}")
    word, bit = divmod(capability, 32)
    mask = ~(1 << bit) & 0xFFFFFFFF
    data[word].effective &= mask
    data[word].permitted &= mask
    data[word].inheritable &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), f"capset: {os.strerror(ctypes.get_errno())}")
