"""An unmodified web server in the lab: Debian's nginx in a lab host's namespace, serving a
site of web-search-sized objects to the emulated users (users.py).

The real-users study (the IETF 78 design of the IW10 authors) measures one
unmodified server passively; this is that server.  :func:`start_nginx` writes everything into
the run's state directory (``/run/iwscope-lab/<run>/nginx-<host>/``, removed with the run;
never ``/etc/nginx``) and starts ``/usr/sbin/nginx`` in the host's namespace:

* the master as root (it reads the key and binds), the workers as ``www-data`` (Debian's web
  user; ``root`` only when that user cannot reach the files, said in :attr:`WebServer.worker_user`);
  ``pid``, ``lock_file``, the error log, the access log and every temporary path in the
  state directory: nothing in ``/run``, ``/var/lib/nginx`` or ``/var/log/nginx``;
* listening only on the host's lab address (and its IPv6 address in dual-stack runs):
  HTTP/1.1 on :attr:`NginxOptions.http_port` (8080), HTTPS with HTTP/2 and HTTP/1.1 (ALPN) on
  :attr:`NginxOptions.https_port` (8443), with a test chain from :mod:`iwscope_lab.certs` whose
  root (:attr:`WebServer.ca_file`) the clients trust;
* keep-alive as nginx's defaults (``keepalive_timeout 65s``, ``keepalive_requests 1000``,
  both options), ``sendfile on`` and ``tcp_nopush on`` (Debian's nginx.conf), no gzip (the
  objects are incompressible random bytes: a response is exactly its file);
* the access log (``access.log``, buffered, flushed every second) has ``$remote_addr``, the
  protocol, status and bytes of every request (``access_log=False`` turns it off).

The site (:func:`build_site`): a pool of objects whose sizes follow ``iwprobe.sizes``'
``websearch`` model (stratified quantiles, so the pool has the model's distribution), and per
page type (search: 4 objects, article: 12, gallery: 24) a few HTML pages of websearch sizes
that reference their objects (``<link>``, ``<script>``, ``<img>``); :meth:`Site.manifest` is
the same as data, what the users' driver fetches.

:meth:`WebServer.stop` shuts nginx down gracefully (``SIGQUIT``, then ``SIGTERM``, then
``SIGKILL`` of the master and of every worker it had), so no nginx process is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iwprobe import sizes as size_models

from ._netns import LabError, alive, process_start_time

if TYPE_CHECKING:
    from .certs import ChainInfo
    from .topology import Topology

__all__ = [
    "PageType",
    "Page",
    "Site",
    "NginxOptions",
    "WebServer",
    "DEFAULT_PAGE_TYPES",
    "PROTOCOLS",
    "build_site",
    "nginx_config",
    "start_nginx",
    "nginx_binary",
]

#: The ways a user fetches a page: HTTP/1.1 over plain HTTP, HTTP/2 over TLS, HTTP/1.1 over TLS.
PROTOCOLS = ("h1", "h2", "h1-tls")
#: How the access log records a request (space separated; the URI last).
ACCESS_LOG_FIELDS = (
    "msec",
    "remote_addr",
    "remote_port",
    "server_addr",
    "server_port",
    "server_protocol",
    "ssl_protocol",
    "status",
    "body_bytes_sent",
    "request_time",
    "connection",
    "connection_requests",
    "request_uri",
)
#: MIME type per object kind (the file name's extension).
_TYPES = {
    "html": "text/html",
    "css": "text/css",
    "js": "application/javascript",
    "png": "image/png",
    "jpg": "image/jpeg",
    "gif": "image/gif",
    "woff2": "font/woff2",
}
#: Object kinds in the pool, in turn (believable names; every object is random bytes).
_KINDS = ("css", "js", "png", "jpg", "png", "js", "gif", "jpg", "woff2", "png")


@dataclass(frozen=True)
class PageType:
    """A kind of page: how many objects one load of it fetches and its share of page loads."""

    name: str
    objects: int
    weight: float


#: Page types of the site: a search result page (few objects), an article, an image gallery.
DEFAULT_PAGE_TYPES = (PageType("search", 4, 0.6), PageType("article", 12, 0.3), PageType("gallery", 24, 0.1))


@dataclass(frozen=True)
class Page:
    """One HTML page of the site: its URL path, type, size (bytes) and the objects it references."""

    path: str
    page_type: str
    size: int
    objects: tuple[str, ...]
    #: Share of page loads of this page (its type's weight over the type's variants).
    weight: float


@dataclass(frozen=True)
class Site:
    """The files nginx serves: :attr:`pages` and :attr:`objects` (URL path -> bytes) under :attr:`root`."""

    root: Path
    pages: tuple[Page, ...]
    objects: dict[str, int]
    size_dist: str
    seed: int

    def size_of(self, path: str) -> int:
        """Bytes of the file at URL ``path`` (a page or an object)."""
        for page in self.pages:
            if page.path == path:
                return page.size
        return self.objects[path]

    def manifest(self) -> dict[str, Any]:
        """The site as data (JSON-able): pages with their objects and weights, object sizes."""
        return {
            "size_dist": self.size_dist,
            "seed": self.seed,
            "pages": [asdict(page) | {"objects": list(page.objects)} for page in self.pages],
            "objects": dict(self.objects),
        }


def _stratified_sizes(size_dist: str, count: int, rng: random.Random) -> list[int]:
    """``count`` sizes at the model's quantiles (i + 0.5) / count, in random order."""
    values = [size_models.quantile(size_dist, (index + 0.5) / count) for index in range(count)]
    rng.shuffle(values)
    return values


def _html(title: str, objects: Sequence[str], size: int, rng: random.Random) -> bytes:
    """An HTML page referencing ``objects``, padded with text to ``size`` bytes (or its natural size)."""
    head = [f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title>']
    body = ["</head><body>"]
    for path in objects:
        kind = path.rsplit(".", 1)[-1]
        if kind == "css":
            head.append(f'<link rel="stylesheet" href="{path}">')
        elif kind == "js":
            head.append(f'<script src="{path}"></script>')
        elif kind == "woff2":
            head.append(f'<link rel="preload" as="font" crossorigin href="{path}">')
        else:
            body.append(f'<img src="{path}" alt="">')
    start = "\n".join(head + body) + "\n<p>"
    end = "</p>\n</body></html>\n"
    words = (
        "initial",
        "window",
        "congestion",
        "segment",
        "latency",
        "search",
        "result",
        "query",
        "page",
        "round",
        "trip",
        "slow",
        "start",
        "server",
        "client",
        "prefix",
        "web",
        "response",
    )
    filler: list[str] = []
    missing = size - len(start) - len(end)
    while missing > 0:
        word = rng.choice(words)[: missing - 1] if missing > 1 else ""
        filler.append(word)
        missing -= len(word) + 1
    text = start + " ".join(filler) + end
    return text.encode()


def build_site(
    root: Path | str,
    *,
    page_types: Sequence[PageType] = DEFAULT_PAGE_TYPES,
    variants: int = 4,
    objects: int = 96,
    size_dist: str = "websearch",
    seed: int = 1,
) -> Site:
    """Write the site into ``root``: ``objects`` objects (``/o/<n>-<bytes>.<kind>``, random bytes,
    sizes from ``size_dist``) and ``variants`` pages per page type (``/p/<type>-<n>.html``, HTML of
    ``size_dist`` sizes, each referencing its type's number of objects drawn from the pool).
    Deterministic for a given ``seed``."""
    if objects < max((page_type.objects for page_type in page_types), default=0):
        raise ValueError(f"a pool of {objects} objects is smaller than a page type's object count")
    if variants < 1 or not page_types:
        raise ValueError("a site needs at least one page type and one variant")
    rng = random.Random(seed)
    root = Path(root)
    for directory in (root, root / "o", root / "p"):
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
    pool: dict[str, int] = {}
    for index, size in enumerate(_stratified_sizes(size_dist, objects, rng)):
        path = f"/o/{index:03d}-{size}.{_KINDS[index % len(_KINDS)]}"
        _write_public(root / path.lstrip("/"), rng.randbytes(size))
        pool[path] = size
    names = list(pool)
    page_sizes = _stratified_sizes(size_dist, variants * len(page_types), rng)
    pages = []
    for type_index, page_type in enumerate(page_types):
        for variant in range(variants):
            chosen = tuple(rng.sample(names, page_type.objects))
            path = f"/p/{page_type.name}-{variant}.html"
            html = _html(f"{page_type.name} {variant}", chosen, page_sizes[type_index * variants + variant], rng)
            _write_public(root / path.lstrip("/"), html)
            pages.append(Page(path, page_type.name, len(html), chosen, page_type.weight / variants))
    site = Site(root=root, pages=tuple(pages), objects=pool, size_dist=size_dist, seed=seed)
    return site


def _write_public(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o644)


@dataclass(frozen=True)
class NginxOptions:
    """What :func:`start_nginx` configures (nginx's own defaults where it has them)."""

    http_port: int = 8080
    https_port: int = 8443
    keepalive_timeout_s: float = 65.0
    keepalive_requests: int = 1000
    worker_processes: int = 1
    worker_connections: int = 4096
    sendfile: bool = True
    tcp_nopush: bool = True
    access_log: bool = True
    #: The TLS chain (leaf + intermediates, DER KB; certs.py): 4 KB is a classical ECDSA chain.
    chain_kb: float = 4.0
    key_type: str = "ec"
    #: Workers' user (Debian's); root when it cannot read the site (see WebServer.worker_user).
    user: str = "www-data"
    #: How long a graceful stop waits for requests in flight (``worker_shutdown_timeout``).
    shutdown_timeout_s: float = 5.0
    server_name: str = "www.iwscope.test"

    def __post_init__(self) -> None:
        for name in ("http_port", "https_port"):
            if not 1 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name}={getattr(self, name)!r} is not a port")
        if self.http_port == self.https_port:
            raise ValueError("http_port and https_port must differ")
        if self.keepalive_timeout_s < 0 or self.keepalive_requests < 1:
            raise ValueError("keepalive_timeout_s must be >= 0 and keepalive_requests >= 1")
        if self.worker_processes < 1 or self.worker_connections < 16:
            raise ValueError("worker_processes must be >= 1 and worker_connections >= 16")


def nginx_binary() -> str:
    """Debian's nginx (``/usr/sbin/nginx``); LabError when it is not installed."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise LabError("nginx is not installed (apt-get install nginx; keep its system service disabled)")
    return binary


def _seconds(value: float) -> str:
    return f"{int(value * 1000)}ms"


def nginx_config(
    work: Path, www: Path, addresses: Sequence[str], options: NginxOptions, *, user: str, chain: Path, key: Path
) -> str:
    """The nginx.conf of a lab web server (module docstring): every path under ``work``."""
    listens = []
    for address in addresses:
        bracketed = f"[{address}]" if ":" in address else address
        listens += [f"listen {bracketed}:{options.http_port};", f"listen {bracketed}:{options.https_port} ssl http2;"]
    tmp = work / "tmp"
    log_format = " ".join(f"${name}" for name in ACCESS_LOG_FIELDS)
    access = f"access_log {work}/access.log iwscope buffer=64k flush=1s;" if options.access_log else "access_log off;"
    types = " ".join(f"{mime} {kind};" for kind, mime in _TYPES.items())
    group = pwd.getpwnam(user).pw_gid if user != "root" else 0
    group_name = _group_name(group)
    return f"""# Written by iwscope_lab.webserver for a lab run: Debian's nginx in a lab namespace.
daemon off;
master_process on;
worker_processes {options.worker_processes};
worker_rlimit_nofile {2 * options.worker_connections + 64};
worker_shutdown_timeout {_seconds(options.shutdown_timeout_s)};
user {user} {group_name};
pid {work}/nginx.pid;
lock_file {work}/nginx.lock;
error_log {work}/error.log warn;
events {{ worker_connections {options.worker_connections}; }}
http {{
    types {{ {types} }}
    default_type application/octet-stream;
    sendfile {"on" if options.sendfile else "off"};
    tcp_nopush {"on" if options.tcp_nopush else "off"};
    tcp_nodelay on;
    gzip off;
    server_tokens off;
    keepalive_timeout {_seconds(options.keepalive_timeout_s)};
    keepalive_requests {options.keepalive_requests};
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    log_format iwscope '{log_format}';
    {access}
    ssl_certificate {chain};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:iwscope:1m;
    ssl_session_timeout 10m;
    server {{
        {(chr(10) + "        ").join(listens)}
        server_name {options.server_name};
        root {www};
        location / {{ try_files $uri =404; }}
    }}
}}
"""


def _group_name(gid: int) -> str:
    import grp

    return grp.getgrgid(gid).gr_name


def _world_readable_path(path: Path) -> bool:
    """Whether a user without privileges can traverse to ``path`` (o+x on every ancestor)."""
    for directory in [path, *path.parents]:
        try:
            if not directory.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _children(pid: int) -> list[tuple[int, int | None]]:
    """(pid, start time) of the live children of ``pid`` (the nginx workers of a master)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append((int(entry.name), process_start_time(int(entry.name))))
    return found


def _cpu_seconds(pid: int, include_children: bool = False) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if include_children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class WebServer:
    """A running nginx in a lab host (:func:`start_nginx`); a context manager that stops it."""

    host: str
    address: str
    address6: str
    http_port: int
    https_port: int
    #: The test chain's root: clients trust it (``curl --cacert``).
    ca_file: Path
    chain: ChainInfo
    work_dir: Path
    site: Site
    options: NginxOptions
    worker_user: str
    process: subprocess.Popen[bytes]
    config_path: Path
    access_log_path: Path | None
    error_log_path: Path
    _workers: list[tuple[int, int | None]] = field(default_factory=list)

    def base_url(self, protocol: str, family: int = 4) -> str:
        """``http://addr:8080`` for ``h1``, ``https://addr:8443`` for ``h2`` and ``h1-tls`` (the
        client chooses HTTP/2 or HTTP/1.1 by ALPN); ``family=6``: the IPv6 address."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}: one of {', '.join(PROTOCOLS)}")
        if family == 6 and not self.address6:
            raise ValueError("this server has no IPv6 address (not a dual-stack run)")
        host = f"[{self.address6}]" if family == 6 else self.address
        return f"http://{host}:{self.http_port}" if protocol == "h1" else f"https://{host}:{self.https_port}"

    def url(self, protocol: str, path: str, family: int = 4) -> str:
        return self.base_url(protocol, family) + path

    def pids(self) -> list[int]:
        """The master's and the workers' pids (live ones)."""
        pids = [self.process.pid] if self.process.poll() is None else []
        return pids + [pid for pid, _ in _children(self.process.pid)] if pids else []

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the master and the workers so far (the exited ones too)."""
        if self.process.poll() is not None:
            return 0.0
        return _cpu_seconds(self.process.pid, include_children=True) + sum(
            _cpu_seconds(pid) for pid, _ in _children(self.process.pid)
        )

    def access_log(self) -> list[dict[str, str]]:
        """The access log's entries (up to the last flush: nginx flushes every second and on stop)."""
        if self.access_log_path is None or not self.access_log_path.exists():
            return []
        entries = []
        for line in self.access_log_path.read_text(errors="replace").splitlines():
            values = line.split(" ", len(ACCESS_LOG_FIELDS) - 1)
            if len(values) == len(ACCESS_LOG_FIELDS):
                entries.append(dict(zip(ACCESS_LOG_FIELDS, values, strict=True)))
        return entries

    def stop(self, timeout_s: float | None = None) -> None:
        """Graceful stop (``SIGQUIT``: requests in flight finish within ``shutdown_timeout_s``),
        then ``SIGTERM`` and ``SIGKILL``; every worker the master had is gone afterwards."""
        if self.process.poll() is None:
            self._workers = _children(self.process.pid) or self._workers
        grace = self.options.shutdown_timeout_s + 2.0 if timeout_s is None else timeout_s
        for sig, wait_s in ((signal.SIGQUIT, grace), (signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            if self.process.poll() is not None:
                break
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        deadline = time.monotonic() + 3.0
        for pid, start in self._workers:
            while alive(pid, start) and time.monotonic() < deadline:
                time.sleep(0.02)
            if alive(pid, start):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> WebServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_nginx(
    topology: Topology,
    host: str,
    *,
    options: NginxOptions | None = None,
    work_dir: Path | str | None = None,
    site: Site | None = None,
    seed: int = 1,
    timeout_s: float = 30.0,
) -> WebServer:
    """Start Debian's nginx in ``host``'s namespace, serving a site (:func:`build_site` with ``seed``
    when ``site`` is None) on the host's lab address(es) only; returns once both ports accept
    connections.  ``work_dir`` defaults to ``<run state dir>/nginx-<host>`` (removed with the run)."""
    from .certs import write_chain

    options = options or NginxOptions()
    placed = topology.host(host)
    if not placed.address:
        raise LabError(f"topology {topology.run_id} is not up")
    work = Path(work_dir) if work_dir is not None else topology.state_dir / f"nginx-{host}"
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (work / "tmp" / name).mkdir(parents=True, exist_ok=True)
    if site is None:
        site = build_site(work / "www", seed=seed)
    addresses = [placed.address] + ([placed.address6] if placed.address6 else [])
    chain = write_chain(work / "tls", options.chain_kb, key_type=options.key_type, name=options.server_name, ips=addresses)
    user = options.user
    try:
        pwd.getpwnam(user)
    except KeyError:
        user = "root"
    if user != "root" and not _world_readable_path(site.root):
        user = "root"  # the workers could not read the site (e.g. a 0700 state directory)
    if user != "root":  # the workers own their temporary directories
        entry = pwd.getpwnam(user)
        for directory in (work / "tmp", *sorted((work / "tmp").iterdir())):
            os.chown(directory, entry.pw_uid, entry.pw_gid)
    config_path = work / "nginx.conf"
    config_path.write_text(
        nginx_config(work, site.root, addresses, options, user=user, chain=chain.chain_path, key=chain.key_path)
    )
    (work / "site.json").write_text(json.dumps(site.manifest(), indent=1))
    error_log = work / "error.log"
    with open(work / "nginx.out", "ab") as log:
        process = topology.popen(
            host,
            [nginx_binary(), "-p", f"{work}/", "-e", str(error_log), "-c", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = WebServer(
        host=host,
        address=placed.address,
        address6=placed.address6,
        http_port=options.http_port,
        https_port=options.https_port,
        ca_file=chain.root_path,
        chain=chain,
        work_dir=work,
        site=site,
        options=options,
        worker_user=user,
        process=process,
        config_path=config_path,
        access_log_path=work / "access.log" if options.access_log else None,
        error_log_path=error_log,
    )
    try:
        for address in addresses:
            topology.wait_listening(host, address, [options.http_port, options.https_port], timeout_s, process)
    except TimeoutError:
        server.stop()
        details = "\n".join(
            path.read_text(errors="replace").strip()[-1500:] for path in (work / "nginx.out", error_log) if path.exists()
        )
        raise LabError(f"nginx on {host} did not start: {details or 'no output'}") from None
    server._workers = _children(process.pid)
    return server
