"""Path estimates per probe x origin, kept up to date by the worker (see ``paths.services``).

Besides the estimates, a row holds what they are computed from, so that new trials, samples and
joined observations are folded in without reading the pair's history again."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Double, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from iwscope.db import Base
from iwscope.types import BigInt, UuidPk


class PathEstimate(Base):
    __tablename__ = "path_estimates"

    probe_id: Mapped[UuidPk]
    origin_id: Mapped[UuidPk]
    #: Smallest RTT seen on the path (path samples and trials' ``tcpi_min_rtt``), µs.
    min_rtt_us: Mapped[BigInt | None]
    #: Robust maximum (90th percentile) of the bandwidth estimates, bit/s.
    bottleneck_bps: Mapped[BigInt | None]
    #: ``bottleneck_bps * min_rtt`` in bytes.
    bdp_bytes: Mapped[BigInt | None]
    #: Server retransmitted bytes / bytes sent, over joined trials.
    loss_rate: Mapped[float | None] = mapped_column(Double)
    #: Path samples plus trials the estimate is based on.
    sample_count: Mapped[BigInt]
    updated_at: Mapped[dt.datetime]
    #: Trials of the pair folded in (``sample_count`` = this + ``path_sample_count``).
    trial_count: Mapped[BigInt] = mapped_column(server_default=text("0"))
    path_sample_count: Mapped[BigInt] = mapped_column(server_default=text("0"))
    #: Sums over joined trials with server retransmission counters (``loss_rate``'s parts).
    bytes_retrans_sum: Mapped[BigInt] = mapped_column(server_default=text("0"))
    bytes_sent_sum: Mapped[BigInt] = mapped_column(server_default=text("0"))
    #: The most recent bandwidth estimates, oldest first (at most ``RECENT_RATES``): of the path
    #: samples, and of the joined observations' server delivery rate (bit/s).
    recent_sample_bps: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), server_default=text("'{}'"))
    recent_server_bps: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), server_default=text("'{}'"))
