"""Every ORM model of the collector, imported in one place (for Alembic's metadata)."""

from iwscope.auth.models import ApiToken
from iwscope.campaigns.models import Campaign, CampaignProbeDone
from iwscope.db import Base
from iwscope.origins.models import Origin
from iwscope.passive.models import PassiveAggregate, PassiveConnection
from iwscope.paths.models import PathEstimate
from iwscope.predictions.models import TwinPrediction
from iwscope.probes.models import Probe
from iwscope.servers.models import Server
from iwscope.traces.models import TrialTrace
from iwscope.trials.models import CensusRecord, OriginObservation, PathSample, Trial, TrialId

__all__ = [
    "ApiToken",
    "Base",
    "Campaign",
    "CampaignProbeDone",
    "CensusRecord",
    "Origin",
    "OriginObservation",
    "PassiveAggregate",
    "PassiveConnection",
    "PathEstimate",
    "PathSample",
    "Probe",
    "Server",
    "Trial",
    "TrialId",
    "TrialTrace",
    "TwinPrediction",
]
