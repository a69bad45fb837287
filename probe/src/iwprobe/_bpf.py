"""Just enough eBPF to load one program without libbpf: an assembler and the ``bpf()`` calls.

The probe and the server agent stay standard-library-only (they run on production servers that
have no compiler, clang or libbpf), so the one eBPF program iwscope loads
(:mod:`iwprobe._tap_bpf`) is written here as instructions, assembled by :class:`Assembler`, and
loaded through the ``bpf()`` system call via ``ctypes``.  Nothing here is specific to that
program: instruction encodings follow ``Documentation/bpf/standardization/instruction-set.rst``;
the ``union bpf_attr`` layouts are those of ``include/uapi/linux/bpf.h`` (stable ABI).

The kernel checks every program (the verifier) before it runs; its log comes back in
:class:`BpfError` when a load is refused.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Optional

#: ``bpf()`` system call numbers per architecture.
_SYSCALL = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351, "riscv64": 280}

# commands
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_PROG_LOAD = 5
BPF_MAP_GET_FD_BY_ID = 14
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_LINK_CREATE = 28
# types
BPF_MAP_TYPE_ARRAY = 2
BPF_PROG_TYPE_SOCK_OPS = 13
BPF_CGROUP_SOCK_OPS = 3
BPF_PSEUDO_MAP_FD = 1

# registers
R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)

# instruction classes and fields
_LD, _LDX, _ST, _STX, _ALU, _JMP, _JMP32, _ALU64 = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07
_W, _DW = 0x00, 0x18
_IMM, _MEM = 0x00, 0x60
_K, _X = 0x00, 0x08
_ALU_OPS = {"add": 0x00, "sub": 0x10, "mul": 0x20, "or": 0x40, "and": 0x50, "lsh": 0x60, "rsh": 0x70, "xor": 0xA0, "mov": 0xB0}
_JMP_OPS = {"ja": 0x00, "jeq": 0x10, "jgt": 0x20, "jge": 0x30, "jne": 0x50, "jlt": 0xA0, "jle": 0xB0}
_CALL, _EXIT = 0x80, 0x90

_INSN = struct.Struct("<BBhi")


class BpfError(OSError):
    """A ``bpf()`` call failed; for a refused program, ``log`` holds the verifier's reasons."""

    def __init__(self, errno_: int, message: str, log: str = "") -> None:
        super().__init__(errno_, message + (f"\n{log.strip()}" if log else ""))
        self.log = log


class Assembler:
    """eBPF instructions with named jump targets (resolved by :meth:`assemble`)."""

    def __init__(self) -> None:
        self._insns: list[tuple[int, int, int, int, int, Optional[str]]] = []
        self._labels: dict[str, int] = {}

    def _emit(self, code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0, target: Optional[str] = None) -> None:
        self._insns.append((code, dst, src, off, imm, target))

    def label(self, name: str) -> None:
        if name in self._labels:
            raise ValueError(f"label {name} defined twice")
        self._labels[name] = len(self._insns)

    # -- arithmetic: ``alu64`` on the whole register, ``alu32`` on its low half (upper half zeroed)
    def alu64(self, op: str, dst: int, src: Optional[int] = None, imm: int = 0) -> None:
        self._emit(_ALU64 | _ALU_OPS[op] | (_X if src is not None else _K), dst, src or 0, 0, _s32(imm))

    def alu32(self, op: str, dst: int, src: Optional[int] = None, imm: int = 0) -> None:
        self._emit(_ALU | _ALU_OPS[op] | (_X if src is not None else _K), dst, src or 0, 0, _s32(imm))

    def mov64(self, dst: int, src: Optional[int] = None, imm: int = 0) -> None:
        self.alu64("mov", dst, src, imm)

    def load_imm64(self, dst: int, value: int, pseudo: int = 0) -> None:
        """``dst = value`` (64 bits; ``pseudo=BPF_PSEUDO_MAP_FD``: ``value`` is a map's fd)."""
        value &= (1 << 64) - 1
        self._emit(_LD | _DW | _IMM, dst, pseudo, 0, _s32(value & 0xFFFFFFFF))
        self._emit(0, 0, 0, 0, _s32(value >> 32))

    # -- memory
    def ldx(self, size: str, dst: int, src: int, off: int) -> None:
        self._emit(_LDX | _MEM | _size(size), dst, src, off)

    def stx(self, size: str, dst: int, off: int, src: int) -> None:
        self._emit(_STX | _MEM | _size(size), dst, src, off)

    def st(self, size: str, dst: int, off: int, imm: int) -> None:
        self._emit(_ST | _MEM | _size(size), dst, 0, off, _s32(imm))

    # -- control flow: ``jmp`` compares 64 bits, ``jmp32`` the low 32
    def jmp(self, op: str, dst: int, target: str, src: Optional[int] = None, imm: int = 0) -> None:
        self._emit(_JMP | _JMP_OPS[op] | (_X if src is not None else _K), dst, src or 0, 0, _s32(imm), target)

    def jmp32(self, op: str, dst: int, target: str, src: Optional[int] = None, imm: int = 0) -> None:
        self._emit(_JMP32 | _JMP_OPS[op] | (_X if src is not None else _K), dst, src or 0, 0, _s32(imm), target)

    def goto(self, target: str) -> None:
        self._emit(_JMP | _JMP_OPS["ja"], target=target)

    def call(self, helper: int) -> None:
        self._emit(_JMP | _CALL, imm=helper)

    def exit(self) -> None:
        self._emit(_JMP | _EXIT)

    def assemble(self) -> bytes:
        out = bytearray()
        for index, (code, dst, src, off, imm, target) in enumerate(self._insns):
            if target is not None:
                if target not in self._labels:
                    raise ValueError(f"jump to undefined label {target}")
                off = self._labels[target] - index - 1
                if not -32768 <= off <= 32767:
                    raise ValueError("jump too far")
            out += _INSN.pack(code, (src << 4) | dst, off, imm)
        return bytes(out)


def _size(size: str) -> int:
    return {"b": 0x10, "h": 0x08, "w": _W, "dw": _DW}[size]


def _s32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


# ----------------------------------------------------------------- the system call
_libc: Optional[ctypes.CDLL] = None


def _call(command: int, attr: ctypes.Array[ctypes.c_char], what: str, log: Optional[ctypes.Array[ctypes.c_char]] = None) -> int:
    global _libc
    machine = os.uname().machine
    number = _SYSCALL.get(machine)
    if number is None:
        raise BpfError(38, f"bpf(): unknown system call number on {machine}")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    result = int(_libc.syscall(ctypes.c_long(number), ctypes.c_int(command), attr, ctypes.c_uint(len(attr))))
    if result < 0:
        error = ctypes.get_errno()
        text = log.value.decode("utf-8", "replace") if log is not None else ""
        raise BpfError(error, f"{what}: {os.strerror(error)}", text)
    return result


def _attr(*fields: tuple[int, str, int | bytes]) -> ctypes.Array[ctypes.c_char]:
    """A zeroed ``union bpf_attr`` (120 bytes covers every command used here) with fields set."""
    buffer = ctypes.create_string_buffer(120)
    for offset, fmt, value in fields:
        struct.pack_into("<" + fmt, buffer, offset, value)
    return buffer


def create_array_map(value_size: int, entries: int = 1, name: str = "") -> int:
    """A ``BPF_MAP_TYPE_ARRAY`` of ``entries`` values (u32 keys); returns its fd."""
    attr = _attr((0, "I", BPF_MAP_TYPE_ARRAY), (4, "I", 4), (8, "I", value_size), (12, "I", entries), (28, "15s", name.encode()))
    return _call(BPF_MAP_CREATE, attr, "creating a BPF map")


def update_map(fd: int, key: int, value: bytes) -> None:
    key_buffer = ctypes.create_string_buffer(struct.pack("<I", key), 4)
    value_buffer = ctypes.create_string_buffer(value, len(value))
    attr = _attr((0, "I", fd), (8, "Q", ctypes.addressof(key_buffer)), (16, "Q", ctypes.addressof(value_buffer)), (24, "Q", 0))
    _call(BPF_MAP_UPDATE_ELEM, attr, "updating a BPF map")


def lookup_map(fd: int, key: int, value_size: int) -> bytes:
    key_buffer = ctypes.create_string_buffer(struct.pack("<I", key), 4)
    value_buffer = ctypes.create_string_buffer(value_size)
    attr = _attr((0, "I", fd), (8, "Q", ctypes.addressof(key_buffer)), (16, "Q", ctypes.addressof(value_buffer)))
    _call(BPF_MAP_LOOKUP_ELEM, attr, "reading a BPF map")
    return value_buffer.raw


def map_fd_by_id(map_id: int) -> int:
    return _call(BPF_MAP_GET_FD_BY_ID, _attr((0, "I", map_id)), f"opening BPF map {map_id}")


def map_info(fd: int) -> tuple[int, str]:
    """(id, name) of a map (``struct bpf_map_info``: id at 4, name at 24)."""
    info = ctypes.create_string_buffer(88)
    attr = _attr((0, "I", fd), (4, "I", len(info)), (8, "Q", ctypes.addressof(info)))
    _call(BPF_OBJ_GET_INFO_BY_FD, attr, "reading a BPF map's info")
    (map_id,) = struct.unpack_from("<I", info, 4)
    return map_id, info.raw[24:40].split(b"\0", 1)[0].decode("ascii", "replace")


def load_program(program: bytes, prog_type: int, expected_attach_type: int, name: str, license_: str = "Dual MIT/GPL") -> int:
    """Load ``program`` (the verifier checks it); returns its fd, or raises with the verifier's log."""
    insns = ctypes.create_string_buffer(program, len(program))
    license_buffer = ctypes.create_string_buffer(license_.encode())
    log = ctypes.create_string_buffer(64 * 1024)
    attr = _attr(
        (0, "I", prog_type),
        (4, "I", len(program) // 8),
        (8, "Q", ctypes.addressof(insns)),
        (16, "Q", ctypes.addressof(license_buffer)),
        (24, "I", 1),  # log_level: the reasons of a refusal
        (28, "I", len(log)),
        (32, "Q", ctypes.addressof(log)),
        (48, "15s", name.encode()),  # prog_name
        (68, "I", expected_attach_type),
    )
    return _call(BPF_PROG_LOAD, attr, f"loading BPF program {name}", log)


def link_cgroup(prog_fd: int, cgroup_fd: int, attach_type: int) -> int:
    """Attach a program to a cgroup through a BPF link: it stays attached exactly as long as
    the returned fd (or a copy of it) is open -- the process that holds it dying detaches it."""
    attr = _attr((0, "I", prog_fd), (4, "I", cgroup_fd), (8, "I", attach_type), (12, "I", 0))
    return _call(BPF_LINK_CREATE, attr, "attaching the BPF program to the cgroup")


SO_NETNS_COOKIE = 71


def netns_cookie() -> int:
    """The kernel's cookie of this process's network namespace (``SO_NETNS_COOKIE``, Linux 5.14)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        return int(struct.unpack("<Q", probe.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0])
