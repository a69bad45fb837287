"""The initial window as the probes saw it: the census of servers iwscope does not run, and the
client-side check of iwscope's own arms.

**Census** (:func:`census_targets`, :func:`census_series`): every census record is one probe's
answer for one target in one round (``iwprobe census``: a few connections that agree).  Per
target the answer is the *modal* IW among the records that determined it, with the share of
determined records that found it and that share's 95 % Wilson interval; every value seen is
listed with its count (a target whose name resolves to servers of different IWs, e.g. a CDN's
customers or regions, shows several).  Fewer than :data:`MIN_RECORDS` determined records: "n
too small", no IW is named -- the largest window any record proved is shown instead, as a lower
bound.
Per region and per UTC day likewise.  Per protocol too: a QUIC census record (wire v9,
``protocol = 'quic'``) counts packets of the server's QUIC stack, often another window than its
TCP one (Caddy: 32 packets over QUIC, 10 segments over TCP, docs/quic.md), so a target measured
over both is two targets, one per ``protocol`` (the filters' ``protocol`` keeps one).

**IW check** (:func:`iw_check`): per probe and origin, the trials of plain arms whose server IW
the probe inferred from its own capture (``client_iw``, wire v5), compared with the window the
origin's own ``TCP_INFO`` had at accept (``server_snd_cwnd_at_accept``; the arm when the
observation is not joined).  Those two differ from the arm on purpose now and then: a server
whose SYN-ACK was retransmitted starts from a window of 1 (RFC 6298's loss window; seen on the
demo's lossy paths, ``origin_not_arm``).  A trial *agrees* when the inference is ``ok`` and
equals the origin's window, or is a ``lower_bound`` not above it (the object ended inside the
window); it *disagrees* when an ``ok`` differs or a lower bound exceeds it.
A path on which most trials of some arm disagree (at least :data:`MIN_RECORDS` of them) has
something between probe and origin that terminates TCP -- a split-TCP proxy, a cache, a VPN
endpoint (``suspect``), the more so when the origin's own window at accept was the arm.  The
verdict is per arm because a proxy's own IW agrees with the arm that happens to equal it.
Shares come with 95 % Wilson intervals; fewer than :data:`MIN_RECORDS` determined trials is
"n too small" (no verdict).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis.filters import Filters, trial_where
from iwscope.analysis.stats import proportion_interval

#: Fewest determined records (census) or trials (check) behind a named IW or a verdict.
MIN_RECORDS = 3
#: A path is suspect when, for some arm, at least this share of its decided trials disagree (and
#: at least :data:`MIN_RECORDS` do): a few odd inferences do not make a proxy.
SUSPECT_SHARE = 0.5


@dataclass(frozen=True)
class IwAnswer:
    """What a set of census records says of one target (or one target in one region or day)."""

    records: int
    #: Records that determined the IW (``ok``), proved a lower bound, or neither.
    ok: int
    lower_bound: int
    undetermined: int
    #: The modal determined IW (segments); ``None``: "n too small" (fewer than MIN_RECORDS ok).
    iw_segments: int | None
    #: Share of the determined records that found ``iw_segments``, with its 95 % interval.
    share: float | None
    share_ci_low: float | None
    share_ci_high: float | None
    #: Every determined value with its count, largest count first (``{"10": 40, "16": 2}``).
    values: dict[str, int]
    #: The largest window any record proved (segments: a lower bound, or a determined value,
    #: which is one too), when no IW is named.
    max_lower_bound: int | None
    #: Why the records that proved ``max_lower_bound`` stopped there (their commonest reason,
    #: e.g. ``receive_window``: the probe's own window cut the flight, so the server's IW may be
    #: larger); empty when no bound is given or it came from a determined value.
    max_lower_bound_reason: str
    #: The commonest sender segment size (bytes) among determined records.
    mss: int | None
    too_small: bool
    #: Why not ``ok``, the commonest reasons with their counts (``{"object_ended": 3}``).
    reasons: dict[str, int]


@dataclass(frozen=True)
class CensusTarget:
    """One census target: the answer over every record, per region, and when it was measured."""

    url: str
    host: str
    probes: int
    first_measured_at: dt.datetime
    last_measured_at: dt.datetime
    overall: IwAnswer
    by_region: dict[str, IwAnswer] = field(default_factory=dict)
    #: ``tcp`` (segments) or ``quic`` (HTTP/3: packets, ``mss`` the datagram size).
    protocol: str = "tcp"


@dataclass(frozen=True)
class CensusDay:
    """One target on one UTC day."""

    url: str
    day: dt.date
    answer: IwAnswer
    protocol: str = "tcp"


@dataclass(frozen=True)
class PathIwCheck:
    """One probe and origin: the client-side inferences of the arms' windows."""

    probe_id: str
    probe_name: str
    region: str
    origin_id: str | None
    #: Trials of plain arms with an inference, and how they came out.
    inferred: int
    ok: int
    lower_bound: int
    undetermined: int
    #: Trials whose inference agrees with the arm, or disagrees (module docstring).
    agree: int
    disagree: int
    #: Of the disagreeing ones, how many times the origin's own window at accept was the arm.
    disagree_origin_had_arm: int
    #: Trials whose origin window at accept was not the arm (e.g. 1 after a retransmitted
    #: SYN-ACK): compared with that window, not with the arm.
    origin_not_arm: int
    #: Share of the decided trials (agree + disagree) that disagree, with its 95 % interval.
    disagree_share: float | None
    disagree_ci_low: float | None
    disagree_ci_high: float | None
    #: The commonest IW the probe saw where it disagreed (segments), e.g. a proxy's own.
    seen_instead: int | None
    #: Per arm: trials decided and disagreeing (``{"10": [40, 0]}``).
    by_arm: dict[str, list[int]]
    #: Per arm: trials with an inference, and those whose first flight the probe's own receive
    #: window cut (the inference's ``receive_window`` reason: the arm's window was not seen, a
    #: lower bound) -- an arm above the client's window measures the client, not the IW
    #: (``{"32": [40, 40]}`` behind a 64 KB window at MSS 1448 is 45 segments: not yet).
    receive_window_by_arm: dict[str, list[int]]
    #: Something between probe and origin terminates TCP (module docstring); ``None``: n too small.
    suspect: bool | None
    too_small: bool


#: The inference's reason when the probe's receive window, not the server's window, ended the
#: first flight (``iwprobe._iwinfer``).
RECEIVE_WINDOW_REASON = "receive_window"


def _wilson(successes: int, trials: int) -> tuple[float | None, float | None, float | None]:
    if trials <= 0:
        return None, None, None
    interval = proportion_interval(successes, trials)
    low, high = interval if interval is not None else (None, None)
    return successes / trials, low, high


def answer_of(rows: Sequence[tuple[str, int | None, int | None, str]]) -> IwAnswer:
    """The answer of census records given as (status, segments, mss, reason) (module docstring)."""
    statuses = Counter(status for status, _, _, _ in rows)
    determined = Counter(segments for status, segments, _, _ in rows if status == "ok" and segments is not None)
    bounds = [segments for status, segments, _, _ in rows if status != "undetermined" and segments is not None]
    sizes = Counter(mss for status, _, mss, _ in rows if status == "ok" and mss is not None)
    reasons = Counter(reason for status, _, _, reason in rows if status != "ok" and reason)
    n_ok = sum(determined.values())
    too_small = n_ok < MIN_RECORDS
    modal, count = determined.most_common(1)[0] if determined else (None, 0)
    share, low, high = _wilson(count, n_ok) if not too_small else (None, None, None)
    max_bound = max(bounds) if bounds and too_small else None
    bound_reasons = Counter(
        reason for status, segments, _, reason in rows if status == "lower_bound" and segments == max_bound and reason
    )
    return IwAnswer(
        records=len(rows),
        ok=statuses["ok"],
        lower_bound=statuses["lower_bound"],
        undetermined=statuses["undetermined"],
        iw_segments=None if too_small else modal,
        share=share,
        share_ci_low=low,
        share_ci_high=high,
        values={str(value): n for value, n in determined.most_common()},
        max_lower_bound=max_bound,
        max_lower_bound_reason=bound_reasons.most_common(1)[0][0] if bound_reasons and max_bound not in determined else "",
        mss=sizes.most_common(1)[0][0] if sizes else None,
        too_small=too_small,
        reasons=dict(reasons.most_common(5)),
    )


def _census_where(filters: Filters) -> tuple[str, dict[str, Any]]:
    """The filters that apply to census records: campaigns, the measurement window, regions."""
    conditions = (
        ("campaign_ids", "c.campaign_id = ANY(:campaign_ids)", list(filters.campaign_ids)),
        ("since", "c.measured_at >= :since", filters.since),
        ("until", "c.measured_at <= :until", filters.until),
        ("regions", "p.region = ANY(:regions)", list(filters.regions)),
        ("protocol", "COALESCE(c.protocol, 'tcp') = :protocol", filters.protocol or None),
    )
    given = [(name, clause, value) for name, clause, value in conditions if value is not None and value != []]
    return (" AND ".join(clause for _, clause, _ in given) or "TRUE"), {name: value for name, _, value in given}


def _census_rows(session: Session, filters: Filters) -> Iterable[Any]:
    where, params = _census_where(filters)
    return session.execute(
        text(f"""
        SELECT c.url, c.host, c.probe_id::text, p.region, c.measured_at, c.status, c.iw_segments, c.mss, c.reason,
               COALESCE(c.protocol, 'tcp')
          FROM census_records c JOIN probes p ON p.id = c.probe_id
         WHERE {where}
         ORDER BY c.url, 10, c.measured_at"""),
        params,
    )


def census_targets(session: Session, filters: Filters) -> list[CensusTarget]:
    """Per census target and protocol: the IW over all its records and per region (module
    docstring)."""
    rows: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in _census_rows(session, filters):
        rows[(row[0], row[9])].append(row)
    targets = []
    for (url, protocol), records in rows.items():
        by_region: dict[str, list[tuple[str, int | None, int | None, str]]] = defaultdict(list)
        for record in records:
            by_region[record[3]].append((record[5], record[6], record[7], record[8]))
        targets.append(
            CensusTarget(
                url=url,
                host=records[0][1],
                probes=len({record[2] for record in records}),
                first_measured_at=records[0][4],
                last_measured_at=records[-1][4],
                overall=answer_of([(record[5], record[6], record[7], record[8]) for record in records]),
                by_region={region: answer_of(values) for region, values in sorted(by_region.items())},
                protocol=protocol,
            )
        )
    return targets


def census_series(session: Session, filters: Filters) -> list[CensusDay]:
    """Per census target, protocol and UTC day: the answer of that day's records (the "over time"
    view)."""
    cells: dict[tuple[str, str, dt.date], list[tuple[str, int | None, int | None, str]]] = defaultdict(list)
    for row in _census_rows(session, filters):
        cells[(row[0], row[9], row[4].astimezone(dt.UTC).date())].append((row[5], row[6], row[7], row[8]))
    return [
        CensusDay(url=url, day=day, answer=answer_of(values), protocol=protocol)
        for (url, protocol, day), values in sorted(cells.items())
    ]


def iw_check(session: Session, filters: Filters) -> list[PathIwCheck]:
    """Per probe and origin: the client-side inferences against the arms (module docstring)."""
    where, params = trial_where(filters)
    rows = session.execute(
        text(f"""
        SELECT t.probe_id::text, p.name, p.region, t.origin_id::text, t.arm_iw, t.client_iw_status,
               t.client_iw_segments, t.server_snd_cwnd_at_accept, t.client_iw_reason
          FROM trials t JOIN probes p ON p.id = t.probe_id
         WHERE {where} AND t.client_iw_status IS NOT NULL AND t.arm IS NULL AND t.error_kind IS NULL
         ORDER BY p.name, t.probe_id, t.origin_id"""),
        params,
    ).all()
    paths: dict[tuple[str, str | None], list[Any]] = defaultdict(list)
    for row in rows:
        paths[(row[0], row[3])].append(row)
    return [_check_path(trials) for trials in paths.values()]


def _check_path(trials: list[Any]) -> PathIwCheck:
    statuses: Counter[str] = Counter()
    agree = disagree = origin_had_arm = origin_not_arm = 0
    instead: Counter[int] = Counter()
    by_arm: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    receive_window: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for _, _, _, _, arm_iw, status, segments, server_cwnd, reason in trials:
        statuses[status] += 1
        limited = receive_window[str(arm_iw)]
        limited[0] += 1
        limited[1] += int(reason == RECEIVE_WINDOW_REASON)
        origin_not_arm += int(server_cwnd is not None and server_cwnd != arm_iw)
        if status == "undetermined" or segments is None:
            continue
        window = arm_iw if server_cwnd is None else server_cwnd
        wrong = segments != window if status == "ok" else segments > window
        cell = by_arm[str(arm_iw)]
        cell[0] += 1
        if wrong:
            disagree += 1
            cell[1] += 1
            origin_had_arm += int(server_cwnd == arm_iw)
            if status == "ok":
                instead[segments] += 1
        else:
            agree += 1
    decided = agree + disagree
    too_small = decided < MIN_RECORDS
    share, low, high = _wilson(disagree, decided) if not too_small else (None, None, None)
    first = trials[0]
    return PathIwCheck(
        probe_id=first[0],
        probe_name=first[1],
        region=first[2],
        origin_id=first[3],
        inferred=len(trials),
        ok=statuses["ok"],
        lower_bound=statuses["lower_bound"],
        undetermined=statuses["undetermined"],
        agree=agree,
        disagree=disagree,
        disagree_origin_had_arm=origin_had_arm,
        origin_not_arm=origin_not_arm,
        disagree_share=share,
        disagree_ci_low=low,
        disagree_ci_high=high,
        seen_instead=instead.most_common(1)[0][0] if instead else None,
        by_arm=dict(sorted(by_arm.items(), key=lambda item: int(item[0]))),
        receive_window_by_arm=dict(sorted(receive_window.items(), key=lambda item: int(item[0]))),
        suspect=None
        if too_small
        else any(wrong >= MIN_RECORDS and wrong >= SUSPECT_SHARE * counted for counted, wrong in by_arm.values()),
        too_small=too_small,
    )
