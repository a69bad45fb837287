"""Offered-load and fairness experiment: what a larger IW costs the *other* traffic.

After the IW10 authors' IETF 78 testbed (Poisson arrivals of short flows at a given offered
load over one bottleneck with a BDP buffer; IW3, IW10 and a 50/50 mix; 15 KB and 50 KB
responses) and the critique that IW studies ignore competing traffic: one probe host whose
access link is the bottleneck, one origin, and per phase (short-flow IW mix x offered load)
one campaign created through the API with ``arrival_rate_per_s`` (Poisson arrivals) and
``background_bytes`` (a long-lived flow fetched once alone, then alongside the short flows).
Everything runs through the product: real agents, the API, the worker, ``fairness()``.

The arrival rate of a phase is ``lambda = load x C / (mean short-flow bytes x 8)``.  The
probe starts the background flow, lets it run ~10 RTTs (out of slow start: the short flows
meet a standing queue), then starts the arrivals.  The background flow carries
``B = C x (T + warm-up) / 8`` bytes with ``T = flows / lambda``: at the link rate it would
still be running when the last short flow arrives, so it is busy throughout the arrivals.
Its throughput is bytes / total time of the whole transfer (warm-up and tail included, so
the measured cost is diluted, never inflated); alone, on long paths, slow start and loss
recovery keep it well below ``C`` too, which is why the baseline is measured, not assumed.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iwprobe import BACKGROUND_WARMUP_RTTS
from iwscope_lab.campaign import CampaignPlan, CampaignResult, LabCampaign
from iwscope_lab.links import LinkSpec
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host, Topology

#: Short-flow response sizes of the IETF 78 testbed (bytes).
IETF_SIZES: tuple[int, ...] = (15_000, 50_000)
#: Connections the fairness origin serves at once (per client and in total; its worker pool):
#: one probe host stands for many clients.
ORIGIN_CONNECTIONS = 300
#: Short-flow IW mixes: all IW3, all IW10, a 50/50 mix.
DEFAULT_MIXES: tuple[tuple[int, ...], ...] = ((3,), (10,), (3, 10))


@dataclass(frozen=True)
class FairnessPlan(CampaignPlan):
    """A campaign plan with Poisson arrivals and a background flow (one round = one phase)."""

    arrival_rate_per_s: float | None = None
    background_bytes: int | None = None
    background_iw: int | None = None

    def trials_per_probe(self, n_origins: int) -> int:
        # The background flow comes from the first origin only: alone + alongside, per round.
        background = 2 * self.repetitions if self.background_bytes else 0
        return self.repetitions * self.trials_per_round(n_origins) + background


class FairnessCampaign(LabCampaign):
    """A :class:`LabCampaign` whose campaign carries the offered-load fields."""

    plan: FairnessPlan
    #: :data:`ORIGIN_CONNECTIONS` unless a run needs more (the IETF 78 testbed point).
    origin_connections: int = ORIGIN_CONNECTIONS

    def _origin_arms(self) -> list[str]:
        """The origin also serves the background flow's arm (which may not be a short-flow arm)."""
        arms = sorted(set(self.plan.arms) | ({self.plan.background_iw} if self.plan.background_iw else set()))
        return [str(iw) for iw in arms]

    def _origin_options(self) -> list[str]:
        # One probe host stands for many clients: lift the per-client connection cap (16 by
        # default, like a browser) and serve every in-flight flow at once (no worker queueing).
        return ["--client-max-connections", str(self.origin_connections), "--workers", str(self.origin_connections)]

    def _campaign_body(self, origin_ids: list[str], timeout_s: float) -> dict[str, Any]:
        return {
            **super()._campaign_body(origin_ids, timeout_s),
            "arrival_rate_per_s": self.plan.arrival_rate_per_s,
            "background_bytes": self.plan.background_bytes,
            "background_iw": self.plan.background_iw,
        }


@dataclass(frozen=True)
class Bottleneck:
    """The probe's access link: the shared bottleneck of every flow of a phase."""

    rate_bps: float = 4e6
    rtt_ms: float = 100.0
    #: Drop-tail buffer in bandwidth-delay products (the testbed used one BDP).
    buffer_bdp: float = 1.0

    @property
    def bdp_bytes(self) -> int:
        return int(self.rate_bps / 8 * self.rtt_ms / 1000)

    def link(self) -> LinkSpec:
        return LinkSpec.symmetric(
            rate_bps=self.rate_bps, rtt_ms=self.rtt_ms, buffer_bytes=max(3000, int(self.buffer_bdp * self.bdp_bytes))
        )


def phase_plan(
    name: str,
    mix: Sequence[int],
    load: float,
    bottleneck: Bottleneck,
    flows: int,
    sizes: Sequence[int] = IETF_SIZES,
    background_iw: int = 3,
    background: bool = True,
) -> FairnessPlan:
    """One phase: ``flows`` short flows (sizes alternating, arms of ``mix`` equally often) at
    Poisson arrivals giving offered load ``load``, with one background flow of IW
    ``background_iw`` sized to last about as long as the arrivals."""
    if not 0 < load < 1:
        raise ValueError(f"offered load must be in (0, 1), not {load}")
    per_arm = max(1, flows // (len(mix) * len(sizes)))
    mean_bytes = sum(sizes) / len(sizes)
    rate = load * bottleneck.rate_bps / (mean_bytes * 8)
    arrival_span_s = per_arm * len(mix) * len(sizes) / rate
    # The probe starts the arrivals after ~10 RTTs of the background flow (its slow start).
    warmup_s = BACKGROUND_WARMUP_RTTS * bottleneck.rtt_ms / 1000
    background_bytes = int(max(100_000, bottleneck.rate_bps / 8 * (arrival_span_s + warmup_s))) if background else None
    return FairnessPlan(
        name=name,
        arms=tuple(mix),
        sizes=tuple(sizes) * per_arm,
        repetitions=1,
        calibrate=True,
        arrival_rate_per_s=round(rate, 4),
        background_bytes=background_bytes,
        background_iw=background_iw if background else None,
    )


@dataclass
class PhaseResult:
    """One phase's campaign and the ``fairness()`` points it produced."""

    mix: tuple[int, ...]
    load: float
    plan: FairnessPlan
    campaign: CampaignResult
    points: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "mix": list(self.mix),
            "load": self.load,
            "campaign_id": self.campaign.campaign_id,
            "arrival_rate_per_s": self.plan.arrival_rate_per_s,
            "background_bytes": self.plan.background_bytes,
            "short_flows": len(self.plan.sizes or ()) * len(self.mix),
            "seconds": round(self.campaign.seconds, 1),
            "points": self.points,
        }


def run_fairness(
    stack: Stack,
    *,
    bottleneck: Bottleneck = Bottleneck(),
    loads: Sequence[float] = (0.5, 0.9),
    mixes: Sequence[tuple[int, ...]] = DEFAULT_MIXES,
    flows: int = 40,
    sizes: Sequence[int] = IETF_SIZES,
    background_iw: int = 3,
    prefix: str = "iws",
    timeout_s: float = 300.0,
    show_progress: bool = True,
    background: bool = True,
    origin_connections: int = ORIGIN_CONNECTIONS,
) -> list[PhaseResult]:
    """Run every phase (mix x load) on one bottleneck topology and read ``fairness()`` back
    (``background=False``: the short flows alone, as the IETF 78 latency testbed ran them)."""
    from iwscope.analysis import Filters, fairness

    hosts = [
        Host("origin", role="origin", region="lab", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0)),
        Host("client", role="probe", region="fairness", link=bottleneck.link()),
    ]
    results: list[PhaseResult] = []
    with Topology(f"{prefix}{secrets.token_hex(3)}", hosts) as topology:
        for load in loads:
            for mix in mixes:
                name = f"fairness IW{'+'.join(map(str, mix))} load {load:g}"
                plan = phase_plan(name, mix, load, bottleneck, flows, sizes, background_iw, background)
                phase = FairnessCampaign(topology, stack, plan)
                phase.origin_connections = origin_connections
                campaign = phase.run(timeout_s=timeout_s, show_progress=show_progress)
                with stack.session() as session:
                    points = [
                        dataclasses.asdict(point) for point in fairness(session, Filters(campaign_ids=(campaign.campaign_id,)))
                    ]
                results.append(PhaseResult(tuple(mix), load, plan, campaign, points))
    return results


def summary_rows(results: Sequence[PhaseResult]) -> list[dict[str, Any]]:
    """Flat rows (phase x flow x IW) for a table or JSON."""
    rows: list[dict[str, Any]] = []
    for result in results:
        for point in result.points:
            rows.append(
                {
                    "load": result.load,
                    "mix": "+".join(map(str, result.mix)),
                    **{
                        key: point[key]
                        for key in (
                            "campaign_id",
                            "offered_load",
                            "flow",
                            "iw",
                            "n",
                            "errors",
                            "throughput_bps",
                            "fct_mean_ms",
                            "fct_p50_ms",
                            "fct_p90_ms",
                            "retrans_flow_share",
                            "bytes_retrans_share",
                        )
                    },
                }
            )
    return rows


#: Key of the fairness experiment in ``iwscope lab reproduce --only`` and in ``summary.json``.
FAIRNESS_KEY = "fairness"


def reproduce_fairness(stack: Stack, *, quick: bool, show_progress: bool = True) -> dict[str, Any]:
    """The IETF 78 fairness testbed for ``iwscope lab reproduce``: JSON-ready summary.

    Quick: a 4 Mbit/s, 100 ms bottleneck, 24 short flows per phase; full: 20 Mbit/s, 300 ms
    (the slides' bottleneck), 120 short flows per phase.  Loads 0.5 and 0.9, mixes IW3, IW10,
    50/50; the background flow starts with IW3.
    """
    bottleneck = Bottleneck(4e6, 100.0) if quick else Bottleneck(20e6, 300.0)
    flows = 24 if quick else 120
    results = run_fairness(
        stack, bottleneck=bottleneck, loads=(0.5, 0.9), flows=flows, timeout_s=300 if quick else 900, show_progress=show_progress
    )
    return {
        "title": "Offered load and fairness (IETF 78 testbed)",
        "bottleneck": dataclasses.asdict(bottleneck),
        "flows_per_phase": flows,
        "phases": [result.to_dict() for result in results],
        "rows": summary_rows(results),
    }
