"""``iwscope lab``: the emulated wide-area testbed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from .links import DirectionSpec, format_rate, parse_rate
from .scenarios import ScenarioError, load_scenario, scenario_names
from .topology import LabError, Topology, cleanup, list_runs, run_is_stale

#: Wide tables also when piped (rich would wrap at 80 columns).
console = Console(width=None if sys.stdout.isatty() else 200)


def _direction_text(direction: dict[str, Any]) -> str:
    spec = DirectionSpec.from_dict(direction)
    parts = [format_rate(spec.rate_bps), f"{spec.delay_ms:g} ms"]
    if spec.loss:
        parts.append(f"loss {spec.loss:.2%}" + (" GE" if spec.loss_model == "gilbert" else ""))
    if spec.jitter_ms:
        parts.append(f"jitter {spec.jitter_ms:g} ms")
    if spec.buffer_bytes:
        parts.append(f"buf {spec.buffer_bytes} B")
    if spec.buffer_packets:
        parts.append(f"buf {spec.buffer_packets} pkt")
    return ", ".join(parts)


def _print_status(status: dict[str, Any]) -> None:
    table = Table(
        title=f"lab run {status['run_id']} ({status.get('scenario') or 'custom'}), collector at {status['collector_address']}"
    )
    for column in (
        "host",
        "role",
        "region",
        "namespace",
        "address",
        "down (to host)",
        "up (from host)",
        "delivered down/up",
        "dropped down/up",
    ):
        table.add_column(column)
    for host in status["hosts"]:
        counters = host.get("counters", {})
        delivered = dropped = "?"
        if "down" in counters:
            delivered = f"{counters['down']['delivered_packets']}/{counters['up']['delivered_packets']}"
            dropped = "/".join(
                str(counters[d]["lost_packets"] + counters[d]["queue_drop_packets"] + counters[d]["overflow_drop_packets"])
                for d in ("down", "up")
            )
        table.add_row(
            host["name"],
            host["role"],
            host.get("region") or "",
            host["netns"],
            host["address"],
            _direction_text(host["link"]["down"]),
            _direction_text(host["link"]["up"]),
            delivered,
            dropped,
        )
    console.print(table)


@click.group()
def lab() -> None:
    """Emulated wide-area testbed: namespaces as hosts, a user-space link emulator."""


@lab.command()
@click.argument("scenario")
@click.option("--run-id", default=None, help="Run id (iws + up to 8 of [a-z0-9]); random if omitted.")
@click.option("--trace", is_flag=True, help="Write a packet trace per link into the run's state directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def up(scenario: str, run_id: str | None, trace: bool, as_json: bool) -> None:
    """Build the topology of SCENARIO (a shipped name or a YAML path); it stays up until `down`."""
    try:
        topo = Topology.from_scenario(scenario, run_id=run_id, detached=True, trace=trace)
        topo.up()
        status = topo.status(counters=False)
    except (ScenarioError, LabError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        _print_status(status)
        console.print(f"run id: [bold]{topo.run_id}[/bold]   (`iwscope lab down --run-id {topo.run_id}`)")


def _resolve_run(run_id: str | None) -> str:
    if run_id:
        return run_id
    runs: list[str] = [str(state["run_id"]) for state in list_runs()]
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise click.ClickException("no lab run is up")
    raise click.ClickException(f"several lab runs are up ({', '.join(runs)}): pass --run-id")


@lab.command()
@click.option("--run-id", default=None, help="Only this run (default: every run).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(run_id: str | None, as_json: bool) -> None:
    """Hosts (role, namespace, address) and links (configured parameters, live counters)."""
    states = [s for s in list_runs() if run_id is None or s["run_id"] == run_id]
    if run_id and not states:
        raise click.ClickException(f"no lab run {run_id!r}")
    result = []
    for state in states:
        try:
            result.append(Topology.attach(state["run_id"]).status())
        except (LabError, KeyError) as exc:
            result.append({"run_id": state["run_id"], "broken": str(exc), "stale": run_is_stale(state)})
    if as_json:
        click.echo(json.dumps({"runs": result}, indent=2))
        return
    if not result:
        console.print("no lab run is up")
    for entry in result:
        if "broken" in entry:
            console.print(f"[red]run {entry['run_id']} is broken[/red]: {entry['broken']}")
        else:
            _print_status(entry)


@lab.command()
@click.option("--run-id", default=None, help="The run to remove (default: the only one).")
def down(run_id: str | None) -> None:
    """Remove a run completely (namespaces, devices, emulators, state)."""
    resolved = _resolve_run(run_id)
    try:
        topo = Topology.attach(resolved)
    except LabError as error:
        removed = [r for r in cleanup(all_runs=False) if r == resolved]
        if not removed:
            raise click.ClickException(f"run {resolved} is not healthy and not stale: use `cleanup --all`") from error
        click.echo(f"removed broken run {resolved}")
        return
    topo.down()
    click.echo(f"removed run {resolved}")


@lab.command(name="cleanup")
@click.option("--all", "all_runs", is_flag=True, help="Remove every lab run, live ones too.")
def cleanup_command(all_runs: bool) -> None:
    """Remove what crashed runs left (owner dead or emulator gone); everything with --all."""
    removed = cleanup(all_runs=all_runs)
    click.echo(f"removed {len(removed)} run(s)" + (f": {', '.join(removed)}" if removed else ""))


@lab.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True)
def scenarios(name: str | None, as_json: bool) -> None:
    """List the shipped scenarios, or show one scenario's paths and Figure-5 buckets."""
    try:
        if name is None:
            rows = [{"name": n, "description": load_scenario(n).description} for n in scenario_names()]
        else:
            rows = load_scenario(name).path_summary()
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    table = Table()
    for column in rows[0].keys() if rows else ():
        table.add_column(column)
    for row in rows:
        table.add_row(*[str(v) if not isinstance(v, float) else f"{v:g}" for v in row.values()])
    console.print(table)


def _rate_option(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    try:
        rate = parse_rate(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    assert rate is not None
    return rate


@lab.command()
@click.option("--rtt", "rtt_ms", type=click.FloatRange(min=0), default=70.0, show_default=True, help="RTT (ms).")
@click.option("--rate", "rate_bps", callback=_rate_option, default="1.2M", show_default=True, help="Rate, e.g. 56k, 1.2M, 100M.")
@click.option(
    "--loss", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True, help="Loss probability per direction."
)
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(min=0.5),
    default=5.0,
    show_default=True,
    help="Rate measurement window (s).",
)
@click.option("--handshakes", type=click.IntRange(min=3), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def selftest(rtt_ms: float, rate_bps: float, loss: float, duration_s: float, handshakes: int, as_json: bool) -> None:
    """Build a two-host topology and print configured vs measured RTT, rate and loss."""
    from .selftest import SelftestConfig, run_selftest

    try:
        report = run_selftest(
            SelftestConfig(rtt_ms=rtt_ms, rate_bps=rate_bps, loss=loss, duration_s=duration_s, handshakes=handshakes)
        )
    except (LabError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v))
    else:
        rtt, rate, loss_report = report["rtt"], report["rate"], report["loss"]
        table = Table(title=f"lab selftest: {rtt_ms:g} ms, {format_rate(rate_bps)}, loss {loss:g}")
        for column in ("quantity", "configured / expected", "measured", "error", "target met"):
            table.add_column(column)
        checks = report["checks"]
        table.add_row(
            "handshake RTT p50", f"{rtt['expected_ms']:.3f} ms", f"{rtt['p50_ms']:.3f} ms", f"{rtt['p50_error_ms']:.3f} ms", ""
        )
        table.add_row(
            "handshake RTT p99",
            f"{rtt['expected_ms']:.3f} ms",
            f"{rtt['p99_ms']:.3f} ms",
            f"{rtt['p99_error_ms']:.3f} ms (target <= 1 ms)",
            str(checks["rtt_p99_error_within_1ms"]),
        )
        table.add_row(
            "rate (emulator counters, busy time)",
            format_rate(rate["configured_bps"]),
            f"{rate['emulator_delivered_bps'] / 1e6:.4f} Mbit/s (link busy {rate['link_busy_share']:.1%})",
            f"{rate['emulator_error']:+.3%}",
            str(checks["rate_within_2pct"]),
        )
        table.add_row(
            "rate (receiver goodput, as IP)",
            f"{rate['delivered_bps'] / 1e6:.4f} Mbit/s delivered",
            f"{rate['goodput_as_ip_bps'] / 1e6:.4f} Mbit/s",
            f"{rate['goodput_error']:+.3%}",
            "",
        )
        low, high = loss_report["interval_99"]
        table.add_row(
            "loss (UDP, down)",
            f"{loss_report['configured']:.4f} (99%: {low}-{high} of {loss_report['sent']})",
            f"{loss_report['measured']:.4f} ({loss_report['lost']} lost)",
            "",
            str(checks["loss_within_99pct_interval"]),
        )
        table.add_row("emulator CPU (rate phase)", "", f"{rate['emulator_cpu_percent']:.1f} % of a core", "", "")
        timing = report["emulator_timing"]
        table.add_row(
            "emulator lateness (all packets)",
            "0",
            f"mean {timing['late_mean_us']:.1f} us, max {timing['late_max_ms']:.2f} ms",
            f"{timing['late_over_1ms']} of {timing['packets']} > 1 ms",
            "",
        )
        console.print(table)
    if not all(report["checks"].values()):
        sys.exit(1)


@lab.command()
@click.option(
    "--chain-kb",
    type=click.FloatRange(1.0, 96.0),
    required=True,
    help="DER size of the chain the server sends (leaf + intermediates), in KB of 1000 bytes: "
    "3-5 is classical RSA/ECDSA, 10-20 ML-DSA-like, up to 96.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for chain.pem, key.pem (0600) and root.pem (created when missing).",
)
@click.option(
    "--intermediates",
    type=click.IntRange(0, 8),
    default=None,
    help="Intermediate CAs in the chain (default: 1 up to 11.2 KB, then one more per 5.6 KB, at most 4).",
)
@click.option(
    "--key-type",
    type=click.Choice(["ec", "rsa"]),
    default="ec",
    show_default=True,
    help="The leaf's key: ec = P-256 (a 72-byte CertificateVerify); rsa adds 256-512 bytes of "
    "signature to the first flight (--rsa-bits 2048-4096) and a larger leaf.",
)
@click.option("--rsa-bits", type=click.Choice(["2048", "3072", "4096"]), default="2048", show_default=True)
@click.option("--name", default="origin.iwscope.test", show_default=True, help="The leaf's DNS subjectAltName.")
@click.option("--ip", "ips", multiple=True, help="An IP subjectAltName (repeatable; IPv4 or IPv6).")
@click.option(
    "--days",
    type=click.IntRange(1, 3650),
    default=90,
    show_default=True,
    help="Validity from now (certificates start one day back).",
)
def certs(
    chain_kb: float,
    out_dir: Path,
    intermediates: int | None,
    key_type: str,
    rsa_bits: str,
    name: str,
    ips: tuple[str, ...],
    days: int,
) -> None:
    """Write a TLS test chain of a chosen size (for the TLS first-flight experiments) and print a JSON summary.

    chain.pem holds the leaf and the intermediates (the server's Certificate message); the
    bulk beyond real keys and signatures is a non-critical private extension of random bytes
    standing in for post-quantum (ML-DSA) keys and signatures. Clients trust root.pem.
    """
    from iwscope.model import OPENSSL_FIRST_WRITE_BYTES, tls_first_flight_bytes, tls_handshake_rounds

    from .certs import write_chain

    try:
        info = write_chain(
            out_dir,
            chain_kb,
            intermediates=intermediates,
            key_type=key_type,
            rsa_bits=int(rsa_bits),
            name=name,
            ips=ips,
            days=days,
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    summary = info.to_json()
    for version in ("1.3", "1.2"):
        flight = tls_first_flight_bytes(
            info.chain_der_bytes, key_type, version, certificates=len(info.certificates), rsa_bits=info.key_bits
        )
        summary[f"tls{version}_first_flight_bytes_estimate"] = flight
        summary[f"tls{version}_handshake_rounds"] = {f"iw{iw}": tls_handshake_rounds(flight, iw) for iw in (3, 10, 16)}
        # OpenSSL servers send their first 4 KB of the flight as a piece of its own.
        summary[f"tls{version}_handshake_rounds_openssl"] = {
            f"iw{iw}": tls_handshake_rounds(flight, iw, first_write_bytes=OPENSSL_FIRST_WRITE_BYTES) for iw in (3, 10, 16)
        }
    click.echo(json.dumps(summary, indent=2))


def _add_campaign_commands() -> None:
    """`run`, `reproduce`, `report`, `demo`, `twin`, `stack`: campaigns on this substrate."""
    from iwscope_lab.cli_campaign import COMMANDS

    for command in COMMANDS:
        lab.add_command(command)


_add_campaign_commands()
