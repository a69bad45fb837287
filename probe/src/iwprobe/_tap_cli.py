"""Command line of ``iwprobe tap``: enroll, run, disable, enable, status (see :mod:`iwprobe._tap`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from . import __version__, wire
from ._passive_capture import DEFAULT_CAPTURE_PPS
from ._tap_arms import METHODS
from ._tap_budget import DEFAULT_CAPTURE_TRAFFIC_PPS, DEFAULT_CLOSES_PER_S
from ._tap_rules import DEFAULT_LEASE_S

ACTIONS = ("run", "enroll", "disable", "enable", "cleanup", "status")


def add_parser(commands: Any) -> None:
    tap = commands.add_parser(
        "tap",
        help="per-client IW arms and passive measurement on this (unmodified) web server",
        description="Runs beside an unmodified web server: assigns client prefixes to IW arms (nftables + policy "
        "routes, or one BPF sock_ops program) while a passive study is in force, measures every connection passively and uploads "
        "aggregates. 'disable' removes the arms at once and keeps them off until 'enable'; 'cleanup' "
        "removes what a dead agent left (the unit's ExecStopPost) without disabling.",
    )
    tap.add_argument("action", choices=ACTIONS)
    tap.add_argument(
        "--state-dir",
        help="credentials, spool, prefix key, installed-rules record (default $IWPROBE_STATE_DIR or /var/lib/iwprobe)",
    )
    tap.add_argument("--collector")
    tap.add_argument("--token", help="enroll: a token of kind 'server'")
    tap.add_argument("--name")
    tap.add_argument("--region", help="enroll: where this server is (its data centre)")
    tap.add_argument(
        "--port",
        type=int,
        action="append",
        default=[],
        dest="ports",
        help="enroll: a TCP port the web server listens on (repeat: --port 80 --port 443)",
    )
    tap.add_argument("--ca-file", help="pinned CA bundle for an https collector")
    tap.add_argument("--force", action="store_true", help="enroll again even if credentials exist")
    tap.add_argument("--region-map", help="CSV of prefix,region[,country]: the clients' regions (longest match)")
    tap.add_argument("--study", help="run standalone: a PassiveStudy JSON file instead of the collector's")
    tap.add_argument("--output", help="run standalone: append aggregates and connection records to this JSONL file")
    tap.add_argument(
        "--lease",
        type=float,
        default=DEFAULT_LEASE_S,
        help="seconds the arms stay in force without the agent (kernel-enforced; default 10)",
    )
    tap.add_argument(
        "--capture-pps",
        type=int,
        default=DEFAULT_CAPTURE_PPS,
        help="packet budget of the first-response capture; above it fewer connections are followed",
    )
    tap.add_argument(
        "--closes-per-s",
        type=float,
        default=DEFAULT_CLOSES_PER_S,
        help="closes measured per second at most (default %(default)g; 0: no limit): above it the agent "
        "listens part of each second, as the kernel's notifications cost the server",
    )
    tap.add_argument(
        "--capture-traffic-pps",
        type=float,
        default=DEFAULT_CAPTURE_TRAFFIC_PPS,
        help="server packets/s (all interfaces) the capture may sit on (default %(default)g; 0: no "
        "limit): above it the capture opens in windows, as a packet socket costs every packet sent",
    )
    tap.add_argument(
        "--capture-start-share",
        type=float,
        default=1 / 16,
        help="share of connections the capture follows at start (1, 1/2, 1/4, ...; default 1/16): it "
        "widens while the packet rate stays under a quarter of its budget for 30 s",
    )
    tap.add_argument(
        "--no-capture",
        dest="capture",
        action="store_false",
        help="no packet capture: final TCP_INFO only (no response latencies)",
    )
    tap.add_argument(
        "--arms",
        choices=METHODS,
        default="auto",
        help="how clients get their arm's window: bpf (one sock_ops program on the cgroup, held by the "
        "agent: nothing on the host's rules, gone with the agent; Linux >= 5.15, CAP_BPF), nft (an "
        "nftables rule marks SYNs, policy routes carry initcwnd, the sysctl tcp_fwmark_accept), or auto "
        "(default: bpf where the kernel takes it, else nft)",
    )
    tap.add_argument(
        "--cgroup",
        help="--arms bpf: the web server's cgroup v2 directory (default: the root, every process), e.g. "
        "/sys/fs/cgroup/system.slice/nginx.service",
    )
    tap.add_argument("--mark-base", type=lambda text: int(text, 0))
    tap.add_argument("--table-base", type=int)
    tap.add_argument("--priority-base", type=int)
    tap.add_argument("--json", action="store_true", help="status: one JSON object")


def main(args: argparse.Namespace) -> int:
    from ._agent import state_dir

    directory = state_dir(args.state_dir)
    if args.action == "enroll":
        return _enroll(args, directory)
    if args.action == "disable":
        return _disable(directory)
    if args.action == "cleanup":
        from ._tap_arms import remove
        from ._tap_rules import STATE_FILE

        removed = remove(os.path.join(directory, STATE_FILE))
        print("removed: " + ("; ".join(removed) if removed else "nothing was installed"))
        return 0
    if args.action == "enable":
        try:
            os.unlink(os.path.join(directory, _tap().DISABLED_FILE))
            print("enabled: the arms return with the next study in force")
        except FileNotFoundError:
            print("not disabled")
        return 0
    if args.action == "status":
        return _status(args, directory)
    return _run(args, directory)


def _tap() -> Any:
    from . import _tap

    return _tap


def _enroll(args: argparse.Namespace, directory: str) -> int:
    from ._agent import Credentials, save_credentials
    from ._collector import CollectorClient, CollectorError, from_dict

    missing = [name for name in ("collector", "token", "name", "region") if not getattr(args, name)]
    if missing or not args.ports:
        raise SystemExit("tap enroll needs " + ", ".join([f"--{name}" for name in missing] + ["--port"] * (not args.ports)))
    path = os.path.join(directory, _tap().SERVER_CREDENTIALS)
    if os.path.exists(path) and not args.force:
        print(f"already enrolled ({path}); use --force to enroll again")
        return 0
    request = wire.ServerEnrollRequest(
        name=args.name, region=args.region, ports=sorted(set(args.ports)), version=__version__, kernel=os.uname().release
    )
    try:
        _, answer = CollectorClient(args.collector, None, args.ca_file).post_json(
            wire.SERVER_ENROLL_PATH, wire.dumps(request), token=args.token
        )
    except CollectorError as error:
        print(f"server enrollment failed: {error}", file=sys.stderr)
        return 2
    response = from_dict(wire.EnrollResponse, answer)
    credentials = Credentials("server", response.id, response.credential, args.collector, args.ca_file, args.name, args.region)
    print(
        f"enrolled server {credentials.id}; credentials in {save_credentials(directory, _tap().SERVER_CREDENTIALS, credentials)}"
    )
    return 0


def _disable(directory: str) -> int:
    """Remove the arms now and keep them off: a running agent sees the marker and stays off."""
    from ._tap_arms import remove
    from ._tap_rules import STATE_FILE

    os.makedirs(directory, mode=0o700, exist_ok=True)
    with open(os.path.join(directory, _tap().DISABLED_FILE), "w", encoding="utf-8") as handle:
        handle.write(wire.utc_timestamp() + "\n")
    removed = remove(os.path.join(directory, STATE_FILE))
    print("disabled; removed: " + ("; ".join(removed) if removed else "nothing was installed"))
    return 0


def _status(args: argparse.Namespace, directory: str) -> int:
    from ._tap_arms import lease_remaining_s
    from ._tap_rules import STATE_FILE, load_installed

    state_path = os.path.join(directory, STATE_FILE)
    installed = load_installed(state_path)
    status: dict[str, Any] = {
        "disabled": os.path.exists(os.path.join(directory, _tap().DISABLED_FILE)),
        "installed": installed.__dict__ if installed is not None else None,
        "lease_remaining_s": lease_remaining_s(state_path),
    }
    try:
        with open(os.path.join(directory, _tap().STATUS_FILE), encoding="utf-8") as handle:
            status["agent"] = json.load(handle)
    except (OSError, ValueError):
        status["agent"] = None
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        for key, value in status.items():
            print(f"{key}: {json.dumps(value)}")
    return 0


def _run(args: argparse.Namespace, directory: str) -> int:
    from ._agent import load_credentials
    from ._signals import stop_event
    from ._tap_edge import RegionMap

    tap = _tap()
    credentials = None if args.study else load_credentials(directory, tap.SERVER_CREDENTIALS)
    if credentials is not None and args.collector:
        credentials.collector = args.collector
    options = {
        name: value
        for name, value in (("mark_base", args.mark_base), ("table_base", args.table_base), ("priority_base", args.priority_base))
        if value is not None
    }
    agent = tap.TapAgent(
        directory,
        credentials=credentials,
        study_file=args.study,
        output=args.output,
        regions=RegionMap.from_csv(args.region_map) if args.region_map else None,
        lease_s=args.lease,
        capture_pps=args.capture_pps,
        capture=args.capture,
        closes_per_s=args.closes_per_s,
        capture_traffic_pps=args.capture_traffic_pps,
        capture_start_bits=_share_bits(args.capture_start_share),
        plan_options=options,
        arms=args.arms,
        cgroup=args.cgroup,
    )
    return int(agent.run(stop_event()))


def _share_bits(share: float) -> int:
    """``k`` with ``2**-k`` the nearest power of two at or below ``share`` (0 < share <= 1)."""
    if not 0 < share <= 1:
        raise SystemExit("--capture-start-share must be in (0, 1]")
    return min(15, max(0, math.ceil(-math.log2(share) - 1e-9)))
