"""Policy routing that gives each arm its initial window: marks, rules and tables.

Each listener carries ``SO_MARK`` = ``mark_base + slot`` (the arm's slot: its IW, or
:data:`iwprobe._arms.LEARNED_SLOT`).  An ``ip rule fwmark M lookup T`` sends the listener's
traffic to table ``T`` = ``table_base + slot``, whose routes are copies of the main table's
routes with ``initcwnd iw initrwnd R``.  The kernel reads the initial window from the route
when the connection is established.  The learned arm's table also receives per-client-prefix
routes at run time (:mod:`iwprobe._learned`).

Both address families get the same marks, rule priorities and table numbers (rules and
tables are per family in the kernel): an origin bound to an IPv6 address needs the ``ip -6``
rules and tables, or its connections silently start with the kernel's default IW.  IPv6 is
skipped (with a line saying so) on a host without it (:func:`ipv6_status`).
"""

from __future__ import annotations

import logging
import os
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
#: The address families the rules and tables are installed for, and their ``ip`` option.
FAMILIES = {"ipv4": "-4", "ipv6": "-6"}
IPV6_SYSCTL_DIR = "/proc/sys/net/ipv6"
_ROUTE_FLAGS = {
    "linkdown",
    "dead",
    "offload",
    "trap",
    "rt_offload",
    "rt_trap",
    "rt_offload_failed",
    "offload_failed",
    "pervasive",
    "notify",
}
#: Words that ``ip route show`` prints with a value that ``ip route replace`` must not get back:
#: the table's own metrics (replaced by the arm's) and an RA route's remaining lifetime.
_DROPPED_WITH_VALUE = {"initcwnd", "initrwnd", "expires"}
_SKIPPED_TYPES = ("broadcast", "local", "anycast", "multicast", "unreachable", "prohibit", "blackhole", "throw", "nat")


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

    def priority(self, arm: Union[Arm, int]) -> int:
        return self.priority_base + (arm.slot if isinstance(arm, Arm) else arm)


def run_ip(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=False, capture_output=True, text=True)


def _flag(family: str) -> str:
    """``"ipv4"``/``"ipv6"`` as the ``ip`` option."""
    try:
        return FAMILIES[family]
    except KeyError:
        raise ValueError(f"address family {family!r}: expected one of {', '.join(FAMILIES)}") from None


def ipv6_status() -> tuple[bool, str]:
    """Whether this host (its network namespace) has IPv6, and if not, why."""
    if not os.path.isdir(IPV6_SYSCTL_DIR):
        return False, f"{IPV6_SYSCTL_DIR} missing (kernel without IPv6 or booted with ipv6.disable=1)"
    try:
        with open(os.path.join(IPV6_SYSCTL_DIR, "conf", "all", "disable_ipv6"), encoding="ascii") as handle:
            if handle.read().strip() == "1":
                return False, "net.ipv6.conf.all.disable_ipv6=1"
    except OSError:
        pass
    return True, ""


def parse_routes(text: str, keep_initrwnd: bool = False) -> list[str]:
    """The unicast routes of ``ip route show`` output, flags and per-route metrics removed.

    A multipath route's ``nexthop`` lines (indented continuation lines) are joined to it.
    ``keep_initrwnd`` keeps a route's own ``initrwnd`` (``iwprobe tap`` changes the initial
    congestion window of a real server's connections and nothing else)."""
    joined: list[str] = []
    for line in text.splitlines():
        if line[:1].isspace() and joined:
            joined[-1] += " " + line.strip()
        elif line.strip():
            joined.append(line.strip())
    routes = []
    for line in joined:
        words = [w for w in line.split() if w not in _ROUTE_FLAGS]
        if not words or words[0] in _SKIPPED_TYPES:
            continue
        dropped = set(_DROPPED_WITH_VALUE) - ({"initrwnd"} if keep_initrwnd else set())
        if {"via", "dev", "nexthop"} & set(words):
            dropped.add("nhid")  # a nexthop object shown resolved: ``replace`` takes one or the other
        cleaned: list[str] = []
        skip = False
        for word in words:
            if skip:
                skip = False
                continue
            if word in dropped:
                skip = True
                continue
            cleaned.append(word)
        routes.append(" ".join(cleaned))
    return routes


def main_routes(family: str = "ipv4", keep_initrwnd: bool = False) -> list[str]:
    """The main table's unicast routes as ``ip route`` prints them, flags removed."""
    output = run_ip(["ip", _flag(family), "route", "show", "table", "main"])
    if output.returncode != 0:
        raise RuntimeError(f"ip {_flag(family)} route show failed: {output.stderr.strip()}")
    return parse_routes(output.stdout, keep_initrwnd)


def route_commands(plan: RoutePlan, routes: Optional[list[str]] = None, family: str = "ipv4") -> list[list[str]]:
    """The ``ip`` commands that make an arm's connections start with its ``initcwnd``.

    One family per call (``"ipv4"`` or ``"ipv6"``); ``routes`` defaults to that family's main table."""
    flag = _flag(family)
    routes = main_routes(family) if routes is None else routes
    commands: list[list[str]] = []
    for arm in plan.slots():
        table = str(plan.table(arm))
        commands.append(["ip", flag, "route", "flush", "table", table])
        for route in routes:
            commands.append(
                [
                    "ip",
                    flag,
                    "route",
                    "replace",
                    *route.split(),
                    "table",
                    table,
                    "initcwnd",
                    str(arm.iw),
                    "initrwnd",
                    str(plan.initrwnd),
                ]
            )
        commands.append(
            ["ip", flag, "rule", "add", "priority", str(plan.priority(arm)), "fwmark", hex(plan.mark(arm)), "lookup", table]
        )
    return commands


def _has_rule(rules: str, priority: str, mark: str, table: str) -> bool:
    """Whether ``ip rule show`` output ``rules`` holds ``priority: ... fwmark mark ... lookup table``."""
    return re.search(rf"^{priority}:\s.*fwmark {mark}\b.*lookup {table}\b", rules, re.M) is not None


def _install(commands: list[list[str]], existing_rules: str, dry_run: bool) -> list[str]:
    printed: list[str] = []
    for command in commands:
        printed.append(" ".join(command))
        if dry_run:
            continue
        if command[2] == "rule" and _has_rule(existing_rules, command[5], command[7], command[9]):
            continue
        outcome = run_ip(command)
        if outcome.returncode != 0 and command[3] == "flush":
            continue  # the table did not exist yet
        if outcome.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {outcome.stderr.strip()}")
    return printed


def setup_routes(plan: RoutePlan, dry_run: bool = False) -> list[str]:
    """Install rules and tables for IPv4 and IPv6 (idempotent: existing rules are kept, tables
    rebuilt).  Returns the commands; on a host without IPv6, a ``#`` line says it was skipped."""
    printed: list[str] = []
    for family, flag in FAMILIES.items():
        if family == "ipv6":
            available, reason = ipv6_status()
            if not available:
                log.info("IPv6 rules and tables skipped: %s", reason)
                printed.append(f"# ipv6 skipped: {reason}")
                continue
        commands = route_commands(plan, family=family)
        existing_rules = "" if dry_run else run_ip(["ip", flag, "rule", "show"]).stdout
        printed += _install(commands, existing_rules, dry_run)
    return printed


def missing_rule_families(plan: RoutePlan) -> list[str]:
    """The families (``"ipv4"``, ``"ipv6"``) in which some arm's fwmark rule is missing.

    IPv6 is not reported on a host without IPv6 (no IPv6 connection can miss its rule there).
    A family whose rules cannot be read counts as missing."""
    missing: list[str] = []
    for family, flag in FAMILIES.items():
        if family == "ipv6" and not ipv6_status()[0]:
            continue
        outcome = run_ip(["ip", flag, "rule", "show"])
        if outcome.returncode != 0 or not all(
            _has_rule(outcome.stdout, str(plan.priority(arm)), hex(plan.mark(arm)), str(plan.table(arm))) for arm in plan.slots()
        ):
            missing.append(family)
    return missing


def ensure_no_metrics_save() -> bool:
    """Set ``net.ipv4.tcp_no_metrics_save=1`` so cached ssthresh/cwnd never leak between trials.

    The sysctl lives under ``net.ipv4`` but covers IPv6 connections too (``tcp_metrics`` is
    shared by both families)."""
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
        log.warning(
            "!!! could not set net.ipv4.tcp_no_metrics_save=1 (%s): the kernel may cache "
            "ssthresh and cwnd per destination and later trials will not start from the "
            "arm's IW. Run as root or set the sysctl before starting the origin !!!",
            error,
        )
        return False
