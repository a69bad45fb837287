"""State of lab runs on this machine, and the cleanup of what crashed or stopped runs left behind.

Every run keeps ``STATE_ROOT/<run>/state.json`` (written by :class:`~iwscope_lab.topology.Topology`
before anything is created, updated as things are): its namespaces, root devices and emulator
processes, so that :func:`cleanup` can remove them even when the run's owner is gone.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from ._netns import LabError, alive, existing_namespaces, ip, namespace_pids, terminate

__all__ = ["STATE_ROOT", "RUN_ID_RE", "read_state", "list_runs", "run_healthy", "run_is_stale", "cleanup_run", "cleanup"]

#: Where run state is kept (tmpfs: a reboot clears it together with the namespaces).
STATE_ROOT = Path(os.environ.get("IWSCOPE_LAB_STATE_DIR", "/run/iwscope-lab"))
#: Run ids: a prefix (``iws`` for the lab, ``iwt`` for tests) and up to 8 more characters,
#: so device names ``<run>h<index>`` fit the kernel's 15 characters.
RUN_ID_RE = re.compile(r"^(iws|iwt)[a-z0-9]{1,8}$")


def read_state(state_dir: Path) -> dict[str, Any] | None:
    """The run's recorded state; None if there is none, a ``corrupt`` stub if it is unreadable."""
    try:
        state: dict[str, Any] = json.loads((state_dir / "state.json").read_text())
        return state
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        return {"run_id": state_dir.name, "namespaces": [], "root_devices": [], "emulators": {}, "hosts": [], "corrupt": True}


def list_runs() -> list[dict[str, Any]]:
    """State of every lab run on this machine (live or left over)."""
    runs = []
    if STATE_ROOT.is_dir():
        for entry in sorted(STATE_ROOT.iterdir()):
            if entry.is_dir():
                state = read_state(entry)
                if state is not None:
                    runs.append(state)
    return runs


def run_healthy(state: dict[str, Any]) -> bool:
    """Every emulator of the run is alive and every namespace exists."""
    if state.get("corrupt") or not state.get("emulators"):
        return False
    if len(state["emulators"]) != len(state.get("hosts", [])):
        return False
    if not all(alive(info["pid"], info.get("start_time")) for info in state["emulators"].values()):
        return False
    return set(state.get("namespaces", [])) <= existing_namespaces()


def run_is_stale(state: dict[str, Any]) -> bool:
    """Left over: its owner died (attached runs) or it is broken (detached runs)."""
    if state.get("corrupt"):
        return True
    if not state.get("detached"):
        return not alive(state.get("owner_pid"), state.get("owner_start_time"))
    return not run_healthy(state)


def cleanup_run(state: dict[str, Any]) -> None:
    """Kill the run's processes, delete its devices and namespaces and its state directory."""
    run_id = state["run_id"]
    if not RUN_ID_RE.match(run_id):
        raise LabError(f"refusing to clean up {run_id!r}: not a lab run id")
    pids: set[int] = set()
    for info in state.get("emulators", {}).values():
        if alive(info.get("pid"), info.get("start_time")):
            pids.add(int(info["pid"]))
    existing = existing_namespaces()
    namespaces = [n for n in state.get("namespaces", []) if n.startswith(f"{run_id}-")]
    namespaces += [n for n in existing if n.startswith(f"{run_id}-") and n not in namespaces]
    for netns in namespaces:
        if netns in existing:
            pids.update(namespace_pids(netns))
    pids.discard(os.getpid())
    terminate(pids)
    for device in state.get("root_devices", []) or [f"{run_id}r"]:
        if device.startswith(run_id):
            ip(["link", "del", device], check=False)
    for netns in namespaces:
        if netns in existing:
            result = ip(["netns", "del", netns], check=False)
            if result.returncode != 0 and "No such file" not in result.stderr:
                raise LabError(f"deleting namespace {netns}: {result.stderr.strip()}")
    state_dir = STATE_ROOT / run_id
    try:
        shutil.rmtree(state_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def cleanup(all_runs: bool = False) -> list[str]:
    """Remove left-over runs (owner dead or broken); every run with ``all_runs``. Returns run ids."""
    removed = []
    for state in list_runs():
        if all_runs or run_is_stale(state):
            cleanup_run(state)
            removed.append(state["run_id"])
    if all_runs:
        # Namespaces of the lab's prefix whose state was lost.
        for netns in sorted(existing_namespaces()):
            run_id = netns.split("-", 1)[0]
            if RUN_ID_RE.match(run_id) and "-" in netns and run_id not in removed:
                cleanup_run({"run_id": run_id, "namespaces": [netns], "root_devices": [f"{run_id}r"], "emulators": {}})
                removed.append(run_id)
    return removed
