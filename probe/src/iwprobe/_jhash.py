"""The kernel's ``jhash`` as nftables applies it (``meta mark set jhash ... mod N seed S``).

``iwprobe tap`` lets the kernel choose each client's arm (an nftables rule hashes the SYN's
source prefix), and the kernel's destroy notifications do not carry the connection's mark, so
the agent recomputes the same function to know which arm a closed connection had.  This is
Bob Jenkins' lookup3 ``hashlittle`` as ``include/linux/jhash.h`` writes it, followed by
``reciprocal_scale`` (``nft_jhash_eval`` in ``net/netfilter/nft_hash.c``).  Keys of at most 12
bytes (an IPv4 /24 is 3, an IPv6 /48 is 6) take only the tail path, which reads bytes
explicitly, so the result does not depend on the CPU's byte order; longer keys are read
little-endian, as on x86.  A test checks it against the marks the kernel set.
"""

from __future__ import annotations

_MASK = 0xFFFFFFFF
#: ``JHASH_INITVAL``.
_INITVAL = 0xDEADBEEF


def _rol(value: int, shift: int) -> int:
    return ((value << shift) | (value >> (32 - shift))) & _MASK


def jhash(key: bytes, initval: int) -> int:
    """``jhash(key, len(key), initval)`` of the kernel."""
    length = len(key)
    a = b = c = (_INITVAL + length + initval) & _MASK
    offset = 0
    while length > 12:
        a = (a + int.from_bytes(key[offset : offset + 4], "little")) & _MASK
        b = (b + int.from_bytes(key[offset + 4 : offset + 8], "little")) & _MASK
        c = (c + int.from_bytes(key[offset + 8 : offset + 12], "little")) & _MASK
        a = (a - c) & _MASK ^ _rol(c, 4)
        c = (c + b) & _MASK
        b = (b - a) & _MASK ^ _rol(a, 6)
        a = (a + c) & _MASK
        c = (c - b) & _MASK ^ _rol(b, 8)
        b = (b + a) & _MASK
        a = (a - c) & _MASK ^ _rol(c, 16)
        c = (c + b) & _MASK
        b = (b - a) & _MASK ^ _rol(a, 19)
        a = (a + c) & _MASK
        c = (c - b) & _MASK ^ _rol(b, 4)
        b = (b + a) & _MASK
        length -= 12
        offset += 12
    if length == 0:
        return c
    tail = key[offset:] + bytes(12 - length)
    a = (a + int.from_bytes(tail[0:4], "little")) & _MASK
    b = (b + int.from_bytes(tail[4:8], "little")) & _MASK
    c = (c + int.from_bytes(tail[8:12], "little")) & _MASK
    c = (c ^ b) - _rol(b, 14) & _MASK
    a = (a ^ c) - _rol(c, 11) & _MASK
    b = (b ^ a) - _rol(a, 25) & _MASK
    c = (c ^ b) - _rol(b, 16) & _MASK
    a = (a ^ c) - _rol(c, 4) & _MASK
    b = (b ^ a) - _rol(a, 14) & _MASK
    c = (c ^ b) - _rol(b, 24) & _MASK
    return c


def jhash_bucket(key: bytes, seed: int, modulus: int) -> int:
    """``jhash key mod modulus seed seed`` of nftables (before its ``offset``)."""
    return (jhash(key, seed) * modulus) >> 32
