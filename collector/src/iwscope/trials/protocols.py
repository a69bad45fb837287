"""Wire v9: a trial's or an origin observation's ``protocol`` against the rest of the record,
the checks the schema cannot state (:func:`iwscope.trials.validation` runs them on every batch).

**The protocol is the arm's.**  A QUIC arm's label ends in ``q`` (``10q``, ``10pq``: the TCP arm's
policy over HTTP/3), and the record's ``protocol`` must say the same:
``protocol == "quic"`` exactly when ``wire.arm_label_protocol(arm) == "quic"``.  The label is what
the analysis keys on (a QUIC arm is not a plain arm, so its trials stay out of the roll-ups, as a
paced arm's do) and ``protocol`` what the exports carry; a record where they disagree would be TCP
to one reader and QUIC to the other.  An empty protocol is "not said", which is TCP, so a QUIC
label with it is refused as well (an agent that measures over QUIC speaks v9 and says so).

**A QUIC connection is not a TCP connection.**  A QUIC trial has no ``connect_us`` and no
``tcp_info``; a QUIC observation no ``tcp_info``.  Their typed ``tcpi_*`` columns feed TCP's
numbers -- the path estimates' minimum RTT and loss rate, the retransmission figures, the server
columns the join copies onto the trial --, where a QUIC connection's would pass for a TCP one's.
The ``quic_*`` fields, the other way round, belong to QUIC observations only.  A record whose
protocol disagrees with its arm is named for that alone: which of its other fields are wrong
depends on which of the two is.
"""

from __future__ import annotations

from collections.abc import Sequence

from iwprobe import wire
from iwscope.trials import fastwire
from iwscope.trials.schemas import RecordError

#: An observation's fields that only a QUIC observation may carry (``None`` otherwise).
QUIC_OBSERVATION_FIELDS = (
    "quic_first_flight_packets",
    "quic_first_flight_bytes",
    "quic_max_datagram_size",
    "quic_lost_packets",
    "quic_zero_rtt",
)


def arm_mismatch(protocol: str, arm: str) -> str | None:
    """Why ``protocol`` does not go with the arm label ``arm``; ``None`` when it does."""
    labelled = wire.arm_label_protocol(arm)
    if (protocol or "tcp") == labelled:
        return None
    if labelled == "quic":
        return f"arm {arm!r} is a QUIC arm: protocol must be 'quic', not {protocol!r}"
    return f"protocol 'quic' needs a QUIC arm (Nq or Npq), not arm {arm!r}"


def trial_errors(trials: Sequence[fastwire.FastTrial]) -> list[RecordError]:
    """Trials whose protocol disagrees with their arm, and QUIC trials with a TCP connection's fields."""
    errors: list[RecordError] = []

    def error(index: int, trial: fastwire.FastTrial, name: str, message: str) -> None:
        errors.append(RecordError(section="trials", index=index, record_id=trial.trial_id, field=name, message=message))

    for index, trial in enumerate(trials):
        mismatch = arm_mismatch(trial.protocol, trial.arm)
        if mismatch:
            error(index, trial, "protocol", mismatch)  # alone: which other fields are wrong depends on it
            continue
        if trial.protocol != "quic":
            continue
        if trial.connect_us is not None:
            error(index, trial, "connect_us", "a QUIC trial has no TCP connection: connect_us must be null")
        if trial.tcp_info:
            error(index, trial, "tcp_info", "a QUIC trial has no TCP connection: tcp_info must be empty")
    return errors


def observation_errors(observations: Sequence[fastwire.FastObservation]) -> list[RecordError]:
    """Observations whose protocol disagrees with their arm, QUIC observations with ``tcp_info``,
    and TCP observations with QUIC fields."""
    errors: list[RecordError] = []

    def error(index: int, observation: fastwire.FastObservation, name: str, message: str) -> None:
        errors.append(
            RecordError(section="observations", index=index, record_id=observation.trial_id, field=name, message=message)
        )

    for index, observation in enumerate(observations):
        mismatch = arm_mismatch(observation.protocol, observation.arm)
        if mismatch:
            error(index, observation, "protocol", mismatch)  # alone: which other fields are wrong depends on it
            continue
        if observation.protocol == "quic":
            if observation.tcp_info:
                error(index, observation, "tcp_info", "a QUIC observation has no TCP connection: tcp_info must be empty")
            continue
        for name in QUIC_OBSERVATION_FIELDS:
            if getattr(observation, name) is not None:
                error(index, observation, name, "only a QUIC observation (protocol 'quic') has it: must be null")
    return errors
