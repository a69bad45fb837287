"""Run a container of the rendered chart natively, as close to its pod as one machine allows.

What is taken from the chart: the command and args, the environment (ConfigMap via envFrom,
Secret keys via secretKeyRef, plain values), the working directory, the probes.
What is taken from docker/collector.Dockerfile: the runtime stage's ENV (paths inside the
image mapped to the repository, e.g. /app/migrations -> migrations/).
What stands in for the pod: a UTS namespace whose hostname is the pod name (and HOSTNAME set,
as the kubelet does), a mount namespace whose root filesystem is read-only
(readOnlyRootFilesystem) with a fresh tmpfs on /tmp (the chart's emptyDir), and the
virtualenv's bin directory on PATH in place of the image's site-packages.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from chartrender import REPO, Manifest, of_kind

DOCKERFILE = REPO / "docker" / "collector.Dockerfile"
EVERY_INTERFACE = "0.0.0.0"
LOOPBACK = "127.0.0.1"
VENV_BIN = pathlib.Path(sys.executable).parent
#: `sh -c` script run by unshare: pod hostname, read-only root, emptyDir /tmp, workdir.
#: A checkout under /tmp (CI may clone there) is kept visible, read-only, through the tmpfs:
#: it is parked on /mnt before /tmp is covered and bound back afterwards.
SANDBOX_SCRIPT = (
    'hostname "$0" && '
    'if [ -n "$IWT_KEEP" ]; then mount --bind "$IWT_KEEP" /mnt; fi && '
    "mount -o remount,bind,ro / && mount -t tmpfs -o size=256m,mode=1777 tmpfs /tmp && "
    'if [ -n "$IWT_KEEP" ]; then mkdir -p "$IWT_KEEP" && mount --bind /mnt "$IWT_KEEP" && '
    'mount -o remount,bind,ro "$IWT_KEEP"; fi && '
    'cd "$IWT_WORKDIR" && unset IWT_WORKDIR IWT_KEEP && exec "$@"'
)
#: The checkout, when the sandbox's tmpfs on /tmp would hide it.
KEEP_DIR = str(REPO) if pathlib.Path("/tmp") in REPO.resolve().parents else ""


def dockerfile_runtime_stage(path: pathlib.Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the last stage, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line[:-1].strip()}" if line.endswith("\\") else f"{pending} {line}"
        if line.endswith("\\"):
            continue
        word, _, rest = pending.strip().partition(" ")
        if word.upper() == "FROM":
            instructions = []
        instructions.append((word.upper(), rest.strip()))
        pending = ""
    return instructions


def image_environment() -> dict[str, str]:
    """ENV of the runtime stage, with paths the image COPYs from the repository mapped back."""
    copies: dict[str, pathlib.Path] = {}
    environment: dict[str, str] = {}
    for word, arguments in dockerfile_runtime_stage():
        parts = shlex.split(arguments)
        if word == "COPY":
            sources = [p for p in parts if not p.startswith("--")]
            copies[sources[-1].rstrip("/")] = REPO / sources[0].rstrip("/")
        elif word == "ENV":
            for assignment in parts:
                name, _, value = assignment.partition("=")
                environment[name] = value
    return {name: str(copies.get(value.rstrip("/"), value)) for name, value in environment.items()}


def _expand(text: str, environment: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion of command and args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: environment.get(m.group(1), m.group(0)), text)


@dataclass
class PodContainer:
    """One container of a rendered workload, ready to run natively."""

    pod_name: str
    spec: dict[str, Any]
    environment: dict[str, str]
    log_dir: pathlib.Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def from_chart(
        cls, objects: list[Manifest], workload: Manifest, container_name: str, pod_name: str, log_dir: pathlib.Path
    ) -> PodContainer:
        spec = workload["spec"]["template"]["spec"]
        candidates = [c for c in [*(spec.get("initContainers") or []), *spec["containers"]] if c["name"] == container_name]
        assert len(candidates) == 1, f"{workload['metadata']['name']} has no container {container_name}"
        container = candidates[0]
        config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in of_kind(objects, "ConfigMap")}
        secrets = {
            o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o.get("data", {}).items()}
            for o in of_kind(objects, "Secret")
        }
        environment = {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            **image_environment(),
            "HOSTNAME": pod_name,
        }
        for source in container.get("envFrom", []):
            environment.update(config_maps[source["configMapRef"]["name"]])
        for variable in container.get("env", []):
            if "value" in variable:
                environment[variable["name"]] = _expand(str(variable["value"]), environment)
                continue
            reference = variable["valueFrom"]["secretKeyRef"]
            value = secrets[reference["name"]].get(reference["key"])
            if value is None:
                assert reference.get("optional"), f"secret key {reference} missing and not optional"
                continue
            environment[variable["name"]] = value
        log_dir.mkdir(parents=True, exist_ok=True)
        return cls(pod_name, container, environment, log_dir)

    @property
    def argv(self) -> list[str]:
        return [_expand(part, self.environment) for part in [*self.spec.get("command", []), *self.spec.get("args", [])]]

    def _sandboxed(self, argv: list[str]) -> list[str]:
        # A pod's "every interface" is its own network namespace; this sandbox shares the
        # machine's, where 0.0.0.0 would serve the test's API to the network: loopback instead.
        argv = [
            LOOPBACK if (part == EVERY_INTERFACE and previous in ("--host", "--bind")) else part
            for previous, part in zip(["", *argv], argv, strict=False)
        ]
        return ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", SANDBOX_SCRIPT, self.pod_name, *argv]

    def _workdir_environment(self) -> dict[str, str]:
        # Without workingDir the image's WORKDIR (/app, read-only) applies: the repository here.
        return {**self.environment, "IWT_WORKDIR": self.spec.get("workingDir", str(REPO)), "IWT_KEEP": KEEP_DIR}

    def start(self, argv: list[str] | None = None, log_name: str | None = None) -> subprocess.Popen[bytes]:
        """Start the container's command (or ``argv`` inside the same kind of sandbox)."""
        with open(self.log_dir / f"{log_name or self.spec['name']}.log", "wb") as log:
            process = subprocess.Popen(
                self._sandboxed(argv or self.argv),
                env=self._workdir_environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def run(
        self, argv: list[str] | None = None, timeout: float = 120.0, extra_environment: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run to completion (a Job, an exec probe, or ``kubectl exec`` of ``argv``)."""
        return subprocess.run(
            self._sandboxed(argv or self.argv),
            env={**self._workdir_environment(), **(extra_environment or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def log(self, log_name: str | None = None) -> str:
        path = self.log_dir / f"{log_name or self.spec['name']}.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def stop(self, grace_seconds: float = 15.0) -> None:
        """SIGTERM the process group (as the kubelet does), SIGKILL after the grace period."""
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + grace_seconds
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def wait_until(condition: Any, timeout: float, interval: float = 0.5, what: str = "condition") -> Any:
    """Poll ``condition()`` until it returns a truthy value; raise TimeoutError with ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(interval)
