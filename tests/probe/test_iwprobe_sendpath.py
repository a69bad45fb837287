"""The origin's send paths (``--send-path``): every path delivers the object whole, and every
observation says the path it took and the device's segmentation offload (wire v8).

Loopback, in process; what the paths hand the device is measured on a veth pair by
tests/lab/test_lab_sendpaths.py.
"""

from __future__ import annotations

import json
import socket
import urllib.request
import uuid

import pytest

from iwprobe import wire
from iwprobe._offload import OffloadCache, device_offload
from iwprobe._origin import Origin, OriginConfig
from iwprobe._sendpath import SEND_PATH_CHOICES, BodyFile, send_mss_writes, send_response

PATTERN = bytes(range(256)) * 400


@pytest.mark.parametrize("send_path", SEND_PATH_CHOICES)
def test_every_send_path_serves_whole_objects_and_says_so(send_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = 18900 + 10 * SEND_PATH_CHOICES.index(send_path)
    config = OriginConfig(
        bind="127.0.0.1", arms=[10], base_port=base, set_marks=False, echo=False, workers=2, send_path=send_path
    )
    origin = Origin(config)
    origin.start()
    trials = {size: str(uuid.uuid4()) for size in (1, 5_000, 100_000)}
    try:
        for size, trial_id in trials.items():
            request = urllib.request.Request(f"http://127.0.0.1:{base + 10}/obj/{size}", headers={wire.TRIAL_HEADER: trial_id})
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.read() == PATTERN[:size], (send_path, size)
        missing = urllib.request.Request(f"http://127.0.0.1:{base + 10}/nothing", headers={wire.TRIAL_HEADER: str(uuid.uuid4())})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(missing, timeout=10)
    finally:
        origin.stop()
    observations = {record["trial_id"]: record for record in map(json.loads, capsys.readouterr().out.splitlines())}
    for trial_id in trials.values():
        seen = observations[trial_id]
        assert seen["send_path"] == send_path and seen["segmentation_offload"] == device_offload("lo") == "tso", seen
    # an error answer is a text, not the object file's content: sendfile cannot carry it
    errors = [record["send_path"] for record in observations.values() if record["http_status"] == 404]
    assert errors == ["writev" if send_path == "sendfile" else send_path]


def test_an_unknown_send_path_is_refused() -> None:
    with pytest.raises(ValueError, match="send path must be one of writev, sendfile, mss-writes"):
        Origin(OriginConfig(bind="127.0.0.1", arms=[10], set_marks=False, send_path="splice"))


def _received(send: object) -> bytes:
    """What the peer of a socket pair reads after ``send(sock)`` and a close."""
    left, right = socket.socketpair()
    with left, right:
        send(left)  # type: ignore[operator]
        left.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := right.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_mss_writes_and_sendfile_carry_the_same_bytes_as_writev() -> None:
    body = memoryview(PATTERN)[:10_000]
    assert _received(lambda sock: send_mss_writes(sock, b"HEAD", body, 1448)) == b"HEAD" + bytes(body)
    assert _received(lambda sock: send_mss_writes(sock, b"HEAD", body, 0)) == b"HEAD" + bytes(body)  # no MSS: one write
    body_file = BodyFile(PATTERN)
    try:
        paths = []
        for path, plain in (("sendfile", True), ("sendfile", False), ("mss-writes", True), ("writev", True)):

            def send(sock: socket.socket, path: str = path, plain: bool = plain) -> None:
                paths.append(send_response(sock, path, b"HEAD", body, mss=1448, body_file=body_file, plain_body=plain))

            assert _received(send) == b"HEAD" + bytes(body), path
        # ciphertext or an error text is not the file's content: sendfile falls back to writev
        assert paths == ["sendfile", "writev", "mss-writes", "writev"]
    finally:
        body_file.close()


def test_the_offload_cache_names_the_device_of_the_local_address() -> None:
    cache = OffloadCache()
    assert cache.of_local("127.0.0.1") == cache.of_local("::ffff:127.0.0.1") == device_offload("lo")
    assert cache.of_local("192.0.2.254") == ""  # no device holds it
    assert cache.of_local("not an address") == ""
    assert device_offload("no-such-device") == ""
