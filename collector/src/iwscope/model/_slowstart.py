"""What TCP slow start predicts for one short transfer: the yardstick next to every measurement.

Two views of the same transfer over a path with round-trip propagation delay ``rtt_s``, a
bottleneck of ``rate_bps`` (towards the client) and no loss:

* :func:`slow_start_rounds` -- the textbook count: how many round trips a response of
  ``size`` bytes needs when the window starts at ``iw`` segments and doubles every round.
* :func:`predict` -- a small packet-level simulation of the same thing that also serialises
  every packet at the bottleneck (in both directions, so a 56 kbit/s uplink delays ACKs) and
  grows the window per acknowledged segment as Linux does in slow start (the receiver acks
  every segment at the start of a connection: quick-ack mode). It gives the server-side
  response latency (request read to last byte acknowledged, the IW10 paper's metric) and
  the client-side total time (connect + request + response), which is what the probe sees.

The lab's link emulator serialises a packet at the configured rate and then delays it by
the one-way propagation delay; the model does the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: TCP payload per segment with timestamps on a 1500-byte MTU (1500 - 20 IP - 32 TCP).
DEFAULT_MSS = 1448
#: IP + TCP header bytes per packet (with the timestamp option).
HEADER_BYTES = 52
#: Bytes of the HTTP response header the origin sends before the body (approximately).
HTTP_HEADER_BYTES = 150
#: Bytes of the HTTP request the probe sends.
HTTP_REQUEST_BYTES = 160
#: Linux's initial SYN retransmission timeout (RFC 6298 says 1 s).
INITIAL_RTO_S = 1.0
#: Linux's lower bound of the RTO variance term (``TCP_RTO_MIN``, 200 ms).
RTO_MIN_S = 0.2


def rto_after_handshake_s(handshake_rtt_s: float) -> float:
    """The data RTO Linux derives from the one RTT sample of the handshake:
    ``srtt + max(2 * srtt, TCP_RTO_MIN)`` (``tcp_rtt_estimator`` on its first sample sets
    ``mdev = 2 * m`` and ``rttvar = max(mdev, rto_min)``; ``tcp_set_rto``: ``srtt + rttvar``)."""
    return handshake_rtt_s + max(2.0 * handshake_rtt_s, RTO_MIN_S)


def slow_start_rounds(size: int, iw: int, mss: int = DEFAULT_MSS) -> int:
    """Round trips slow start needs to send ``size`` bytes: the least k with iw*(2^k - 1) >= segments."""
    if size <= 0:
        return 0
    segments = math.ceil(size / mss)
    return max(1, math.ceil(math.log2(segments / iw + 1)))


@dataclass(frozen=True)
class Prediction:
    """The model's view of one transfer."""

    #: Segments of the response (header + body).
    segments: int
    #: Round trips from :func:`slow_start_rounds`.
    rounds: int
    #: Request read to last response byte acknowledged, seconds (server side).
    server_latency_s: float
    #: SYN sent to connection established, seconds.
    connect_s: float
    #: Trial start to last response byte received, seconds (client side).
    client_total_s: float
    #: True when the RTT reaches the initial SYN RTO, so the SYN is retransmitted and the
    #: measurement departs from this model (the lab does not hide it).
    syn_rto_expected: bool
    #: True when the bottleneck, not the window, dominates (the burst of the initial window
    #: takes longer to serialise than one RTT).
    bandwidth_bound: bool
    #: When the first data ACK reaches the server (s after the request is read), and the RTO
    #: then running (:func:`rto_after_handshake_s` of the handshake RTT).
    first_ack_s: float
    rto_s: float

    @property
    def spurious_rto_expected(self) -> bool:
        """The first ACK cannot come back before the RTO fires: on slow links one full
        segment's serialisation plus the RTT outlasts an RTO computed from the tiny handshake
        packets (at 70 ms, below about 60 kbit/s). Loss-free paths then retransmit."""
        return self.first_ack_s > self.rto_s


def _serialise_s(nbytes: int, rate_bps: float | None) -> float:
    return 0.0 if not rate_bps else nbytes * 8.0 / rate_bps


def predict(
    size: int,
    iw: int,
    rtt_s: float,
    rate_bps: float | None,
    *,
    up_rate_bps: float | None = None,
    mss: int = DEFAULT_MSS,
    header_bytes: int = HTTP_HEADER_BYTES,
) -> Prediction:
    """Predict server- and client-side latency of fetching ``size`` body bytes at IW ``iw``.

    ``rate_bps`` is the bottleneck towards the client (``None``: unlimited); ``up_rate_bps``
    the one towards the server (default: the same).  Propagation delay is split evenly.
    """
    if iw < 1:
        raise ValueError("iw must be at least 1")
    up_rate = rate_bps if up_rate_bps is None else up_rate_bps
    one_way = rtt_s / 2.0
    total_bytes = size + header_bytes
    segments = max(1, math.ceil(total_bytes / mss))
    sizes = [min(mss, total_bytes - i * mss) for i in range(segments)]
    ack_delay = _serialise_s(HEADER_BYTES, up_rate) + one_way

    # Packet-level slow start.  Time 0 = the server has read the request.
    cwnd = float(iw)
    next_seg = 0
    in_flight: list[int] = []  # segments sent, not yet acked, in order
    link_free_at = 0.0  # bottleneck (server -> client) busy until
    ack_times: list[tuple[float, int]] = []  # (arrival at server, segment index)
    last_ack_at = 0.0
    now = 0.0
    acked = 0
    while acked < segments:
        while next_seg < segments and len(in_flight) < int(cwnd):
            start = max(now, link_free_at)
            link_free_at = start + _serialise_s(sizes[next_seg] + HEADER_BYTES, rate_bps)
            arrive_client = link_free_at + one_way
            ack_times.append((arrive_client + ack_delay, next_seg))
            in_flight.append(next_seg)
            next_seg += 1
        ack_times.sort()
        now, seg = ack_times.pop(0)
        in_flight.remove(seg)
        acked += 1
        cwnd += 1.0  # slow start: one segment per acknowledged segment
        last_ack_at = now
    server_latency = last_ack_at

    syn_bytes = 60 + 14  # SYN with options, plus a little for the SYN-ACK difference
    connect = _serialise_s(syn_bytes, up_rate) + _serialise_s(syn_bytes, rate_bps) + rtt_s
    request = _serialise_s(HTTP_REQUEST_BYTES + HEADER_BYTES, up_rate) + one_way
    # The client has the last byte one ACK trip before the server hears of it.
    client_total = connect + request + server_latency - ack_delay
    burst_s = _serialise_s(min(iw, segments) * (mss + HEADER_BYTES), rate_bps)
    first_ack = _serialise_s(sizes[0] + HEADER_BYTES, rate_bps) + one_way + ack_delay
    return Prediction(
        segments=segments,
        rounds=slow_start_rounds(total_bytes, iw, mss),
        server_latency_s=server_latency,
        connect_s=connect,
        client_total_s=client_total,
        syn_rto_expected=rtt_s >= INITIAL_RTO_S,
        bandwidth_bound=burst_s > rtt_s,
        first_ack_s=first_ack,
        rto_s=rto_after_handshake_s(connect),
    )


def explain_gap(measured_s: float, predicted: Prediction) -> str | None:
    """A known reason why a measurement can differ from the model, or ``None``."""
    if predicted.syn_rto_expected:
        return "RTT >= 1 s initial SYN RTO: the SYN is retransmitted and the server's window restarts"
    if predicted.spurious_rto_expected:
        return (
            f"spurious RTO: the first ACK needs one full segment at the bottleneck plus the RTT "
            f"({1000 * predicted.first_ack_s:.0f} ms), longer than the RTO derived from the handshake RTT "
            f"({1000 * predicted.rto_s:.0f} ms); the retransmission and window collapse are outside the model"
        )
    if predicted.bandwidth_bound and measured_s > predicted.server_latency_s:
        return "bandwidth-bound: queueing of the initial burst at the bottleneck"
    if measured_s < predicted.server_latency_s * 0.9:
        return "faster than slow start predicts: delayed-ACK or window growth differs from the model"
    return None


@dataclass(frozen=True)
class BurstQueue:
    """What one first flight does to a drop-tail bottleneck queue (see :func:`first_flight_queue`)."""

    #: Packets of the flight the bottleneck dropped.
    dropped: int
    #: Most packets waiting or in serialisation at once.
    peak_packets: int
    #: Queueing delay (ms) a packet of another flow meets when it arrives at the peak.
    peak_delay_ms: float


def first_flight_queue(
    iw: int,
    bottleneck_bps: float,
    buffer_packets: int | None,
    *,
    paced_rtt_s: float = 0.0,
    access_bps: float = 1e9,
    packet_bytes: int = DEFAULT_MSS + HEADER_BYTES,
) -> BurstQueue:
    """The queue ``iw`` full-size packets build at a bottleneck of ``bottleneck_bps`` with a
    drop-tail buffer of ``buffer_packets`` (the one in serialisation included, as the lab's
    emulator counts; None = unlimited), arriving back to back at ``access_bps`` (a burst) or
    one every ``paced_rtt_s / iw`` (initial spreading).  Acknowledgements come a round trip
    later, so nothing else of the flow joins the queue meanwhile."""
    service = packet_bytes * 8 / bottleneck_bps
    gap = paced_rtt_s / iw if paced_rtt_s > 0 else packet_bytes * 8 / access_bps
    departures: list[float] = []  # serialisation end of every accepted packet
    dropped = peak = 0
    for index in range(iw):
        arrival = index * gap
        waiting = sum(1 for end in departures if end > arrival)
        if buffer_packets is not None and waiting + 1 > buffer_packets:
            dropped += 1
            continue
        start = max(arrival, departures[-1]) if departures else arrival
        departures.append(start + service)
        peak = max(peak, waiting + 1)
    return BurstQueue(dropped=dropped, peak_packets=peak, peak_delay_ms=peak * service * 1e3)


# --- TLS first flights (HTTPS handshakes against the IW) --------------------------------------
#
# A TLS server's first flight (TLS 1.3: ServerHello, EncryptedExtensions, Certificate,
# CertificateVerify, Finished; TLS 1.2: ServerHello, Certificate, ServerKeyExchange,
# ServerHelloDone) is a short transfer of its own: the server writes it at once when the
# ClientHello arrives, so it leaves under the initial window like a response.

#: TLS record header: content type, legacy version, length.
TLS_RECORD_HEADER_BYTES = 5
#: What protection adds to a TLS 1.3 record: the AEAD tag (AES-GCM and ChaCha20-Poly1305:
#: 16 bytes) and the inner content type byte.
TLS13_RECORD_PROTECTION_BYTES = 16 + 1
#: Largest plaintext of one record (2^14); a larger handshake message spans several records.
TLS_MAX_RECORD_PLAINTEXT = 16384
#: Handshake message header: type and 24-bit length.
HANDSHAKE_HEADER_BYTES = 4
#: TLS 1.3 ServerHello with an X25519 key share: header 4, version 2, random 32, echoed
#: 32-byte legacy session id 1 + 32, cipher suite 2, compression 1, extensions length 2,
#: supported_versions 6, key_share 4 + 2 + 2 + 32.
TLS13_SERVER_HELLO_BYTES = 122
#: TLS 1.3 EncryptedExtensions: header 4, extensions length 2, an empty server_name
#: acknowledgement 4 (sent by servers that use SNI, such as nginx; Python's ssl without an
#: SNI callback sends 6 bytes in all; ALPN "h2" adds 9; a supported_groups list 12-20).
TLS13_ENCRYPTED_EXTENSIONS_BYTES = 10
#: The dummy ChangeCipherSpec record of TLS 1.3's middlebox compatibility mode: servers send
#: it when the client sent a legacy session id, as browsers, curl and OpenSSL clients do.
CHANGE_CIPHER_SPEC_RECORD_BYTES = 6
#: TLS 1.2 ServerHello: header 4, version 2, random 32, an empty session id 1 (OpenSSL sends
#: none when it issues a session ticket; a server with a session cache adds 32), cipher suite
#: 2, compression 1, extensions length 2, renegotiation_info 5, ec_point_formats 8,
#: session_ticket 4, extended_master_secret 4 (measured: 65 bytes from OpenSSL 3.0).
TLS12_SERVER_HELLO_BYTES = 65
#: TLS 1.2 ServerKeyExchange for ECDHE with X25519 without its signature: header 4, curve
#: type 1, named curve 2, point length 1 + 32, signature algorithm 2, signature length 2.
TLS12_SERVER_KEY_EXCHANGE_BYTES = 44
#: TLS 1.2 ServerHelloDone: an empty handshake message.
TLS12_SERVER_HELLO_DONE_BYTES = 4
#: An ECDSA P-256 signature in DER: 70-72 bytes; the longest form is taken.
ECDSA_P256_SIGNATURE_BYTES = 72
#: A ClientHello on the wire as OpenSSL 3 (curl, Python) sends it: padded to 512 bytes of
#: handshake message (the padding extension) plus the record header.
CLIENT_HELLO_BYTES = 517
#: TLS 1.2 client's second flight: ClientKeyExchange (X25519) 42, ChangeCipherSpec 6,
#: Finished in an AES-GCM record 45.
TLS12_CLIENT_FINISHED_FLIGHT_BYTES = 93
#: OpenSSL sends a handshake flight through a 4 KB write buffer (``BIO_f_buffer``'s default),
#: and the kernel sends the first write at once: its 4,096 bytes leave as 2 full segments and
#: a 1,200-byte one, later writes coalesce into full segments (measured in the lab with
#: TCP_NODELAY). So at IW3 a flight of 4,097-4,344 bytes, which "fits" 3 segments, needs a
#: second round: a 4,276-byte flight over 200 ms took 605 ms to appconnect instead of 400.
OPENSSL_FIRST_WRITE_BYTES = 4096
#: TLS 1.2 server's second flight: NewSessionTicket (about 200), ChangeCipherSpec 6, Finished 45.
TLS12_SERVER_FINISHED_FLIGHT_BYTES = 250


def _signature_bytes(key_type: str, rsa_bits: int) -> int:
    if key_type == "ec":
        return ECDSA_P256_SIGNATURE_BYTES
    if key_type == "rsa":
        return rsa_bits // 8
    raise ValueError(f"key_type must be 'ec' or 'rsa', not {key_type!r}")


def _records_bytes(message_bytes: int, per_record_overhead: int) -> int:
    """One handshake message in its own records (OpenSSL writes one record per message and
    splits messages above 16 KB; BoringSSL, Go and rustls pack several messages into one
    record, which saves one overhead per message)."""
    records = max(1, math.ceil(message_bytes / TLS_MAX_RECORD_PLAINTEXT))
    return message_bytes + records * per_record_overhead


def tls_first_flight_bytes(
    chain_der_bytes: int,
    key_type: str = "ec",
    tls_version: str = "1.3",
    *,
    certificates: int = 2,
    rsa_bits: int = 2048,
    finished_hash_bytes: int = 32,
) -> int:
    """TCP payload bytes of a TLS server's first flight with a chain of ``chain_der_bytes``
    (leaf + intermediates, DER) of ``certificates`` certificates, estimated message by message.

    ``key_type`` is the leaf's key ('ec': P-256; 'rsa': ``rsa_bits``), which signs
    CertificateVerify (TLS 1.3) or ServerKeyExchange (TLS 1.2): an RSA leaf adds 256-512
    bytes of signature where ECDSA takes 72. ``finished_hash_bytes`` is the cipher suite's
    hash (32 for SHA-256; 48 for TLS_AES_256_GCM_SHA384, OpenSSL's first choice when both
    ends are OpenSSL). Assumed: an X25519 key share, no ALPN, no OCSP staple or SCTs (they
    would be more bytes of the Certificate message), no certificate compression (RFC 8879),
    every handshake message in records of its own (OpenSSL's layout), AEAD records
    (5-byte header + 16-byte tag + content type) in TLS 1.3 and plaintext records in the
    TLS 1.2 first flight.
    """
    if chain_der_bytes <= 0 or certificates < 1:
        raise ValueError("a chain has at least one certificate of some bytes")
    signature = _signature_bytes(key_type, rsa_bits)
    if tls_version == "1.3":
        protected = TLS_RECORD_HEADER_BYTES + TLS13_RECORD_PROTECTION_BYTES
        # Certificate: request context 1, list length 3, per certificate length 3 + extensions 2.
        certificate = HANDSHAKE_HEADER_BYTES + 1 + 3 + chain_der_bytes + certificates * (3 + 2)
        certificate_verify = HANDSHAKE_HEADER_BYTES + 2 + 2 + signature
        finished = HANDSHAKE_HEADER_BYTES + finished_hash_bytes
        return (
            TLS_RECORD_HEADER_BYTES
            + TLS13_SERVER_HELLO_BYTES
            + CHANGE_CIPHER_SPEC_RECORD_BYTES
            + sum(
                _records_bytes(message, protected)
                for message in (TLS13_ENCRYPTED_EXTENSIONS_BYTES, certificate, certificate_verify, finished)
            )
        )
    if tls_version == "1.2":
        # Certificate: list length 3, per certificate length 3.
        certificate = HANDSHAKE_HEADER_BYTES + 3 + chain_der_bytes + certificates * 3
        server_key_exchange = TLS12_SERVER_KEY_EXCHANGE_BYTES + signature
        return sum(
            _records_bytes(message, TLS_RECORD_HEADER_BYTES)
            for message in (TLS12_SERVER_HELLO_BYTES, certificate, server_key_exchange, TLS12_SERVER_HELLO_DONE_BYTES)
        )
    raise ValueError(f"tls_version must be '1.2' or '1.3', not {tls_version!r}")


def _flight_segments(first_flight_bytes: int, mss: int, first_write_bytes: int | None) -> int:
    """Segments of the flight: full ones, except that a first write of ``first_write_bytes``
    leaves on its own (its last segment partial) when the stack writes the flight in pieces."""
    if first_write_bytes is None or first_flight_bytes <= first_write_bytes:
        return math.ceil(first_flight_bytes / mss)
    return math.ceil(first_write_bytes / mss) + math.ceil((first_flight_bytes - first_write_bytes) / mss)


def tls_handshake_rounds(
    first_flight_bytes: int, iw: int, mss: int = DEFAULT_MSS, *, first_write_bytes: int | None = None
) -> int:
    """Server round trips the first flight needs in slow start: 1 when it fits in the IW
    (``iw * mss`` bytes), 2 when it fits in ``3 * iw`` segments, and so on
    (:func:`slow_start_rounds`). Each round beyond the first costs the handshake one RTT.

    ``first_write_bytes``: the flight's first piece leaves as segments of its own, the rest
    in full segments (:data:`OPENSSL_FIRST_WRITE_BYTES` for OpenSSL servers; None: every
    segment full, the ideal stack)."""
    if first_flight_bytes <= 0:
        raise ValueError("a first flight has at least one byte")
    if iw < 1:
        raise ValueError("iw must be at least 1")
    segments = _flight_segments(first_flight_bytes, mss, first_write_bytes)
    return slow_start_rounds(segments * mss, iw, mss)


def predict_appconnect(
    rtt_s: float,
    rate_bps: float | None,
    first_flight_bytes: int,
    iw: int,
    mss: int = DEFAULT_MSS,
    *,
    up_rate_bps: float | None = None,
    tls_version: str = "1.3",
    client_hello_bytes: int = CLIENT_HELLO_BYTES,
    first_write_bytes: int | None = None,
) -> float:
    """curl's ``time_appconnect``: seconds from the start to the TLS handshake's end, TCP
    connect included, for a first flight of ``first_flight_bytes`` (see
    :func:`tls_first_flight_bytes`) sent from an initial window of ``iw`` segments.

    The sequence: the TCP handshake (one RTT, as in :func:`predict`); the ClientHello
    (``client_hello_bytes``) serialised upstream and half an RTT; the server writes its whole
    first flight as soon as the ClientHello arrives (zero processing time, so no RSA-4096
    signing time) and slow start delivers it exactly like a response of that many bytes:
    :func:`predict`'s packet-level simulation with ACK-clocked window growth and
    serialisation at the bottleneck. In TLS 1.3 curl reports appconnect when the client has
    processed the server's Finished, the last byte of that flight: the client's Finished
    goes out afterwards and nothing waits for it, so a flight within the IW makes
    appconnect two RTTs (plus serialisation) and every further slow-start round adds one.
    TLS 1.2 adds one more round trip: the client's ClientKeyExchange/Finished and the
    server's ChangeCipherSpec/Finished. Loss, the 1 s SYN RTO at very long RTTs (see
    :attr:`Prediction.syn_rto_expected`) and session resumption are outside the model.

    Slow start here is Reno's and CUBIC's. BBR's startup paces the rounds after the first (the
    lab's default congestion control on this machine is BBR: a 16 KB flight at IW3 over 200 ms
    took 829 ms with BBR, 805 ms with CUBIC; the model says 801). ``first_write_bytes``: see
    :data:`OPENSSL_FIRST_WRITE_BYTES` (the partial segment is counted as a full one at the
    bottleneck: at most one MSS of serialisation too much).
    """
    if first_flight_bytes <= 0:
        raise ValueError("a first flight has at least one byte")
    if tls_version not in ("1.2", "1.3"):
        raise ValueError(f"tls_version must be '1.2' or '1.3', not {tls_version!r}")
    # The same number of segments as the stack sends (a partial first write rounded up).
    segments = _flight_segments(first_flight_bytes, mss, first_write_bytes)
    flight_bytes = max(first_flight_bytes, (segments - 1) * mss + 1)
    flight = predict(flight_bytes, iw, rtt_s, rate_bps, up_rate_bps=up_rate_bps, mss=mss, header_bytes=0)
    up_rate = rate_bps if up_rate_bps is None else up_rate_bps
    one_way = rtt_s / 2.0
    ack_delay = _serialise_s(HEADER_BYTES, up_rate) + one_way
    client_hello = _serialise_s(client_hello_bytes + HEADER_BYTES, up_rate) + one_way
    # predict's clock starts when the server has read the request (here: the ClientHello) and
    # ends when the last ACK is back; the client had the last byte one ACK trip earlier.
    flight_received = flight.server_latency_s - ack_delay
    appconnect = flight.connect_s + client_hello + flight_received
    if tls_version == "1.2":
        appconnect += (
            _serialise_s(TLS12_CLIENT_FINISHED_FLIGHT_BYTES + HEADER_BYTES, up_rate)
            + rtt_s
            + _serialise_s(TLS12_SERVER_FINISHED_FLIGHT_BYTES + HEADER_BYTES, rate_bps)
        )
    return appconnect
