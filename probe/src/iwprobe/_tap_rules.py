"""Per-client IW arms on an unmodified server: one nftables rule, policy routes, one sysctl.

No code runs inside the web server.  Three standard kernel pieces give each client's
connections its arm's initial window:

1. an nftables rule in the ``prerouting`` hook (priority ``mangle``) marks every SYN to the
   study's ports with the arm of the client's prefix: ``jhash`` of the source /24 (IPv4) or
   /48 (IPv6) with the study's seed, ``mod`` :data:`~iwprobe.wire.PASSIVE_SHARE_SCALE`, looked
   up in a map of bucket ranges -> marks.  Buckets of the ``default`` arm are not in the map,
   so those SYNs keep mark 0 and their connections take the server's own routes;
2. ``net.ipv4.tcp_fwmark_accept=1`` (both families): an accepted socket whose listener has no
   ``SO_MARK`` takes its SYN's mark, so the SYN-ACK and every later packet carry it;
3. per treated arm an ``ip rule fwmark M lookup T`` and a table ``T`` holding copies of the
   main table's routes with ``initcwnd IW`` (and nothing else changed: the routes' own
   ``initrwnd`` and metrics stay).  ``tcp_init_cwnd()`` reads the IW from that route.

Fail-safe (a dead agent must not leave users on a treated arm): the rule only matches while
the set ``alive`` holds an element, which the agent re-adds every few seconds with a timeout
of :data:`DEFAULT_LEASE_S`.  If the agent dies (``kill -9``, OOM, a hang), the kernel lets the
element expire and from then on no SYN is marked: new connections get the server's default
IW within the lease, with no process needed.  What is left (the now inert table, rules, route
tables and sysctl) is removed by ``iwprobe tap disable``, the systemd unit's ``ExecStopPost``,
or the agent's next start, from the record written before anything is installed
(``tap-installed.json`` in the state directory).

Only what this module created is ever removed: its own nftables table, rules matched by
priority, mark and table together, its own table numbers; the sysctl is put back to the value
it had, unless someone changed it since.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from . import wire
from ._routes import FAMILIES, _has_rule, ipv6_status, main_routes, run_ip

log = logging.getLogger("iwprobe.tap")

#: The nftables table (family ``inet``: one rule set for IPv4 and IPv6).
NFT_TABLE = "iwscope_tap"
#: Marks, routing tables and rule priorities of arm slot ``n`` (1, 2, ...): base + n.  Apart
#: from the instrumented origin's (``iwprobe._routes``), so both can run on one host.
DEFAULT_TAP_MARK_BASE = 0x7A100
DEFAULT_TAP_TABLE_BASE = 22100
DEFAULT_TAP_PRIORITY_BASE = 9100
#: Seconds the arms stay in force without the agent renewing them.
DEFAULT_LEASE_S = 10.0
FWMARK_ACCEPT = "/proc/sys/net/ipv4/tcp_fwmark_accept"
#: The record of what is installed, in the agent's state directory.
STATE_FILE = "tap-installed.json"


class ArmsError(RuntimeError):
    """The arms cannot be installed here (no nft, no permission, a conflicting rule)."""


@dataclass(frozen=True)
class ArmRange:
    """An arm and the hash buckets (inclusive) whose client prefixes it gets."""

    arm: str
    #: The IW it sets; ``None`` for the default arm (the server's own).
    iw: Optional[int]
    low: int
    high: int
    #: 1, 2, ... for treated arms (their mark, table and priority), 0 for the default arm.
    slot: int

    @property
    def share_bp(self) -> int:
        return self.high - self.low + 1


def arm_ranges(arms: Sequence[wire.PassiveArm]) -> list[ArmRange]:
    """Bucket ranges of a study's arms: treated arms from the top of the range down, in the
    order listed; the default arm the rest from 0.  So changing only the last-listed treated
    arm's share moves prefixes between it and the default arm, and no other."""
    if sum(arm.share_bp for arm in arms) != wire.PASSIVE_SHARE_SCALE:
        raise ValueError(f"arm shares must sum to {wire.PASSIVE_SHARE_SCALE} basis points")
    ranges: list[ArmRange] = []
    top = wire.PASSIVE_SHARE_SCALE
    slot = 0
    default: Optional[wire.PassiveArm] = None
    for arm in arms:
        if arm.arm == wire.DEFAULT_ARM:
            default = arm
            continue
        slot += 1
        if arm.share_bp:
            ranges.append(ArmRange(arm.arm, int(arm.arm), top - arm.share_bp, top - 1, slot))
        top -= arm.share_bp
    if default is not None and default.share_bp:
        ranges.append(ArmRange(wire.DEFAULT_ARM, None, 0, top - 1, 0))
    return sorted(ranges, key=lambda item: item.low)


@dataclass
class TapPlan:
    """What one study installs: arms by bucket range, the ports, the prefix lengths, the seed."""

    arms: list[ArmRange]
    ports: list[int]
    seed: int
    prefix_v4: int = wire.DEFAULT_PREFIX_V4
    prefix_v6: int = wire.DEFAULT_PREFIX_V6
    lease_s: float = DEFAULT_LEASE_S
    mark_base: int = DEFAULT_TAP_MARK_BASE
    table_base: int = DEFAULT_TAP_TABLE_BASE
    priority_base: int = DEFAULT_TAP_PRIORITY_BASE
    #: The study's identity (campaign and phase); a change reinstalls.
    key: tuple[int, int] = (0, 0)

    @classmethod
    def from_study(cls, study: wire.PassiveStudy, **kwargs: Any) -> TapPlan:
        return cls(
            arm_ranges(study.arms),
            sorted(set(study.ports)),
            study.assignment_seed,
            study.prefix_v4,
            study.prefix_v6,
            key=(study.campaign_id, study.phase),
            **kwargs,
        )

    @property
    def treated(self) -> list[ArmRange]:
        """The treated arms, by slot."""
        return sorted((arm for arm in self.arms if arm.slot), key=lambda arm: arm.slot)

    def mark(self, arm: ArmRange) -> int:
        return self.mark_base + arm.slot

    def table(self, arm: ArmRange) -> int:
        return self.table_base + arm.slot

    def priority(self, arm: ArmRange) -> int:
        return self.priority_base + arm.slot

    def nft_script(self) -> str:
        """The whole table, replaced atomically (one ``nft -f`` transaction)."""
        lines = [
            f"add table inet {NFT_TABLE}",
            f"delete table inet {NFT_TABLE}",
            f"table inet {NFT_TABLE} {{",
            "  set alive { type inet_proto; flags timeout; }",
            "  chain arms {",
            "    type filter hook prerouting priority mangle; policy accept;",
        ]
        if self.treated:
            ports = ", ".join(str(port) for port in self.ports)
            mapping = ", ".join(
                f"{arm.low}-{arm.high} : {hex(self.mark(arm))}" if arm.low != arm.high else f"{arm.low} : {hex(self.mark(arm))}"
                for arm in sorted(self.treated, key=lambda arm: arm.low)
            )
            scale = wire.PASSIVE_SHARE_SCALE
            # Cheapest test first: every packet of the host crosses this chain, and all but the
            # SYNs leave it at the flags.
            for family, source in (("ipv4", f"@nh,96,{self.prefix_v4}"), ("ipv6", f"@nh,64,{self.prefix_v6}")):
                lines.append(
                    f"    tcp flags & (syn|ack) == syn tcp dport {{ {ports} }} meta nfproto {family} "
                    f"meta l4proto @alive meta mark set jhash {source} mod {scale} "
                    f"seed {hex(self.seed)} map {{ {mapping} }}"
                )
        lines += ["  }", "}", self._lease_line()]
        return "\n".join(lines) + "\n"

    def _lease_line(self) -> str:
        return f"add element inet {NFT_TABLE} alive {{ tcp timeout {int(round(self.lease_s * 1000))}ms }}"

    def lease_script(self) -> str:
        """Renew the lease: delete and re-add the element in one transaction (re-adding an
        element that exists does not reset its timeout)."""
        line = self._lease_line()
        return f"{line}\ndelete element inet {NFT_TABLE} alive {{ tcp }}\n{line}\n"

    def route_commands(self, family: str, routes: Sequence[str]) -> list[list[str]]:
        flag = FAMILIES[family]
        commands: list[list[str]] = []
        for arm in self.treated:
            table = str(self.table(arm))
            commands.append(["ip", flag, "route", "flush", "table", table])
            for route in routes:
                commands.append(["ip", flag, "route", "replace", *route.split(), "table", table, "initcwnd", str(arm.iw)])
            commands.append(
                ["ip", flag, "rule", "add", "priority", str(self.priority(arm)), "fwmark", hex(self.mark(arm)), "lookup", table]
            )
        return commands

    def rules(self) -> list[tuple[str, int, int, int]]:
        """(family, priority, mark, table) of every rule this plan adds."""
        return [(family, self.priority(arm), self.mark(arm), self.table(arm)) for family in FAMILIES for arm in self.treated]


@dataclass
class Installed:
    """What is installed (``tap-installed.json``): enough to remove it without the plan."""

    nft_table: str = NFT_TABLE
    rules: list[list[Any]] = field(default_factory=list)
    tables: list[list[Any]] = field(default_factory=list)
    sysctl_original: Optional[str] = None
    sysctl_set: Optional[str] = None
    pid: int = 0
    installed_at: float = 0.0
    plan_key: list[int] = field(default_factory=list)
    #: ``nft`` (this module's rule, routes and sysctl) or ``bpf`` (:mod:`iwprobe._tap_bpf`).
    method: str = "nft"
    #: The BPF arms' lease map, by id (``disable`` ends the lease through it).
    bpf_map_id: int = 0
    cgroup: str = ""


def _nft(script: str) -> None:
    try:
        outcome = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ArmsError("nft not found: install nftables (Debian: apt-get install nftables)") from None
    if outcome.returncode != 0:
        raise ArmsError(f"nft failed: {outcome.stderr.strip()}")


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value + "\n")


def _save(state_path: str, installed: Installed) -> None:
    directory = os.path.dirname(os.path.abspath(state_path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    temporary = state_path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(installed.__dict__, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, state_path)


def load_installed(state_path: str) -> Optional[Installed]:
    try:
        with open(state_path, encoding="utf-8") as handle:
            return Installed(**json.load(handle))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as error:
        log.warning("unreadable %s (%s): removing the tap's arms by their names", state_path, error)
        return Installed()


def _families() -> list[str]:
    return [family for family in FAMILIES if family == "ipv4" or ipv6_status()[0]]


def conflicts(plan: TapPlan) -> list[str]:
    """Rules of someone else at this plan's priorities (a clash to refuse)."""
    found: list[str] = []
    for family in _families():
        shown = run_ip(["ip", FAMILIES[family], "rule", "show"]).stdout
        for line in shown.splitlines():
            priority = line.split(":", 1)[0].strip()
            for arm in plan.treated:
                if priority == str(plan.priority(arm)) and not _has_rule(
                    line, priority, hex(plan.mark(arm)), str(plan.table(arm))
                ):
                    found.append(f"{family}: {line.strip()}")
    return found


def install(plan: TapPlan, state_path: str) -> Installed:
    """Install the plan's arms (replacing an earlier plan's); the record is written first, so
    a crash half-way leaves something :func:`remove` can clean."""
    clash = conflicts(plan)
    if clash:
        raise ArmsError(
            "rule priorities taken by another program: " + "; ".join(clash) + " (choose other bases with --priority-base)"
        )
    previous = load_installed(state_path)
    original = previous.sysctl_original if previous and previous.sysctl_set else _read(FWMARK_ACCEPT)
    if previous is not None:
        _remove_rules(previous, keep_sysctl=True)
    installed = Installed(
        rules=[list(rule) for rule in plan.rules()],
        tables=[[family, plan.table(arm)] for family in FAMILIES for arm in plan.treated],
        sysctl_original=original,
        sysctl_set="1",
        pid=os.getpid(),
        installed_at=time.time(),
        plan_key=list(plan.key),
    )
    _save(state_path, installed)
    try:
        if _read(FWMARK_ACCEPT) != "1":
            _write(FWMARK_ACCEPT, "1")
        for family in _families():
            for command in plan.route_commands(family, main_routes(family, keep_initrwnd=True)):
                outcome = run_ip(command)
                if outcome.returncode != 0 and command[3] != "flush":
                    raise ArmsError(f"{' '.join(command)} failed: {outcome.stderr.strip()}")
        _nft(plan.nft_script())
    except (OSError, ArmsError) as error:
        remove(state_path)
        raise ArmsError(f"installing the arms failed and was undone: {error}") from None
    log.info(
        "arms installed: %s on ports %s (lease %.0f s)",
        ", ".join(f"{arm.arm} {arm.share_bp / 100:g} %" for arm in plan.arms),
        plan.ports,
        plan.lease_s,
    )
    return installed


def renew_lease(plan: TapPlan) -> None:
    _nft(plan.lease_script())


def lease_remaining_s() -> Optional[float]:
    """Seconds until the arms lapse (``None``: no lease element, i.e. lapsed or not installed)."""
    outcome = subprocess.run(
        ["nft", "-j", "list", "set", "inet", NFT_TABLE, "alive"], capture_output=True, text=True, check=False
    )
    if outcome.returncode != 0:
        return None
    for item in json.loads(outcome.stdout).get("nftables", []):
        for element in item.get("set", {}).get("elem", []):
            if isinstance(element, dict) and "elem" in element:
                expires = element["elem"].get("expires")
                return float(expires) if expires is not None else None
    return None


def _remove_rules(installed: Installed, keep_sysctl: bool = False) -> list[str]:
    removed: list[str] = []
    if installed.nft_table:
        outcome = subprocess.run(
            ["nft", "delete", "table", "inet", installed.nft_table], capture_output=True, text=True, check=False
        )
        if outcome.returncode == 0:
            removed.append(f"nft table inet {installed.nft_table}")
    for family, priority, mark, table in installed.rules:
        flag = FAMILIES[family]
        # Several identical rules may exist (a crashed install repeated): delete until none is left.
        while (
            run_ip(["ip", flag, "rule", "del", "priority", str(priority), "fwmark", hex(mark), "lookup", str(table)]).returncode
            == 0
        ):
            removed.append(f"{family} rule {priority} fwmark {hex(mark)} lookup {table}")
    for family, table in installed.tables:
        if run_ip(["ip", FAMILIES[family], "route", "flush", "table", str(table)]).returncode == 0:
            removed.append(f"{family} table {table}")
    if (
        not keep_sysctl
        and installed.sysctl_set is not None
        and installed.sysctl_original is not None
        and _read(FWMARK_ACCEPT) == installed.sysctl_set
        and installed.sysctl_original != installed.sysctl_set
    ):
        _write(FWMARK_ACCEPT, installed.sysctl_original)
        removed.append(f"net.ipv4.tcp_fwmark_accept={installed.sysctl_original}")
    return removed


def remove(state_path: str, plan: Optional[TapPlan] = None) -> list[str]:
    """Remove what ``tap-installed.json`` says was installed by this module (or, without it,
    the tap's nft table and ``plan``'s rules); the server is back on its own configuration.
    A record of either method: :func:`iwprobe._tap_arms.remove`."""
    installed = load_installed(state_path)
    if installed is None:
        installed = Installed(
            rules=[list(rule) for rule in plan.rules()] if plan else [],
            tables=[[family, plan.table(arm)] for family in FAMILIES for arm in plan.treated] if plan else [],
        )
    removed = _remove_rules(installed)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state_path)
    if removed:
        log.info("arms removed: %s", "; ".join(removed))
    return removed


class NftArms:
    """The arms by nftables, policy routes and the sysctl (this module), as an agent holds them."""

    method = "nft"

    def install(self, plan: TapPlan, state_path: str) -> Installed:
        return install(plan, state_path)

    def renew_lease(self, plan: TapPlan) -> None:
        renew_lease(plan)

    def remove(self, state_path: str, plan: Optional[TapPlan] = None) -> list[str]:
        return remove(state_path, plan)
