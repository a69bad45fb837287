"""Campaign create / update / read."""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from iwprobe import wire
from iwscope.passive.schemas import PassiveArmIn
from iwscope.trials.census import target_host
from iwscope.wiretypes import (
    NO_NUL,
    AssignmentSeed,
    CensusUrl,
    FlushInterval,
    NamedFamily,
    Phase,
    Port,
    PrefixV4,
    PrefixV6,
    SampleShare,
)

#: Arms as IWs (``10``) or labels (``"10"``, ``"10p"`` paced, ``"10q"``/``"10pq"`` the same over
#: QUIC -- wire v9 --, ``"learned"``); see ``iwprobe._arms``.
ArmSpec = (
    Annotated[int, Field(ge=1, le=1000)] | Annotated[str, Field(min_length=1, max_length=16, pattern=wire.ARM_LABEL_PATTERN)]
)
Arms = Annotated[list[ArmSpec], Field(min_length=1, max_length=16)]
Sizes = Annotated[list[Annotated[int, Field(ge=0, le=17_179_869_184)]], Field(min_length=1, max_length=256)]
SizeDist = Literal[wire.SIZE_DISTRIBUTIONS]  # type: ignore[valid-type]
#: Longest time box of a campaign (30 days).
MAX_DURATION_S = 30 * 86_400
#: Share of a campaign's rounds traced (wire v7): 0 (none) to 1 (every round).
TraceShare = Annotated[float, Field(ge=0, le=1)]
Regions = Annotated[list[Annotated[str, Field(min_length=1, max_length=64), NO_NUL]], Field(min_length=1)]
CensusUrls = Annotated[list[CensusUrl], Field(min_length=1, max_length=wire.MAX_CENSUS_URLS)]
#: What an ordinary campaign needs and a census campaign must not have, and what only the
#: measurement of iwscope's own origins uses (neither can a census campaign have).
_MEASUREMENT_ONLY = (
    "sizes",
    "size_dist",
    "arrival_rate_per_s",
    "background_bytes",
    "background_iw",
    "target_ci_ms",
    "arm_shares",
    "interactive_interval_us",
    "interactive_packet_bytes",
    "page_connections",
)
#: What only a passive campaign takes (besides ``server_ids``, which makes a campaign passive).
_PASSIVE_ONLY = ("passive_arms", "passive_ports", "prefix_v4", "prefix_v6", "assignment_seed", "sample_share", "flush_interval_s")
#: What a passive campaign does not take: it measures real users of its servers, not probes.
_NOT_PASSIVE = ("origin_ids", "arms", "census_urls", "probe_regions", "family") + _MEASUREMENT_ONLY
#: How probes run rounds: a passive campaign has no rounds, so these must not be given.
_ROUNDS_ONLY = frozenset({"sizes_per_round", "repetitions", "interval_s", "calibrate"})
#: Most servers one passive campaign runs on.
MAX_PASSIVE_SERVERS = 1000
#: Defaults of a passive campaign (the wire's prefix lengths, 1 % of connections as raw records,
#: an upload a minute).
DEFAULT_SAMPLE_SHARE = 0.01
DEFAULT_FLUSH_INTERVAL_S = 60


def check_passive_arms(arms: list[PassiveArmIn]) -> list[PassiveArmIn]:
    """A passive study's arms: no arm twice, at most one ``default`` arm, IWs spelled plainly in
    ``1..wire.MAX_PASSIVE_IW``, shares summing to ``wire.PASSIVE_SHARE_SCALE`` (every client
    prefix falls into exactly one arm)."""
    labels = [arm.arm for arm in arms]
    if len(set(labels)) != len(labels):
        raise ValueError("passive_arms: an arm must not repeat")
    for label in labels:
        if label == wire.DEFAULT_ARM:
            continue
        if str(int(label)) != label or not 1 <= int(label) <= wire.MAX_PASSIVE_IW:
            raise ValueError(
                f"passive_arms: arm {label!r} must be 'default' or an IW from 1 to {wire.MAX_PASSIVE_IW} without leading zeros"
            )
    total = sum(arm.share_bp for arm in arms)
    if total != wire.PASSIVE_SHARE_SCALE:
        raise ValueError(f"passive_arms: shares must sum to {wire.PASSIVE_SHARE_SCALE} basis points (100 %), not {total}")
    return arms


#: A passive study's arms as the campaign API takes them (``[{"arm": "default", "share_bp": 9000}, ...]``).
PassiveArms = Annotated[
    list[PassiveArmIn], Field(min_length=1, max_length=wire.MAX_PASSIVE_ARMS), AfterValidator(check_passive_arms)
]
ServerIds = Annotated[list[uuid.UUID], Field(min_length=1, max_length=MAX_PASSIVE_SERVERS)]
PassivePorts = Annotated[list[Port], Field(min_length=1, max_length=wire.MAX_PASSIVE_PORTS)]


class CampaignIn(BaseModel):
    """A new campaign.  Either an ordinary one -- ``origin_ids``, ``arms`` and exactly one of
    ``sizes`` (fixed) and ``size_dist`` (named distribution) --, a census campaign:
    ``census_urls`` alone (servers iwscope does not run, whose IW every round infers), with
    neither origins, arms, sizes nor the measurement options, or a passive campaign (wire v6):
    ``server_ids`` and ``passive_arms`` (real users of operators' servers split into IW arms by a
    keyed hash of their prefix), with a time box and none of the probes' options."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=200), NO_NUL]
    origin_ids: list[uuid.UUID] = []
    probe_regions: Regions | None = None
    arms: Arms | None = None
    sizes: Sizes | None = None
    size_dist: SizeDist | None = None
    sizes_per_round: Annotated[int, Field(ge=1, le=1000)] = 1
    repetitions: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    interval_s: Annotated[float, Field(ge=0, le=86400)] = 0.0
    starts_at: AwareDatetime
    ends_at: AwareDatetime | None = None
    calibrate: bool = True
    #: Poisson arrivals of trials at this mean rate (per second); ``None``: sequential rounds.
    arrival_rate_per_s: Annotated[float, Field(gt=0, le=10_000)] | None = None
    #: Bytes of one long-lived flow run alone before each round and alongside it.
    background_bytes: Annotated[int, Field(ge=1, le=wire.MAX_OBJECT_BYTES)] | None = None
    #: IW arm of the background flow (``None``: the largest of ``arms``).
    background_iw: Annotated[int, Field(ge=1, le=1000)] | None = None
    #: Time box: the campaign ends this many seconds after ``starts_at`` (instead of ``ends_at``).
    duration_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S)] | None = None
    #: Adaptive: probes stop once the buckets they feed have a 95 % interval of at most +- this
    #: (ms); ``repetitions`` is then a maximum.  Needs ``duration_s`` or ``ends_at`` as well.
    target_ci_ms: Annotated[float, Field(gt=0, le=1_000_000)] | None = None
    #: Share of a round's short flows per arm (same order as ``arms``, summing to 1): a share
    #: sweep on one bottleneck.  ``None``: every arm fetches every size (the paired design).
    arm_shares: Annotated[list[Annotated[float, Field(ge=0, le=1)]], Field(min_length=1, max_length=16)] | None = None
    #: The interactive flow (cost experiments): a UDP packet every this many microseconds to
    #: the origin's echo port during every round.  ``None``: none.
    interactive_interval_us: Annotated[int, Field(ge=1000, le=10_000_000)] | None = None
    #: Its packets' UDP payload bytes (default 160, a voice frame).
    interactive_packet_bytes: Annotated[int, Field(ge=wire.MIN_ECHO_PACKET_BYTES, le=wire.MAX_ECHO_PACKET_BYTES)] | None = None
    #: Page loads: each short flow is fetched over this many parallel connections (6 like a browser).
    page_connections: Annotated[int, Field(ge=2, le=16)] | None = None
    #: The IP version to measure over: ``ipv6`` fetches from the origins' ``host6`` (or resolves
    #: their host to IPv6 only), ``ipv4`` resolves to IPv4 only; ``None``: whatever the host is.
    #: Probes before wire v4 are not given such a campaign.
    family: NamedFamily | None = None
    #: A census campaign: every round infers the IW of each of these servers (absolute
    #: ``http``/``https`` URLs of objects large enough to outlast a window, or servers that
    #: answer ``Range``).  Only probes of wire v5 are given it.
    census_urls: CensusUrls | None = None
    #: A passive campaign: the servers (``iwprobe tap``) whose real users are split into arms.
    server_ids: ServerIds | None = None
    #: Its arms and their shares of client prefixes (basis points summing to 10,000; at most one
    #: ``default`` arm, the server's own IW).
    passive_arms: PassiveArms | None = None
    #: The ports whose connections are split; ``None``: each server's enrolled ports.
    passive_ports: PassivePorts | None = None
    #: Prefix lengths hashed, so one user stays in one arm (default /24 and /48).
    prefix_v4: PrefixV4 | None = None
    prefix_v6: PrefixV6 | None = None
    #: Seed of the assignment hash; ``None``: a random one (``secrets.randbits(32)``).
    assignment_seed: AssignmentSeed | None = None
    #: Share of connections uploaded as raw records (default 0.01).
    sample_share: SampleShare | None = None
    #: Seconds between the servers' uploads (default 60).
    flush_interval_s: FlushInterval | None = None
    #: Wire v7: the share of rounds whose trials the probes capture and upload as traces (every
    #: trial of a chosen round, so the arms of one round are traced together); 0: none.  Probes
    #: that cannot capture (not root) or predate wire v7 measure the rounds untraced.
    trace_share: TraceShare = 0.0

    @property
    def passive(self) -> bool:
        return self.server_ids is not None

    @property
    def arm_labels(self) -> list[str]:
        """``arms`` as labels (``10``, ``10p``, ``10q``, ``10pq``, ``learned``); empty for a census campaign."""
        return [str(arm) for arm in self.arms or []]

    @property
    def arm_iws(self) -> list[int]:
        """The IW each arm starts from (``learned``: ``wire.LEARNED_BASE_IW``)."""
        return [wire.arm_label_iw(label) for label in self.arm_labels]

    @property
    def plain_arms_only(self) -> bool:
        return all(label.isdigit() for label in self.arm_labels)

    @model_validator(mode="after")
    def _consistent(self) -> CampaignIn:
        if self.trace_share and (self.server_ids is not None or self.census_urls is not None):
            raise ValueError("trace_share: only an ordinary campaign's trials are traced (not a census or passive campaign)")
        if self.server_ids is not None:
            return self._passive_consistent()
        given = [name for name in _PASSIVE_ONLY if getattr(self, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only a passive campaign takes them (give server_ids)")
        if self.census_urls is not None:
            return self._census_consistent()
        if not self.origin_ids:
            raise ValueError("origin_ids: an ordinary campaign needs at least one origin (or give census_urls)")
        if not self.arms:
            raise ValueError("arms: an ordinary campaign needs its arms (or give census_urls)")
        labels = self.arm_labels
        if len(set(labels)) != len(labels):
            raise ValueError("arms must not repeat")
        # A QUIC arm listens on its TCP arm's port number, so it has that arm's bounds.
        paced = [wire.tcp_arm_label(label).endswith("p") for label in labels]
        if any(not 1 <= iw <= (999 if pace else 1000) for pace, iw in zip(paced, self.arm_iws, strict=True)):
            raise ValueError("an arm's IW must be in [1, 1000] (a paced arm's in [1, 999])")
        if self.arm_shares is not None:
            if len(self.arm_shares) != len(labels):
                raise ValueError("arm_shares needs one share per arm")
            if abs(sum(self.arm_shares) - 1.0) > 1e-6:
                raise ValueError("arm_shares must sum to 1")
        if self.interactive_packet_bytes is not None and self.interactive_interval_us is None:
            raise ValueError("interactive_packet_bytes needs interactive_interval_us")
        if (self.sizes is None) == (self.size_dist is None):
            raise ValueError("give exactly one of sizes and size_dist")
        self._check_window()
        if self.target_ci_ms is not None and self.ends_at is None:
            raise ValueError("target_ci_ms needs a time box: duration_s or ends_at")
        if self.background_iw is not None and self.background_bytes is None:
            raise ValueError("background_iw needs background_bytes")
        if self.background_bytes is not None and self.background_iw is None and not self.plain_arms_only:
            raise ValueError("a background flow next to paced, QUIC or learned arms needs background_iw")
        return self

    def _check_window(self) -> None:
        if self.duration_s is not None and self.ends_at is not None:
            raise ValueError("give ends_at or duration_s, not both")
        if self.duration_s is not None:
            try:
                self.ends_at = self.starts_at + dt.timedelta(seconds=self.duration_s)
            except OverflowError:
                raise ValueError("starts_at + duration_s is past the year 9999") from None
        if self.ends_at is not None and self.ends_at <= self.starts_at:
            raise ValueError("ends_at must be after starts_at")

    def _census_consistent(self) -> CampaignIn:
        """A census campaign names its targets and nothing of the origins' measurement."""
        if self.origin_ids or self.arms:
            raise ValueError("a census campaign (census_urls) has no origin_ids or arms")
        given = [name for name in _MEASUREMENT_ONLY if getattr(self, name) is not None]
        if given:
            raise ValueError(f"a census campaign (census_urls) does not take {', '.join(given)}")
        assert self.census_urls is not None
        for url in self.census_urls:
            if target_host(url) is None:
                raise ValueError(f"census_urls: {url!r} is not an http(s) URL with a host")
            if "@" in url.split("://", 1)[1].split("/", 1)[0]:
                raise ValueError(f"census_urls: {url!r} carries credentials; census targets are public servers")
        if len(set(self.census_urls)) != len(self.census_urls):
            raise ValueError("census_urls must not repeat")
        self._check_window()
        return self

    def _passive_consistent(self) -> CampaignIn:
        """A passive campaign names its servers and arms, has a time box, and nothing of the
        probes' measurement; the defaults of what it leaves out are filled in here."""
        given = [name for name in _NOT_PASSIVE if getattr(self, name) not in (None, [])]
        given += sorted(_ROUNDS_ONLY & self.model_fields_set)
        if given:
            raise ValueError(f"a passive campaign (server_ids) does not take {', '.join(given)}")
        if self.passive_arms is None:
            raise ValueError("passive_arms: a passive campaign needs its arms and their shares")
        assert self.server_ids is not None
        if len(set(self.server_ids)) != len(self.server_ids):
            raise ValueError("server_ids must not repeat")
        if self.passive_ports is not None and len(set(self.passive_ports)) != len(self.passive_ports):
            raise ValueError("passive_ports must not repeat")
        self._check_window()
        if self.ends_at is None:
            raise ValueError("a passive campaign needs a time box: duration_s or ends_at")
        self.prefix_v4 = wire.DEFAULT_PREFIX_V4 if self.prefix_v4 is None else self.prefix_v4
        self.prefix_v6 = wire.DEFAULT_PREFIX_V6 if self.prefix_v6 is None else self.prefix_v6
        self.assignment_seed = secrets.randbits(32) if self.assignment_seed is None else self.assignment_seed
        self.sample_share = DEFAULT_SAMPLE_SHARE if self.sample_share is None else self.sample_share
        self.flush_interval_s = DEFAULT_FLUSH_INTERVAL_S if self.flush_interval_s is None else self.flush_interval_s
        return self


class CampaignPatch(BaseModel):
    """Fields of a campaign that may change after creation (e.g. ``ends_at`` to stop it)."""

    model_config = ConfigDict(extra="forbid")

    # Omitted means "unchanged". Only the columns that may be NULL accept an explicit null:
    # ``probe_regions`` (null = every region) and ``ends_at`` (null = open-ended). The others
    # default to None without admitting it, so ``{"starts_at": null}`` is a 422 naming the field
    # (and the OpenAPI does not call them nullable); the type checker is told so on each line.
    name: Annotated[str, Field(min_length=1, max_length=200), NO_NUL] = Field(default=None)  # type: ignore[assignment]
    probe_regions: Regions | None = None
    repetitions: Annotated[int, Field(ge=1, le=1_000_000)] = Field(default=None)  # type: ignore[assignment]
    interval_s: Annotated[float, Field(ge=0, le=86400)] = Field(default=None)  # type: ignore[assignment]
    starts_at: AwareDatetime = Field(default=None)  # type: ignore[assignment]
    ends_at: AwareDatetime | None = None
    # Passive campaigns only.  A change of ``passive_arms`` (a share sweep: 5 % -> 25 % -> 50 %
    # treated) starts the next phase; the seed and the prefix lengths never change, so a client
    # prefix stays where the shares put it.
    server_ids: ServerIds = Field(default=None)  # type: ignore[arg-type]
    passive_arms: PassiveArms = Field(default=None)  # type: ignore[arg-type]
    sample_share: SampleShare = Field(default=None)  # type: ignore[assignment]
    flush_interval_s: FlushInterval = Field(default=None)  # type: ignore[assignment]
    # Ordinary campaigns only: the share of rounds traced from now on.
    trace_share: TraceShare = Field(default=None)  # type: ignore[assignment]


class CampaignOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    origin_ids: list[uuid.UUID]
    probe_regions: list[str] | None
    arms: list[int]
    sizes: list[int] | None
    size_dist: str | None
    sizes_per_round: int
    repetitions: int
    interval_s: float
    starts_at: dt.datetime
    ends_at: dt.datetime | None
    calibrate: bool
    created_at: dt.datetime
    arrival_rate_per_s: float | None = None
    background_bytes: int | None = None
    background_iw: int | None = None
    target_ci_ms: float | None = None
    arm_labels: list[str] | None = None
    arm_shares: list[float] | None = None
    interactive_interval_us: int | None = None
    interactive_packet_bytes: int | None = None
    page_connections: int | None = None
    family: NamedFamily | None = None
    census_urls: list[str] | None = None
    server_ids: list[uuid.UUID] | None = None
    passive_arms: list[PassiveArmIn] | None = None
    passive_ports: list[int] | None = None
    prefix_v4: PrefixV4 | None = None
    prefix_v6: PrefixV6 | None = None
    assignment_seed: AssignmentSeed | None = None
    sample_share: SampleShare | None = None
    flush_interval_s: FlushInterval | None = None
    phase: Phase | None = None
    trace_share: float = 0.0
