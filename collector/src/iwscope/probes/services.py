"""Probe enrollment, heartbeats and the schedule a probe runs."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.auth.services import format_credential, hash_secret, new_secret
from iwscope.campaigns.models import Campaign, CampaignProbeDone
from iwscope.origins.models import Origin
from iwscope.probes.models import Probe
from iwscope.probes.schemas import (
    ArmPortModel,
    CampaignScheduleOut,
    EnrollRequestIn,
    HeartbeatIn,
    ProbeOut,
    ScheduleOut,
    ScheduleTargetOut,
)
from iwscope.types import utcnow


def enroll_probe(session: Session, request: EnrollRequestIn) -> tuple[Probe, str]:
    """Create a probe; returns it and its credential (the secret is not stored)."""
    secret = new_secret()
    probe = Probe(
        id=uuid.uuid4(),
        name=request.name,
        region=request.region,
        country=request.country,
        asn=request.asn,
        labels=dict(request.labels),
        version=request.version,
        secret_hash=hash_secret(secret),
    )
    session.add(probe)
    session.flush()
    return probe, format_credential(probe.id, secret)


def heartbeat_values(heartbeat: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The ``probes`` columns a heartbeat sets (posted alone or folded into a trial upload)."""
    return {
        "last_seen_at": now,
        "version": heartbeat["version"],
        "last_heartbeat": {**heartbeat, "received_at": wire.utc_timestamp(now)},
    }


def record_heartbeat(session: Session, probe_id: uuid.UUID, heartbeat: HeartbeatIn) -> None:
    """Store a heartbeat of probe ``probe_id`` (one ``UPDATE``; the caller commits)."""
    session.execute(update(Probe).where(Probe.id == probe_id).values(**heartbeat_values(heartbeat.model_dump(), utcnow())))


class ScheduledProbe(Protocol):
    """What a schedule needs of a probe: a :class:`Probe` or an authenticated identity."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def region(self) -> str: ...


def _wire_time(when: dt.datetime | None) -> str | None:
    return wire.utc_timestamp(when) if when is not None else None


#: Wire version a probe that does not say (``?wire_version=``) is assumed to speak.
DEFAULT_PROBE_WIRE_VERSION = 2


def needs_wire_v4(campaign: Campaign) -> bool:
    """Whether a campaign measures over a chosen IP version (wire v4): earlier probes would
    ignore the choice, so they are not given it."""
    return bool(campaign.family)


def needs_wire_v5(campaign: Campaign) -> bool:
    """Whether a campaign is a census campaign (wire v5): earlier probes cannot run it."""
    return campaign.census_urls is not None


def needs_wire_v9(campaign: Campaign) -> bool:
    """Whether a campaign has a QUIC arm (``10q``, ``10pq``; wire v9): an earlier probe would
    read its label as no arm it knows, so it is not given the campaign at all (as a campaign of
    labelled arms is withheld from probes before v3), rather than a paired round without it."""
    return any(wire.arm_label_protocol(label) == "quic" for label in campaign.arm_labels or [])


def _level(wire_version: int) -> int:
    """Which prepared entry a probe of ``wire_version`` gets: 9, 5, 4, 3, or 2 (before v3).

    Level 9 is the newest schedule: campaigns with QUIC arms.  Wire v6 added only the server
    agent's messages and v7's ``trace_share`` is in every level's entries (older probes ignore a
    key they do not know), v8 only an observation's fields: probes of v5 to v8 read level 5.  A
    later version that changes the schedule adds a level here (and an entry in :func:`_entries`)."""
    if wire_version >= 9:
        return 9
    return min(5, wire_version) if wire_version >= 3 else 2


def _entries(campaign: Campaign, origins: dict[uuid.UUID, Origin]) -> dict[int, CampaignScheduleOut | None]:
    """The campaign's schedule entry per wire level (:func:`_level`), ``None`` where probes of
    that level cannot run it; the entries below 5 never show ``census_urls``, those below 9 no
    QUIC arm (a campaign without one has the same entry at 9 and 5)."""
    entries: dict[int, CampaignScheduleOut | None] = {9: _entry(campaign, _targets(campaign, origins, 9))}
    entries[5] = None if needs_wire_v9(campaign) else entries[9]
    entries[4] = None if entries[5] is None or needs_wire_v5(campaign) else _entry(campaign, _targets(campaign, origins, 4))
    entries[3] = None if entries[4] is None or needs_wire_v4(campaign) else _entry(campaign, _targets(campaign, origins, 3))
    entries[2] = None if entries[3] is None or needs_wire_v3(campaign) else _entry(campaign, _targets(campaign, origins, 2))
    return entries


def needs_wire_v3(campaign: Campaign) -> bool:
    """Whether a campaign uses what probes before wire v3 cannot run (arms by label, shares,
    the interactive flow, page loads): such probes are not given it."""
    return bool(campaign.arm_labels or campaign.arm_shares or campaign.interactive_interval_us or campaign.page_connections)


@dataclass(frozen=True)
class _ScheduledCampaign:
    """A campaign as schedules show it, prepared once per snapshot for every probe."""

    campaign_id: int
    starts_at: dt.datetime
    ends_at: dt.datetime | None
    probe_regions: frozenset[str] | None
    #: The entry per wire level (:func:`_level`): 9 (current), 5 (no campaign with a QUIC arm),
    #: 4 (also no census campaigns), 3 (also no HTTPS origins, no chosen IP version), 2 (also no
    #: echo port, no paced or learned listeners); ``None``: the campaign is not shown to probes
    #: of that level.
    entries: dict[int, CampaignScheduleOut | None]
    #: Hash of each entry (the schedule's ETag combines them).
    digests: dict[int, bytes]


@dataclass(frozen=True)
class ScheduleSnapshot:
    """Everything schedules need, read in one go (:func:`load_schedule_snapshot`): campaigns whose
    window overlaps ``[loaded_at, horizon]``, with their targets prepared, and which probes are
    done with which adaptive campaign.  :func:`schedule_from` answers any probe from it without
    the database; a process keeps one for ``IWSCOPE_SCHEDULE_CACHE_S`` (``probes.routes``)."""

    loaded_at: dt.datetime
    horizon: dt.datetime
    campaigns: tuple[_ScheduledCampaign, ...]
    done: frozenset[tuple[int, uuid.UUID]]


def _targets(campaign: Campaign, origins: dict[uuid.UUID, Origin], wire_version: int) -> list[ScheduleTargetOut]:
    wanted = set(campaign.arm_labels or [str(iw) for iw in campaign.arms])
    if campaign.background_bytes is not None:
        wanted.add(str(campaign.background_iw or max(campaign.arms)))
    targets: list[ScheduleTargetOut] = []
    for origin_id in campaign.origin_ids:
        origin = origins.get(origin_id)
        if origin is None or (origin.tls and wire_version < 4):
            continue  # a probe before wire v4 cannot fetch over HTTPS
        # Before v3 a probe picks a listener by IW, so a paced or learned one would pass for plain.
        arms = [
            ArmPortModel(
                iw=arm["iw"], port=arm["port"], arm=arm.get("arm") or str(arm["iw"]), paced=bool(arm.get("paced", False))
            )
            for arm in origin.arms
            if (arm.get("arm") or str(arm["iw"])) in wanted
        ]
        if arms:
            targets.append(
                ScheduleTargetOut(
                    origin_id=str(origin.id),
                    host=origin.host,
                    arms=arms,
                    echo_port=origin.echo_port if wire_version >= 3 else None,
                    tls=origin.tls,
                    host6=origin.host6 if wire_version >= 4 else None,
                )
            )
    return targets


def _entry(campaign: Campaign, targets: list[ScheduleTargetOut]) -> CampaignScheduleOut:
    return CampaignScheduleOut(
        campaign_id=campaign.id,
        name=campaign.name,
        arms=list(campaign.arms),
        sizes=list(campaign.sizes) if campaign.sizes is not None else None,
        size_dist=campaign.size_dist,
        sizes_per_round=campaign.sizes_per_round,
        repetitions=campaign.repetitions,
        interval_s=campaign.interval_s,
        starts_at=wire.utc_timestamp(campaign.starts_at),
        ends_at=_wire_time(campaign.ends_at),
        calibrate=campaign.calibrate,
        targets=targets,
        arrival_rate_per_s=campaign.arrival_rate_per_s,
        background_bytes=campaign.background_bytes,
        background_iw=(campaign.background_iw or max(campaign.arms)) if campaign.background_bytes else None,
        arm_labels=list(campaign.arm_labels or []),
        arm_shares=list(campaign.arm_shares or []),
        interactive_interval_us=campaign.interactive_interval_us,
        interactive_packet_bytes=campaign.interactive_packet_bytes or 160,
        page_connections=campaign.page_connections,
        family=campaign.family or "",
        census_urls=list(campaign.census_urls or []),
        trace_share=campaign.trace_share,
    )


def _digest(entry: CampaignScheduleOut | None) -> bytes:
    return hashlib.sha256(entry.model_dump_json().encode()).digest() if entry is not None else b""


def load_schedule_snapshot(session: Session, now: dt.datetime, horizon_s: float) -> ScheduleSnapshot:
    """Read the campaigns whose window overlaps ``[now, now + horizon_s]``, their unrevoked
    origins and the done marks of those campaigns (three queries).  Passive campaigns (wire v6)
    are not the probes' business: their servers get them (``iwscope.servers``)."""
    horizon = now + dt.timedelta(seconds=horizon_s)
    campaigns = session.scalars(
        select(Campaign)
        .where(
            Campaign.starts_at <= horizon, or_(Campaign.ends_at.is_(None), Campaign.ends_at > now), Campaign.server_ids.is_(None)
        )
        .order_by(Campaign.id)
    ).all()
    origin_ids = {origin_id for campaign in campaigns for origin_id in campaign.origin_ids}
    origins = (
        {
            origin.id: origin
            for origin in session.scalars(select(Origin).where(Origin.id.in_(origin_ids), Origin.revoked_at.is_(None)))
        }
        if origin_ids
        else {}
    )
    done = (
        frozenset(
            (row[0], row[1])
            for row in session.execute(
                select(CampaignProbeDone.campaign_id, CampaignProbeDone.probe_id).where(
                    CampaignProbeDone.campaign_id.in_([campaign.id for campaign in campaigns])
                )
            )
        )
        if campaigns
        else frozenset()
    )
    prepared = []
    for campaign in campaigns:
        entries = _entries(campaign, origins)
        prepared.append(
            _ScheduledCampaign(
                campaign_id=campaign.id,
                starts_at=campaign.starts_at,
                ends_at=campaign.ends_at,
                probe_regions=frozenset(campaign.probe_regions) if campaign.probe_regions is not None else None,
                entries=entries,
                digests={level: _digest(entry) for level, entry in entries.items()},
            )
        )
    return ScheduleSnapshot(loaded_at=now, horizon=horizon, campaigns=tuple(prepared), done=done)


def schedule_from(
    snapshot: ScheduleSnapshot,
    probe: ScheduledProbe,
    poll_after_s: float,
    now: dt.datetime,
    wire_version: int = DEFAULT_PROBE_WIRE_VERSION,
) -> tuple[ScheduleOut, str]:
    """Campaigns this probe takes part in now or within the next poll interval, and the
    schedule's ETag (a hash of everything in it but ``generated_at``).

    A campaign applies when its window ``[starts_at, ends_at)`` overlaps
    ``[now, now + poll_after_s]``, its ``probe_regions`` is ``NULL`` or holds the probe's
    region, and (adaptive campaigns) the probe has not reached the target precision yet.
    Targets are its unrevoked origins, each with the listeners of the campaign's arms and of
    its background flow's arm (an origin serving none of them is left out).  Offered-load
    fields are passed through; ``background_iw`` is resolved (default: the largest arm).
    Probes that speak a wire version below 3 get neither campaigns needing it
    (:func:`needs_wire_v3`) nor the labels of paced and learned listeners (they pick a listener
    by IW, so a ``10p`` listener would pass for ``10``); below 4, neither HTTPS origins nor
    campaigns over a chosen IP version (:func:`needs_wire_v4`); below 5, no census campaigns
    (:func:`needs_wire_v5`); below 9, no campaign with a QUIC arm (:func:`needs_wire_v9`).  A
    QUIC arm's listener (``10q``: HTTP/3 on the UDP port of the same number as ``10``'s) is an
    origin's ``ArmPort`` like any other, so the targets of a v9 entry carry it.
    """
    entries, etag = _applicable(snapshot, probe, poll_after_s, now, wire_version)
    schedule = ScheduleOut(
        probe_id=str(probe.id), generated_at=wire.utc_timestamp(now), poll_after_s=poll_after_s, campaigns=entries
    )
    return schedule, etag


def schedule_etag(
    snapshot: ScheduleSnapshot,
    probe: ScheduledProbe,
    poll_after_s: float,
    now: dt.datetime,
    wire_version: int = DEFAULT_PROBE_WIRE_VERSION,
) -> str:
    """The ETag :func:`schedule_from` gives, without building the schedule (the 304 answer)."""
    return _applicable(snapshot, probe, poll_after_s, now, wire_version)[1]


def _applicable(
    snapshot: ScheduleSnapshot, probe: ScheduledProbe, poll_after_s: float, now: dt.datetime, wire_version: int
) -> tuple[list[CampaignScheduleOut], str]:
    """The schedule entries of :func:`schedule_from` and their ETag."""
    horizon = now + dt.timedelta(seconds=poll_after_s)
    entries: list[CampaignScheduleOut] = []
    level = _level(wire_version)
    etag = hashlib.sha256(f"{poll_after_s!r}|{level}".encode())
    for campaign in snapshot.campaigns:
        if campaign.starts_at > horizon or (campaign.ends_at is not None and campaign.ends_at <= now):
            continue
        if campaign.probe_regions is not None and probe.region not in campaign.probe_regions:
            continue
        if (campaign.campaign_id, probe.id) in snapshot.done:
            continue
        entry = campaign.entries[level]
        if entry is None:
            continue
        entries.append(entry)
        etag.update(campaign.digests[level])
    return entries, f'"{etag.hexdigest()[:32]}"'


def schedule_for(
    session: Session,
    probe: ScheduledProbe,
    poll_after_s: float,
    now: dt.datetime | None = None,
    wire_version: int = DEFAULT_PROBE_WIRE_VERSION,
) -> ScheduleOut:
    """:func:`schedule_from` a snapshot read now (one probe, no cache)."""
    now = now or utcnow()
    return schedule_from(load_schedule_snapshot(session, now, poll_after_s), probe, poll_after_s, now, wire_version)[0]


def probe_out(probe: Probe) -> ProbeOut:
    heartbeat: dict[str, Any] | None = probe.last_heartbeat
    return ProbeOut(
        id=str(probe.id),
        name=probe.name,
        region=probe.region,
        country=probe.country,
        asn=probe.asn,
        labels=probe.labels,
        version=probe.version,
        enrolled_at=probe.enrolled_at,
        last_seen_at=probe.last_seen_at,
        revoked_at=probe.revoked_at,
        backlog=heartbeat.get("spool_backlog") if heartbeat else None,
        last_heartbeat=heartbeat,
    )


def list_probes(session: Session) -> list[ProbeOut]:
    return [probe_out(probe) for probe in session.scalars(select(Probe).order_by(Probe.region, Probe.name))]
