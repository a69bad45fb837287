"""Command line of the agent: ``iwprobe fetch|census|enroll|run|origin|tap|version``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from . import __version__, wire
from ._arms import Arm, arm_ports, parse_arms
from ._sendpath import SEND_PATH_CHOICES
from ._signals import stop_event as _stop_event

if TYPE_CHECKING:
    from ._fetch import FetchResult


def _labels(values: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--label wants key=value, got {item!r}")
        labels[key] = value
    return labels


def _arms(text: str) -> list[Arm]:
    """``--arms 3,10,10p,32,learned``: the arms (IW policies, see iwprobe._arms)."""
    try:
        return parse_arms(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iwprobe", description="iwscope measurement agent (probe, origin, tap)")
    parser.add_argument("--log-level", default=os.environ.get("IWPROBE_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)

    fetch = commands.add_parser("fetch", help="measure one fetch and print it (like curl -w)")
    fetch.add_argument("url", help="http://host:port/obj/<bytes> or an origin base URL")
    fetch.add_argument("--arm", type=int, help="IW arm: fetch from port base-port + IW of the URL's host")
    fetch.add_argument("--base-port", type=int, default=8000)
    fetch.add_argument("--size", type=int, help="object size when the URL has no /obj/ path")
    fetch.add_argument("--json", action="store_true", help="print the wire TrialRecord as JSON")
    fetch.add_argument("--timeout", type=float, default=60.0)
    fetch.add_argument("--ca-file", help="https: trust this CA bundle (e.g. a lab chain's root.pem)")
    fetch.add_argument("--insecure", action="store_true", help="https: do not verify the certificate")
    fetch.add_argument("--family", choices=("ipv4", "ipv6"), default="", help="resolve the host in this family only")
    fetch.add_argument(
        "--trace", metavar="FILE", help="capture the connection (root) and write its packets to FILE as a JSON trace"
    )
    fetch.add_argument(
        "--quic",
        action="store_true",
        help="over HTTP/3 (an https URL; the port is UDP): prints the fetch and the server's first flight as JSON",
    )

    census = commands.add_parser("census", help="infer the initial window of any HTTP(S) server (root), and of its HTTP/3")
    census.add_argument("url", help="http(s)://host[:port]/path of an object large enough to outlast the window")
    census.add_argument("--json", action="store_true", help="print one JSON object")
    census.add_argument("--connections", type=int, default=3, help="fresh connections to agree on (default 3)")
    census.add_argument(
        "--range-bytes", type=int, default=256 * 1024, help="ask for the first N bytes only (Range); 0 fetches the whole object"
    )
    census.add_argument(
        "--announce-mss",
        type=int,
        help="MSS the probe's SYN announces (88..1460): a small one makes a small object fill a large window",
    )
    census.add_argument("--timeout", type=float, default=30.0)
    census.add_argument("--ca-file", help="https: trust this CA bundle")
    census.add_argument("--insecure", action="store_true", help="https: do not verify the certificate")
    census.add_argument("--family", choices=("ipv4", "ipv6"), default="", help="resolve the host in this family only")
    census.add_argument(
        "--quic",
        choices=("auto", "no", "only"),
        default="auto",
        help="HTTP/3's window too (auto: when the server's Alt-Svc offers it; only: HTTP/3 on the URL's port); iwprobe[quic]",
    )

    enroll = commands.add_parser("enroll", help="enroll this probe with a collector")
    enroll.add_argument("--collector", required=True)
    enroll.add_argument("--token", required=True)
    enroll.add_argument("--name", required=True)
    enroll.add_argument("--region", required=True)
    enroll.add_argument("--country")
    enroll.add_argument("--asn", type=int)
    enroll.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    enroll.add_argument("--state-dir")
    enroll.add_argument("--ca-file", help="pinned CA bundle for an https collector")
    enroll.add_argument("--force", action="store_true", help="enroll again even if credentials exist")

    run = commands.add_parser("run", help="the probe daemon")
    run.add_argument("--state-dir")
    run.add_argument("--once", action="store_true", help="run the current schedule, upload, exit")
    run.add_argument("--spool-max-mb", type=float, default=512.0)
    run.add_argument("--heartbeat-s", type=float, default=60.0)
    run.add_argument(
        "--calibration-bytes", type=int, default=1_000_000, help="first calibration transfer; grown 4x while still in slow start"
    )
    run.add_argument("--trial-timeout", type=float, default=60.0)
    run.add_argument(
        "--campaign",
        type=int,
        action="append",
        dest="campaigns",
        metavar="ID",
        help="run only this campaign (repeatable; default: every campaign of the schedule)",
    )
    run.add_argument("--trial-gap", type=float, default=0.05, help="pause between two trials, seconds")
    run.add_argument("--upload-timeout", type=float, help="with --once: give up uploading after this many seconds")
    run.add_argument("--backoff-cap", type=float, default=60.0, help="longest wait between upload retries, s")
    run.add_argument("--tls-ca-file", help="verify HTTPS origins against this CA bundle (default: the system's)")
    run.add_argument(
        "--no-iw-inference",
        dest="infer_iw",
        action="store_false",
        help="do not capture each trial's packets to infer the server's IW (on by default when root; census campaigns need it)",
    )

    origin = commands.add_parser("origin", help="the instrumented origin (serve, setup-routes, enroll)")
    origin.add_argument("action", nargs="?", default="serve", choices=("serve", "setup-routes", "enroll"))
    origin.add_argument(
        "--bind",
        action="append",
        default=None,
        metavar="ADDRESS",
        help="listen on this address (repeat for several, e.g. an IPv4 and an IPv6 one; default 0.0.0.0)",
    )
    origin.add_argument("--tls-cert", default="", help="serve HTTPS on every arm: the chain (PEM, leaf first)")
    origin.add_argument("--tls-key", default="", help="serve HTTPS on every arm: the leaf's key (PEM)")
    origin.add_argument(
        "--quic",
        action="store_true",
        help="also serve HTTP/3 on UDP next to every plain and paced arm (same port numbers; needs --tls-cert and iwprobe[quic])",
    )
    origin.add_argument(
        "--arms",
        type=_arms,
        default=parse_arms("3,10,16,32"),
        help="IW policies: N (IW N), Np (IW N, first window paced over the RTT), learned "
        "(the window the client's /24 or /48 last ended with); e.g. 3,10,10p,32,learned",
    )
    origin.add_argument(
        "--congestion-control",
        default="",
        help="TCP congestion control of the origin's connections (e.g. cubic); default: the host's",
    )
    origin.add_argument(
        "--send-path",
        choices=SEND_PATH_CHOICES,
        default="writev",
        help="how responses are written: writev (head and body in one call), sendfile (head, then the body "
        "by sendfile(2)) or mss-writes (one write per MSS); each observation records the path taken",
    )
    origin.add_argument(
        "--print-arms", action="store_true", help="print the arms as JSON (arm, iw, paced, policy, port) and exit"
    )
    origin.add_argument("--learned-cap", type=int, default=64, help="largest window the learned arm starts with")
    origin.add_argument(
        "--learned-ttl", type=float, default=600.0, help="seconds after which a client prefix's learned window is forgotten"
    )
    origin.add_argument("--base-port", type=int, default=8000)
    origin.add_argument(
        "--no-echo",
        dest="echo",
        action="store_false",
        help="serve no UDP echo (the interactive flow of cost campaigns) on the base port",
    )
    origin.add_argument("--max-object-bytes", type=int, default=wire.MAX_OBJECT_BYTES)
    origin.add_argument("--workers", type=int, default=32)
    origin.add_argument(
        "--sndbuf", type=int, default=0, help="fixed SO_SNDBUF in bytes (default 0: kernel autotuning, which sizes it for the IW)"
    )
    origin.add_argument("--request-timeout", type=float, default=10.0, help="seconds a client has to send its request")
    origin.add_argument("--ack-timeout", type=float, default=60.0, help="seconds to wait for the response to be acknowledged")
    origin.add_argument(
        "--client-max-connections",
        type=int,
        default=None,
        help="open connections allowed per client address (default: $IWPROBE_ORIGIN_CLIENT_CONNECTIONS "
        "or the built-in default; offered-load experiments from one host need many; 0 = no limit)",
    )
    origin.add_argument("--state-dir")
    origin.add_argument(
        "--no-upload", action="store_true", help="serve without a collector: observations are printed to stdout as JSON lines"
    )
    origin.add_argument("--spool-max-mb", type=float, default=512.0)
    origin.add_argument("--print-routes", action="store_true", help="setup-routes: print the commands only")
    origin.add_argument("--initrwnd", type=int, default=64)
    origin.add_argument("--setup-routes", dest="with_routes", action="store_true", help="serve: install the routes first")
    origin.add_argument("--collector")
    origin.add_argument("--token")
    origin.add_argument("--name")
    origin.add_argument("--region")
    origin.add_argument("--host", help="host name or address probes use to reach this origin")
    origin.add_argument("--host6", help="its IPv6 address or name, for campaigns over IPv6")
    origin.add_argument("--ca-file")

    from . import _tap_cli

    _tap_cli.add_parser(commands)
    commands.add_parser("version", help="print the version")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "fetch":
        return _fetch(args)
    if args.command == "census":
        return _census(args)
    if args.command == "enroll":
        return _enroll(args)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "tap":
            from . import _tap_cli

            return _tap_cli.main(args)
        return _origin(args)
    except (RuntimeError, PermissionError, OSError) as error:
        print(f"iwprobe: {error}", file=sys.stderr)
        return 2


def _fetch(args: argparse.Namespace) -> int:
    import urllib.parse

    from ._fetch import fetch, format_curl_style

    url = args.url
    parts = urllib.parse.urlsplit(url)
    if args.arm is not None:
        host = parts.hostname or ""
        size = args.size
        if size is None and parts.path.startswith(wire.OBJECT_PATH_PREFIX):
            size = int(parts.path[len(wire.OBJECT_PATH_PREFIX) :])
        if size is None:
            raise SystemExit("--arm needs --size or a /obj/<bytes> URL")
        from ._fetch import object_url

        url = object_url(host, args.base_port + args.arm, size, tls=parts.scheme == "https")
    elif args.size is not None and not parts.path.startswith(wire.OBJECT_PATH_PREFIX):
        url = url.rstrip("/") + f"{wire.OBJECT_PATH_PREFIX}{args.size}"
    trial_id = wire.new_id()
    if args.quic:
        return _fetch_quic(url, trial_id, args)
    from ._fetch import client_context

    context = client_context(args.ca_file, verify=not args.insecure) if parts.scheme == "https" else None
    if args.trace:
        from ._capture import capture_status

        status = capture_status()
        if status != "on":
            print(f"iwprobe: --trace needs the packet capture, which is {status}", file=sys.stderr)
            return 2
    # --trace reuses the IW inference's capture (one capture socket per fetch).
    result = fetch(url, trial_id, timeout_s=args.timeout, tls_context=context, family=args.family, infer_iw=bool(args.trace))
    if args.trace:
        if result.iw_unavailable:
            print(f"iwprobe: no trace: {result.iw_unavailable}", file=sys.stderr)
            return 2
        written = _write_trace(args.trace, result)
        # stdout stays one JSON document with --json.
        print(written, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        size = args.size or 0
        tail = urllib.parse.urlsplit(url).path
        if tail.startswith(wire.OBJECT_PATH_PREFIX) and tail[len(wire.OBJECT_PATH_PREFIX) :].isdigit():
            size = int(tail[len(wire.OBJECT_PATH_PREFIX) :])
        record = result.to_trial(trial_id, "00000000-0000-0000-0000-000000000000", None, None, 0, args.arm or 1, size)
        print(json.dumps(wire.to_dict(record), indent=2))
    else:
        print(format_curl_style(result))
    return 0 if result.error_kind is None else 1


def _fetch_quic(url: str, trial_id: str, args: argparse.Namespace) -> int:
    from ._quic import fetch_h3, quic_available

    available, why = quic_available()
    if not available:
        print(f"iwprobe: --quic needs the optional extra: pip install 'iwprobe[quic]' ({why})", file=sys.stderr)
        return 2
    if not url.startswith("https://"):
        raise SystemExit("--quic wants an https:// URL")
    result = fetch_h3(url, ca_file=args.ca_file, insecure=args.insecure, trial_id=trial_id, timeout_s=args.timeout)
    print(json.dumps(result.to_dict(with_datagrams=bool(args.trace)), indent=2))
    return 0 if result.error_kind is None else 1


def _write_trace(path: str, result: FetchResult) -> str:
    """Write the fetch's trace (compact JSON) to ``path``; the line saying what was written."""
    from ._trace import trace_of

    trace = trace_of(result)
    text = json.dumps(trace.to_dict(), separators=(",", ":"))
    with open(path, "w", encoding="utf-8") as file:
        file.write(text + "\n")
    per_packet = len(text) / len(trace) if len(trace) else 0.0
    dropped = f", {trace.dropped} dropped by the capture" if trace.dropped else ""
    return f"trace:          {path} ({len(trace)} packets, {len(text) + 1} bytes, {per_packet:.1f} bytes/packet{dropped})"


def _census(args: argparse.Namespace) -> int:
    """0: the IW determined; 1: a lower bound or undetermined; 2: no capture (not root) or no answer."""
    import urllib.parse

    from ._census import census, format_census
    from ._census_quic import format_quic_census
    from ._fetch import client_context

    if urllib.parse.urlsplit(args.url).scheme not in ("http", "https"):
        raise SystemExit("census wants an http:// or https:// URL")
    if args.quic == "only" and not args.url.startswith("https://"):
        raise SystemExit("--quic only wants an https:// URL (HTTP/3 is always encrypted)")
    if args.announce_mss is not None and not 88 <= args.announce_mss <= 65535:
        raise SystemExit("--announce-mss must be between 88 (Linux's minimum) and 65535")
    context = client_context(args.ca_file, verify=not args.insecure) if args.url.startswith("https") else None
    result = census(
        args.url,
        connections=args.connections,
        range_bytes=args.range_bytes or None,
        announce_mss=args.announce_mss,
        family=args.family,
        tls_context=context,
        timeout_s=args.timeout,
        quic=args.quic,
        ca_file=args.ca_file,
        insecure=args.insecure,
    )
    if args.quic == "only":
        assert result.quic is not None
        print(json.dumps(result.to_dict(), indent=2) if args.json else format_quic_census(result.quic))
        return 0 if result.quic.status == "ok" else (2 if result.quic.reason == "no_quic_extra" else 1)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_census(result))
    if result.reason == "no_capture":
        print(f"iwprobe: {result.error}", file=sys.stderr)
        return 2
    return 0 if result.status == "ok" else 1


def _enroll(args: argparse.Namespace) -> int:
    from ._agent import PROBE_CREDENTIALS, enroll_probe, state_dir
    from ._collector import CollectorError

    directory = state_dir(args.state_dir)
    if os.path.exists(os.path.join(directory, PROBE_CREDENTIALS)) and not args.force:
        print(f"already enrolled ({os.path.join(directory, PROBE_CREDENTIALS)}); use --force to enroll again")
        return 0
    request = wire.EnrollRequest(
        name=args.name, region=args.region, country=args.country, asn=args.asn, labels=_labels(args.label), version=__version__
    )
    try:
        credentials, path = enroll_probe(args.collector, args.token, request, directory, args.ca_file)
    except CollectorError as error:
        print(f"enrollment failed: {error}", file=sys.stderr)
        return 2
    print(f"enrolled probe {credentials.id}; credentials in {path}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from ._agent import PROBE_CREDENTIALS, ProbeAgent, load_credentials, state_dir

    directory = state_dir(args.state_dir)
    agent = ProbeAgent(
        directory,
        load_credentials(directory, PROBE_CREDENTIALS),
        spool_max_bytes=int(args.spool_max_mb * 1024 * 1024),
        heartbeat_s=args.heartbeat_s,
        calibration_bytes=args.calibration_bytes,
        trial_timeout_s=args.trial_timeout,
        trial_gap_s=args.trial_gap,
        backoff_cap_s=args.backoff_cap,
        campaign_ids=args.campaigns,
        tls_ca_file=args.tls_ca_file,
        infer_iw=args.infer_iw,
    )
    return agent.run(once=args.once, stop=_stop_event(), upload_timeout_s=args.upload_timeout)


def _origin(args: argparse.Namespace) -> int:
    from ._origin import Origin, OriginConfig, serve_forever
    from ._routes import RoutePlan, ensure_no_metrics_save, setup_routes

    arms = args.arms
    if args.print_arms:
        print(json.dumps([arm.describe(args.base_port) for arm in arms]))
        return 0
    plan = RoutePlan(arms, initrwnd=args.initrwnd)
    if args.action == "setup-routes":
        for line in setup_routes(plan, dry_run=args.print_routes):
            print(line)
        if not args.print_routes:
            ensure_no_metrics_save()
        return 0
    if args.action == "enroll":
        return _origin_enroll(args)
    from ._agent import ORIGIN_CREDENTIALS, load_credentials, state_dir
    from ._spool import Spool
    from ._upload import Uploader

    if args.with_routes:
        setup_routes(plan)
    ensure_no_metrics_save()
    stop = _stop_event()
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together")
    if args.quic:
        _check_quic_origin(args)
    config = OriginConfig(
        bind=args.bind or ["0.0.0.0"],
        arms=args.arms,
        base_port=args.base_port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        max_object_bytes=args.max_object_bytes,
        workers=args.workers,
        request_timeout_s=args.request_timeout,
        sndbuf_bytes=args.sndbuf,
        ack_timeout_s=args.ack_timeout,
        learned_cap_iw=args.learned_cap,
        learned_ttl_s=args.learned_ttl,
        initrwnd=args.initrwnd,
        congestion_control=args.congestion_control,
        echo=args.echo,
        send_path=args.send_path,
        quic=args.quic,
    )
    if args.client_max_connections is not None:
        config.client_max_connections = args.client_max_connections
    spool = None
    uploader_thread = None
    if not args.no_upload:
        directory = state_dir(args.state_dir)
        credentials = load_credentials(directory, ORIGIN_CREDENTIALS)
        if args.collector:
            credentials.collector = args.collector  # e.g. the collector moved since enrollment
        config.origin_id = credentials.id
        spool = Spool(os.path.join(directory, "origin-spool.sqlite"), int(args.spool_max_mb * 1024 * 1024))
        client = credentials.client()
        traces = Uploader(spool, client, "trace", credentials.id, backoff_cap_s=60.0)  # after the observations
        uploader = Uploader(spool, client, "origin", credentials.id, backoff_cap_s=60.0, traces=traces)
        uploader_thread = threading.Thread(target=uploader.run_forever, args=(stop, 1.0), name="uploader", daemon=True)
    origin = Origin(config, spool)
    origin.start()
    # Capabilities are per thread and inherited by new ones: drop CAP_NET_ADMIN in the origin's
    # threads and this one first, so that the uploader (which talks to the network) never has it.
    origin.drop_net_admin()
    if uploader_thread is not None:
        uploader_thread.start()
    print(
        f"serving arms {[arm.label for arm in arms]} over {'HTTPS' if args.tls_cert else 'HTTP'} "
        f"on {origin.addresses} ports "
        f"{[arm.port(args.base_port) for arm in arms]}",
        file=sys.stderr,
        flush=True,
    )
    quic_origin = _quic_origin(args, origin) if args.quic else None
    if quic_origin is not None:
        quic_origin.start()
        print(
            f"serving HTTP/3 (UDP) on arms {[arm.label for arm in quic_origin.arms]} "
            f"ports {[quic_origin.port(arm) for arm in quic_origin.arms]}",
            file=sys.stderr,
            flush=True,
        )
    try:
        serve_forever(origin, stop)
    finally:
        if quic_origin is not None:
            quic_origin.stop()
    if uploader_thread is not None:
        uploader_thread.join(timeout=10)
    return 0


def _check_quic_origin(args: argparse.Namespace) -> None:
    """``--quic`` can be served: the extra is installed and a certificate is given."""
    from ._quic import quic_available

    available, why = quic_available()
    if not available:
        raise SystemExit(f"--quic needs the optional extra: pip install 'iwprobe[quic]' ({why})")
    if not args.tls_cert:
        raise SystemExit("--quic needs --tls-cert and --tls-key (HTTP/3 is always encrypted)")


def _quic_origin(args: argparse.Namespace, origin: Any) -> Any:
    """The HTTP/3 side of ``iwprobe origin --quic``: plain and paced arms (the learned policy is a
    TCP route's; docs/quic.md), under the TCP origin's per-client budgets.  Its observations
    (wire v9, ``protocol`` ``quic``, arm ``Nq``) go where the TCP origin's go: to the spool and
    the collector, or to stdout with ``--no-upload``."""
    from ._quic_origin import QuicOrigin
    from ._quic_records import quic_observation

    def report(observation: dict[str, Any]) -> None:
        record = quic_observation(observation, origin.config.origin_id)
        if record is not None:
            origin.record(record)

    arms = [arm for arm in args.arms if arm.policy != "learned"]
    binds = args.bind or ["0.0.0.0"]
    return QuicOrigin(arms, binds, args.base_port, args.tls_cert, args.tls_key, report, args.max_object_bytes, origin.budgets)


def _origin_enroll(args: argparse.Namespace) -> int:
    from ._agent import enroll_origin, state_dir
    from ._collector import CollectorError

    missing = [name for name in ("collector", "token", "name", "region", "host") if not getattr(args, name)]
    if missing:
        raise SystemExit("origin enroll needs " + ", ".join(f"--{name}" for name in missing))
    if args.quic and not args.tls_cert:
        raise SystemExit("--quic needs --tls-cert (HTTP/3 is always encrypted; the origin enrolls as HTTPS)")
    request = wire.OriginEnrollRequest(
        name=args.name,
        region=args.region,
        host=args.host,
        arms=arm_ports(args.arms, args.base_port, quic=args.quic),
        version=__version__,
        echo_port=args.base_port if args.echo else None,
        tls=bool(args.tls_cert),
        host6=args.host6,
    )
    try:
        credentials, path = enroll_origin(args.collector, args.token, request, state_dir(args.state_dir), args.ca_file)
    except CollectorError as error:
        print(f"origin enrollment failed: {error}", file=sys.stderr)
        return 2
    print(f"enrolled origin {credentials.id}; credentials in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
