"""Per-client IW arms by one eBPF ``sock_ops`` program: no rule, route or sysctl on the host.

The other way to give an unmodified server's clients their arms (:mod:`iwprobe._tap_rules`)
marks SYNs in nftables and routes marked connections through tables with ``initcwnd``: every
packet of the host then crosses the mark rule and every route lookup the policy rules.  This
one runs code only once per accepted connection.  The kernel calls a cgroup's ``sock_ops``
programs at ``BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB`` (``tcp_init_transfer()``), right after it set
the connection's initial window from its route and before the first data segment; the program

1. leaves every connection alone unless the study's lease holds (an array map the agent renews:
   an expiry in ``CLOCK_MONOTONIC`` nanoseconds), the socket is in the agent's network namespace
   (``bpf_get_netns_cookie``), its local port is one of the study's, and the kernel did not
   start it at 1 segment (``snd_cwnd == 1``: a retransmitted SYN-ACK, RFC 6928 -- left as is);
2. hashes the client's prefix exactly as nftables' ``jhash @nh,OFF,BITS mod N seed S`` does
   (:mod:`iwprobe._jhash`: the same arm for the same client under either method, and the agent's
   arm of a closed connection is the same computation); an IPv4-mapped IPv6 client is hashed
   as IPv4;
3. for a bucket of a treated arm, sets the window with ``bpf_setsockopt(TCP_BPF_IW)``; the
   default arm's connections keep the server's own.

It is attached through a BPF link held by the agent only: when the agent exits, however it
exits (``kill -9``, OOM), the kernel closes the link and detaches the program with it -- no
arm outlives its agent.  A hung agent stops renewing the lease, and ``iwprobe tap disable`` ends
the lease at once through the map's id (kept in ``tap-installed.json``).

Scope: by default the cgroup v2 root (every process, filtered to the namespace and ports as
the nftables rule is); ``--cgroup`` narrows it to the web server's own cgroup (e.g.
``/sys/fs/cgroup/system.slice/nginx.service``).  What differs from the route method: Linux
restarts an idle connection's window from the *route's* initial window (``tcp_cwnd_restart``),
so after an idle period a connection of a treated arm restarts at the server's default -- its
later responses are reused-after-idle, which the analysis already counts apart.
Needs ``CAP_BPF`` + ``CAP_NET_ADMIN`` (root) and Linux >= 5.15.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import time
from typing import Optional

from . import _bpf, wire
from ._bpf import R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, Assembler
from ._tap_rules import ArmsError, Installed, TapPlan, _save, load_installed

log = logging.getLogger("iwprobe.tap")

PROGRAM_NAME = "iwscope_tap"
LEASE_MAP_NAME = "iwscope_lease"
_SOCK_OPS_OP, _FAMILY, _REMOTE_IP4, _REMOTE_IP6, _LOCAL_PORT, _SND_CWND = 0, 20, 24, 32, 68, 76
_PASSIVE_ESTABLISHED_CB = 5
_AF_INET, _AF_INET6 = 2, 10
_SOL_TCP, _TCP_BPF_IW = 6, 1001
_HELPER_MAP_LOOKUP, _HELPER_KTIME, _HELPER_SETSOCKOPT, _HELPER_NETNS_COOKIE = 1, 5, 49, 122
_JHASH_INITVAL = 0xDEADBEEF


def _cgroup2_mounts() -> list[str]:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as handle:
            return [line.split()[1] for line in handle if line.split()[2:3] == ["cgroup2"]]
    except OSError:
        return []


def open_cgroup(cgroup: Optional[str]) -> tuple[int, str]:
    """An fd of the cgroup v2 directory to attach to, and its name: ``cgroup`` (an absolute
    directory, or a path under the cgroup v2 root) or the root itself.  Where no cgroup v2 is
    mounted in this mount namespace (``ip netns exec`` remounts ``/sys``), one is mounted on a
    temporary directory just long enough to open the directory."""
    relative = (cgroup or "/").lstrip("/")
    if cgroup and os.path.isabs(cgroup) and os.path.isdir(cgroup):
        return os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY), cgroup
    for mount in _cgroup2_mounts():
        path = os.path.join(mount, relative)
        if os.path.isdir(path):
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY), "/" + relative
    import ctypes
    import tempfile

    libc = ctypes.CDLL(None, use_errno=True)
    directory = tempfile.mkdtemp(prefix="iwprobe-cgroup2-")
    try:
        if libc.mount(b"cgroup2", directory.encode(), b"cgroup2", 0, None) != 0:
            error = ctypes.get_errno()
            raise ArmsError(f"no cgroup v2 hierarchy (mounting one failed: {os.strerror(error)})")
        try:
            path = os.path.join(directory, relative)
            if not os.path.isdir(path):
                raise ArmsError(f"no cgroup {cgroup!r} under the cgroup v2 root")
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY), "/" + relative
        finally:
            libc.umount2(directory.encode(), 2)  # MNT_DETACH
    finally:
        os.rmdir(directory)


def _word_masks(bits: int) -> list[int]:
    """Per 32-bit word of an address (as the program loads it: network-order bytes read
    little-endian), the mask keeping the first ``bits`` bits."""
    masks = []
    for word in range(4):
        mask = 0
        for byte in range(4):
            position = word * 4 + byte
            kept = max(0, min(8, bits - position * 8))
            mask |= ((0xFF << (8 - kept)) & 0xFF) << (8 * byte)
        masks.append(mask)
    return masks


def _rol(asm: Assembler, dst: int, src: int, shift: int, scratch: int) -> None:
    """``dst = rol32(src, shift)``."""
    asm.mov64(dst, src)
    asm.alu32("lsh", dst, imm=shift)
    asm.mov64(scratch, src)
    asm.alu32("rsh", scratch, imm=32 - shift)
    asm.alu32("or", dst, scratch)


def _jhash(asm: Assembler, words: tuple[int, int, int, int], key_bytes: int, seed: int) -> None:
    """The kernel's ``jhash(key, key_bytes, seed)`` of the masked key words in ``words``
    (registers), result in R9 (R7 = a, R8 = b, R9 = c; R0, R1 scratch)."""
    a, b, c, t, s = R7, R8, R9, R0, R1
    start = (_JHASH_INITVAL + key_bytes + seed) & 0xFFFFFFFF
    for register in (a, b, c):
        asm.alu32("mov", register, imm=start)
    if key_bytes > 12:
        asm.alu32("add", a, words[0])
        asm.alu32("add", b, words[1])
        asm.alu32("add", c, words[2])
        # __jhash_mix
        for x, y, z, shift in ((a, c, b, 4), (b, a, c, 6), (c, b, a, 8), (a, c, b, 16), (b, a, c, 19), (c, b, a, 4)):
            asm.alu32("sub", x, y)
            _rol(asm, t, y, shift, s)
            asm.alu32("xor", x, t)
            asm.alu32("add", y, z)
        asm.alu32("add", a, words[3])
    else:
        asm.alu32("add", a, words[0])
        asm.alu32("add", b, words[1])
        asm.alu32("add", c, words[2])
    # __jhash_final
    for x, y, shift in ((c, b, 14), (a, c, 11), (b, a, 25), (c, b, 16), (a, c, 4), (b, a, 14), (c, b, 24)):
        asm.alu32("xor", x, y)
        _rol(asm, t, y, shift, s)
        asm.alu32("sub", x, t)


def program(plan: TapPlan, lease_map_fd: int, netns: int) -> bytes:
    """The ``sock_ops`` program of ``plan`` (see the module docstring)."""
    asm = Assembler()
    asm.mov64(R6, R1)
    asm.ldx("w", R2, R6, _SOCK_OPS_OP)
    asm.jmp32("jne", R2, "out", imm=_PASSIVE_ESTABLISHED_CB)
    asm.ldx("w", R2, R6, _LOCAL_PORT)
    for port in plan.ports:
        asm.jmp32("jeq", R2, "port", imm=port)
    asm.goto("out")
    asm.label("port")
    asm.ldx("w", R2, R6, _SND_CWND)
    asm.jmp32("jle", R2, "out", imm=1)
    # the lease
    asm.st("w", R10, -4, 0)
    asm.load_imm64(R1, lease_map_fd, pseudo=_bpf.BPF_PSEUDO_MAP_FD)
    asm.mov64(R2, R10)
    asm.alu64("add", R2, imm=-4)
    asm.call(_HELPER_MAP_LOOKUP)
    asm.jmp("jeq", R0, "out", imm=0)
    asm.ldx("dw", R7, R0, 0)
    asm.call(_HELPER_KTIME)
    asm.jmp("jge", R0, "out", src=R7)
    # the namespace
    asm.mov64(R1, R6)
    asm.call(_HELPER_NETNS_COOKIE)
    asm.load_imm64(R2, netns)
    asm.jmp("jne", R0, "out", src=R2)
    # the client's prefix, as masked key words in R2..R5
    masks_v4, masks_v6 = _word_masks(plan.prefix_v4), _word_masks(plan.prefix_v6)
    asm.ldx("w", R2, R6, _FAMILY)
    asm.jmp32("jeq", R2, "v4", imm=_AF_INET)
    asm.jmp32("jne", R2, "out", imm=_AF_INET6)
    asm.ldx("w", R2, R6, _REMOTE_IP6)
    asm.ldx("w", R3, R6, _REMOTE_IP6 + 4)
    asm.ldx("w", R4, R6, _REMOTE_IP6 + 8)
    asm.ldx("w", R5, R6, _REMOTE_IP6 + 12)
    asm.jmp32("jne", R2, "v6", imm=0)
    asm.jmp32("jne", R3, "v6", imm=0)
    asm.jmp32("jne", R4, "v6", imm=0xFFFF0000)  # ::ffff:a.b.c.d, bytes 00 00 ff ff read little-endian
    asm.mov64(R2, R5)
    asm.goto("v4key")
    asm.label("v4")
    asm.ldx("w", R2, R6, _REMOTE_IP4)
    asm.label("v4key")
    asm.alu32("and", R2, imm=masks_v4[0])
    asm.mov64(R3, imm=0)
    asm.mov64(R4, imm=0)
    asm.mov64(R5, imm=0)
    _jhash(asm, (R2, R3, R4, R5), (plan.prefix_v4 + 7) // 8, plan.seed)
    asm.goto("bucket")
    asm.label("v6")
    for register, mask in zip((R2, R3, R4, R5), masks_v6):
        asm.alu32("and", register, imm=mask)
    _jhash(asm, (R2, R3, R4, R5), (plan.prefix_v6 + 7) // 8, plan.seed)
    asm.label("bucket")
    # reciprocal_scale(hash, N): (u64)hash * N >> 32 (R9's upper half is zero after the 32-bit ops)
    asm.alu64("mul", R9, imm=wire.PASSIVE_SHARE_SCALE)
    asm.alu64("rsh", R9, imm=32)
    for index, arm in enumerate(plan.treated):
        skip = f"arm{index}"
        asm.jmp("jlt", R9, skip, imm=arm.low)
        asm.jmp("jgt", R9, skip, imm=arm.high)
        asm.mov64(R2, imm=int(arm.iw or 0))
        asm.goto("set")
        asm.label(skip)
    asm.goto("out")
    asm.label("set")
    asm.stx("w", R10, -8, R2)
    asm.mov64(R1, R6)
    asm.mov64(R2, imm=_SOL_TCP)
    asm.mov64(R3, imm=_TCP_BPF_IW)
    asm.mov64(R4, R10)
    asm.alu64("add", R4, imm=-8)
    asm.mov64(R5, imm=4)
    asm.call(_HELPER_SETSOCKOPT)
    asm.label("out")
    asm.mov64(R0, imm=1)
    asm.exit()
    return asm.assemble()


def _expiry(lease_s: float) -> bytes:
    return struct.pack("<Q", time.monotonic_ns() + int(lease_s * 1e9))


class BpfArms:
    """The arms of one agent by ``sock_ops`` (its fds: closing them, or dying, removes them)."""

    method = "bpf"

    def __init__(self, cgroup: Optional[str] = None) -> None:
        self.cgroup = cgroup
        self._map_fd: Optional[int] = None
        self._link_fd: Optional[int] = None

    def install(self, plan: TapPlan, state_path: str) -> Installed:
        """Load ``plan``'s program and attach it; an earlier plan's link is closed only after
        the new one is attached (a moment with both: the newer runs last and its window wins)."""
        map_fd = prog_fd = cgroup_fd = -1
        try:
            cgroup_fd, cgroup = open_cgroup(self.cgroup)
            map_fd = _bpf.create_array_map(8, 1, LEASE_MAP_NAME)
            _bpf.update_map(map_fd, 0, _expiry(plan.lease_s))
            prog_fd = _bpf.load_program(
                program(plan, map_fd, _bpf.netns_cookie()), _bpf.BPF_PROG_TYPE_SOCK_OPS, _bpf.BPF_CGROUP_SOCK_OPS, PROGRAM_NAME
            )
            link_fd = _bpf.link_cgroup(prog_fd, cgroup_fd, _bpf.BPF_CGROUP_SOCK_OPS)
            map_id, _ = _bpf.map_info(map_fd)
        except OSError as error:
            if map_fd >= 0:
                os.close(map_fd)
            raise ArmsError(f"the BPF arms could not be installed: {error}") from None
        finally:
            for fd in (prog_fd, cgroup_fd):
                if fd >= 0:
                    os.close(fd)
        self._close()
        self._map_fd, self._link_fd = map_fd, link_fd
        installed = Installed(
            nft_table="",
            pid=os.getpid(),
            installed_at=time.time(),
            plan_key=list(plan.key),
            method="bpf",
            bpf_map_id=map_id,
            cgroup=cgroup,
        )
        _save(state_path, installed)
        log.info(
            "arms installed (BPF sock_ops on %s): %s on ports %s (lease %.0f s)",
            cgroup,
            ", ".join(f"{arm.arm} {arm.share_bp / 100:g} %" for arm in plan.arms),
            plan.ports,
            plan.lease_s,
        )
        return installed

    def renew_lease(self, plan: TapPlan) -> None:
        if self._map_fd is None:
            raise ArmsError("no BPF arms installed")
        try:
            _bpf.update_map(self._map_fd, 0, _expiry(plan.lease_s))
        except OSError as error:
            raise ArmsError(f"renewing the BPF arms' lease failed: {error}") from None

    def remove(self, state_path: str, plan: Optional[TapPlan] = None) -> list[str]:
        removed = [f"BPF sock_ops program {PROGRAM_NAME}"] if self._link_fd is not None else []
        self._close()
        removed += end_lease(state_path)
        return removed

    def _close(self) -> None:
        for fd in (self._link_fd, self._map_fd):
            if fd is not None:
                os.close(fd)
        self._link_fd = self._map_fd = None


def _open_lease_map(state_path: str) -> tuple[Optional[int], Optional[Installed]]:
    """An fd of the lease map ``state_path`` records (``None`` when there is no BPF record, or
    its map went with its agent), and the record."""
    installed = load_installed(state_path)
    if installed is None or not installed.bpf_map_id:
        return None, installed
    try:
        fd = _bpf.map_fd_by_id(installed.bpf_map_id)
    except OSError:
        return None, installed
    try:
        if _bpf.map_info(fd)[1] == LEASE_MAP_NAME:
            return fd, installed
    except OSError:
        pass
    os.close(fd)  # the id was reused by another map
    return None, installed


def end_lease(state_path: str) -> list[str]:
    """End the lease of the BPF arms recorded in ``state_path`` (from any process: ``disable``)
    and forget the record; new connections get the server's own window from now on."""
    fd, installed = _open_lease_map(state_path)
    done: list[str] = []
    if fd is not None and installed is not None:
        try:
            _bpf.update_map(fd, 0, struct.pack("<Q", 0))
            done.append(f"BPF arms' lease (map {installed.bpf_map_id})")
        finally:
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state_path)
    return done


def lease_remaining_s(state_path: str) -> Optional[float]:
    fd, _ = _open_lease_map(state_path)
    if fd is None:
        return None
    try:
        (expiry,) = struct.unpack("<Q", _bpf.lookup_map(fd, 0, 8))
    finally:
        os.close(fd)
    remaining = (expiry - time.monotonic_ns()) / 1e9
    return remaining if remaining > 0 else None
