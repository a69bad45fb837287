"""Path estimates per probe x origin, recomputed by the worker."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Double
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
