"""The cost experiments: what each IW policy costs the traffic sharing its bottleneck.

One probe host behind the bottleneck (its access link: 10 Mbit/s, 100 ms by default), one origin
serving every policy (``3``, ``10``, ``10p``, ``32``, ``32p``, ``learned``; CUBIC, so an unpaced
window leaves as a burst), and per *phase* one campaign through the API.  Two bottlenecks:
a shallow drop-tail buffer of :data:`SHALLOW_PACKETS` packets (small routers, seed 002) and one
bandwidth-delay product.  Phases:

* ``policy``: every short flow (Poisson arrivals at offered load 0.5, 15 KB / 50 KB) uses one
  policy, with the interactive flow (160-byte UDP packets every 5 ms, echoed by the origin)
  measuring the queueing delay and loss the short flows cause;
* ``share``: the short flows split between baseline ``10`` and treatment ``32`` at 25 / 50 /
  75 % (0 and 100 % are the ``policy`` phases): completion time per arm at each share and
  the A/B estimate at 50 % against the total effect (Spang et al., IMC 2021);
* ``bulk``: a long-lived flow (IW 10) measured alone, then alongside short flows of one policy
  (its throughput: the cost to bulk traffic, as in docs/fairness.md);
* ``page``: page loads, 6 parallel connections per page (the size split over them), each
  starting with the policy's IW.

Everything goes through the product (origin, probe, API, worker); the numbers come back from
:func:`iwscope.analysis.cost`.  The model's expectation for each policy is the queue its first
flight builds at the bottleneck (:func:`iwscope.model.first_flight_queue`).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iwprobe import wire
from iwscope.model import first_flight_queue
from iwscope_lab.campaign import CampaignResult
from iwscope_lab.fairness import Bottleneck, FairnessCampaign, FairnessPlan, phase_plan
from iwscope_lab.links import LinkSpec
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host, Topology

#: Key of the cost experiments in ``iwscope lab reproduce --only`` and in ``summary.json``.
COST_KEY = "cost"
#: The IW policies compared (the arm-policies work): plain, paced and learned initial windows.
POLICIES: tuple[str, ...] = ("3", "10", "10p", "32", "32p", "learned")
#: Baseline and treatment of the share sweep, and the treatment shares between the pure phases.
SWEEP_ARMS: tuple[str, str] = ("10", "32")
SWEEP_SHARES: tuple[float, ...] = (0.25, 0.5, 0.75)
#: A small router's buffer, packets.
SHALLOW_PACKETS = 10
#: The interactive flow: 160-byte packets (a G.711 voice frame's size) every 5 ms (200/s, like a
#: fast game; 256 kbit/s, 2.6 % of the link).  A phase's short flows run 2-3 s, so a voice call's
#: 50/s would give 100-150 packets, too few for a p99 (``MIN_P99_SAMPLES``: 367).
INTERACTIVE_INTERVAL_US = 5_000
INTERACTIVE_PACKET_BYTES = 160
#: Parallel connections of a page load (what browsers open per host).
PAGE_CONNECTIONS = 6
#: Offered load of the short flows.
LOAD = 0.5
#: The bulk flow's IW.
BULK_IW = 10
#: Rounds of a bulk phase: one bulk flow per round, and a throughput needs ``MIN_FLOWS`` (6) flows.
BULK_ROUNDS = 6


@dataclass(frozen=True)
class CostBottleneck:
    """One bottleneck condition: rate, RTT and a drop-tail buffer in packets."""

    name: str
    rate_bps: float
    rtt_ms: float
    buffer_packets: int

    def link(self) -> LinkSpec:
        return LinkSpec.symmetric(rate_bps=self.rate_bps, rtt_ms=self.rtt_ms, buffer_packets=self.buffer_packets)

    def as_fairness(self) -> Bottleneck:
        return Bottleneck(self.rate_bps, self.rtt_ms)

    @property
    def region(self) -> str:
        return f"cost-{self.name}"


def bottlenecks(rate_bps: float = 10e6, rtt_ms: float = 100.0) -> tuple[CostBottleneck, CostBottleneck]:
    """The shallow and the BDP-buffer bottleneck at ``rate_bps`` / ``rtt_ms``."""
    bdp_packets = max(SHALLOW_PACKETS + 1, round(rate_bps / 8 * rtt_ms / 1000 / 1500))
    return (CostBottleneck("shallow", rate_bps, rtt_ms, SHALLOW_PACKETS), CostBottleneck("bdp", rate_bps, rtt_ms, bdp_packets))


@dataclass(frozen=True)
class CostPlan(FairnessPlan):
    """A fairness plan with arms by label, shares, the interactive flow and page loads."""

    kind: str = "policy"
    arm_shares: tuple[float, ...] | None = None
    interactive: bool = False
    page_connections: int | None = None

    def trials_per_probe(self, n_origins: int) -> int:
        flows = self.repetitions * self.trials_per_round(n_origins)
        if self.page_connections:
            flows *= self.page_connections
        background = 2 * self.repetitions if self.background_bytes else 0
        return flows + background + (self.repetitions if self.interactive else 0)


class CostCampaign(FairnessCampaign):
    """A phase: the origin serves every policy with CUBIC; the campaign names arms by label."""

    plan: CostPlan

    def _origin_arms(self) -> list[str]:
        return list(dict.fromkeys([*POLICIES, *self.plan.arm_labels, str(BULK_IW)]))

    def _origin_options(self) -> list[str]:
        return [*super()._origin_options(), "--congestion-control", "cubic"]

    def _campaign_body(self, origin_ids: list[str], timeout_s: float) -> dict[str, Any]:
        plan = self.plan
        return {
            **super()._campaign_body(origin_ids, timeout_s),
            "arms": list(plan.arm_labels),
            "arm_shares": list(plan.arm_shares) if plan.arm_shares else None,
            "interactive_interval_us": INTERACTIVE_INTERVAL_US if plan.interactive else None,
            "interactive_packet_bytes": INTERACTIVE_PACKET_BYTES if plan.interactive else None,
            "page_connections": plan.page_connections,
        }


def cost_plan(
    kind: str, arms: Sequence[str], bottleneck: CostBottleneck, flows: int, shares: Sequence[float] | None = None
) -> CostPlan:
    """One phase's plan: ``flows`` short flows (pages) at offered load :data:`LOAD`."""
    page = kind == "page"
    sizes = (PAGE_CONNECTIONS * 15_000, PAGE_CONNECTIONS * 50_000) if page else (15_000, 50_000)
    base = phase_plan(
        f"cost {bottleneck.name} {kind} {'/'.join(arms)}" + (f" {'/'.join(f'{share:g}' for share in shares)}" if shares else ""),
        (10,) * len(arms),
        LOAD,
        bottleneck.as_fairness(),
        flows,
        sizes=sizes,
        background_iw=BULK_IW,
        background=kind == "bulk",
    )
    # ``arms`` of the base plan count flows per round (len(sizes) x len(arms)); their IWs are
    # informational, the labels are what the campaign names.
    iws = tuple(wire.arm_label_iw(arm) for arm in arms)
    return CostPlan(
        **{**dataclasses.asdict(base), "arms": iws, "repetitions": BULK_ROUNDS if kind == "bulk" else 1},
        kind=kind,
        arm_labels=tuple(arms),
        arm_shares=tuple(shares) if shares else None,
        interactive=kind in ("policy", "share"),
        page_connections=PAGE_CONNECTIONS if page else None,
    )


@dataclass
class CostPhase:
    kind: str
    bottleneck: CostBottleneck
    arms: tuple[str, ...]
    shares: tuple[float, ...] | None
    campaign: CampaignResult

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bottleneck": self.bottleneck.name,
            "region": self.bottleneck.region,
            "arms": list(self.arms),
            "shares": list(self.shares) if self.shares else None,
            "campaign_id": self.campaign.campaign_id,
            "seconds": round(self.campaign.seconds, 1),
            "stored": self.campaign.stored_per_probe,
            "expected": self.campaign.expected_per_probe,
        }


def phases_for(quick: bool) -> list[tuple[str, tuple[str, ...], tuple[float, ...] | None]]:
    """(kind, arms, shares) of every phase on one bottleneck."""
    phases: list[tuple[str, tuple[str, ...], tuple[float, ...] | None]] = [("policy", (policy,), None) for policy in POLICIES]
    phases += [("share", SWEEP_ARMS, (1 - share, share)) for share in SWEEP_SHARES]
    bulk = ("10", "32", "32p") if quick else POLICIES
    phases += [("bulk", (policy,), None) for policy in bulk]
    page = ("10", "32", "32p") if quick else POLICIES
    phases += [("page", (policy,), None) for policy in page]
    return phases


def run_cost(
    stack: Stack,
    *,
    quick: bool = True,
    flows: int | None = None,
    pages: int | None = None,
    conditions: Sequence[CostBottleneck] | None = None,
    phases: Sequence[tuple[str, tuple[str, ...], tuple[float, ...] | None]] | None = None,
    timeout_s: float = 300.0,
    show_progress: bool = True,
    prefix: str = "iws",
) -> list[CostPhase]:
    """Run the phases on each bottleneck (one topology per bottleneck, its own region)."""
    flows = flows or (40 if quick else 120)
    pages = pages or (12 if quick else 40)
    results: list[CostPhase] = []
    for bottleneck in conditions or bottlenecks():
        hosts = [
            Host("origin", role="origin", region="lab", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0)),
            Host("client", role="probe", region=bottleneck.region, link=bottleneck.link()),
        ]
        with Topology(f"{prefix}{secrets.token_hex(3)}", hosts) as topology:
            for kind, arms, shares in phases or phases_for(quick):
                plan = cost_plan(kind, arms, bottleneck, pages if kind == "page" else flows, shares)
                campaign = CostCampaign(topology, stack, plan).run(timeout_s=timeout_s, show_progress=show_progress)
                results.append(CostPhase(kind, bottleneck, arms, shares, campaign))
    return results


def model_expectations(conditions: Sequence[CostBottleneck]) -> list[dict[str, Any]]:
    """The queue one first flight of each policy builds at each bottleneck (the model)."""
    rows: list[dict[str, Any]] = []
    for bottleneck in conditions:
        for policy in POLICIES:
            if policy == "learned":
                continue  # its window depends on what earlier connections ended with
            iw = wire.arm_label_iw(policy)
            queue = first_flight_queue(
                iw,
                bottleneck.rate_bps,
                bottleneck.buffer_packets,
                paced_rtt_s=bottleneck.rtt_ms / 1000 if policy.endswith("p") else 0.0,
            )
            rows.append(
                {
                    "bottleneck": bottleneck.name,
                    "policy": policy,
                    "dropped": queue.dropped,
                    "peak_packets": queue.peak_packets,
                    "peak_delay_ms": queue.peak_delay_ms,
                }
            )
    return rows


def reproduce_cost(stack: Stack, *, quick: bool, show_progress: bool = True) -> dict[str, Any]:
    """The cost experiments for ``iwscope lab reproduce``: JSON-ready summary."""
    from iwscope.analysis import Filters, cost

    conditions = bottlenecks()
    results = run_cost(stack, quick=quick, conditions=conditions, show_progress=show_progress, timeout_s=300 if quick else 900)
    with stack.session() as session:
        report = cost(session, Filters(campaign_ids=tuple(phase.campaign.campaign_id for phase in results)))
    return {
        "title": "Cost to competing traffic (IW policies on a shared bottleneck)",
        "bottlenecks": [dataclasses.asdict(condition) for condition in conditions],
        "load": LOAD,
        "interactive": {"interval_us": INTERACTIVE_INTERVAL_US, "packet_bytes": INTERACTIVE_PACKET_BYTES},
        "page_connections": PAGE_CONNECTIONS,
        "phases": [phase.to_dict() for phase in results],
        "model": model_expectations(conditions),
        "report": dataclasses.asdict(report),
    }
