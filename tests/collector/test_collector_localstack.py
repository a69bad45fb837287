"""The local stack's services and their ports: a second stack of the same checkout (other
``IWSCOPE_LOCAL_*_PORT``) shares the data directory, so a service running from it on another
port must not be reported as running on this one (it once was: the URL handed out pointed at a
port nothing listened on, and every test of that run failed to reach Redis)."""

from __future__ import annotations

import pathlib
import secrets
import shutil

import pytest
from testkit import free_port

from iwscope.localstack import RedisServer, ServiceError, _listening


def test_a_service_running_on_another_port_is_an_error_not_running() -> None:
    directory = pathlib.Path(f"/tmp/iwt-ports-{secrets.token_hex(3)}")
    password = secrets.token_urlsafe(18)
    first = RedisServer(directory, free_port(), password, daemon=False)
    first.start()
    try:
        second = RedisServer(directory, free_port(), password, daemon=False)
        assert second.running()  # the pid file is the directory's, whichever port started it
        with pytest.raises(ServiceError, match=rf"runs, but not on port {second.port}: .*IWSCOPE_LOCAL_REDIS_PORT"):
            second.start()
        assert first.running() and _listening(first.port)  # the running one is left alone
        first.start()  # the same port again: already running, nothing to do
        assert _listening(first.port)
    finally:
        first.stop()
        shutil.rmtree(directory, ignore_errors=True)
