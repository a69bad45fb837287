"""The lab twin's result as the API takes and gives it (``iwscope_lab.twin.TwinResult.to_dict``).

Every estimate is a paired improvement over the baseline arm (ms, positive: the arm is faster)
with its 95 % interval, or ``ms = None`` below 20 pairs ("n too small").  Every estimate the
twins made for an arm is a :class:`PredictedEstimate`, whose ``prediction`` must be ``true``:
a document that drops the mark is refused, so nothing downstream can show a prediction as a
measurement.  Checked beyond types: intervals in order and around their point, the predicted
arms exactly ``what_if``, the held-out block there iff ``compare_arm`` is.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from iwprobe import wire
from iwscope.wiretypes import ArmLabel

_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)

Iw = Annotated[int, Field(ge=1, le=wire.MAX_IW_SEGMENTS)]


def _label_of_iw(value: object) -> object:
    """An arm given as its IW (results stored before arm labels, 2026-11-28) as its label."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


#: A predicted arm by label: ``32``, ``32p`` (paced), ``learned``; an integer is the plain arm.
Arm = Annotated[ArmLabel, BeforeValidator(_label_of_iw), Field(min_length=1)]
Name = Annotated[str, Field(max_length=200)]
#: Most paths and RTT buckets one result may carry.
MAX_PATHS = 10_000
MAX_BUCKETS = 64


class EstimateIn(BaseModel):
    """A paired improvement with its interval (``None``: n too small)."""

    model_config = _CONFIG

    n_pairs: Annotated[int, Field(ge=0)]
    ms: float | None
    ci_ms: tuple[float, float] | None
    pct: float | None

    @model_validator(mode="after")
    def _interval_around_point(self) -> Self:
        if self.ci_ms is not None:
            low, high = self.ci_ms
            if low > high:
                raise ValueError(f"ci_ms {list(self.ci_ms)}: low above high")
            if self.ms is None:
                raise ValueError("ci_ms without ms")
            slack = 1e-6 * max(1.0, abs(self.ms))
            if not low - slack <= self.ms <= high + slack:
                raise ValueError(f"ms {self.ms} outside its interval {list(self.ci_ms)}")
        return self


class PredictedEstimate(EstimateIn):
    """What the twins predict for an arm: marked, always."""

    prediction: Literal[True]
    #: An IW burst beyond what the path showed of its queue (the fit says nothing of it).
    beyond_fit: bool | None = None


class PathIn(BaseModel):
    """The measured path and the link fitted to it (``iwscope_lab.twin.TwinPath``)."""

    model_config = _CONFIG

    probe_id: Name
    probe_name: Name
    region: Name
    origin_id: Name
    trials: Annotated[int, Field(ge=0)]
    rtt_ms: Annotated[float, Field(gt=0)]
    rate_bps: Annotated[float, Field(gt=0)] | None
    loss: Annotated[float, Field(ge=0, le=1)]
    buffer_bytes: Annotated[int, Field(ge=0)] | None
    buffer_fit: Name
    queue_seen_bytes: Annotated[int, Field(ge=0)]


class FitCheckIn(BaseModel):
    """The measured arm beside the twins' run of it."""

    model_config = _CONFIG

    measured: EstimateIn
    twin: PredictedEstimate
    overlap: bool | None


class HeldOutIn(BaseModel):
    """An arm the campaign measured and the twins predicted without it."""

    model_config = _CONFIG

    measured: EstimateIn
    predicted: PredictedEstimate
    overlap: bool | None


class BucketFitIn(FitCheckIn):
    paths: Annotated[int, Field(ge=0)]


class BucketHeldOutIn(HeldOutIn):
    paths: Annotated[int, Field(ge=0)]


class TwinPathIn(BaseModel):
    model_config = _CONFIG

    path: PathIn
    bucket: Name
    fit: FitCheckIn
    predicted: dict[Name, PredictedEstimate]
    held_out: HeldOutIn | None = None


class TwinBucketIn(BaseModel):
    model_config = _CONFIG

    bucket: Name
    order: int
    paths: Annotated[int, Field(ge=0)]
    fit: BucketFitIn
    predicted: dict[Name, PredictedEstimate]
    held_out: BucketHeldOutIn | None = None


class TwinResultIn(BaseModel):
    """A twin's whole result for one campaign."""

    model_config = _CONFIG

    campaign_id: Annotated[int, Field(ge=1)]
    baseline_iw: Iw
    treatment_iw: Iw
    what_if: Annotated[list[Arm], Field(max_length=16)]
    compare_arm: Arm | None
    twin_campaign_id: Annotated[int, Field(ge=1)] | None
    paths: Annotated[list[TwinPathIn], Field(min_length=1, max_length=MAX_PATHS)]
    buckets: Annotated[list[TwinBucketIn], Field(max_length=MAX_BUCKETS)]

    @model_validator(mode="after")
    def _arms_consistent(self) -> Self:
        if self.baseline_iw == self.treatment_iw:
            raise ValueError("baseline_iw and treatment_iw are the same arm")
        if len(set(self.what_if)) != len(self.what_if):
            raise ValueError("what_if names an arm twice")
        if self.compare_arm is not None and self.compare_arm not in self.what_if:
            raise ValueError(f"compare_arm {self.compare_arm} is not among what_if")
        arms = set(self.what_if)
        held = self.compare_arm is not None
        entries: list[tuple[str, int, TwinPathIn | TwinBucketIn]] = [("path", i, entry) for i, entry in enumerate(self.paths)]
        entries += [("bucket", i, entry) for i, entry in enumerate(self.buckets)]
        for kind, index, entry in entries:
            if set(entry.predicted) != arms:
                raise ValueError(f"{kind} {index}: predicted arms {sorted(entry.predicted)} are not what_if {sorted(arms)}")
            if (entry.held_out is not None) != held:
                raise ValueError(f"{kind} {index}: a held_out block {'missing' if held else 'without compare_arm'}")
        return self

    @property
    def fit_judged(self) -> int:
        return sum(entry.fit.overlap is not None for entry in self.paths)

    @property
    def fit_overlapping(self) -> int:
        return sum(entry.fit.overlap is True for entry in self.paths)


class TwinPredictionOut(BaseModel):
    """A stored twin result.  ``kind`` is always ``prediction``: lab-twin numbers, not measurements."""

    id: int
    campaign_id: int
    created_at: dt.datetime
    kind: Literal["prediction"] = "prediction"
    source: Literal["iwscope lab twin"] = "iwscope lab twin"
    #: Paths with a twin; of them, whose fit check could be judged, and whose intervals overlap.
    paths: int
    fit_judged: int
    fit_overlapping: int
    result: TwinResultIn


class TwinPredictionStored(BaseModel):
    """``POST``'s answer: the stored prediction's id; ``duplicate``: the same result was stored before."""

    id: int
    duplicate: bool


class TwinPredictionsOut(BaseModel):
    """Newest first."""

    data: list[TwinPredictionOut]
