"""Debian's nginx in a lab namespace (iwscope_lab.webserver): HTTP/1.1, HTTP/2 over TLS and
HTTP/1.1 over TLS on the lab address only, workers without root, keep-alive as configured, the
site's web-search sizes, and nothing left after stop."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from iwprobe import sizes as size_models
from iwscope_lab.topology import Host, LinkSpec, Topology
from iwscope_lab.webserver import DEFAULT_PAGE_TYPES, NginxOptions, WebServer, build_site, start_nginx

pytestmark = pytest.mark.skipif(not Path("/usr/sbin/nginx").exists(), reason="Debian's nginx is not installed")

FORMAT = "%{http_code} %{http_version} %{size_download} %{num_connects} %{local_ip} %{ssl_verify_result}\\n"


def _nginx_processes() -> dict[int, tuple[int, str]]:
    """Every nginx process on the machine: pid -> (real uid, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if command.startswith("nginx:"):
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            found[int(entry.name)] = (uid, command)
    return found


def _curl(topo: Topology, server: WebServer, source: str, protocol: str, paths: list[str], *extra: str) -> list[list[str]]:
    flag = "--http2" if protocol == "h2" else "--http1.1"
    command = [
        "curl",
        "-q",
        "-sS",
        "--noproxy",
        "*",
        "--interface",
        f"host!{source}",
        flag,
        "--cacert",
        str(server.ca_file),
        "-w",
        FORMAT,
        *extra,
    ]
    for path in paths:
        command += ["-o", "/dev/null", server.url(protocol, path)]
    result = topo.run("client", command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [line.split() for line in result.stdout.splitlines()]


def test_site_has_web_search_sizes_and_pages_list_their_objects(tmp_path: Path) -> None:
    site = build_site(tmp_path / "www", seed=7)
    objects = sorted(site.objects.values())
    assert len(objects) == 96 and objects[0] >= 1000 and objects[-1] <= 30000
    # Stratified quantiles of the websearch model: its median and 90th percentile.
    assert abs(statistics.median(objects) - size_models.quantile("websearch", 0.5)) <= 200
    assert abs(objects[int(0.9 * len(objects))] - size_models.quantile("websearch", 0.9)) <= 600
    for path, size in site.objects.items():
        assert (site.root / path.lstrip("/")).stat().st_size == size
    assert {page.page_type for page in site.pages} == {t.name for t in DEFAULT_PAGE_TYPES}
    assert sum(page.weight for page in site.pages) == pytest.approx(1.0)
    for page in site.pages:
        html = (site.root / page.path.lstrip("/")).read_text()
        assert len(html.encode()) == page.size and 1000 <= page.size <= 30000
        wanted = next(t.objects for t in DEFAULT_PAGE_TYPES if t.name == page.page_type)
        assert len(set(page.objects)) == len(page.objects) == wanted
        assert all(f'"{path}"' in html for path in page.objects)  # the HTML lists what a load fetches
    again = build_site(tmp_path / "again", seed=7)
    assert again.manifest()["pages"] == site.manifest()["pages"] and again.objects == site.objects
    assert json.loads(json.dumps(site.manifest()))["objects"] == site.objects


def test_nginx_serves_h1_h2_and_h1_over_tls_on_the_lab_address_only(run_id: str) -> None:
    hosts = [
        Host("server", role="server", link=LinkSpec.symmetric(rate_bps=1e9)),
        Host("client", role="users", link=LinkSpec.symmetric(rate_bps=50e6, rtt_ms=20), users=3),
    ]
    before = set(_nginx_processes())
    run_nginx_pid = Path("/run/nginx.pid").exists()
    with Topology(run_id, hosts) as topo:
        server = start_nginx(topo, "server", options=NginxOptions(keepalive_requests=3))
        try:
            ours = {pid: info for pid, info in _nginx_processes().items() if pid not in before}
            assert set(server.pids()) == set(ours) and len(ours) == 2  # a master and one worker
            assert server.process.pid in ours and ours[server.process.pid][0] == 0
            assert [uid for pid, (uid, _) in ours.items() if pid != server.process.pid] == [33]  # www-data
            assert server.worker_user == "www-data" and str(server.config_path).startswith(str(topo.state_dir))
            assert (server.work_dir / "nginx.pid").read_text().strip() == str(server.process.pid)

            listening = topo.run("server", ["ss", "-tlnH"], capture_output=True, text=True).stdout
            sockets = {line.split()[3] for line in listening.splitlines()}
            address = topo.host("server").address
            assert sockets == {f"{address}:8080", f"{address}:8443"}

            user = topo.host("client").user_addresses[1]
            page = next(p for p in server.site.pages if p.page_type == "article")
            for protocol, version in (("h1", "1.1"), ("h2", "2"), ("h1-tls", "1.1")):
                lines = _curl(topo, server, user, protocol, [page.path, *page.objects])
                assert [line[0] for line in lines] == ["200"] * 13, (protocol, lines)
                assert {line[1] for line in lines} == {version}, (protocol, lines)
                assert [int(line[2]) for line in lines] == [page.size] + [server.site.objects[o] for o in page.objects]
                assert {line[4] for line in lines} == {user}
                # Serial transfers reuse the connection; keepalive_requests=3: a new one every 3rd.
                assert sum(int(line[3]) for line in lines) == 5, (protocol, lines)

            # The bytes are the file's, from sendfile (nothing compresses or changes them).
            some = page.objects[0]
            fetched = topo.run(
                "client",
                ["curl", "-q", "-sS", "--interface", f"host!{user}", server.url("h1", some)],
                capture_output=True,
                timeout=30,
            ).stdout
            assert hashlib.sha256(fetched).digest() == hashlib.sha256((server.site.root / some.lstrip("/")).read_bytes()).digest()
            config = server.config_path.read_text()
            assert "sendfile on;" in config and "keepalive_timeout 65000ms;" in config and "keepalive_requests 3;" in config
            assert "/etc/nginx" not in config and "/var/" not in config

            workers = set(server.pids()) - {server.process.pid}
            server.stop()
            log = server.access_log()
            assert {entry["remote_addr"] for entry in log} == {user}
            protocols = {(entry["server_protocol"], entry["ssl_protocol"]) for entry in log}
            assert protocols == {("HTTP/1.1", "-"), ("HTTP/2.0", "TLSv1.3"), ("HTTP/1.1", "TLSv1.3")}
            assert {entry["status"] for entry in log} == {"200"}
        finally:
            server.stop()
        assert not set(_nginx_processes()) - before  # master and worker gone
        assert workers and all(not Path(f"/proc/{pid}").exists() for pid in workers)
        assert not (server.work_dir / "nginx.pid").exists()
    assert Path("/run/nginx.pid").exists() == run_nginx_pid
    assert not server.work_dir.exists()  # the state directory goes with the run


def test_keepalive_is_configurable_and_dual_stack_listens_on_both_addresses(run_id: str) -> None:
    hosts = [
        Host("server", role="server", link=LinkSpec.symmetric(rate_bps=1e9)),
        Host("client", role="users", link=LinkSpec.symmetric(rate_bps=50e6, rtt_ms=10), users=1),
    ]
    with Topology(run_id, hosts, dual_stack=True) as topo:
        options = NginxOptions(http_port=8081, https_port=8444, keepalive_timeout_s=0.5)
        with start_nginx(topo, "server", options=options) as server:
            sockets = {
                line.split()[3]
                for line in topo.run("server", ["ss", "-tlnH"], capture_output=True, text=True).stdout.splitlines()
            }
            placed = topo.host("server")
            assert sockets == {
                f"{placed.address}:8081",
                f"{placed.address}:8444",
                f"[{placed.address6}]:8081",
                f"[{placed.address6}]:8444",
            }
            user6 = topo.host("client").user_addresses6[0]
            page = server.site.pages[0]
            command = [
                "curl",
                "-q",
                "-sS",
                "--interface",
                f"host!{user6}",
                "--http2",
                "--cacert",
                str(server.ca_file),
                "-w",
                FORMAT,
                "-o",
                "/dev/null",
                server.url("h2", page.path, family=6),
            ]
            line = topo.run("client", command, capture_output=True, text=True, timeout=30).stdout.split()
            assert line[:3] == ["200", "2", str(page.size)] and line[4] == user6
            # A connection idle longer than keepalive_timeout is closed by nginx: curl reconnects.
            script = (
                f"import socket, time\ns = socket.create_connection(('{placed.address}', 8081))\n"
                "s.sendall(b'GET /nothing HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n'); s.recv(4096); time.sleep(1.5)\n"
                "s.settimeout(2); print(repr(s.recv(10)))"
            )
            closed = topo.run("client", ["python3", "-c", script], capture_output=True, text=True, timeout=30)
            assert closed.stdout.strip() == "b''", closed  # EOF: nginx closed the idle connection
    assert not os.path.exists(f"/run/netns/{run_id}-server")
    leftovers = subprocess.run(["ip", "-6", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    assert "fd75:7372" not in leftovers
