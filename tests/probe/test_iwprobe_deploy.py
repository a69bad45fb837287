"""Deployment artefacts: zipapp, systemd units, cloud-init template, Ansible role."""

from __future__ import annotations

import base64
import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "probe" / "deploy"
ANSIBLE = DEPLOY / "ansible"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def _ansible_env(tmp_path: Path) -> dict:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        ANSIBLE_HOME=str(tmp_path / "home"),
        HOME=str(tmp_path),
        ANSIBLE_NOCOLOR="1",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


def test_playbook_syntax_check(tmp_path: Path) -> None:
    outcome = subprocess.run(
        [
            _tool("ansible-playbook"),
            "--syntax-check",
            "-i",
            str(ANSIBLE / "inventory" / "example.yml"),
            str(ANSIBLE / "site.yml"),
        ],
        cwd=ANSIBLE,
        capture_output=True,
        text=True,
        env=_ansible_env(tmp_path),
        timeout=120,
    )
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr


def test_ansible_lint_passes(tmp_path: Path) -> None:
    outcome = subprocess.run(
        [_tool("ansible-lint"), "--offline", "--nocolor", "site.yml", "roles/iwprobe"],
        cwd=ANSIBLE,
        capture_output=True,
        text=True,
        env=_ansible_env(tmp_path),
        timeout=300,
    )
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr


def test_inventory_groups_probes_by_region(tmp_path: Path) -> None:
    import json

    outcome = subprocess.run(
        [_tool("ansible-inventory"), "-i", str(ANSIBLE / "inventory" / "example.yml"), "--list"],
        capture_output=True,
        text=True,
        env=_ansible_env(tmp_path),
        timeout=120,
        check=True,
    )
    inventory = json.loads(outcome.stdout)
    regions = {host: values["iwprobe_region"] for host, values in inventory["_meta"]["hostvars"].items()}
    assert regions["probe-jnb-1"] == "africa" and regions["probe-gru-1"] == "south-america"
    assert set(inventory["probes"]["children"]) == {"africa", "south_america", "europe"}


def test_systemd_units_verify() -> None:
    tool = _tool("systemd-analyze")
    for unit in ("iwprobe.service", "iwprobe-origin.service", "iwprobe-tap.service"):
        outcome = subprocess.run([tool, "verify", str(DEPLOY / "systemd" / unit)], capture_output=True, text=True, timeout=60)
        assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    origin = (DEPLOY / "systemd" / "iwprobe-origin.service").read_text()
    assert "AmbientCapabilities=CAP_NET_ADMIN" in origin and "CapabilityBoundingSet=CAP_NET_ADMIN" in origin
    for unit in ("iwprobe.service", "iwprobe-origin.service"):
        text = (DEPLOY / "systemd" / unit).read_text()
        assert "ProtectSystem=strict" in text and "NoNewPrivileges=yes" in text and "StateDirectory=iwprobe" in text
        assert "User=iwprobe" in text
    tap = (DEPLOY / "systemd" / "iwprobe-tap.service").read_text()
    assert "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW CAP_BPF\n" in tap and "NoNewPrivileges=yes" in tap
    # A dead agent's inert rules go with the unit (its kill -9 is covered by the kernel's lease).
    assert re.search(r"^ExecStopPost=.* tap cleanup ", tap, re.M)


#: Highest acceptable ``systemd-analyze security`` exposure (0 = locked down, 10 = none).  The
#: probe needs the network and nothing else; the origin also keeps CAP_NET_ADMIN (SO_MARK); the
#: tap CAP_NET_ADMIN and CAP_NET_RAW as root, and writes one sysctl.
EXPOSURE_LIMITS = {"iwprobe.service": 3.0, "iwprobe-origin.service": 3.5, "iwprobe-tap.service": 4.0}


@pytest.mark.parametrize("unit", sorted(EXPOSURE_LIMITS))
def test_systemd_units_are_sandboxed(unit: str) -> None:
    tool = _tool("systemd-analyze")
    outcome = subprocess.run(
        [tool, "security", "--offline=yes", "--no-pager", str(DEPLOY / "systemd" / unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", outcome.stdout)
    assert match, outcome.stdout + outcome.stderr
    exposure = float(match.group(1))
    print(f"{unit}: exposure {exposure}")
    assert exposure <= EXPOSURE_LIMITS[unit], outcome.stdout


def test_cloud_init_embeds_the_zipapp(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    pyz = tmp_path / "iwprobe.pyz"
    subprocess.run(["sh", str(DEPLOY / "build-pyz.sh"), str(pyz)], check=True, capture_output=True)
    rendered = subprocess.run(
        [
            sys.executable,
            str(DEPLOY / "cloud-init" / "render.py"),
            "--collector",
            "https://c.example.org",
            "--token",
            "tok123",
            "--name",
            "probe-x",
            "--region",
            "africa",
            "--asn",
            "37100",
            "--pyz",
            str(pyz),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert rendered.startswith("#cloud-config\n")
    document = yaml.safe_load(rendered)
    files = {entry["path"]: entry for entry in document["write_files"]}
    embedded = files["/usr/local/lib/iwprobe/iwprobe.pyz"]
    assert gzip.decompress(base64.b64decode(embedded["content"])) == pyz.read_bytes()
    assert (
        base64.b64decode(files["/etc/systemd/system/iwprobe.service"]["content"])
        == (DEPLOY / "systemd" / "iwprobe.service").read_bytes()
    )
    assert files["/etc/iwprobe/enroll.env"]["permissions"] == "0600"
    enroll = " ".join(document["runcmd"][1])
    assert "--name probe-x --region africa --asn 37100" in enroll
    bad = subprocess.run(
        [
            sys.executable,
            str(DEPLOY / "cloud-init" / "render.py"),
            "--collector",
            "x",
            "--token",
            "a b",
            "--name",
            "n",
            "--region",
            "r",
            "--pyz",
            str(pyz),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--token may only contain" in bad.stderr


@pytest.mark.deploy  # make deploy-check, beside the role run over SSH on the VMs (15 s of make test)
def test_role_installs_and_enrolls_for_real_on_localhost(
    tmp_path: Path, api_server: object, enroll_token: str, database_url: str
) -> None:
    """Run the role against this machine (connection local, paths under tmp, no systemd)."""
    import json

    import psycopg

    playbook = _tool("ansible-playbook")
    pyz = tmp_path / "iwprobe.pyz"
    subprocess.run(["sh", str(DEPLOY / "build-pyz.sh"), str(pyz)], check=True, capture_output=True)
    root = tmp_path / "target"
    region = f"role-{os.urandom(3).hex()}"
    inventory = {
        "all": {
            "children": {
                "probes": {
                    "children": {
                        "testregion": {
                            "vars": {"iwprobe_region": region},
                            "hosts": {
                                "localhost": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": sys.executable,
                                    "ansible_become_method": "su",
                                    "iwprobe_collector_url": api_server.url,  # type: ignore[attr-defined]
                                    "iwprobe_enroll_token": enroll_token,
                                    "iwprobe_pyz_src": str(pyz),
                                    "iwprobe_install_dir": str(root / "lib"),
                                    "iwprobe_bin": str(root / "bin" / "iwprobe"),
                                    "iwprobe_state_dir": str(root / "state"),
                                    "iwprobe_user": "root",
                                    "iwprobe_group": "root",
                                    "iwprobe_create_user": False,
                                    "iwprobe_manage_systemd": False,
                                    "iwprobe_python": sys.executable,
                                    "iwprobe_country": "ZA",
                                    "iwprobe_labels": {"access": "lab", "tier": "test"},
                                }
                            },
                        }
                    }
                }
            }
        }
    }
    (root / "bin").mkdir(parents=True)
    inventory_path = tmp_path / "inventory.json"
    inventory_path.write_text(json.dumps(inventory))
    env = _ansible_env(tmp_path)
    first = subprocess.run(
        [playbook, "-i", str(inventory_path), str(ANSIBLE / "site.yml")],
        cwd=ANSIBLE,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    credentials = root / "state" / "probe.json"
    assert (credentials.stat().st_mode & 0o777) == 0o600
    probe_id = json.loads(credentials.read_text())["id"]
    version = subprocess.run([str(root / "bin" / "iwprobe"), "version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == "0.1.0"
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://", 1)) as connection:
        row = connection.execute("SELECT name, region, country, labels FROM probes WHERE id = %s", (probe_id,)).fetchone()
    assert row == ("localhost", region, "ZA", {"access": "lab", "tier": "test"})
    # A second run changes nothing and does not enroll again.
    second = subprocess.run(
        [playbook, "-i", str(inventory_path), str(ANSIBLE / "site.yml")],
        cwd=ANSIBLE,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert second.returncode == 0, second.stdout[-4000:]
    assert "changed=0" in second.stdout, second.stdout[-3000:]
    assert json.loads(credentials.read_text())["id"] == probe_id
