"""A round's plan: which arm of which target fetches which size, in what order.

Paired design (the default): every arm of every target fetches every size of the round once,
in random order.  With ``arm_shares`` (a share sweep on one bottleneck) a round still has
``len(sizes) x len(arms)`` flows per target, but each arm gets its share of them (largest
remainder), so 25 % treatment means a quarter of the short flows use the treatment arm.

An entry is a JSON list (the spool stores plans): ``[origin_id, host, iw, port, size, arm, tls]``
(``host`` as the campaign's family picks it, :func:`target_host`); plans spooled by earlier
versions have no ``arm`` (the plain arm ``str(iw)``) and no ``tls`` (HTTP).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import wire

log = logging.getLogger("iwprobe.agent")


class PlanEntry(NamedTuple):
    origin_id: str
    host: str
    iw: int
    port: int
    size: int
    arm: str
    tls: bool = False

    @classmethod
    def from_json(cls, entry: Sequence[Any]) -> PlanEntry:
        origin_id, host, iw, port, size = entry[:5]
        return cls(
            origin_id,
            host,
            int(iw),
            int(port),
            int(size),
            str(entry[5]) if len(entry) > 5 else str(iw),
            bool(entry[6]) if len(entry) > 6 else False,
        )


def target_host(target: wire.ScheduleTarget, family: str) -> str:
    """The address or name to fetch ``target`` at: its ``host6`` for an IPv6 campaign when it
    has one, else its ``host`` (resolved in the campaign's family by the fetch)."""
    return target.host6 if family == "ipv6" and target.host6 else target.host


def campaign_arms(campaign: wire.CampaignSchedule) -> list[str]:
    """The campaign's arms by label (``arm_labels``, else the plain ``arms``)."""
    return list(campaign.arm_labels) if campaign.arm_labels else [str(iw) for iw in campaign.arms]


def target_arms(target: wire.ScheduleTarget) -> dict[str, wire.ArmPort]:
    """A target's listeners by arm label (an empty label is a v1 origin's plain arm)."""
    return {arm.arm or str(arm.iw): arm for arm in target.arms}


def share_counts(shares: Sequence[float], total: int) -> list[int]:
    """``total`` flows split by ``shares`` (largest remainder; the counts sum to ``total``)."""
    weight = sum(shares)
    if weight <= 0:
        raise ValueError("arm shares must not all be zero")
    exact = [share / weight * total for share in shares]
    counts = [int(value) for value in exact]
    by_remainder = sorted(range(len(shares)), key=lambda index: exact[index] - counts[index], reverse=True)
    for index in by_remainder[: total - sum(counts)]:
        counts[index] += 1
    return counts


def round_plan(
    campaign: wire.CampaignSchedule, round_sizes: Sequence[int], rng: random.Random, quic: bool = True
) -> list[list[Any]]:
    """The shuffled plan of one round (see the module docstring).  ``quic``: whether this probe
    can fetch QUIC arms (``Nq``, wire v9; without the ``iwprobe[quic]`` extra they are left out,
    with a warning)."""
    labels = campaign_arms(campaign)
    shares = list(campaign.arm_shares)
    if shares and len(shares) != len(labels):
        raise ValueError(f"campaign {campaign.campaign_id}: {len(shares)} arm shares for {len(labels)} arms")
    if not quic and any(wire.arm_label_protocol(label) == "quic" for label in labels):
        log.warning("campaign %d: QUIC arms skipped (no iwprobe[quic] here)", campaign.campaign_id)
        kept = [index for index, label in enumerate(labels) if wire.arm_label_protocol(label) != "quic"]
        labels = [labels[index] for index in kept]
        shares = [shares[index] for index in kept] if shares else []
    plan: list[list[Any]] = []
    for target in campaign.targets:
        ports = target_arms(target)
        host = target_host(target, campaign.family)
        served = [(label, share) for label, share in zip(labels, shares or [1.0] * len(labels)) if label in ports]
        for label in labels:
            if label not in ports:
                log.warning("origin %s has no arm %s; skipped", target.origin_id, label)
        if not served:
            continue
        if not shares:
            for label, _ in served:
                arm = ports[label]
                plan.extend([target.origin_id, host, arm.iw, arm.port, size, label, target.tls] for size in round_sizes)
            continue
        counts = share_counts([share for _, share in served], len(round_sizes) * len(served))
        arms = [label for (label, _), count in zip(served, counts) for _ in range(count)]
        flow_sizes = list(round_sizes) * len(served)
        rng.shuffle(arms)
        rng.shuffle(flow_sizes)
        plan.extend(
            [target.origin_id, host, ports[label].iw, ports[label].port, size, label, target.tls]
            for label, size in zip(arms, flow_sizes)
        )
    rng.shuffle(plan)
    return plan


def page_parts(size: int, connections: int) -> list[int]:
    """A page of ``size`` bytes over ``connections`` parallel connections: equal parts (the
    first ones a byte larger when it does not divide), none empty."""
    connections = max(1, min(connections, size))
    part, rest = divmod(size, connections)
    return [part + 1 if index < rest else part for index in range(connections)]


__all__ = ["PlanEntry", "target_host", "campaign_arms", "target_arms", "share_counts", "round_plan", "page_parts"]
