"""Analysis of IW experiments: treatment-vs-baseline comparisons served from incremental roll-ups.

The public surface (the contract with the dashboard and the HTTP API) is re-exported here;
see ``README.md`` in this folder for units, resolutions and statistical choices.
"""

from iwscope.analysis.cost import (
    CostCampaign,
    CostFlows,
    CostInteractive,
    CostInterference,
    CostReport,
    arm_order,
    cost,
    used_arms,
)
from iwscope.analysis.filters import Filters, Metric
from iwscope.analysis.iwcheck import CensusDay, CensusTarget, IwAnswer, PathIwCheck, census_series, census_targets, iw_check
from iwscope.analysis.modelfit import model_fit
from iwscope.analysis.modelfit_results import ArmFit, BucketModelFit, ModelFit, PathInputs, PathModelFit
from iwscope.analysis.offered_load import fairness
from iwscope.analysis.passive import (
    PASSIVE_DIMENSIONS,
    PassiveDimension,
    PassiveFilters,
    passive_buckets,
    passive_campaigns,
    passive_days,
    passive_filter_options,
    passive_load,
    passive_regions,
    passive_share_sweep,
    passive_summary,
)
from iwscope.analysis.queries import (
    compare_by,
    compare_many,
    filter_options,
    fleet,
    headline,
    latency_cdf,
    latency_vs_iw,
    loss_summary,
    percentile_table,
    region_summary,
)
from iwscope.analysis.raw import iter_trials_csv, trial_near, trials_page
from iwscope.analysis.results import (
    ArmPercentiles,
    ArmStats,
    BucketComparison,
    FairnessPoint,
    FilterOptions,
    Headline,
    LossBucket,
    PercentileTable,
    ProbeRow,
    RegionSummary,
)
from iwscope.analysis.rollups import RefreshResult, rebuild_rollups, refresh_rollups, reset_rollups
from iwscope.analysis.tls import tls_by_flight

__all__ = [
    "tls_by_flight",
    "ArmFit",
    "BucketModelFit",
    "ModelFit",
    "PathInputs",
    "PathModelFit",
    "model_fit",
    "PASSIVE_DIMENSIONS",
    "PassiveDimension",
    "PassiveFilters",
    "passive_buckets",
    "passive_campaigns",
    "passive_days",
    "passive_filter_options",
    "passive_load",
    "passive_regions",
    "passive_share_sweep",
    "passive_summary",
    "CensusDay",
    "CensusTarget",
    "IwAnswer",
    "PathIwCheck",
    "census_series",
    "census_targets",
    "iw_check",
    "CostCampaign",
    "CostFlows",
    "CostInteractive",
    "CostInterference",
    "CostReport",
    "arm_order",
    "cost",
    "used_arms",
    "ArmPercentiles",
    "ArmStats",
    "BucketComparison",
    "FairnessPoint",
    "FilterOptions",
    "Filters",
    "Headline",
    "LossBucket",
    "Metric",
    "PercentileTable",
    "ProbeRow",
    "RefreshResult",
    "RegionSummary",
    "compare_by",
    "compare_many",
    "fairness",
    "filter_options",
    "fleet",
    "headline",
    "iter_trials_csv",
    "latency_cdf",
    "latency_vs_iw",
    "loss_summary",
    "percentile_table",
    "rebuild_rollups",
    "refresh_rollups",
    "region_summary",
    "reset_rollups",
    "trial_near",
    "trials_page",
]
