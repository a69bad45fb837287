"""Policy routing that gives each arm its initial window: marks, rules and tables.

Each listener carries ``SO_MARK`` = ``mark_base + slot`` (the arm's slot: its IW, or
:data:`iwprobe._arms.LEARNED_SLOT`).  An ``ip rule fwmark M lookup T`` sends the listener's
traffic to table ``T`` = ``table_base + slot``, whose routes are copies of the main table's
routes with ``initcwnd iw initrwnd R``.  The kernel reads the initial window from the route
when the connection is established.  The learned arm's table also receives per-client-prefix
routes at run time (:mod:`iwprobe._learned`).
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional, Union

from ._arms import Arm, parse_arms

log = logging.getLogger("iwprobe.origin")

#: fwmark of the arm in slot ``n`` is ``DEFAULT_MARK_BASE + n``.
DEFAULT_MARK_BASE = 0x1F000
#: Routing table of the arm in slot ``n`` is ``DEFAULT_TABLE_BASE + n``.
DEFAULT_TABLE_BASE = 21000
#: Priority of the arm's ``ip rule`` is ``DEFAULT_RULE_PRIORITY_BASE + n`` (before main, 32766).
DEFAULT_RULE_PRIORITY_BASE = 9000
#: Initial receive window the arm routes advertise (segments); large so it never limits.
DEFAULT_INITRWND = 64
NO_METRICS_SAVE = "/proc/sys/net/ipv4/tcp_no_metrics_save"
_ROUTE_FLAGS = {"linkdown", "dead", "offload", "trap", "rt_offload", "rt_trap", "pervasive", "notify"}


@dataclass
class RoutePlan:
    """How arms map to marks and tables (``arms``: labels, ints or :class:`Arm`)."""

    arms: Sequence[Union[Arm, int, str]]
    mark_base: int = DEFAULT_MARK_BASE
    table_base: int = DEFAULT_TABLE_BASE
    priority_base: int = DEFAULT_RULE_PRIORITY_BASE
    initrwnd: int = DEFAULT_INITRWND

    def policies(self) -> list[Arm]:
        return parse_arms(list(self.arms))

    def slots(self) -> list[Arm]:
        """One arm per routing table (``N`` and ``Np`` share one)."""
        by_slot: dict[int, Arm] = {}
        for arm in self.policies():
            by_slot.setdefault(arm.slot, arm)
        return [by_slot[slot] for slot in sorted(by_slot)]

    def mark(self, arm: Union[Arm, int]) -> int:
        return self.mark_base + (arm.slot if isinstance(arm, Arm) else arm)

    def table(self, arm: Union[Arm, int]) -> int:
        return self.table_base + (arm.slot if isinstance(arm, Arm) else arm)


def run_ip(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=False, capture_output=True, text=True)


def main_routes(family: str = "-4") -> list[str]:
    """The main table's unicast routes as ``ip route`` prints them, flags removed."""
    output = run_ip(["ip", family, "route", "show", "table", "main"])
    if output.returncode != 0:
        raise RuntimeError(f"ip route show failed: {output.stderr.strip()}")
    routes = []
    for line in output.stdout.splitlines():
        words = [w for w in line.split() if w not in _ROUTE_FLAGS]
        if not words or words[0] in ("broadcast", "local", "anycast", "multicast", "unreachable", "prohibit", "blackhole"):
            continue
        cleaned: list[str] = []
        skip = False
        for word in words:
            if skip:
                skip = False
                continue
            if word in ("initcwnd", "initrwnd"):
                skip = True
                continue
            cleaned.append(word)
        routes.append(" ".join(cleaned))
    return routes


def route_commands(plan: RoutePlan, routes: Optional[list[str]] = None) -> list[list[str]]:
    """The ``ip`` commands that make an arm's connections start with its ``initcwnd``."""
    routes = main_routes() if routes is None else routes
    commands: list[list[str]] = []
    for arm in plan.slots():
        table = str(plan.table(arm))
        commands.append(["ip", "-4", "route", "flush", "table", table])
        for route in routes:
            commands.append(["ip", "-4", "route", "replace", *route.split(), "table", table,
                             "initcwnd", str(arm.iw), "initrwnd", str(plan.initrwnd)])
        commands.append(["ip", "-4", "rule", "add", "priority", str(plan.priority_base + arm.slot),
                         "fwmark", hex(plan.mark(arm)), "lookup", table])
    return commands


def setup_routes(plan: RoutePlan, dry_run: bool = False) -> list[str]:
    """Install rules and tables (idempotent: existing rules are kept, tables rebuilt)."""
    commands = route_commands(plan)
    existing_rules = run_ip(["ip", "-4", "rule", "show"]).stdout
    printed: list[str] = []
    for command in commands:
        printed.append(" ".join(command))
        if dry_run:
            continue
        if command[2] == "rule":
            priority, mark, table = command[5], command[7], command[9]
            if re.search(rf"^{priority}:\s.*fwmark {mark}\b.*lookup {table}\b", existing_rules, re.M):
                continue
        outcome = run_ip(command)
        if outcome.returncode != 0 and command[3] == "flush":
            continue  # the table did not exist yet
        if outcome.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {outcome.stderr.strip()}")
    return printed


def ensure_no_metrics_save() -> bool:
    """Set ``net.ipv4.tcp_no_metrics_save=1`` so cached ssthresh/cwnd never leak between trials."""
    try:
        with open(NO_METRICS_SAVE, "r+", encoding="ascii") as handle:
            if handle.read().strip() != "1":
                handle.seek(0)
                handle.write("1\n")
        return True
    except OSError as error:
        try:
            with open(NO_METRICS_SAVE, encoding="ascii") as handle:
                if handle.read().strip() == "1":
                    return True
        except OSError:
            pass
        log.warning("!!! could not set net.ipv4.tcp_no_metrics_save=1 (%s): the kernel may cache "
                    "ssthresh and cwnd per destination and later trials will not start from the "
                    "arm's IW. Run as root or set the sysctl before starting the origin !!!", error)
        return False
