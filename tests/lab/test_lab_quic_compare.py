"""Must-show (issue 39): HTTPS on TCP against HTTP/3 at IW 10, same path, same object, paired.

``iwscope_lab.quic_compare`` on a QUIC lab (``iwscope_lab.quic.quic_lab``: the origin behind a
zero-delay link, the probe behind 100 Mbit/s at 100 and 200 ms): per size, seven pairs, each
point's measured saving (TCP's total minus QUIC's, median of the pairs) within 10 % of the
model's saving plus the stacks' own difference on a zero-delay link of the same run.  About
3.5 minutes: ``make test-slow``; the numbers of three runs are in docs/quic.md.  The report's
rendering of the section is checked here too, on the run's own numbers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from iwscope.model import tls_first_flight_bytes
from iwscope_lab.quic import BASE_PORT, quic_lab
from iwscope_lab.quic_compare import COMPARE_IW, TOLERANCE, compare
from iwscope_lab.quic_report import quic_html, quic_markdown


@pytest.mark.slow
def test_quic_saves_the_handshakes_round_trip_as_the_model_says(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    with quic_lab(tmp_path, arms=(COMPARE_IW,), servers=False) as lab:
        flight = tls_first_flight_bytes(lab.chain.chain_der_bytes, certificates=len(lab.chain.certificates))
        points = compare(lab.topo, lab.address, BASE_PORT + COMPARE_IW, str(lab.ca_file()), COMPARE_IW, flight)
    section = {"title": "t", "metric": "m", "tolerance": TOLERANCE, "points": [p.to_dict() for p in points], "census": []}
    table = quic_markdown(section)
    print("\n".join(table))
    assert "iwscope-quic" in quic_html(section, False)
    assert sum(line.startswith(("| 100 |", "| 200 |")) for line in table) == len(points)  # a row per point
    for point in points:
        assert abs(point.error) <= TOLERANCE, point.to_dict()
