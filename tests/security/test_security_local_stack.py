"""The local stack that `make demo` and `make test` start is safe on a networked machine.

A second network namespace plays another host on the machine's network: a veth to the root
namespace, with a default route through it, so it reaches every address of this machine
the way a neighbour on the LAN would.  From there, PostgreSQL, Redis, the API and the
dashboard must refuse connections on all of them.  From the machine itself they must ask
for passwords and run as their own unprivileged users; and lab hosts still reach the API.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import pwd
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
import redis
from testenv import server_database_url, server_redis_url

from iwscope.localstack import default_stack
from iwscope_lab.service_address import SERVICE_ADDRESS
from iwscope_lab.stack import Stack

REPO = pathlib.Path(__file__).resolve().parents[2]


@dataclass
class Outsider:
    """Another host on the machine's network: a namespace behind a veth with a default route."""

    netns: str
    machine_address: str

    def connect(self, address: str, port: int) -> str:
        """``connected``, ``refused`` or ``timeout``/an errno name, as seen from the outsider."""
        script = (
            "import socket, errno\n"
            f"s = socket.socket(socket.AF_INET6 if ':' in {address!r} else socket.AF_INET); s.settimeout(3)\n"
            f"try:\n    s.connect(({address!r}, {port:d})); print('connected')\n"
            "except ConnectionRefusedError: print('refused')\n"
            "except OSError as e: print(errno.errorcode.get(e.errno, str(e)))\n"
        )
        done = subprocess.run(
            ["ip", "netns", "exec", self.netns, sys.executable, "-c", script], capture_output=True, text=True, timeout=30
        )
        return done.stdout.strip() or done.stderr.strip()


@pytest.fixture(scope="module")
def outsider() -> Iterator[Outsider]:
    tag = secrets.token_hex(3)
    netns, root_dev, peer_dev = f"iwt-out-{tag}", f"iwto{tag}", f"iwtp{tag}"
    octet = 16 + int(tag[:2], 16) % 200
    machine, outside = f"10.62.{octet}.1", f"10.62.{octet}.2"
    commands = [
        ["ip", "netns", "add", netns],
        ["ip", "link", "add", root_dev, "type", "veth", "peer", "name", peer_dev, "netns", netns],
        ["ip", "addr", "add", f"{machine}/30", "dev", root_dev],
        ["ip", "link", "set", root_dev, "up"],
        ["ip", "-n", netns, "addr", "add", f"{outside}/30", "dev", peer_dev],
        ["ip", "-n", netns, "link", "set", peer_dev, "up"],
        ["ip", "-n", netns, "link", "set", "lo", "up"],
        ["ip", "-n", netns, "route", "add", "default", "via", machine],
    ]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True)
        yield Outsider(netns, machine)
    finally:
        subprocess.run(["ip", "link", "del", root_dev], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def machine_addresses(outsider: Outsider) -> list[str]:
    """Every IPv4 address of the root namespace a neighbour could aim at (not loopback)."""
    listing = json.loads(subprocess.run(["ip", "-4", "-j", "addr", "show"], capture_output=True, text=True, check=True).stdout)
    found = {info["local"] for interface in listing for info in interface.get("addr_info", [])}
    usable = [address for address in found if not ipaddress.ip_address(address).is_loopback and address != SERVICE_ADDRESS]
    assert outsider.machine_address in usable
    return sorted(usable)


@pytest.fixture(scope="module")
def demo_stack(database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The collector stack exactly as `make demo` starts it (default listen addresses), on free ports."""
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    run_dir = tmp_path_factory.mktemp("stack")
    (run_dir / "logs").mkdir()
    stack = Stack(
        database_url=database_url,
        redis_url=redis_url,
        api_port=ports[0],
        dashboard_port=ports[1],
        run_dir=run_dir,
        celery_queue=f"iwscope-sec-{secrets.token_hex(3)}",
        extra_env={
            "IWSCOPE_CELERY_QUEUE": f"iwscope-sec-{secrets.token_hex(3)}",
            "IWSCOPE_ENV": "development",
            "IWSCOPE_LOG_LEVEL": "WARNING",
        },
    )
    saved = {key: os.environ.get(key) for key in ("DATABASE_URL", "REDIS_URL")}
    stack.start(beat=False)
    try:
        yield stack
    finally:
        stack.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_nothing_of_the_stack_answers_another_host(outsider: Outsider, demo_stack: Stack) -> None:
    pg_port = urlsplit(server_database_url()).port
    redis_port = urlsplit(server_redis_url()).port
    assert pg_port and redis_port and demo_stack.dashboard_port
    ports = {"postgresql": pg_port, "redis": redis_port, "api": demo_stack.api_port, "dashboard": demo_stack.dashboard_port}
    # The services are up and answer on loopback ...
    for port in ports.values():
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    # ... and the outsider does reach this machine (a port that listens everywhere answers it).
    with socket.create_server(("0.0.0.0", 0)) as everywhere:
        assert outsider.connect(outsider.machine_address, everywhere.getsockname()[1]) == "connected"
    answers = {
        (name, address): outsider.connect(address, port)
        for address in machine_addresses(outsider)
        for name, port in ports.items()
    }
    assert set(answers.values()) == {"refused"}, answers
    # The database and the broker are not even on the lab's service address.
    for name in ("postgresql", "redis"):
        assert outsider.connect(SERVICE_ADDRESS, ports[name]) == "refused"


def test_the_api_listens_on_the_lab_service_address(demo_stack: Stack) -> None:
    """Where lab hosts reach it (tests/lab/test_lab_topology.py and the lab e2e tests connect from
    the namespaces themselves)."""
    answer = httpx.get(f"{demo_stack.api_url_for()}/healthz", timeout=10)
    assert answer.status_code == 200
    assert demo_stack.api_url_for().startswith(f"http://{SERVICE_ADDRESS}:")


def test_services_want_passwords() -> None:
    database = urlsplit(server_database_url())
    assert database.password, "the test database URL carries the generated password"
    without = f"postgresql://{database.username}@127.0.0.1:{database.port}{database.path}"
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without, connect_timeout=5).close()
    wrong = f"postgresql://{database.username}:not-the-password@127.0.0.1:{database.port}{database.path}"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=5).close()
    for user in ("postgres", "root"):  # the superuser has no password: peer authentication on its socket only
        as_superuser = f"postgresql://{user}:{database.password}@127.0.0.1:{database.port}/postgres"
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(as_superuser, connect_timeout=5).close()
    with psycopg.connect(server_database_url().replace("postgresql+psycopg://", "postgresql://")) as connection:
        superuser, create_db = connection.execute(
            "SELECT rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user"
        ).fetchone()  # type: ignore[misc]
        assert (superuser, create_db) == (False, True)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("COPY (SELECT 1) TO PROGRAM 'true'")

    broker = urlsplit(server_redis_url())
    anonymous = redis.Redis(host="127.0.0.1", port=broker.port, socket_timeout=5)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    authenticated = redis.Redis.from_url(server_redis_url(), socket_timeout=5)
    try:
        assert authenticated.ping() is True
        assert authenticated.config_get("protected-mode")["protected-mode"] == "yes"
        with pytest.raises(redis.exceptions.ResponseError):  # protected configs: no `CONFIG SET dir`
            authenticated.config_set("dir", "/root")
    finally:
        authenticated.close()


def _owner_of_listener(port: int) -> str:
    """User name of the process listening on 127.0.0.1:``port`` (via /proc, as root)."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inode = fields[9]
    assert inode is not None, f"nothing listens on {port}"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    raise AssertionError(f"no process owns the listener on {port}")


def test_services_do_not_run_as_root() -> None:
    assert _owner_of_listener(urlsplit(server_database_url()).port or 0) == "postgres"
    assert _owner_of_listener(urlsplit(server_redis_url()).port or 0) == "redis"


def test_secrets_and_data_where_their_users_can_reach_them() -> None:
    stack = default_stack()
    assert stack.secrets_path.stat().st_mode & 0o777 == 0o600
    # The data directories live outside the checkout (which may sit in a 0700 home).
    assert not stack.data_dir.is_relative_to(REPO)
    pg_data = stack.postgres().data_dir
    assert pwd.getpwuid(pg_data.stat().st_uid).pw_name == "postgres"
    assert pg_data.stat().st_mode & 0o777 == 0o700
    hba = (pg_data / "pg_hba.conf").read_text()
    assert "trust" not in hba and "0.0.0.0" not in hba
