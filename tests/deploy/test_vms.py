"""Probes and an origin on virtual machines, deployed the two ways docs/deployment.md gives:
cloud-init and Ansible over SSH.

Three qemu guests from the image ``scripts/vm-image.sh`` makes (Debian 12, Debian's cloud kernel
and cloud-init), each behind a lab host's emulated access link (tests/deploy/vmlab.py):

* ``probe-ci``: provisioned by cloud-init NoCloud alone, with the user-data that
  ``probe/deploy/cloud-init/render.py`` renders (the zipapp embedded, enrolled at first boot,
  started by systemd);
* ``origin`` and ``probe-ans``: booted with an SSH key only, then provisioned by the Ansible role
  (``probe/deploy/ansible/site.yml``) from the root namespace, over SSH through the guests'
  emulated links; the origin's per-IW routes are set by its unit's ``setup-routes``.

Then a campaign of arms 3 and 10: both probes fetch from the origin VM through both links, the
trials and the origin's observations reach the collector (this checkout's API and worker on the
lab's service address), every connection started with its arm's window (the origin's own
``snd_cwnd`` at accept), and the trials show on the dashboard's Trials and Probes pages in
headless Chromium.  Last, the upgrade path: the role installs a new build on ``probe-ans`` (the
fleet listing reports its version), then rolls it back.  Timings under TCG say nothing about
latency: nothing here compares latencies.  Marked ``deploy`` (``make deploy-check``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import zipapp
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from chartrender import REPO
from testenv import libpq_url
from testkit import create_campaign, running_dashboard, wait_for
from vmlab import LabVm, VmImage, vm_image

#: Minutes, not seconds: three guests boot on emulated CPUs and Ansible runs over SSH into them.
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(3600)]

topology_module = pytest.importorskip("iwscope_lab.topology")
Topology, Host, LinkSpec = topology_module.Topology, topology_module.Host, topology_module.LinkSpec

DEPLOY = REPO / "probe" / "deploy"
ANSIBLE = DEPLOY / "ansible"
ARMS = (3, 10)
BASE_PORT = 8000
#: The guests' links: the origin near the core, the probes 60 and 100 ms away.
LINKS = {
    "origin": LinkSpec.symmetric(rate_bps=100_000_000, rtt_ms=2),
    "probe-ci": LinkSpec.symmetric(rate_bps=20_000_000, rtt_ms=60),
    "probe-ans": LinkSpec.symmetric(rate_bps=20_000_000, rtt_ms=100),
}
#: The version the "new build" of the upgrade reports (a valid release number above the checkout's).
UPGRADE_VERSION = "0.1.1.dev1"
#: Generous: everything runs on emulated CPUs, three guests on two host cores.
CAMPAIGN_TIMEOUT_S = 900.0
ANSIBLE_TIMEOUT_S = 1800.0
#: Timings of the run, printed for docs/deployment.md.
TIMINGS: dict[str, float] = {}


def _build_pyz(directory: Path) -> tuple[Path, Path]:
    """The checkout's zipapp (``build-pyz.sh``) and a "new build" of it that reports :data:`UPGRADE_VERSION`."""
    current = directory / "iwprobe.pyz"
    built = subprocess.run([str(DEPLOY / "build-pyz.sh"), str(current)], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    staging = directory / "upgrade"
    with zipfile.ZipFile(current) as archive:
        archive.extractall(staging)
    init = staging / "iwprobe" / "__init__.py"
    text, count = re.subn(r'^__version__ = "[^"]+"$', f'__version__ = "{UPGRADE_VERSION}"', init.read_text(), flags=re.M)
    assert count == 1
    init.write_text(text)
    upgrade = directory / "iwprobe-upgrade.pyz"
    zipapp.create_archive(staging, upgrade, interpreter="/usr/bin/env python3")  # its __main__.py is build-pyz.sh's
    return current, upgrade


def _ssh_user_data(public_key: str) -> str:
    # manage_etc_hosts: the guest's own name resolves (sudo looks it up), as cloud images set it up.
    return f"#cloud-config\nssh_pwauth: false\nmanage_etc_hosts: true\nssh_authorized_keys:\n  - {public_key}\n"


class VmFleet:
    """The topology, the three guests, the SSH key and the zipapps."""

    def __init__(self, topo: Any, image: VmImage, tmp: Path, api_port: int) -> None:
        self.topo = topo
        self.tmp = tmp
        self.collector = f"http://{topo.collector_address}:{api_port}"
        self.vms = {name: LabVm(topo, name, image, tmp / name) for name in LINKS}
        self.key = tmp / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "iwscope-vm-check", "-f", str(self.key)], check=True)
        self.pyz, self.upgrade_pyz = _build_pyz(tmp)
        self.regions = {name: f"vm-{name}-{secrets.token_hex(2)}" for name in ("probe-ci", "probe-ans")}

    def boot(self, enroll_token: str) -> None:
        rendered = subprocess.run(
            [
                sys.executable,
                str(DEPLOY / "cloud-init" / "render.py"),
                "--collector",
                self.collector,
                "--token",
                enroll_token,
                "--name",
                "probe-ci",
                "--region",
                self.regions["probe-ci"],
                "--pyz",
                str(self.pyz),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert rendered.returncode == 0, rendered.stderr
        public_key = (self.tmp / "id_ed25519.pub").read_text().strip()
        for name, vm in self.vms.items():
            vm.boot(rendered.stdout if name == "probe-ci" else _ssh_user_data(public_key))
        for name, vm in self.vms.items():
            TIMINGS[f"boot {name} (s)"] = round(vm.wait_booted(), 1)

    def inventory(self, enroll_token: str, origin_token: str, pyz: Path, limit_probe: bool = False) -> Path:
        common = {
            "ansible_user": "debian",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=60",
            "ansible_python_interpreter": "/usr/bin/python3",
        }
        origin = self.vms["origin"]
        probe_vars = {"ansible_host": self.vms["probe-ans"].address, "iwprobe_region": self.regions["probe-ans"]}
        document = {
            "all": {
                "vars": {**common, "iwprobe_collector_url": self.collector, "iwprobe_pyz_src": str(pyz)},
                "children": {
                    "probes": {"hosts": {"probe-ans": probe_vars}},
                    "origins": {
                        "hosts": {}
                        if limit_probe
                        else {
                            "origin": {
                                "ansible_host": origin.address,
                                "iwprobe_region": "vm-origin",
                                "iwprobe_origin_arms": ",".join(map(str, ARMS)),
                                "iwprobe_origin_base_port": BASE_PORT,
                                "iwprobe_origin_host": origin.address,
                            }
                        }
                    },
                },
            }
        }
        document["all"]["vars"] |= {"iwprobe_enroll_token": enroll_token, "iwprobe_origin_token": origin_token}
        path = self.tmp / ("inventory-upgrade.json" if limit_probe else "inventory.json")
        path.write_text(json.dumps(document))
        path.chmod(0o600)
        return path

    def ansible(self, inventory: Path, label: str) -> str:
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
            "ANSIBLE_LOCAL_TEMP": str(self.tmp / "ansible-local"),
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_NOCOLOR": "1",
            # Emulated CPUs: a sudo prompt or an SSH connection can take longer than the 10 s default.
            "ANSIBLE_TIMEOUT": "120",
        }
        started = time.monotonic()
        done = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(ANSIBLE / "site.yml")],
            capture_output=True,
            text=True,
            env=env,
            timeout=ANSIBLE_TIMEOUT_S,
            check=False,
            cwd=ANSIBLE,
        )
        TIMINGS[f"ansible {label} (s)"] = round(time.monotonic() - started, 1)
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:] + self.tails()
        return done.stdout

    def ssh(self, name: str, command: str) -> str:
        done = subprocess.run(
            [
                "ssh",
                "-i",
                str(self.key),
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                f"debian@{self.vms[name].address}",
                command,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def tails(self) -> str:
        return "".join(f"\n--- {name} console\n{vm.tail(40)}" for name, vm in self.vms.items())

    def stop(self) -> None:
        for vm in self.vms.values():
            vm.stop()


@pytest.fixture(scope="module")
def image() -> VmImage:
    if os.geteuid() != 0:
        pytest.skip("the VMs need root (namespaces, TAP devices)")
    started = time.monotonic()
    made = vm_image()
    TIMINGS["image (s, cached after the first run)"] = round(time.monotonic() - started, 1)
    return made


@pytest.fixture(scope="module")
def fleet(
    image: VmImage,
    _api_server_process: Any,
    celery_worker: Any,
    enroll_token: str,
    origin_token: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VmFleet]:
    _api_server_process.start()
    topo = Topology(
        f"iwt{secrets.token_hex(3)}",
        hosts=[Host(name, role="origin" if name == "origin" else "probe", link=link) for name, link in LINKS.items()],
    )
    with topo:
        vms = VmFleet(topo, image, tmp_path_factory.mktemp("vms"), _api_server_process.port)
        try:
            vms.boot(enroll_token)
            vms.ansible(vms.inventory(enroll_token, origin_token, vms.pyz), "first deployment")
            yield vms
        finally:
            vms.stop()
            print("VM rehearsal timings:", json.dumps(TIMINGS, indent=1))


@pytest.fixture
def admin(_api_server_process: Any, admin_token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=_api_server_process.url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60) as client:
        yield client


def _probes(admin: httpx.Client, fleet: VmFleet) -> dict[str, dict[str, Any]]:
    listed = admin.get("/api/v1/probes").raise_for_status().json()
    return {probe["name"]: probe for probe in listed if probe["region"] in fleet.regions.values()}


def test_vms_provisioned_by_cloud_init_and_ansible_run_a_campaign(
    fleet: VmFleet, admin: httpx.Client, admin_token: str, database_url: str
) -> None:
    probes = wait_for(
        lambda: len(_probes(admin, fleet)) == 2 and _probes(admin, fleet), 300, 5, "both probes enrolled", fleet.tails
    )
    origins = [o for o in admin.get("/api/v1/origins").raise_for_status().json() if o["host"] == fleet.vms["origin"].address]
    assert len(origins) == 1, origins
    # The origin VM's per-IW routes, read on the VM itself (set by the unit's setup-routes).
    routes = fleet.ssh("origin", "ip route show table all")
    assert {int(window) for window in re.findall(r"initcwnd (\d+)", routes)} >= set(ARMS), routes
    campaign_id = create_campaign(
        admin,
        admin_token,
        origins[0]["id"],
        name=f"vm-check-{secrets.token_hex(3)}",
        arms=list(ARMS),
        sizes=[30000],
        probe_regions=list(fleet.regions.values()),
        repetitions=2,
        interval_s=0.0,
        calibrate=False,
    )["id"]
    expected = 2 * len(ARMS) * 2  # probes x arms x repetitions
    sql = (
        "SELECT p.name, t.arm_iw, t.error_kind, o.snd_cwnd_at_accept, o.cwnd_mismatch "
        "FROM trials t JOIN probes p ON p.id = t.probe_id JOIN origin_observations o USING (trial_id) "
        "WHERE t.campaign_id = %s"
    )

    def joined() -> list[tuple[Any, ...]]:
        with psycopg.connect(libpq_url(database_url)) as connection:
            rows = connection.execute(sql, (campaign_id,)).fetchall()
        return rows if len(rows) >= expected else []

    started = time.monotonic()
    rows = wait_for(joined, CAMPAIGN_TIMEOUT_S, 5, f"{expected} joined trials of campaign {campaign_id}", fleet.tails)
    TIMINGS["campaign to joined trials (s)"] = round(time.monotonic() - started, 1)
    assert {name for name, *_ in rows} == {"probe-ci", "probe-ans"}
    assert all(error is None for _, _, error, _, _ in rows), rows
    # Every connection started with its arm's window, as the origin VM's kernel reported at accept.
    assert all(cwnd == arm and not mismatch for _, arm, _, cwnd, mismatch in rows), rows
    assert probes["probe-ci"]["region"] == fleet.regions["probe-ci"]
    _dashboard_shows(fleet, database_url, campaign_id)


def _dashboard_shows(fleet: VmFleet, database_url: str, campaign_id: int) -> None:
    """The Trials and Probes pages of a real dashboard process, in headless Chromium."""
    from iwscope_dashboard.pagecheck import PAGES, check_pages

    with running_dashboard(database_url, fleet.tmp / "dashboard.log") as dashboard:
        pages = [spec for spec in PAGES if spec.path in ("/trials", "/probes")]
        report = check_pages(
            dashboard.url + "/", query=f"campaign={campaign_id}", pages=pages, empty_allowed=frozenset(), timeout_s=60
        )
        assert report.ok, report


def test_the_role_upgrades_a_probe_vm_and_rolls_it_back(
    fleet: VmFleet, admin: httpx.Client, enroll_token: str, origin_token: str
) -> None:
    current = subprocess.run([sys.executable, "-I", str(fleet.pyz), "version"], capture_output=True, text=True, check=True)
    current_version = current.stdout.strip()
    for pyz, version, label in ((fleet.upgrade_pyz, UPGRADE_VERSION, "upgrade"), (fleet.pyz, current_version, "rollback")):
        output = fleet.ansible(fleet.inventory(enroll_token, origin_token, pyz, limit_probe=True), label)
        assert "RUNNING HANDLER [iwprobe : Restart iwprobe]" in output, output[-3000:]
        installed = fleet.ssh("probe-ans", "/usr/local/bin/iwprobe version").strip()
        assert installed == version
        started = time.monotonic()
        wait_for(
            lambda version=version: _probes(admin, fleet)["probe-ans"]["version"] == version,
            300,
            5,
            f"probe-ans reporting {version}",
            fleet.tails,
        )
        TIMINGS[f"{label}: role run to the version reported (s)"] = round(time.monotonic() - started, 1)
    # The cloud-init probe was left alone.
    assert _probes(admin, fleet)["probe-ci"]["version"] == current_version
