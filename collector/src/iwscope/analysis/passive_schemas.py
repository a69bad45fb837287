"""Response models of ``/api/v1/analysis/passive/...`` (the real-user study; a ``read`` or
``admin`` token): thin ``{"data": ...}`` envelopes around the result dataclasses of
:mod:`iwscope.analysis.passive_results`, as :mod:`iwscope.analysis.schemas` does for the
probes' analysis."""

from __future__ import annotations

from pydantic import BaseModel

from iwscope.analysis.passive_results import (
    PassiveBuckets,
    PassiveCampaign,
    PassiveGroupRow,
    PassiveLoadDay,
    PassivePercentileTable,
    PassiveShareSweep,
    PassiveSummary,
)


class PassiveCampaignsOut(BaseModel):
    """``/passive/campaigns``: every passive campaign, the one that started last first."""

    data: list[PassiveCampaign]


class PassiveSummaryOut(BaseModel):
    """``/passive/summary``: percentile table per arm with improvements, retransmissions, biased shares."""

    data: PassiveSummary


class PassiveBucketsOut(BaseModel):
    """``/passive/buckets``: the Figure 5 panel of one dimension."""

    data: PassiveBuckets


class PassiveRegionsOut(BaseModel):
    """``/passive/regions``: the percentile table per client region."""

    data: list[PassivePercentileTable]


class PassiveDaysOut(BaseModel):
    """``/passive/days``: mean and median per arm and their improvement per UTC day."""

    data: list[PassiveGroupRow]


class PassiveShareSweepOut(BaseModel):
    """``/passive/share-sweep``: the default arm per treated share."""

    data: PassiveShareSweep


class PassiveLoadOut(BaseModel):
    """``/passive/load``: aggregates vs raw records per server and UTC day."""

    data: list[PassiveLoadDay]
