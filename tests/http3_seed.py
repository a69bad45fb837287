"""An HTTP/3 campaign beside the seeded study (``study_seed``): TCP arms 3 and 10 and their QUIC
arms ``3q`` and ``10q`` (wire v9) measured in the same rounds on four of the study's paths, and
Caddy-like census records (10 segments over TCP, 32 packets over QUIC).

HTTP/3's handshake is a round trip shorter than TCP + TLS 1.3's, so a QUIC fetch's total is the
TCP fetch's minus one RTT (with the same multiplicative noise); the transfer itself follows the
same slow start, windows counted in packets of 1,200 bytes.  What the HTTP/3 page and
``iwscope.analysis.protocols`` must then show: a saving of about one RTT per pair at either IW.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from dataclasses import dataclass

import numpy as np
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session
from study_seed import PATHS, PathSpec

from iwscope.models import Campaign, CensusRecord, Origin, Probe, Trial, TrialId

#: The study's paths the campaign runs on (RTTs 25, 70, 150, 220 ms).
HTTP3_PATHS: tuple[PathSpec, ...] = tuple(
    path for path in PATHS if path.name in ("frankfurt-1", "chicago-1", "saopaulo-1", "lagos-1")
)
HTTP3_SIZES = (2_000, 30_000)
HTTP3_ROUNDS = 12
QUIC_PAYLOAD = 1_165
MSS = 1_448
CENSUS_URL = "https://caddy.example/big.bin"


@dataclass(frozen=True)
class Http3Seed:
    campaign_id: int
    n_trials: int
    n_quic_trials: int
    #: The mean of (TCP total - QUIC total) the trials were drawn with, per (IW, size) (ms): one RTT
    #: where both take the same rounds of slow start, none where QUIC's smaller packets need one
    #: more (30 KB from IW 3: 21 segments in three rounds, 26 packets in four).
    mean_saving_ms: dict[tuple[int, int], float]


def _rounds(size: int, iw: int, unit: int) -> int:
    return max(1, math.ceil(math.log2(math.ceil(size / unit) / iw + 1)))


def seed_http3(session: Session, now: dt.datetime, *, seed: int = 11) -> Http3Seed:
    """Write the campaign, its trials and the census records; the caller commits."""
    rng = np.random.default_rng(seed)
    origin_id = session.scalars(select(Origin.id).where(Origin.name == "origin-eu")).one()
    probes = {probe.name: probe.id for probe in session.scalars(select(Probe))}
    day0 = (now - dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    stamped = now - dt.timedelta(minutes=5)
    campaign = Campaign(
        name="http3",
        origin_ids=[origin_id],
        probe_regions=None,
        arms=[3, 10, 3, 10],
        arm_labels=["3", "10", "3q", "10q"],
        sizes=list(HTTP3_SIZES),
        size_dist=None,
        sizes_per_round=len(HTTP3_SIZES),
        repetitions=HTTP3_ROUNDS,
        interval_s=60.0,
        starts_at=day0,
        ends_at=None,
        calibrate=False,
    )
    session.add(campaign)
    session.flush()
    trials: list[dict[str, object]] = []
    savings: dict[tuple[int, int], list[float]] = {}
    for path in HTTP3_PATHS:
        rtt_us = path.rtt_ms * 1000
        for round_number in range(HTTP3_ROUNDS):
            started = day0 + dt.timedelta(hours=round_number, minutes=int(rng.integers(0, 50)))
            for iw in (3, 10):
                for size in HTTP3_SIZES:
                    noise = float(rng.lognormal(0.0, 0.05))
                    transfer = size * 8 / (path.bandwidth_mbps * 1e6) * 1e6
                    # TCP + TLS 1.3: SYN, ClientHello, request: three round trips before slow start's rounds
                    tcp_total = (3 * rtt_us + _rounds(size, iw, MSS) * rtt_us + transfer) * noise
                    quic_total = (2 * rtt_us + _rounds(size, iw, QUIC_PAYLOAD) * rtt_us + transfer) * noise
                    savings.setdefault((iw, size), []).append((tcp_total - quic_total) / 1000)
                    for label, total, connect in ((str(iw), tcp_total, rtt_us), (f"{iw}q", quic_total, None)):
                        quic = label.endswith("q")
                        trials.append(
                            {
                                "trial_id": uuid.uuid4(),
                                "started_at": started + dt.timedelta(seconds=len(trials) % 60),
                                "probe_id": probes[path.name],
                                "campaign_id": campaign.id,
                                "origin_id": origin_id,
                                "round": round_number,
                                "arm_iw": iw,
                                "arm": label if quic else None,
                                "protocol": "quic" if quic else "tcp",
                                "object_size": size,
                                "url": f"https://origin.example:{8000 + iw}/obj/{size}",
                                "dns_us": 0,
                                "connect_us": None if connect is None else int(connect),
                                "ttfb_us": int(total - transfer),
                                "total_us": int(total),
                                "bytes_received": size,
                                "http_status": 200,
                                "error_kind": None,
                                "error_detail": None,
                                "syn_retrans": 0,
                                "tcp_info": {},
                                "tls_version": "TLSv1.3",
                                "tls_handshake_us": int(rtt_us * noise),
                                "family": "ipv4",
                                "server_latency_us": int(_rounds(size, iw, QUIC_PAYLOAD if quic else MSS) * rtt_us * noise),
                                "received_at": stamped,
                                "joined_at": stamped,
                            }
                        )
    session.execute(insert(TrialId), [{"trial_id": t["trial_id"], "started_at": t["started_at"]} for t in trials])
    session.execute(insert(Trial), trials)
    census = []
    for index, name in enumerate(path.name for path in HTTP3_PATHS):
        for protocol, segments, unit in (("tcp", 10, MSS), ("quic", 32, 1_252)):
            census.append(
                {
                    "census_id": uuid.uuid4(),
                    "probe_id": probes[name],
                    "campaign_id": campaign.id,
                    "round": 0,
                    "url": CENSUS_URL,
                    "host": "caddy.example",
                    "measured_at": day0 + dt.timedelta(hours=index),
                    "status": "ok",
                    "iw_segments": segments,
                    "iw_bytes": segments * unit,
                    "mss": unit,
                    "reason": "",
                    "connections": 3,
                    "connections_ok": 3,
                    "announced_mss": None if protocol == "quic" else 1460,
                    "rtt_us": 50_000,
                    "family": "ipv4",
                    "tls_version": "TLSv1.3",
                    "http_status": 200,
                    "error_detail": None,
                    "protocol": protocol,
                    "received_at": stamped,
                }
            )
    session.execute(insert(CensusRecord), census)
    return Http3Seed(
        campaign_id=campaign.id,
        n_trials=len(trials),
        n_quic_trials=sum(1 for trial in trials if trial["protocol"] == "quic"),
        mean_saving_ms={key: float(np.mean(values)) for key, values in savings.items()},
    )


def remove_http3(session: Session, seeded: Http3Seed) -> None:
    """Take the campaign out again (the study's other tests count every trial)."""
    ids = list(session.scalars(select(Trial.trial_id).where(Trial.campaign_id == seeded.campaign_id)))
    session.execute(delete(Trial).where(Trial.campaign_id == seeded.campaign_id))
    session.execute(delete(TrialId).where(TrialId.trial_id.in_(ids)))
    session.execute(delete(CensusRecord).where(CensusRecord.campaign_id == seeded.campaign_id))
    session.execute(delete(Campaign).where(Campaign.id == seeded.campaign_id))
