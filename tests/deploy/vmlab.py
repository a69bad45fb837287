"""Virtual machines on the lab's emulated links: qemu guests booted from the image
``scripts/vm-image.sh`` makes, each one behind a lab host's access link.

Where a VM sits: lab host ``i`` (a namespace ``<run>-<host>``, address ``10.N.i.2``) routes the
upper half of its /24, ``10.N.i.128/25``, to a TAP device whose address ``10.N.i.129`` is the
guest's gateway; the guest is ``10.N.i.130``, and the run's core routes that /25 over the host's
emulated link.  So every packet of the guest crosses the host's emulated link and the core, as
the namespace's own packets do; guests reach each other through both their links, and the root
namespace (the collector stack on the lab's service address, where the test also runs Ansible)
reaches them over the run's veth, whose route covers the run's 10.N.0.0/16.  Nothing is added
outside the run's namespaces: the route and the TAP go with them.

What qemu is asked for: TCG (this box's KVM hangs guests), the kernel and initrd given
directly (no boot loader in the image), a copy-on-write overlay of the image per VM, the
NoCloud seed as an ISO 9660 volume labelled ``cidata`` (cloud-init's own convention), a
virtio NIC on the TAP, the serial console into a file: the boot log that tests read and
print on failure.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chartrender import REPO

#: Memory of each guest (cloud-init and the probe's Python fit in it with room).
GUEST_MEMORY_MB = 768
#: A TCG boot to the end of cloud-init measured 97 s with a CI run beside it; three VMs boot at once.
BOOT_TIMEOUT_S = 900.0
#: The guest's interface name (``net.ifnames=0``) and MAC (one VM per namespace: the same MAC is fine).
GUEST_INTERFACE = "eth0"
GUEST_MAC = "52:54:00:69:77:01"
TAP_DEVICE = "vm0"


@dataclass(frozen=True)
class VmImage:
    """The image and the kernel and initrd it boots with."""

    root: Path
    kernel: Path
    initrd: Path


def vm_image() -> VmImage:
    """Make (or take the cached) image with ``scripts/vm-image.sh``."""
    made = subprocess.run([str(REPO / "scripts" / "vm-image.sh")], capture_output=True, text=True, timeout=1800, check=False)
    if made.returncode != 0:
        raise RuntimeError(f"scripts/vm-image.sh failed:\n{made.stderr[-3000:]}")
    root, kernel, initrd = made.stdout.strip().splitlines()[-3:]
    return VmImage(Path(root), Path(kernel), Path(initrd))


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


class LabVm:
    """One guest behind the access link of lab host ``host``."""

    def __init__(self, topo: Any, host: str, image: VmImage, workdir: Path) -> None:
        self.topo = topo
        self.host = host
        self.image = image
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        placed = topo.host(host)
        guest_net = list(ipaddress.ip_network(f"{placed.address}/24", strict=False).subnets(1))[1]  # 10.N.i.128/25
        self.prefixlen = guest_net.prefixlen
        self.gateway = str(guest_net.network_address + 1)
        self.address: str = str(guest_net.network_address + 2)
        self.guest_net = str(guest_net)
        self.core_device: str = placed.core_device
        self.netns: str = placed.netns
        self.console_path = workdir / "console.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    # -- provisioning
    def network_config(self) -> str:
        """cloud-init network configuration (version 1): the static address and its gateway."""
        return (
            "version: 1\n"
            "config:\n"
            "  - type: physical\n"
            f"    name: {GUEST_INTERFACE}\n"
            f'    mac_address: "{GUEST_MAC}"\n'
            "    subnets:\n"
            "      - type: static\n"
            f"        address: {self.address}/{self.prefixlen}\n"
            f"        gateway: {self.gateway}\n"
        )

    def write_seed(self, user_data: str) -> Path:
        """The NoCloud seed (user-data as given, meta-data, network-config) as a ``cidata`` ISO."""
        seed = self.workdir / "seed"
        shutil.rmtree(seed, ignore_errors=True)
        seed.mkdir()
        (seed / "user-data").write_text(user_data, encoding="utf-8")
        (seed / "meta-data").write_text(
            f"instance-id: {self.host}-{os.getpid()}\nlocal-hostname: {self.host}\n", encoding="utf-8"
        )
        (seed / "network-config").write_text(self.network_config(), encoding="utf-8")
        iso = self.workdir / "seed.iso"
        _run(
            [
                "genisoimage",
                "-quiet",
                "-output",
                str(iso),
                "-volid",
                "cidata",
                "-joliet",
                "-rock",
                *map(str, sorted(seed.iterdir())),
            ]
        )
        return iso

    # -- lifecycle
    def boot(self, user_data: str) -> None:
        """Wire the guest's address to the host's link and start qemu in the host's namespace."""
        iso = self.write_seed(user_data)
        overlay = self.workdir / "disk.qcow2"
        overlay.unlink(missing_ok=True)
        _run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.image.root), "-F", "raw", str(overlay)])
        namespace = ["ip", "-n", self.netns]
        _run([*namespace, "tuntap", "add", "dev", TAP_DEVICE, "mode", "tap"])
        _run([*namespace, "addr", "add", f"{self.gateway}/{self.prefixlen}", "dev", TAP_DEVICE])
        _run([*namespace, "link", "set", TAP_DEVICE, "up"])
        _run(["ip", "netns", "exec", self.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        # The TUN link is layer 3: the core needs no next hop, only the device.
        _run(["ip", "-n", self.topo.core_netns, "route", "add", self.guest_net, "dev", self.core_device])
        argv = [
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-m",
            str(GUEST_MEMORY_MB),
            "-smp",
            "1",
            "-nographic",
            "-monitor",
            "none",
            "-no-reboot",
            "-kernel",
            str(self.image.kernel),
            "-initrd",
            str(self.image.initrd),
            "-append",
            "root=/dev/vda rw console=ttyS0 net.ifnames=0",
            "-drive",
            f"file={overlay},if=virtio,format=qcow2",
            "-drive",
            f"file={iso},if=virtio,media=cdrom,readonly=on",
            "-netdev",
            f"tap,id=net0,ifname={TAP_DEVICE},script=no,downscript=no",
            "-device",
            f"virtio-net-pci,netdev=net0,mac={GUEST_MAC}",
            "-serial",
            f"file:{self.console_path}",
        ]
        self.started_at = time.monotonic()
        with open(self.workdir / "qemu.log", "wb") as log:
            self.process = self.topo.popen(self.host, argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def console(self) -> str:
        return self.console_path.read_text(errors="replace") if self.console_path.exists() else ""

    def wait_console(self, pattern: str, timeout_s: float = BOOT_TIMEOUT_S) -> float:
        """Seconds from boot until the regular expression ``pattern`` matches the serial console."""
        deadline = time.monotonic() + timeout_s
        while re.search(pattern, self.console()) is None:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"qemu of {self.host} exited ({self.process.returncode}):\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.host}: {pattern!r} not on the console within {timeout_s} s:\n{self.tail()}")
            time.sleep(1.0)
        return time.monotonic() - self.started_at

    def wait_booted(self, timeout_s: float = BOOT_TIMEOUT_S) -> float:
        """Seconds from boot until cloud-init's last stage finished."""
        return self.wait_console(r"Cloud-init v\. \S+ finished at ", timeout_s)

    def tail(self, lines: int = 60) -> str:
        qemu = self.workdir / "qemu.log"
        own = qemu.read_text(errors="replace") if qemu.exists() else ""
        return own + "\n".join(self.console().splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
