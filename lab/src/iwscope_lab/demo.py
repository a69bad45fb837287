"""The main job (`make demo`): both halves of the question in one short, powered run.

* **Benefit**: a time-boxed, adaptive campaign on the ``demo`` scenario (17 probes in six
  regions, every Figure 5 bucket up to 3 s RTT): paired rounds (every arm fetches the same
  web-search sizes over the same path, in random order), as many rounds as fit in
  :data:`DURATION_S`; a probe stops early once the buckets it feeds have a 95 % interval of
  +- :data:`TARGET_CI_MS` or better, which leaves the slow paths the machine to themselves.
* **HTTPS**: on the benefit topology, a second origin serves HTTPS with a test chain of
  :data:`HTTPS_CHAIN_KB` KB (a post-quantum-sized first flight: three rounds from IW3, two from
  IW10, one from IW16), and one probe of an existing path (:data:`HTTPS_PROBE`) runs a short
  HTTPS campaign against it between its benefit rounds (:class:`DemoCampaign`), so the TLS page
  has data; a minute of that probe's time, no phase of its own.  The same origin serves HTTP/3
  (``iwprobe origin --quic``) and the campaign's QUIC arms (:data:`HTTPS_QUIC_ARMS`) pair with its
  TCP arms in the same rounds, so the HTTP/3 page has data.
* **Cost**: at the same time, on a topology of its own, the competing-flow experiment of the
  IETF 78 testbed (a long-lived flow and Poisson arrivals of short IW3 / IW10 flows on one
  4 Mbit/s, 100 ms bottleneck), short settings, so the Cost page's "Bulk flows" section has data.
* **Proof and the wild**: the probes capture their trials' packets and infer the IW the
  origin used (the summary says how many agreed with their arm); alongside, a census campaign
  of four lab web servers nobody here wrote (Python's ``http.server`` and lighttpd at initcwnd
  4, 10, 16 and 32) through the API, so the "IW in the wild" page has data.
* **Real users**: alongside, the IETF 78 design on an unmodified web server (scenario
  ``passive``): Debian's nginx, 220 emulated users in their own /24s behind six regional links,
  ``iwprobe tap`` splitting their prefixes between the server's default IW (10) and IW 3 and
  IW 16, a passive campaign through the API, half-way a share sweep (the treated share from 50 %
  to 80 %), so the "Real users" page has data (it needs a read token: the demo writes one to
  ``.run/read-token``).
* A text summary: the headline with its interval, the buckets where the gain is clear, what
  the short flows of each IW went through on the shared bottleneck (n, 95 % intervals), the
  client-side check, the census and the real users' table.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from iwscope_lab.campaign import CampaignPlan, CampaignResult, LabCampaign
from iwscope_lab.census import CensusResult, LabCensus, census_plan
from iwscope_lab.fairness import Bottleneck, PhaseResult, run_fairness
from iwscope_lab.hostspec import PlacedHost
from iwscope_lab.links import LinkSpec
from iwscope_lab.passive import LabPassive, PassivePlan, PassiveResult
from iwscope_lab.scenarios import load_scenario
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host, Topology
from iwscope_lab.users import PopulationConfig

#: Scenario of the benefit campaign.
SCENARIO = "demo"
#: Time box of the benefit campaign (seconds).
DURATION_S = 300.0
#: A probe stops once every bucket it feeds is within +- this (ms, 95 %).
TARGET_CI_MS = 15.0
#: HTTPS: an origin beside the benefit's, serving a test chain of this many KB (``certs``).
HTTPS_ORIGIN = "origin-tls"
HTTPS_CHAIN_KB = 16
#: The probe of the benefit topology that also runs the HTTPS campaign (80 ms, 5 Mbit/s, 0.2 %
#: loss: a round of the flight is 80 ms), and that campaign: 1 KB objects (the handshake is the
#: transfer measured), every arm, this many rounds (about 0.4 s a trial).
HTTPS_PROBE = "na-dsl"
HTTPS_SIZES: tuple[int, ...] = (1_000,)
#: The QUIC arms of the HTTPS campaign (wire v9): the HTTP/3 page's default pair (IW 3 and 10),
#: each against its TCP arm and against each other.
HTTPS_QUIC_ARMS: tuple[str, ...] = ("3q", "10q")
HTTPS_REPETITIONS = 30
#: The competing-flow phases: all-IW3 and all-IW10 short flows at 70 % offered load.
COST_BOTTLENECK = Bottleneck(4e6, 100.0)
COST_LOAD = 0.7
COST_MIXES: tuple[tuple[int, ...], ...] = ((3,), (10,))
COST_FLOWS = 24
#: The census's lab web servers: host -> (server, initcwnd), and its rounds.
CENSUS_WEBS: dict[str, tuple[str, int]] = {
    "web4": ("http.server", 4),
    "web10": ("lighttpd", 10),
    "web16": ("http.server", 16),
    "web32": ("lighttpd", 32),
}
CENSUS_ROUNDS = 3
#: The real users' study: the server's default IW and two treated arms, then a share sweep.
PASSIVE_SCENARIO = "passive"
PASSIVE_ARMS: tuple[tuple[str, int], ...] = (("default", 5000), ("3", 2500), ("16", 2500))
PASSIVE_SWEEP: tuple[tuple[tuple[str, int], ...], ...] = ((("default", 2000), ("3", 4000), ("16", 4000)),)
#: Users active at once per user host (the rest of the demo shares the machine).
PASSIVE_CONCURRENT_USERS = 4


def census_hosts() -> list[Host]:
    """The census topology: the web servers and two probes on different paths."""
    webs = [
        Host(
            name,
            role="web",
            region="lab",
            link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0),
            labels={"server": server, "iw": str(iw)},
        )
        for name, (server, iw) in CENSUS_WEBS.items()
    ]
    return webs + [
        Host("census-eu", role="probe", region="census-eu", link=LinkSpec.symmetric(rate_bps=50e6, rtt_ms=40)),
        Host("census-as", role="probe", region="census-as", link=LinkSpec.symmetric(rate_bps=10e6, rtt_ms=180)),
    ]


#: Share of the benefit campaign's rounds traced (their packets kept, for the Trials page's
#: inspector): a few dozen rounds of a demo, ~5 KB per trial.
TRACE_SHARE = 0.05


def demo_plan(
    scenario: str = SCENARIO, duration_s: float = DURATION_S, target_ci_ms: float | None = TARGET_CI_MS
) -> CampaignPlan:
    return CampaignPlan(
        name=f"demo {scenario}",
        arms=(3, 10, 16),
        sizes=None,
        size_dist="websearch",
        sizes_per_round=4,
        repetitions=100_000,
        duration_s=duration_s,
        target_ci_ms=target_ci_ms,
        trace_share=TRACE_SHARE,
        # CUBIC, Linux's default, whatever this host's is: the Model page plays CUBIC
        congestion_control="cubic",
        quic=True,  # the HTTPS origin serves HTTP/3 too (the HTTPS campaign's QUIC arms)
    )


def passive_plan(duration_s: float = DURATION_S) -> PassivePlan:
    return PassivePlan(
        name="demo real users",
        arms=PASSIVE_ARMS,
        duration_s=duration_s,
        sample_share=0.1,
        flush_interval_s=15,
        sweep=PASSIVE_SWEEP,
        population=PopulationConfig(concurrent_users=PASSIVE_CONCURRENT_USERS),
    )


def demo_topology(scenario: str = SCENARIO) -> Topology:
    """The benefit scenario's hosts plus the HTTPS origin (when the scenario has :data:`HTTPS_PROBE`)."""
    https_origin = Host(
        HTTPS_ORIGIN,
        role="origin",
        region="datacenter",
        link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0),
        labels={"chain_kb": str(HTTPS_CHAIN_KB)},
    )
    with_probe = any(host.name == HTTPS_PROBE for host in load_scenario(scenario).hosts())
    return Topology.from_scenario(scenario, extra_hosts=[https_origin] if with_probe else [])


class DemoCampaign(LabCampaign):
    """The benefit campaign over the plain-HTTP origin(s), and an HTTPS campaign of
    ``https_repetitions`` rounds over the HTTPS origin(s) (a ``chain_kb`` label) that only the
    probe on host ``https_probe`` runs, between its benefit rounds (``iwprobe run --campaign A
    --campaign B``: one round of each in turn)."""

    def __init__(
        self, *args: Any, https_probe: str | None = HTTPS_PROBE, https_repetitions: int = HTTPS_REPETITIONS, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.https_probe = https_probe
        self.https_repetitions = https_repetitions
        self.https_campaign_id: int | None = None

    def _create_campaign(self, origin_ids: list[str], timeout_s: float) -> int:
        https = [self.origin_ids[name] for name in self.chains if name in self.origin_ids]
        benefit = super()._create_campaign([origin for origin in origin_ids if origin not in https], timeout_s)
        if https and self.https_probe is not None:
            answer = self._api("POST", "/api/v1/campaigns", self._https_body(https, timeout_s), token=self._tokens["admin"])
            self.https_campaign_id = int(answer["id"])
        return benefit

    def _https_body(self, origin_ids: list[str], timeout_s: float) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        probe = self.topology.host(self.https_probe or "")
        return {
            "name": f"demo https ({HTTPS_CHAIN_KB} KB chain, {probe.name})",
            "origin_ids": origin_ids,
            "probe_regions": [probe.region or "lab"],  # and of that region, only the probe started with it
            "arms": [str(iw) for iw in self.plan.arms] + (list(HTTPS_QUIC_ARMS) if self.plan.quic else []),
            "sizes": list(HTTPS_SIZES),
            "size_dist": None,
            "sizes_per_round": len(HTTPS_SIZES),
            "repetitions": self.https_repetitions,
            "interval_s": 0.0,
            "starts_at": (now - dt.timedelta(seconds=5)).isoformat(),
            "ends_at": (now + dt.timedelta(seconds=timeout_s + 300)).isoformat(),
            "calibrate": False,
        }

    def _probe_campaigns(self, host: PlacedHost) -> list[int]:
        extra = [self.https_campaign_id] if self.https_campaign_id is not None and host.name == self.https_probe else []
        return super()._probe_campaigns(host) + extra

    def finish(self, *, timeout_s: float = 900.0, show_progress: bool = True, join_timeout_s: float = 120.0) -> CampaignResult:
        result = super().finish(timeout_s=timeout_s, show_progress=show_progress, join_timeout_s=join_timeout_s)
        if self.https_campaign_id is not None:
            # the TLS page needs the origin's first flight: until the HTTPS trials are joined and folded
            self._wait_until_folded(time.monotonic() + 60, campaign_id=self.https_campaign_id)
        return result

    def close(self) -> None:
        if self.https_campaign_id is not None:  # its window ends with the run, like the benefit campaign's
            self._close_window(self.https_campaign_id)
        super().close()


@dataclass
class DemoResult:
    benefit: CampaignResult
    cost: list[PhaseResult] = field(default_factory=list)
    cost_error: str | None = None
    census: CensusResult | None = None
    census_error: str | None = None
    passive: PassiveResult | None = None
    passive_error: str | None = None
    #: The HTTPS campaign on :data:`HTTPS_PROBE`'s path (``None``: the scenario has no such probe).
    https_campaign_id: int | None = None


def run_demo(
    stack: Stack,
    console: Console,
    scenario: str = SCENARIO,
    duration_s: float = DURATION_S,
    with_cost: bool = True,
    with_passive: bool = True,
) -> DemoResult:
    """The benefit campaign with the cost phases, the census and the real users alongside (their
    own topologies, no progress bars)."""
    cost: list[PhaseResult] = []
    errors: list[str] = []

    def cost_phases() -> None:
        try:
            cost.extend(
                run_fairness(
                    stack,
                    bottleneck=COST_BOTTLENECK,
                    loads=(COST_LOAD,),
                    mixes=COST_MIXES,
                    flows=COST_FLOWS,
                    timeout_s=duration_s + 120,
                    show_progress=False,
                )
            )
        except Exception as error:  # reported with the result, the benefit half still stands
            errors.append(f"{type(error).__name__}: {error}")

    census: list[CensusResult] = []
    census_errors: list[str] = []

    def census_phase() -> None:
        try:
            with Topology(hosts=census_hosts()) as topology:
                census.append(
                    LabCensus(topology, stack, census_plan("demo census", rounds=CENSUS_ROUNDS), console=console).run(
                        timeout_s=duration_s + 120, show_progress=False
                    )
                )
        except Exception as error:  # reported with the result, like the cost phases
            census_errors.append(f"{type(error).__name__}: {error}")

    passive: list[PassiveResult] = []
    passive_errors: list[str] = []

    def passive_phase() -> None:
        try:
            with Topology.from_scenario(PASSIVE_SCENARIO) as topology:
                passive.append(
                    LabPassive(topology, stack, passive_plan(duration_s), console=console).run(timeout_s=duration_s + 300)
                )
        except Exception as error:  # reported with the result, like the cost phases
            passive_errors.append(f"{type(error).__name__}: {error}")

    workers = [threading.Thread(target=cost_phases, name="iwscope-demo-cost", daemon=True)] if with_cost else []
    workers.append(threading.Thread(target=census_phase, name="iwscope-demo-census", daemon=True))
    if with_passive:
        workers.append(threading.Thread(target=passive_phase, name="iwscope-demo-passive", daemon=True))
    for worker in workers:
        worker.start()
    with demo_topology(scenario) as topology:
        campaign = DemoCampaign(topology, stack, demo_plan(scenario, duration_s), console=console)
        benefit = campaign.run(timeout_s=duration_s + 300)
    console.print("waiting for the competing-flow phases and the census ...")
    for worker in workers:
        worker.join()
    return DemoResult(
        benefit,
        cost,
        errors[0] if errors else None,
        census[0] if census else None,
        census_errors[0] if census_errors else None,
        passive[0] if passive else None,
        passive_errors[0] if passive_errors else None,
        campaign.https_campaign_id,
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def summary(stack: Stack, result: DemoResult) -> tuple[list[Table], list[str]]:
    """Tables and lines of the closing summary, read back through the analysis functions."""
    from iwscope.analysis import Filters, compare_many, headline

    filters = Filters(campaign_ids=(result.benefit.campaign_id,), baseline_iw=3, treatment_iw=10)
    lines: list[str] = []
    tables: list[Table] = []
    with stack.session() as session:
        top = headline(session, filters)
        per_dimension = compare_many(session, filters, ("rtt", "bandwidth"))
    if top.too_small:
        lines.append(f"IW10 vs IW3: n too small ({top.n_pairs} pairs)")
    else:
        retrans = "n/a" if top.retrans_increase_pp is None else f"{top.retrans_increase_pp:+.2f} pp"
        lines.append(
            f"IW10 vs IW3 over {top.n_pairs:,} paired trials on {top.n_paths} paths: "
            f"{_ms(top.abs_ms)} ms faster [95 % CI {_ms(top.abs_ci_low)}, {_ms(top.abs_ci_high)}], "
            f"{_ms(top.pct)} % [{_ms(top.pct_ci_low)}, {_ms(top.pct_ci_high)}]; "
            f"share of trials with retransmissions {retrans}"
        )
    for dimension, results in per_dimension.items():
        table = Table(title=f"IW10 vs IW3 by {dimension} (paired, 95 % CI)", title_justify="left")
        for column in ("bucket", "pairs", "paths", "ms", "95 % CI", "%", "clear gain"):
            table.add_column(column, justify="right" if column not in ("bucket",) else "left")
        for row in results:
            if row.too_small:
                table.add_row(row.bucket, str(row.n_pairs), str(row.n_paths), "n too small", "", "", "")
                continue
            clear = row.abs_ci_low is not None and row.abs_ci_low > 0
            table.add_row(
                row.bucket,
                str(row.n_pairs),
                str(row.n_paths),
                _ms(row.abs_ms),
                f"[{_ms(row.abs_ci_low)}, {_ms(row.abs_ci_high)}]",
                _ms(row.pct),
                "yes" if clear else "no",
            )
        tables.append(table)
    clear_rtt = [row.bucket for row in per_dimension["rtt"] if not row.too_small and (row.abs_ci_low or 0) > 0]
    lines.append(f"clear gain (95 % CI above 0) in RTT buckets: {', '.join(clear_rtt) or 'none'}")
    if result.https_campaign_id is not None:
        lines.extend(https_lines(stack, result.https_campaign_id))
        lines.extend(http3_lines(stack, result.https_campaign_id))
    if result.cost:
        lines.extend(cost_lines(result.cost))
    elif result.cost_error:
        lines.append(f"competing-flow phases failed: {result.cost_error}")
    lines.extend(proof_lines(stack, result))
    if result.passive is not None:
        lines.extend(passive_lines(stack, result.passive))
    elif result.passive_error:
        lines.append(f"real users failed: {result.passive_error}")
    return tables, lines


def http3_lines(stack: Stack, campaign_id: int) -> list[str]:
    """The HTTPS campaign's HTTP/3 trials: what HTTP/3 saves against TCP + TLS at IW 3 and 10, and
    IW 10 against IW 3 over HTTP/3 (the probe's total; what the HTTP/3 page shows)."""
    from iwscope.analysis import Filters
    from iwscope.analysis.protocols import QUIC_ARMS, protocol_comparisons

    with stack.session() as session:
        filters = Filters(campaign_ids=(campaign_id,), baseline_iw=3, treatment_iw=10, metric="client")
        rows = protocol_comparisons(session, filters)
    lines = []
    for row in rows:
        what = (
            f"HTTP/3 IW{row.treatment.iw} vs IW{row.baseline.iw}"
            if row.dimension == QUIC_ARMS
            else f"HTTP/3 vs TCP+TLS at IW{row.baseline.iw}"
        )
        paths = f"{row.n_paths} path{'s' if row.n_paths != 1 else ''}"
        gain = (
            f"n too small ({row.n_pairs} pairs on {paths})"
            if row.too_small
            else f"{_ms(row.abs_ms)} ms faster {_bounds(_pair_of(row.abs_ci_low, row.abs_ci_high), digits=1)} "
            f"over {row.n_pairs} pairs on {paths}" + (f" ({row.note})" if row.note else "")
        )
        lines.append(f"{what} ({row.bucket}): {gain}")
    return lines or ["HTTP/3: no trials (the HTTPS origin did not serve HTTP/3)"]


def https_lines(stack: Stack, campaign_id: int) -> list[str]:
    """The HTTPS campaign's handshakes, IW10 and IW16 vs IW3 (what the TLS page shows)."""
    from iwscope.analysis import Filters, tls_by_flight

    lines = []
    for treatment in (10, 16):
        with stack.session() as session:
            rows = tls_by_flight(session, Filters(campaign_ids=(campaign_id,), baseline_iw=3, treatment_iw=treatment))
        for row in rows:
            paths = f"{row.n_paths} path{'s' if row.n_paths != 1 else ''}"
            gain = (
                f"n too small ({row.n_pairs} pairs on {paths})"
                if row.too_small
                else f"{_ms(row.abs_ms)} ms faster {_bounds(_pair_of(row.abs_ci_low, row.abs_ci_high), digits=1)} "
                f"over {row.n_pairs} pairs on {paths}" + (f" ({row.note})" if row.note else "")
            )
            lines.append(
                f"HTTPS ({HTTPS_CHAIN_KB} KB chain on {HTTPS_PROBE}, first flight {row.bucket}): the origin's handshake "
                f"at IW{treatment} vs IW3: {gain}"
            )
    return lines or [f"HTTPS campaign {campaign_id}: no handshake with its origin's first flight recorded"]


def _pair_of(low: float | None, high: float | None) -> tuple[float, float] | None:
    return None if low is None or high is None else (low, high)


def passive_lines(stack: Stack, result: PassiveResult) -> list[str]:
    """The real users' table (seed 003's layout, from the Real users analysis) and what arrived."""
    from iwscope.analysis.passive import passive_summary
    from iwscope.analysis.passive_frames import PassiveFilters

    with stack.session() as session:
        summary = passive_summary(session, PassiveFilters(campaign_id=result.campaign_id))
    failures = result.population.get("failures", 0)
    lines = [
        f"real users (nginx + iwprobe tap, campaign {result.campaign_id}): "
        f"{result.population.get('requests', 0):,} requests from {result.population.get('addresses', 0)} "
        f"addresses, {failures} failed; the agent saw {result.agent.get('connections_seen', 0):,} connections "
        f"({result.agent.get('connections_captured', 0):,} with a measured first response), the collector "
        f"holds {result.stored_connections:,} in {result.stored_aggregates:,} aggregate rows"
    ]
    table = summary.overall
    for arm in table.arms:
        name = f"IW{arm.iw}" if arm.arm != "default" else f"default (IW{arm.iw})"
        if arm.too_small:
            lines.append(f"  {name}: n too small ({arm.responses} responses, {arm.clusters} clusters)")
            continue
        latency = arm.latency_ms
        improvement = (
            ""
            if arm.baseline or not arm.improvement_ms
            else f"; avg {arm.improvement_ms['avg'].value:+,.1f} ms {_bounds(_pair(arm.improvement_ms['avg']))}"
            f" faster than {table.baseline_arm}"
        )
        lines.append(
            f"  {name}: {arm.responses:,} first responses, avg {_ms(latency['avg'].value)} ms "
            f"{_bounds(_pair(latency['avg']))}, p50 {_ms(latency['p50'].value)}, "
            f"p90 {_ms(latency['p90'].value)}, p99 {_ms(latency['p99'].value)} ms" + improvement
        )
    lines.append("  the Real users page needs a read token: one is in .run/read-token (mode 0600)")
    return lines


def traced_trial(stack: Stack, campaign_id: int) -> str | None:
    """A trial of the campaign whose packets were traced (:data:`TRACE_SHARE` of its rounds),
    preferring one traced at both ends: the page check opens its inspector.  ``None`` when no
    round was traced (a share of 5 % of a short run can draw none)."""
    from sqlalchemy import text

    with stack.session() as session:
        found = session.execute(
            text(
                "SELECT tt.trial_id FROM trial_traces tt JOIN trials t ON t.trial_id = tt.trial_id "
                "WHERE t.campaign_id = :campaign AND tt.side = 'receiver' "
                "ORDER BY EXISTS (SELECT 1 FROM trial_traces s WHERE s.trial_id = tt.trial_id AND s.side = 'sender') DESC, "
                "t.started_at LIMIT 1"
            ),
            {"campaign": campaign_id},
        ).scalar()
    return None if found is None else str(found)


def ensure_read_token(stack: Stack) -> pathlib.Path:
    """``.run/read-token`` (0600): a ``read`` token for the Real users page, made once per stack
    database and made again when the one there no longer opens the door (revoked)."""
    from iwscope.auth.services import api_token_valid, create_api_token
    from iwscope.config import get_settings

    path = stack.run_dir / "read-token"
    with stack.session() as session:
        if path.exists() and api_token_valid(session, get_settings(), "read", path.read_text().strip()):
            return path
        token = create_api_token(session, "read", "make demo: the Real users page")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    return path


def _pair(value: Any) -> tuple[float, float] | None:
    return None if value is None or value.low is None else (value.low, value.high)


def proof_lines(stack: Stack, result: DemoResult) -> list[str]:
    """The client-side check of the benefit campaign and the census, read back through the
    analysis functions (what the "IW in the wild" page shows)."""
    from iwscope.analysis import Filters, census_targets, iw_check

    with stack.session() as session:
        checks = iw_check(session, Filters(campaign_ids=(result.benefit.campaign_id,)))
        targets = census_targets(session, Filters(campaign_ids=(result.census.campaign_id,))) if result.census is not None else []
    agree, disagree = sum(c.agree for c in checks), sum(c.disagree for c in checks)
    inferred = sum(c.inferred for c in checks)
    suspects = [c.probe_name for c in checks if c.suspect]
    not_arm = sum(c.origin_not_arm for c in checks)
    lines = [
        f"client-side IW check: {inferred:,} trials inferred on {len(checks)} paths; of those decided, "
        f"{agree:,} agree with the window the origin had and {disagree:,} do not"
        + (f" ({not_arm:,} origin windows were not the arm: 1 after a retransmitted SYN-ACK)" if not_arm else "")
        + (f"; proxy or cache suspected on {', '.join(suspects)}" if suspects else "; no proxy or cache suspected")
    ]
    if result.census is None:
        lines.append(f"census failed: {result.census_error}")
        return lines
    configured = {url: (host, iw) for host, (url, iw) in result.census.targets.items()}
    for target in sorted(targets, key=lambda t: configured.get(t.url, ("", 0))[1]):
        host, iw = configured.get(target.url, ("?", 0))
        answer = target.overall
        found = (
            f"IW {answer.iw_segments} in {answer.share:.0%} of {answer.ok} determined records "
            f"{_bounds(None if answer.share_ci_low is None else (answer.share_ci_low, answer.share_ci_high), 100)} %"
            if answer.iw_segments is not None and answer.share is not None
            else "n too small"
        )
        lines.append(f"census {host} ({CENSUS_WEBS.get(host, ('?', 0))[0]}, initcwnd {iw}): {found}")
    return lines


def _bounds(interval: Any, scale: float = 1.0, digits: int = 0) -> str:
    return "no interval" if not interval else f"[{interval[0] * scale:,.{digits}f}, {interval[1] * scale:,.{digits}f}]"


def cost_lines(phases: list[PhaseResult]) -> list[str]:
    """What the short flows of each IW went through on the shared bottleneck, with n and 95 %
    intervals.  The long-lived competing flow is one flow per phase: its throughput share is
    one measurement, too few to say what an IW cost it, and is not printed as a number."""
    lines = []
    for phase in sorted(phases, key=lambda phase: phase.mix):
        mix = "+".join(map(str, phase.mix))
        short = next((point for point in phase.points if point["flow"] == "short"), None)
        if short is None:
            lines.append(f"cost, short flows IW{mix}: no short flows recorded")
            continue
        completed = short["n"] - short["errors"]
        # Below 6 flows the median has no 95 % order-statistic interval: no number either.
        median = (
            f"median completion {_ms(short.get('fct_p50_ms'))} ms {_bounds(short.get('fct_p50_ci_ms'))}"
            if short.get("fct_p50_ci_ms")
            else "median completion: n too small"
        )
        lines.append(
            f"cost, short flows IW{mix} at {COST_LOAD:.0%} load on {COST_BOTTLENECK.rate_bps / 1e6:g} Mbit/s: "
            f"{completed} completed, {median}; {short.get('retrans_flows', 0)} of "
            f"{short.get('joined_flows', 0)} retransmitted {_bounds(short.get('retrans_flow_share_ci'), 100)} %"
        )
    if phases:
        lines.append(
            "cost to the competing bulk flow: n too small (one flow per phase); "
            "the Cost page (section Bulk flows) shows its throughput"
        )
    return lines
