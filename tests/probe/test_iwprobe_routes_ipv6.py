"""The arms' policy routing in both address families: the ``ip`` commands, and in a throwaway
network namespace the ``ip -6`` rules and tables ``setup_routes`` installs, their
idempotency, the skip on a host without IPv6, and ``missing_rule_families``."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest

from iwprobe._routes import RoutePlan, parse_routes, route_commands

PYTHON = sys.executable
MISSING = (
    "import json; from iwprobe._routes import RoutePlan, missing_rule_families; "
    "print(json.dumps(missing_rule_families(RoutePlan([3, 10]))))"
)


def test_route_commands_for_both_families() -> None:
    plan = RoutePlan([3, 10], initrwnd=40)
    v6 = ["default via fd00:1::1 dev eth0 metric 1024 pref medium", "fd00:1::/64 dev eth0 proto kernel metric 256 pref medium"]
    commands = [" ".join(command) for command in route_commands(plan, v6, family="ipv6")]
    assert commands == [
        "ip -6 route flush table 21003",
        "ip -6 route replace default via fd00:1::1 dev eth0 metric 1024 pref medium table 21003 initcwnd 3 initrwnd 40",
        "ip -6 route replace fd00:1::/64 dev eth0 proto kernel metric 256 pref medium table 21003 initcwnd 3 initrwnd 40",
        "ip -6 rule add priority 9003 fwmark 0x1f003 lookup 21003",
        "ip -6 route flush table 21010",
        "ip -6 route replace default via fd00:1::1 dev eth0 metric 1024 pref medium table 21010 initcwnd 10 initrwnd 40",
        "ip -6 route replace fd00:1::/64 dev eth0 proto kernel metric 256 pref medium table 21010 initcwnd 10 initrwnd 40",
        "ip -6 rule add priority 9010 fwmark 0x1f00a lookup 21010",
    ]
    # The default family is still IPv4 (existing callers), with the same tables and marks.
    v4 = [" ".join(command) for command in route_commands(plan, ["default via 192.0.2.1 dev eth0"])]
    assert v4[0] == "ip -4 route flush table 21003" and v4[-1] == "ip -4 rule add priority 9010 fwmark 0x1f00a lookup 21010"
    with pytest.raises(ValueError, match="family"):
        route_commands(plan, v6, family="inet6")


def test_parse_routes_keeps_unicast_routes_of_either_family() -> None:
    shown = "\n".join(
        [
            "default proto ra metric 1024 expires 1796sec pref medium",
            "\tnexthop via fe80::1 dev eth0 weight 1",
            "\tnexthop via fe80::2 dev eth0 weight 1",
            "fd00:1::/64 dev eth0 proto kernel metric 256 linkdown pref medium",
            "fe80::/64 dev eth0 proto kernel metric 256 pref medium",
            "multicast ff00::/8 dev eth0 proto kernel metric 256 pref medium",
            "anycast fd00:1:: dev eth0 proto kernel metric 0 pref medium",
            "unreachable fd00:dead::/64 dev lo metric 1024 pref medium",
            "10.1.0.0/16 via 10.0.0.1 dev eth1 initcwnd 4 initrwnd 8",
            "10.2.0.0/16 nhid 7 via 10.0.0.1 dev eth1 proto static",
            "10.3.0.0/16 nhid 8 proto static",
        ]
    )
    assert parse_routes(shown) == [
        "default proto ra metric 1024 pref medium nexthop via fe80::1 dev eth0 weight 1 nexthop via fe80::2 dev eth0 weight 1",
        "fd00:1::/64 dev eth0 proto kernel metric 256 pref medium",
        "fe80::/64 dev eth0 proto kernel metric 256 pref medium",
        "10.1.0.0/16 via 10.0.0.1 dev eth1",
        "10.2.0.0/16 via 10.0.0.1 dev eth1 proto static",
        "10.3.0.0/16 nhid 8 proto static",
    ]


@contextlib.contextmanager
def _namespace(ipv6: bool = True) -> Iterator[str]:
    """A namespace with a veth pair, IPv4 and (unless ``ipv6`` is false: then IPv6 is disabled)
    IPv6 addresses and default routes, like a host; deleted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    name = f"iwt{secrets.token_hex(3)}r"

    def ip(*args: str) -> None:
        subprocess.run(["ip", "-n", name, *args], check=True, capture_output=True, text=True)

    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        ip("link", "set", "lo", "up")
        ip("link", "add", "va", "type", "veth", "peer", "name", "vb")
        ip("addr", "add", "192.0.2.1/24", "dev", "va")
        if ipv6:
            ip("-6", "addr", "add", "fd00:db8:1::1/64", "dev", "va", "nodad")
        else:
            _exec(name, ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"])
        ip("link", "set", "va", "up")
        ip("link", "set", "vb", "up")
        ip("route", "add", "default", "via", "192.0.2.254")
        if ipv6:
            ip("-6", "route", "add", "default", "via", "fd00:db8:1::fe", "dev", "va")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _exec(namespace: str, command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", namespace, *command], capture_output=True, text=True, timeout=60)


def _missing(namespace: str) -> list[str]:
    outcome = _exec(namespace, [PYTHON, "-c", MISSING])
    assert outcome.returncode == 0, outcome.stderr
    families: list[str] = json.loads(outcome.stdout)
    return families


def test_setup_routes_installs_ipv6_rules_and_tables() -> None:
    with _namespace() as namespace:
        for _ in range(2):  # the second run keeps the rules and rebuilds the tables
            outcome = _exec(namespace, [PYTHON, "-m", "iwprobe", "origin", "setup-routes", "--arms", "3,10"])
            assert outcome.returncode == 0, outcome.stderr
        assert "ip -6 rule add priority 9003 fwmark 0x1f003 lookup 21003" in outcome.stdout
        assert "skipped" not in outcome.stdout
        for flag in ("-4", "-6"):
            rules = _exec(namespace, ["ip", flag, "rule", "show"]).stdout
            assert rules.count("fwmark 0x1f003 lookup 21003") == 1 and rules.count("fwmark 0x1f00a lookup 21010") == 1, rules
        for iw in (3, 10):
            table = _exec(namespace, ["ip", "-6", "route", "show", "table", str(21000 + iw)]).stdout
            assert "default via fd00:db8:1::fe dev va" in table and "fd00:db8:1::/64 dev va" in table, table
            assert all(f"initcwnd {iw} " in line and "initrwnd 64" in line for line in table.splitlines()), table
        # Which route an arm's IPv6 connection gets: the one with its initcwnd.
        chosen = _exec(namespace, ["ip", "-6", "route", "get", "fd00:db8:2::1", "mark", "0x1f003"]).stdout
        assert "table 21003" in chosen and "initcwnd 3" in chosen, chosen

        assert _missing(namespace) == []
        _exec(namespace, ["ip", "-6", "rule", "del", "priority", "9010"]).check_returncode()
        assert _missing(namespace) == ["ipv6"]
        _exec(namespace, ["ip", "-4", "rule", "del", "priority", "9003"]).check_returncode()
        assert _missing(namespace) == ["ipv4", "ipv6"]


def test_setup_routes_skips_ipv6_where_it_is_disabled() -> None:
    with _namespace(ipv6=False) as namespace:
        outcome = _exec(namespace, [PYTHON, "-m", "iwprobe", "origin", "setup-routes", "--arms", "3,10"])
        assert outcome.returncode == 0, outcome.stderr
        assert "# ipv6 skipped: net.ipv6.conf.all.disable_ipv6=1" in outcome.stdout
        assert "ip -4 rule add priority 9010 fwmark 0x1f00a lookup 21010" in outcome.stdout
        assert "lookup 210" not in _exec(namespace, ["ip", "-6", "rule", "show"]).stdout
        assert _missing(namespace) == []
