"""What TCP should give a short transfer on a path: the yardstick beside every measurement.

Two models of one HTTP fetch over a path of round-trip propagation ``rtt_s`` and a bottleneck
of ``rate_bps``, both with the initial window as a parameter:

* without loss (``_slowstart``): :func:`slow_start_rounds`, the textbook count, and
  :func:`predict`, a packet-level simulation of Linux's slow start with serialisation in both
  directions; :func:`predict_appconnect` and the TLS flight sizes for HTTPS; the queue an
  initial flight builds (:func:`first_flight_queue`); HTTPS on TCP against HTTP/3 at the same
  IW (``_quic``: :func:`predict_quic_saving`);
* with random loss (``_loss`` over ``_loss_*``): :func:`predict_with_loss`, a Monte-Carlo over
  the same simulation turned event-driven with Linux 6.x's recovery (SYN timers, RACK, PRR, the
  tail loss probe, the RTO and its undo), :func:`simulate_connection` for one trial with chosen
  drops, and Cardwell, Savage and Anderson's closed form (:func:`csa_latency`) beside it.

Pure Python, no I/O: the collector's analysis sets it beside field measurements
(``iwscope.analysis.model_fit``) and the lab beside its own (``iwscope lab reproduce``, the
twins).  docs/reproduction.md gives the derivations and what each model leaves out.
"""

from iwscope.model._loss import predict_with_loss, simulate_connection
from iwscope.model._loss_csa import CsaEstimate, csa_latency
from iwscope.model._loss_types import (
    BBR_CWND_MIN,
    CONGESTION_CONTROLS,
    CUBIC_BETA,
    DEFAULT_SAMPLES,
    DUPTHRESH,
    QUANTILES,
    RTO_MAX_S,
    SYN_BYTES,
    SYNACK_TIMER_FIRST,
    TIMER_MIN_S,
    CongestionControl,
    Drop,
    LossPrediction,
    Spread,
    Trial,
    congestion_control,
)
from iwscope.model._quic import (
    QUIC_DATAGRAM_BYTES,
    QUIC_STREAM_PAYLOAD_BYTES,
    TLS13_SESSION_TICKETS_BYTES,
    predict_h3_total,
    predict_https_total,
    predict_quic_saving,
    quic_handshake_rounds,
    tls_response_bytes,
)
from iwscope.model._slowstart import (
    CHANGE_CIPHER_SPEC_RECORD_BYTES,
    CLIENT_HELLO_BYTES,
    DEFAULT_MSS,
    ECDSA_P256_SIGNATURE_BYTES,
    HANDSHAKE_HEADER_BYTES,
    HEADER_BYTES,
    HTTP_HEADER_BYTES,
    HTTP_REQUEST_BYTES,
    INITIAL_RTO_S,
    OPENSSL_FIRST_WRITE_BYTES,
    RTO_MIN_S,
    TLS12_CLIENT_FINISHED_FLIGHT_BYTES,
    TLS12_SERVER_FINISHED_FLIGHT_BYTES,
    TLS12_SERVER_HELLO_BYTES,
    TLS12_SERVER_HELLO_DONE_BYTES,
    TLS12_SERVER_KEY_EXCHANGE_BYTES,
    TLS13_ENCRYPTED_EXTENSIONS_BYTES,
    TLS13_RECORD_PROTECTION_BYTES,
    TLS13_SERVER_HELLO_BYTES,
    TLS_MAX_RECORD_PLAINTEXT,
    TLS_RECORD_HEADER_BYTES,
    BurstQueue,
    Prediction,
    explain_gap,
    first_flight_queue,
    predict,
    predict_appconnect,
    rto_after_handshake_s,
    slow_start_rounds,
    tls_first_flight_bytes,
    tls_handshake_rounds,
)

__all__ = [
    "BBR_CWND_MIN",
    "CHANGE_CIPHER_SPEC_RECORD_BYTES",
    "CONGESTION_CONTROLS",
    "CLIENT_HELLO_BYTES",
    "CUBIC_BETA",
    "DEFAULT_MSS",
    "DEFAULT_SAMPLES",
    "DUPTHRESH",
    "ECDSA_P256_SIGNATURE_BYTES",
    "HANDSHAKE_HEADER_BYTES",
    "HEADER_BYTES",
    "HTTP_HEADER_BYTES",
    "HTTP_REQUEST_BYTES",
    "INITIAL_RTO_S",
    "OPENSSL_FIRST_WRITE_BYTES",
    "QUANTILES",
    "QUIC_DATAGRAM_BYTES",
    "QUIC_STREAM_PAYLOAD_BYTES",
    "RTO_MAX_S",
    "RTO_MIN_S",
    "SYNACK_TIMER_FIRST",
    "SYN_BYTES",
    "TIMER_MIN_S",
    "TLS12_CLIENT_FINISHED_FLIGHT_BYTES",
    "TLS12_SERVER_FINISHED_FLIGHT_BYTES",
    "TLS12_SERVER_HELLO_BYTES",
    "TLS12_SERVER_HELLO_DONE_BYTES",
    "TLS12_SERVER_KEY_EXCHANGE_BYTES",
    "TLS13_ENCRYPTED_EXTENSIONS_BYTES",
    "TLS13_RECORD_PROTECTION_BYTES",
    "TLS13_SERVER_HELLO_BYTES",
    "TLS13_SESSION_TICKETS_BYTES",
    "TLS_MAX_RECORD_PLAINTEXT",
    "TLS_RECORD_HEADER_BYTES",
    "BurstQueue",
    "CongestionControl",
    "CsaEstimate",
    "Drop",
    "LossPrediction",
    "Prediction",
    "Spread",
    "Trial",
    "congestion_control",
    "csa_latency",
    "explain_gap",
    "first_flight_queue",
    "predict",
    "predict_appconnect",
    "predict_h3_total",
    "predict_https_total",
    "predict_quic_saving",
    "predict_with_loss",
    "quic_handshake_rounds",
    "rto_after_handshake_s",
    "simulate_connection",
    "slow_start_rounds",
    "tls_first_flight_bytes",
    "tls_handshake_rounds",
    "tls_response_bytes",
]
