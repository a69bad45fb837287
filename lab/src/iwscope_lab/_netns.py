"""System helpers of the lab: ``ip`` commands and sysctls in namespaces, the processes the lab
started, the emulator binary and its control socket.

Used by :mod:`iwscope_lab.topology`, :mod:`iwscope_lab.addressing` and :mod:`iwscope_lab.runstate`;
callers import the public names (``LabError``, ``emulator_path``) from :mod:`iwscope_lab.topology`.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "LabError",
    "ip",
    "ip_batch",
    "sysctl",
    "emulator_path",
    "spawn_emulator",
    "wait_emulator_ready",
    "process_start_time",
    "alive",
    "existing_namespaces",
    "namespace_pids",
    "terminate",
    "reap",
    "control",
]


class LabError(RuntimeError):
    """A lab operation failed; the message says which step and why."""


def ip(
    args: Sequence[str], *, namespace: str | None = None, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``ip [-n namespace] args``; LabError when it fails and ``check`` is set."""
    cmd = ["ip"] + (["-n", namespace] if namespace else []) + list(args)
    result = subprocess.run(cmd, capture_output=True, text=True, input=stdin)
    if check and result.returncode != 0:
        raise LabError(f"`{' '.join(cmd)}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def ip_batch(namespace: str | None, lines: Iterable[str]) -> None:
    """Run several ``ip`` commands in one process (``ip -batch -``)."""
    ip(["-batch", "-"], namespace=namespace, stdin="\n".join(lines) + "\n")


def sysctl(netns: str, settings: Mapping[str, str]) -> None:
    """Write /proc/sys values inside ``netns`` (plain sh: no dependency on procps' sysctl)."""
    commands = []
    for key, value in settings.items():
        if not re.match(r"^[a-z0-9_.]+$", key) or not re.match(r"^[A-Za-z0-9_ .-]*$", str(value)):
            raise LabError(f"sysctl {key}={value!r}: unexpected characters")
        commands.append(f"echo '{value}' > /proc/sys/{key.replace('.', '/')}")
    result = subprocess.run(["ip", "netns", "exec", netns, "sh", "-ec", "; ".join(commands)], capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"sysctl in {netns} failed: {result.stderr.strip()}")


def emulator_path() -> Path:
    """The iwemu binary: ``$IWSCOPE_LAB_EMULATOR`` or ``lab/emulator/iwemu`` (built if missing)."""
    configured = os.environ.get("IWSCOPE_LAB_EMULATOR")
    if configured:
        return Path(configured)
    source_dir = Path(__file__).resolve().parents[2] / "emulator"
    binary = source_dir / "iwemu"
    source = source_dir / "iwemu.c"
    if source.exists() and (not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime):
        result = subprocess.run(["make", "-s", "-C", str(source_dir)], capture_output=True, text=True)
        if result.returncode != 0:
            raise LabError(f"building the emulator failed: {result.stderr.strip()}")
    if not binary.exists():
        raise LabError(f"emulator binary {binary} missing: run `make -C {source_dir}`")
    return binary


def spawn_emulator(binary: str, cmd: Sequence[str], log_path: Path) -> tuple[int, int]:
    """Spawn iwemu in its own session (it outlives a detached ``lab up``): (pid, fd of its stdout).

    Its stderr goes to ``log_path``; pass the fd to :func:`wait_emulator_ready`, which closes it."""
    read_fd, write_fd = os.pipe()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pid = os.posix_spawn(
            binary,
            list(cmd),
            dict(os.environ),
            setsid=True,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, write_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
        os.close(log_fd)
    return pid, read_fd


def wait_emulator_ready(pid: int, read_fd: int, log_path: Path, name: str, timeout_s: float) -> None:
    """Wait until the emulator ``pid`` prints "ready"; LabError (with its log) if it exits or times out."""
    try:
        deadline = time.monotonic() + timeout_s
        received = b""
        while b"ready\n" not in received:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LabError(f"emulator for {name} not ready within {timeout_s} s")
            ready, _, _ = select.select([read_fd], [], [], remaining)
            chunk = os.read(read_fd, 64) if ready else b""
            if ready and not chunk:  # EOF: the emulator exited
                reap(pid)
                error = log_path.read_text(errors="replace").strip()
                raise LabError(f"emulator for {name} failed: {error}")
            received += chunk
    finally:
        os.close(read_fd)


def process_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live process, None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def alive(pid: int | None, start_time: int | None) -> bool:
    """Whether ``pid`` is live and (when ``start_time`` is known) still the same process."""
    if not pid:
        return False
    actual = process_start_time(pid)
    return actual is not None and (start_time is None or actual == start_time)


def existing_namespaces() -> set[str]:
    result = ip(["netns", "list"], check=False)
    return {line.split()[0] for line in result.stdout.splitlines() if line.strip()}


def namespace_pids(namespace: str) -> list[int]:
    result = ip(["netns", "pids", namespace], check=False)
    return [int(token) for token in result.stdout.split() if token.isdigit()]


def terminate(pids: Iterable[int], grace_s: float = 1.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace_s`` (only pids the lab started)."""
    pending = set(pids)
    for pid in list(pending):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pending.discard(pid)
    deadline = time.monotonic() + grace_s
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            reap(pid)
            if process_start_time(pid) is None:
                pending.discard(pid)
        time.sleep(0.02)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pending:
        for _ in range(50):
            reap(pid)
            if process_start_time(pid) is None:
                break
            time.sleep(0.02)


def reap(pid: int) -> None:
    """Collect ``pid`` if it is an exited child of this process (no-op otherwise)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def control(socket_path: str | Path, line: str, timeout_s: float = 2.0) -> str:
    """Send one command to an emulator's control socket and return its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))
        sock.sendall(line.encode() + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode()
