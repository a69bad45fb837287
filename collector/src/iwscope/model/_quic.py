"""One HTTPS fetch over TCP + TLS 1.3 against the same fetch over HTTP/3, at the same IW.

Both from a new connection, both timed by the client from its first packet to the response's
last byte, both on a loss-free path of round trip ``rtt_s`` and bottleneck ``rate_bps``:

* :func:`predict_https_total`: the TCP handshake, the TLS handshake (:func:`predict_appconnect`,
  the server's first flight in slow start), the client's Finished with the request, and the
  response in slow start (:func:`predict`) from the same IW: Linux grows no window the TLS
  flight did not fill.  The response's bytes are TLS records (22 bytes per 16 KB) after the
  server's session tickets (OpenSSL 3 sends two, 510 bytes, once it has the client's Finished),
  which leave in a segment of their own: 100 KB is 70 full segments and the tickets' one, a
  fourth round at IW 10 (measured: 6.1 round trips at 50, 100 and 200 ms).
* :func:`predict_h3_total`: one round trip for QUIC's handshake (the client's Initial, padded to
  1,200 bytes; the server's Initial and Handshake packets, at most three times the client's
  bytes until the client's address is validated: RFC 9000 8.1), more for a certificate chain
  beyond that first round (:func:`quic_handshake_rounds`: slow start from the IW once the
  client's first Handshake packet validated its address), then the request and the response in slow start
  from the same IW, counted in QUIC packets: 1,165 stream bytes in a 1,200-byte datagram
  (aioquic: an 11-byte short header, a 16-byte AEAD tag, an 8-byte STREAM frame header).

Their difference is QUIC's handshake saving, one round trip, minus what QUIC's smaller packets
cost: a response that fits TCP's rounds can need one more in QUIC (100 KB at IW 10: 70 TCP
segments fit three rounds, 87 QUIC packets need four).  Processing time is outside the model:
aioquic, in Python, takes milliseconds per handshake and tens of microseconds per datagram.
"""

from __future__ import annotations

import math

from iwscope.model._slowstart import (
    DEFAULT_MSS,
    HEADER_BYTES,
    HTTP_HEADER_BYTES,
    HTTP_REQUEST_BYTES,
    TLS13_RECORD_PROTECTION_BYTES,
    TLS_MAX_RECORD_PLAINTEXT,
    TLS_RECORD_HEADER_BYTES,
    _serialise_s,
    predict,
    predict_appconnect,
)

#: A QUIC datagram's UDP payload (aioquic's, RFC 9000's smallest maximum).
QUIC_DATAGRAM_BYTES = 1200
#: Stream bytes in a full 1-RTT datagram of aioquic: 1,200 - 11 (short header: flags, 8-byte
#: connection id, 2-byte packet number) - 16 (AEAD tag) - 8 (STREAM frame: type, id, offset, length).
QUIC_STREAM_PAYLOAD_BYTES = 1165
#: IPv4 + UDP headers of a datagram.
UDP_HEADER_BYTES = 28
#: HTTP/3 response framing: HEADERS (status, content-length, content-type in QPACK) and the DATA
#: frame's header.
H3_RESPONSE_OVERHEAD_BYTES = 45
#: The client's second flight: its Handshake Finished (and ACKs) and the 1-RTT request with
#: HTTP/3's control streams (aioquic: 357 + 108 bytes, measured).
H3_CLIENT_SECOND_FLIGHT_BYTES = 465
#: RFC 9000 8.1: before it has validated the client's address a server sends at most three
#: times the bytes it received.
AMPLIFICATION_FACTOR = 3
#: OpenSSL 3's two TLS 1.3 session tickets after the client's Finished (measured: 2 x 255 bytes).
TLS13_SESSION_TICKETS_BYTES = 510
#: The client's TLS 1.3 Finished (with the ChangeCipherSpec compatibility record): 80 bytes.
TLS13_CLIENT_FINISHED_BYTES = 80


def tls_response_bytes(plaintext_bytes: int) -> int:
    """TCP payload of a response of ``plaintext_bytes`` over TLS 1.3: the session tickets, then
    the plaintext in records of up to 16 KB (header 5, tag 16, content type 1 each)."""
    records = max(1, math.ceil(plaintext_bytes / TLS_MAX_RECORD_PLAINTEXT))
    return TLS13_SESSION_TICKETS_BYTES + plaintext_bytes + records * (TLS_RECORD_HEADER_BYTES + TLS13_RECORD_PROTECTION_BYTES)


def predict_https_total(
    size: int, iw: int, rtt_s: float, rate_bps: float | None, tls_flight_bytes: int, *, up_rate_bps: float | None = None
) -> float:
    """Seconds from the SYN to the last byte of ``size`` body bytes over HTTPS (TLS 1.3)."""
    up_rate = rate_bps if up_rate_bps is None else up_rate_bps
    one_way = rtt_s / 2.0
    appconnect = predict_appconnect(rtt_s, rate_bps, tls_flight_bytes, iw, up_rate_bps=up_rate_bps)
    request = _serialise_s(TLS13_CLIENT_FINISHED_BYTES + HTTP_REQUEST_BYTES + HEADER_BYTES, up_rate) + one_way
    records = tls_response_bytes(HTTP_HEADER_BYTES + size) - TLS13_SESSION_TICKETS_BYTES
    segments = 1 + math.ceil(records / DEFAULT_MSS)  # the tickets, then the records in full segments
    response_bytes = max(TLS13_SESSION_TICKETS_BYTES + records, (segments - 1) * DEFAULT_MSS + 1)
    response = predict(response_bytes, iw, rtt_s, rate_bps, up_rate_bps=up_rate_bps, header_bytes=0)
    ack_delay = _serialise_s(HEADER_BYTES, up_rate) + one_way
    return appconnect + request + response.server_latency_s - ack_delay


def quic_handshake_rounds(server_flight_bytes: int, iw: int) -> int:
    """Round trips of the server's handshake flight (its Initial and Handshake packets): the first
    round is at most three times the client's Initial (RFC 9000 8.1: 3,600 bytes) and at most the
    window; the client's answer to it carries its first Handshake packet, which validates its
    address, so from the second round on only the window holds the flight back, and it grows by
    every byte acknowledged (slow start: each round's ACKs arrive while the next round fills it).

    Measured with aioquic in the lab (80 ms, 5 Mbit/s, a 17.2 KB flight, docs/quic.md): IW 3 sent
    3, 6 and 6 datagrams in three rounds, IW 10 3 and 12 in two -- not the one round per 3,600
    bytes a client that only answered with padded Initials would allow."""
    window = iw * QUIC_DATAGRAM_BYTES
    sent = min(AMPLIFICATION_FACTOR * QUIC_DATAGRAM_BYTES, window)
    rounds, last = 1, sent
    while sent < server_flight_bytes:
        window += last
        last = min(window, server_flight_bytes - sent)
        sent += last
        rounds += 1
    return rounds


def predict_h3_total(
    size: int, iw: int, rtt_s: float, rate_bps: float | None, server_flight_bytes: int, *, up_rate_bps: float | None = None
) -> float:
    """Seconds from the client's first Initial to the last byte of ``size`` body bytes over
    HTTP/3, the server's window starting at ``iw`` packets of :data:`QUIC_DATAGRAM_BYTES`."""
    up_rate = rate_bps if up_rate_bps is None else up_rate_bps
    one_way = rtt_s / 2.0
    datagram = QUIC_DATAGRAM_BYTES + UDP_HEADER_BYTES
    handshake = (
        quic_handshake_rounds(server_flight_bytes, iw) * rtt_s
        + _serialise_s(datagram, up_rate)
        + math.ceil(server_flight_bytes / QUIC_DATAGRAM_BYTES) * _serialise_s(datagram, rate_bps)
    )
    request = _serialise_s(H3_CLIENT_SECOND_FLIGHT_BYTES + UDP_HEADER_BYTES, up_rate) + one_way
    response = predict(
        H3_RESPONSE_OVERHEAD_BYTES + size,
        iw,
        rtt_s,
        rate_bps,
        up_rate_bps=up_rate_bps,
        mss=QUIC_STREAM_PAYLOAD_BYTES,
        header_bytes=0,
    )
    ack_delay = _serialise_s(UDP_HEADER_BYTES + 40, up_rate) + one_way
    return handshake + request + response.server_latency_s - ack_delay


def predict_quic_saving(
    size: int,
    iw: int,
    rtt_s: float,
    rate_bps: float | None,
    tls_flight_bytes: int,
    quic_server_flight_bytes: int,
    *,
    up_rate_bps: float | None = None,
) -> float:
    """Seconds HTTP/3 saves over HTTPS on TCP for the same fetch at the same IW (negative: it
    loses)."""
    https = predict_https_total(size, iw, rtt_s, rate_bps, tls_flight_bytes, up_rate_bps=up_rate_bps)
    return https - predict_h3_total(size, iw, rtt_s, rate_bps, quic_server_flight_bytes, up_rate_bps=up_rate_bps)
