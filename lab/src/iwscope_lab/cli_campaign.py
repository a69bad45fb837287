"""``iwscope lab run | reproduce | report | demo | twin | stack``: campaigns on the lab substrate."""

from __future__ import annotations

import contextlib
import json
import pathlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click
from rich.console import Console

from iwprobe import wire
from iwscope_lab import demo
from iwscope_lab.campaign import CampaignError, CampaignPlan, LabCampaign
from iwscope_lab.service_address import DEFAULT_LISTEN, EXPOSED_LISTEN
from iwscope_lab.stack import Stack, local_stack
from iwscope_lab.topology import Topology

if TYPE_CHECKING:
    from iwscope_dashboard.pagecheck import PageReport

console = Console(stderr=True)
#: The reproduction's own API port (the demo stack uses 8700).
REPRODUCE_API_PORT = 8701


def _int_list(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        numbers = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError as error:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from error
    if not numbers:
        raise click.BadParameter("empty list")
    return numbers


def _arm_labels(value: str) -> tuple[str, ...]:
    """Comma-separated arms by label (``16``, ``32p``, ``learned``), each checked as the wire checks one."""
    labels = tuple(part.strip().lower() for part in value.split(",") if part.strip())
    for label in labels:
        try:
            wire.arm_label_iw(label)
        except ValueError as error:
            raise click.BadParameter(str(error)) from error
    if not labels:
        raise click.BadParameter("empty list")
    return labels


@contextlib.contextmanager
def _stack(detached: bool = False, listen: tuple[str, ...] = DEFAULT_LISTEN) -> Iterator[Stack]:
    """The running detached stack if there is one, else a stack for the duration of the command."""
    existing = Stack.attach()
    if existing is not None:
        if listen != existing.listen:
            console.print(
                f"[yellow]the running stack listens on {', '.join(existing.listen)}; "
                "`iwscope lab stack stop` first to change that"
            )
        yield existing
        return
    stack = local_stack(listen=listen).start(detached=detached)
    try:
        yield stack
    finally:
        if not detached:
            stack.stop()


@click.command("run")
@click.argument("scenario")
@click.option(
    "--trials",
    "repetitions",
    default=5,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Trials per probe, origin, arm and size (the campaign's rounds).",
)
@click.option("--arms", default="3,10", show_default=True, help="IW arms, comma-separated.")
@click.option("--sizes", default=None, help="Fixed object sizes in bytes, comma-separated (default 9000).")
@click.option(
    "--size-dist", type=click.Choice(["websearch"]), default=None, help="Draw sizes from a distribution instead of --sizes."
)
@click.option("--sizes-per-round", default=1, show_default=True, type=click.IntRange(1, 1000))
@click.option("--interval", "interval_s", default=0.0, show_default=True, type=float, help="Seconds between rounds.")
@click.option("--name", default=None, help="Campaign name (default: scenario and run id).")
@click.option(
    "--family",
    type=click.Choice(["ipv4", "ipv6"]),
    default=None,
    help="Measure over this IP version (ipv6 needs a dual_stack scenario; default: IPv4 addresses).",
)
@click.option("--timeout", "timeout_s", default=1800.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def run_command(
    scenario: str,
    repetitions: int,
    arms: str,
    sizes: str | None,
    size_dist: str | None,
    sizes_per_round: int,
    interval_s: float,
    name: str | None,
    family: str | None,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Run a measurement campaign on SCENARIO's topology, through the API and the worker.

    Origins whose scenario entry has a ``chain_kb`` label serve HTTPS with a test chain of
    that size (``iwscope lab certs``); the probes trust it."""
    if sizes is not None and size_dist is not None:
        raise click.UsageError("give --sizes or --size-dist, not both")
    fixed = _int_list(sizes) if sizes else (None if size_dist else (9_000,))
    topology = Topology.from_scenario(scenario)
    plan = CampaignPlan(
        name=name or f"{scenario} {topology.run_id}",
        arms=_int_list(arms) or (3, 10),
        sizes=fixed,
        size_dist=size_dist,
        sizes_per_round=sizes_per_round,
        repetitions=repetitions,
        interval_s=interval_s,
        family=family,
    )
    try:
        with _stack() as stack, topology:
            result = LabCampaign(topology, stack, plan, console=console).run(timeout_s=timeout_s)
    except CampaignError as error:
        raise click.ClickException(str(error)) from error
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: agents stopped, topology torn down")
        raise SystemExit(130) from None
    _print_result(result.to_dict(), as_json)


def _print_result(result: dict[str, object], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
        return
    expected = result["expected_per_probe"]
    console.print(
        f"campaign {result['campaign_id']}: "
        f"{'time-boxed' if expected is None else f'{expected} trials expected per probe'}; "
        f"stored {result['stored_per_probe']}; {result['unjoined']} without origin observation; "
        f"{result['seconds']:.0f} s"
    )


@click.command("reproduce")
@click.option("--quick", is_flag=True, help="Fewer sweep points and repetitions (a few minutes).")
@click.option("--out", "out_dir", default="out/reproduce", show_default=True, type=click.Path(path_type=pathlib.Path))
@click.option("--only", multiple=True, help="Run only these experiments (e.g. fig5_rtt_9k); repeatable.")
def reproduce_command(quick: bool, out_dir: pathlib.Path, only: tuple[str, ...]) -> None:
    """Rebuild the IW10 paper's Figure 5 and Figure 2 (and size / loss comparisons, the cost to
    competing traffic, TLS handshakes against the IW, HTTPS against HTTP/3 and the QUIC census, seed 002's
    time-sequence plots and send paths) in the lab."""
    from iwscope_lab.cost import COST_KEY
    from iwscope_lab.fairness import FAIRNESS_KEY
    from iwscope_lab.quic_compare import QUIC_KEY
    from iwscope_lab.reproduce import experiments, reproduce
    from iwscope_lab.seedtraces import SEED_TRACES_KEY
    from iwscope_lab.sendpaths import SEND_PATHS_KEY
    from iwscope_lab.testbed import TESTBED_KEY
    from iwscope_lab.tls import TLS_KEY

    known = {experiment.key for experiment in experiments(quick)} | {
        FAIRNESS_KEY,
        TESTBED_KEY,
        COST_KEY,
        TLS_KEY,
        QUIC_KEY,
        SEED_TRACES_KEY,
        SEND_PATHS_KEY,
    }
    unknown = sorted(set(only) - known)
    if unknown:
        raise click.BadParameter(f"unknown experiments {unknown}; known: {sorted(known)}", param_hint="--only")
    # A stack of its own (database, Redis db, queue, port): the paper's sweep probes must not
    # mix with the demo's regions, and a running demo stack keeps running.
    stack = local_stack(
        api_port=REPRODUCE_API_PORT,
        dashboard_port=None,
        database="iwscope_reproduce",
        redis_db=1,
        celery_queue="iwscope-reproduce",
    ).start(beat=False)
    try:
        reproduce(out_dir, stack, quick=quick, only=only, console=console)
    except CampaignError as error:
        raise click.ClickException(str(error)) from error
    finally:
        stack.stop()
    console.print(f"report: {out_dir / 'report.html'}\ntables: {out_dir / 'report.md'}\nsummary: {out_dir / 'summary.json'}")


@click.command("report")
@click.argument("out_dir", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path))
def report_command(out_dir: pathlib.Path) -> None:
    """Re-render OUT_DIR/report.html and OUT_DIR/report.md from OUT_DIR/summary.json."""
    from iwscope_lab.report import write_reports

    html_path, markdown_path = write_reports(json.loads((out_dir / "summary.json").read_text()), out_dir)
    console.print(f"report: {html_path}\ntables: {markdown_path}")


#: The main job's campaign: every arm of interest, web-search sizes, short enough that the
#: slowest path of `world` (3.2 s RTT behind 256 kbit/s) finishes in about three minutes.
@click.command("demo")
@click.option("--scenario", default=demo.SCENARIO, show_default=True)
@click.option(
    "--duration",
    "duration_s",
    default=demo.DURATION_S,
    show_default=True,
    type=click.FloatRange(30, 86_400),
    help="Time box of the benefit campaign, seconds.",
)
@click.option("--no-cost", is_flag=True, help="Skip the competing-flow phases.")
@click.option("--no-passive", is_flag=True, help="Skip the real users (nginx + iwprobe tap) phase.")
@click.option(
    "--expose",
    is_flag=True,
    help="Serve the API and the dashboard on every interface (default: loopback and the lab's "
    "service address only). PostgreSQL and Redis stay on loopback either way.",
)
@click.option("--no-page-check", is_flag=True, help="Skip the last step: every dashboard page opened in headless Chromium.")
def demo_command(scenario: str, duration_s: float, no_cost: bool, no_passive: bool, expose: bool, no_page_check: bool) -> None:
    """The main job: a detached stack, a time-boxed paired campaign, the cost phases, the census and
    the real users alongside, a summary, a check of every dashboard page.

    The check opens every page in headless Chromium and counts its figures' data points (exit 1
    when one the demo fills is empty; `iwscope dashboard check-pages` runs it alone)."""
    started = time.monotonic()
    listen = EXPOSED_LISTEN if expose else DEFAULT_LISTEN
    if expose:
        console.print(
            "[bold yellow]warning:[/] --expose: the API and the dashboard listen on every interface; "
            "anyone who can reach this machine can read the dashboard and the public API "
            "(writes still need tokens). Put them behind a firewall or a TLS proxy."
        )
    try:
        with _stack(detached=True, listen=listen) as stack:
            result = demo.run_demo(stack, console, scenario, duration_s, with_cost=not no_cost, with_passive=not no_passive)
            tables, lines = demo.summary(stack, result)
            traced = demo.traced_trial(stack, result.benefit.campaign_id)
            if result.passive is not None:
                demo.ensure_read_token(stack)
    except CampaignError as error:
        raise click.ClickException(str(error)) from error
    _print_result(result.benefit.to_dict(), as_json=False)
    for table in tables:
        console.print(table)
    for line in lines:
        console.print(line)
    running = Stack.attach()  # the detached stack, as recorded once the `with` above let go of it
    url = running.dashboard_url if running else None
    check, unchecked = None, None
    if url and running is not None and not no_page_check:
        token = running.run_dir / "read-token" if result.passive is not None else None
        try:
            check = _check_pages(url, token, no_cost=no_cost, no_https=result.https_campaign_id is None, trial=traced)
        except click.ClickException as error:  # said after the addresses below
            unchecked = error
    console.print(
        f"\n[bold green]Dashboard:[/] {url or '(dashboard not installed)'}"
        f"?campaign={result.benefit.campaign_id}\n"
        + (
            f"Real users: {url}real-users (sign in with the token in {running.run_dir / 'read-token'})\n"
            if url and running is not None and result.passive is not None
            else ""
        )
        + f"API: {running.local_api_url if running else '?'}/docs\n"
        f"make demo took {time.monotonic() - started:.0f} s. The stack keeps running; "
        "`iwscope lab stack stop` (or `make clean`) stops it."
    )
    if unchecked is not None:
        raise unchecked
    if check is not None and not check.ok:
        raise click.ClickException(
            "the dashboard shows no data in "
            + ", ".join(f"{count.page} {count.item}" for count in check.failures)
            + " (table above; `iwscope dashboard check-pages --url URL` checks again)"
        )


#: What a demo without the cost phases, or without the HTTPS campaign (a scenario without
#: ``demo.HTTPS_PROBE``), leaves empty.
NO_COST_EMPTY = frozenset({"cost-bulk-graph"})
NO_HTTPS_EMPTY = frozenset({"tls-improvement-graph", "tls-means-graph"})
_NOT_CHECKED = "\n[yellow]Dashboard pages not checked:[/] {error} (the check needs the dashboard and its `test` extra)"


def _check_pages(
    url: str, token_path: pathlib.Path | None, *, no_cost: bool, no_https: bool, trial: str | None = None
) -> PageReport | None:
    """The demo's last step: every page in headless Chromium, the table page -> figure -> points,
    and the Trials page's inspector of ``trial`` (a traced one) (``None``: skipped, the dashboard's
    page check is not installed)."""
    try:  # the dashboard is the lab's optional neighbour: `iwscope` loads without it
        from iwscope_dashboard.pagecheck import DEMO_EMPTY, BrowserUnavailable, check_pages, format_report
    except ImportError as error:
        console.print(_NOT_CHECKED.format(error=error))
        return None
    console.print("\n[bold]Dashboard pages[/] (headless Chromium, data points per figure):")
    token = token_path.read_text().strip() if token_path is not None and token_path.exists() else None
    empty = DEMO_EMPTY | (NO_COST_EMPTY if no_cost else set()) | (NO_HTTPS_EMPTY if no_https else set())
    try:
        report = check_pages(url, read_token=token, empty_allowed=empty, trial=trial)
    except ImportError as error:  # Playwright
        console.print(_NOT_CHECKED.format(error=error))
        return None
    except BrowserUnavailable as error:
        raise click.ClickException(f"{error}; `make setup` installs Chromium, `--no-page-check` skips the check") from error
    console.print(format_report(report), markup=False, highlight=False)
    return report


@click.group("stack")
def stack_group() -> None:
    """The detached collector stack that `demo` leaves running."""


@stack_group.command("status")
def stack_status() -> None:
    """Show whether a detached stack runs, and where."""
    stack = Stack.attach()
    if stack is None:
        click.echo("no stack running")
        raise SystemExit(1)
    click.echo(
        json.dumps(
            {"api": stack.local_api_url, "dashboard": stack.dashboard_url, "listen": list(stack.listen), "pids": stack.pids},
            indent=2,
        )
    )


@stack_group.command("stop")
def stack_stop() -> None:
    """Stop the detached stack (API, worker, beat, dashboard); data stays in .run/."""
    stack = Stack.attach()
    if stack is not None:
        stack.stop()
    click.echo("stack stopped")


@click.command("twin")
@click.option("--campaign", "campaign_id", type=int, required=True, help="The measured campaign to build twins of.")
@click.option("--base", "baseline_iw", type=int, default=3, show_default=True, help="Baseline arm.")
@click.option("--treat", "treatment_iw", type=int, default=10, show_default=True, help="Treatment arm of the fit check.")
@click.option(
    "--what-if",
    "what_if",
    default="16,32",
    show_default=True,
    help="Arms to predict, comma-separated: IWs, paced (32p) or learned.",
)
@click.option("--compare-arm", default=None, help="An arm the campaign measured, predicted and compared (held out).")
@click.option("--repetitions", type=int, default=40, show_default=True, help="Rounds per twin path (at most, with --duration).")
@click.option("--duration", "duration_s", type=float, default=None, help="Time box (s): rounds until it ends, as make demo's.")
@click.option("--source-database-url", default=None, help="Where the campaign is (default: the local stack's, make demo's).")
@click.option("--twin-campaign", type=int, default=None, help="Compare an earlier twin campaign again instead of running one.")
@click.option("--out", "out_dir", default="out/twin", show_default=True, type=click.Path(path_type=pathlib.Path))
@click.option(
    "--store/--no-store",
    default=True,
    show_default=True,
    help="Store the result beside the campaign in its collector (the API and the Model page show it, as a prediction).",
)
def twin_command(
    campaign_id: int,
    baseline_iw: int,
    treatment_iw: int,
    what_if: str,
    compare_arm: str | None,
    repetitions: int,
    duration_s: float | None,
    source_database_url: str | None,
    twin_campaign: int | None,
    out_dir: pathlib.Path,
    store: bool,
) -> None:
    """A calibrated lab twin of each path of a measured campaign: the fit check on its arms, then
    predictions for arms it did not measure (docs/reproduction.md, "The lab twin")."""
    from iwscope_lab import twin, twin_report

    predicted = [arm for arm in _arm_labels(what_if) if arm not in (str(baseline_iw), str(treatment_iw))]
    if compare_arm is not None:
        compare_arm = _arm_labels(compare_arm)[0]
        if compare_arm not in predicted:
            predicted.append(compare_arm)
    source = source_database_url or local_stack().database_url
    stack = local_stack(
        api_port=twin.TWIN_API_PORT,
        dashboard_port=None,
        database=twin.TWIN_DATABASE,
        redis_db=twin.TWIN_REDIS_DB,
        celery_queue=twin.TWIN_QUEUE,
    )
    if twin_campaign is None:
        stack.start(beat=False)
    try:
        result = twin.run_twin(
            source,
            stack,
            campaign_id,
            baseline_iw=baseline_iw,
            treatment_iw=treatment_iw,
            what_if=predicted,
            compare_arm=compare_arm,
            repetitions=repetitions,
            duration_s=duration_s,
            console=console,
            twin_campaign_id=twin_campaign,
        )
    except (CampaignError, ValueError) as error:
        raise click.ClickException(str(error)) from error
    finally:
        if twin_campaign is None:
            stack.stop()
    twin_report.write_outputs(result, out_dir)
    click.echo(twin_report.twin_markdown(result))
    console.print(f"wrote {out_dir / 'twin.json'} and {out_dir / 'twin.md'}")
    if store:
        prediction_id, duplicate = twin.store_result(source, result)
        console.print(
            f"{'already stored' if duplicate else 'stored'} as twin prediction {prediction_id} of campaign {campaign_id} "
            f"(GET /api/v1/analysis/twin-predictions?campaign={campaign_id}; the Model page)"
        )


COMMANDS = (run_command, reproduce_command, report_command, demo_command, twin_command, stack_group)
