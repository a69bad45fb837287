"""The results of :func:`iwscope.analysis.modelfit.model_fit` (its docstring says how each is
computed); latencies and improvements in ms, intervals as ``(low, high)``."""

from __future__ import annotations

from dataclasses import dataclass

Interval = tuple[float, float]


@dataclass(frozen=True)
class PathInputs:
    """What the model was given for one path (and where each value came from: module docstring)."""

    min_rtt_ms: float
    bottleneck_bps: float | None
    loss: float
    rwnd_segments: int | None
    mss: int
    cc: str


@dataclass(frozen=True)
class ArmFit:
    """One arm of a path: measured mean latency (ms, t interval) beside the model's."""

    iw: int
    n: int
    measured_mean_ms: float | None
    measured_ci_ms: Interval | None
    predicted_mean_ms: float | None
    #: measured / predicted - 1 (0.2 = 20 % slower than the model).
    gap: float | None
    retrans_share: float | None
    retrans_ci: Interval | None
    #: The model's share of trials in which the origin retransmitted (SYN-ACK or data).
    predicted_retrans_share: float | None


@dataclass(frozen=True)
class PathModelFit:
    """One probe x origin path: measured and predicted improvement, residual, verdict."""

    probe_id: str
    probe_name: str
    region: str
    origin_id: str
    bucket: str
    bucket_order: int
    inputs: PathInputs | None
    n_pairs: int
    measured_ms: float | None
    measured_ci_ms: Interval | None
    measured_pct: float | None
    predicted_ms: float | None
    predicted_ci_ms: Interval | None
    predicted_pct: float | None
    #: The model's mean baseline latency over the path's pair sizes (what ``predicted_pct`` and
    #: the :data:`~iwscope.analysis.modelfit.ODD_SHARE` tolerance are relative to).
    predicted_baseline_ms: float | None
    residual_ms: float | None
    arms: list[ArmFit]
    too_small: bool
    #: Why there is no verdict ("n too small", no RTT estimate), else None.
    reason: str | None
    agrees: bool | None
    odd: bool
    explanations: list[str]


@dataclass(frozen=True)
class BucketModelFit:
    """One RTT bucket: the paths' pairs together beside their pair-weighted prediction."""

    bucket: str
    order: int
    n_paths: int
    n_pairs: int
    measured_ms: float | None
    measured_ci_ms: Interval | None
    measured_pct: float | None
    predicted_ms: float | None
    #: The prediction's 95 % Monte-Carlo interval: the paths' own intervals combined with the
    #: same pair weights (their simulations are independent); None without one.
    predicted_ci_ms: Interval | None
    predicted_pct: float | None
    predicted_baseline_ms: float | None
    residual_ms: float | None
    #: The measured interval holds the prediction, or the residual is within ``ODD_SHARE`` of
    #: the predicted baseline latency (as for a path); None: n too small or no prediction.
    agrees: bool | None
    too_small: bool
    caveat: str | None


@dataclass(frozen=True)
class ModelFit:
    """:func:`model_fit`'s answer."""

    baseline_iw: int
    treatment_iw: int
    metric: str
    cc: str
    model_samples: int
    paths: list[PathModelFit]
    buckets: list[BucketModelFit]
    odd_paths: int
    #: Trials read, and whether more matched (the newest ``MAX_TRIALS`` were kept).
    trials_read: int
    truncated: bool
