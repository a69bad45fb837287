"""The rendered chart played by a real container engine: ``podman kube play`` (podman 4.3).

What kube play does as Kubernetes would: Deployments (played with one replica each: on the
host's network a second one would find its port taken, see :func:`for_podman`), their init
containers, ConfigMaps (``envFrom``), ``secretKeyRef`` env, emptyDir volumes, the security
context (read-only root, UID/GID, dropped capabilities, seccomp), images by name and pull
policy.  What it does not, and what stands in for it here:

* **Secrets**: podman 4.3 stores a Secret document of the YAML as written but reads a
  ``secretKeyRef`` as a JSON map of base64 values, so each rendered Secret is created as a
  podman secret in that form (same name, same keys and values) and left out of the play.
* **Jobs** (the migration hook): kube play has no Job; the Job's pod template is played as a
  Pod (``restartPolicy: Never``), before the Deployments, as the ``pre-install`` hook runs
  before them, and its container's exit code is the Job's outcome.
* **Services, their DNS names, and pods' own network namespaces**: every pod joins the host's
  network (``--network host``; podman then refuses port mappings, so the containers' ``ports``
  are dropped and probes get port numbers), so each listener needs a free port (the chart's
  ``containerPort`` values) and reaches PostgreSQL and Redis by URL as an external database
  is reached; ServiceAccounts, NetworkPolicies, PodDisruptionBudgets, HPAs and Ingresses
  have no engine here and are left out (the chart's tests render and lint them).
* **Init containers**: podman 4.3 on this host (runc) starts a Deployment's init container and
  then fails the pod trying to remove it while it still runs, so each Deployment's init
  containers are played first, each as a Pod of its own, in their order (each must exit 0),
  then the Deployment without them -- the order the init containers enforce, kept.
* **Probes**: the liveness probe becomes a podman healthcheck; readiness gates nothing (the
  tests ask ``/readyz`` themselves).
* **Rolling updates** (``helm upgrade``): one pod per Deployment on the host's network, no
  Service to move between an old pod and a new one, and the new pod needs the old one's port:
  :meth:`PlayedChart.replace_workloads` replaces each Deployment's pod (the old one stopped
  with its grace period, then the new one played) -- what the ``Recreate`` strategy does, with
  the window that leaves; the chart's rolling update keeps an old pod serving until a new one
  is ready.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import subprocess
import time
from dataclasses import dataclass, field

import yaml
from chartrender import REPO, Manifest, find

#: What kube play runs; everything else of the chart is listed in the module docstring.
PLAYED_KINDS = ("ConfigMap", "Deployment", "PersistentVolumeClaim")
LEFT_OUT_KINDS = frozenset(
    {"Service", "ServiceAccount", "NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler", "Ingress"}
)
#: Podman's settings, as scripts/image-base.sh takes them (the caller's CONTAINERS_CONF, else the project's).
CONTAINERS_CONF = os.environ.get("CONTAINERS_CONF", str(REPO / "docker" / "podman-containers.conf"))


def podman(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *arguments],
        env={**os.environ, "CONTAINERS_CONF": CONTAINERS_CONF},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _checked(result: subprocess.CompletedProcess[str]) -> str:
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(result.args)} failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return result.stdout


def _secret_data(secret: Manifest) -> dict[str, str]:
    """Key -> base64 value of a Secret (``data`` is base64 already, ``stringData`` is not)."""
    data = dict(secret.get("data") or {})
    for key, value in (secret.get("stringData") or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    return data


def pod_of(name: str, spec: Manifest, containers: list[Manifest]) -> Manifest:
    """A Pod named ``name`` running ``containers`` once (``restartPolicy: Never``) with the rest of
    the pod ``spec`` (volumes, security context, service account) as the chart rendered it."""
    rest = {key: value for key, value in spec.items() if key not in ("initContainers", "containers")}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {**rest, "containers": containers, "restartPolicy": "Never"},
    }


def for_podman(workload: Manifest) -> Manifest:
    """``workload`` as podman 4.3 can play it: on the host's network podman refuses port
    mappings, so each container's ``ports`` go (its process listens on the ``containerPort`` its
    command names) and probes that name a port get its number; one replica (podman plays each
    as a pod ``<name>-pod-<i>``, and a second one's listener would find the port taken); its
    init containers are played before (:meth:`PlayedChart.run_init_containers`), not here."""
    copied: Manifest = json.loads(json.dumps(workload))
    copied["spec"]["replicas"] = 1
    copied["spec"]["template"]["spec"].pop("initContainers", None)
    for container in copied["spec"]["template"]["spec"]["containers"]:
        numbers = {port["name"]: port["containerPort"] for port in container.pop("ports", []) if "name" in port}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            http_get = container.get(probe, {}).get("httpGet")
            if http_get is not None and http_get.get("port") in numbers:
                http_get["port"] = numbers[http_get["port"]]
    return copied


@dataclass
class Replaced:
    """A Deployment's pod replaced (:meth:`PlayedChart.replace_workloads`)."""

    #: Seconds from the old pod's stop to the new one played.
    seconds: float
    #: The old pod's logs through its stop, by container.
    old_logs: dict[str, str]


@dataclass
class PlayedChart:
    """The chart's objects, played by podman in ``directory``; :meth:`down` removes all of it."""

    objects: list[Manifest]
    directory: pathlib.Path
    secrets: list[str] = field(default_factory=list)
    plays: list[pathlib.Path] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)

    def kinds_left_out(self) -> set[str]:
        handled = {*PLAYED_KINDS, "Secret", "Job"}
        unknown = {obj["kind"] for obj in self.objects} - handled - LEFT_OUT_KINDS
        if unknown:
            raise AssertionError(f"the chart renders kinds this harness does not know: {sorted(unknown)}")
        return {obj["kind"] for obj in self.objects} & LEFT_OUT_KINDS

    def create_secrets(self) -> None:
        for secret in (obj for obj in self.objects if obj["kind"] == "Secret"):
            name = secret["metadata"]["name"]
            path = self.directory / f"secret-{name}.json"
            path.write_text(json.dumps(_secret_data(secret)))
            path.chmod(0o600)
            podman("secret", "rm", name)  # a leftover of an interrupted run
            _checked(podman("secret", "create", name, str(path)))
            path.unlink()
            self.secrets.append(name)

    def _play(self, name: str, documents: list[Manifest]) -> pathlib.Path:
        path = self.directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        if path not in self.plays:  # played again after an upgrade: the same pods, kube down once
            self.plays.append(path)
        for document in documents:  # an interrupted run's pods, or the last release's (kube play fails on a name in use)
            if document["kind"] in ("Deployment", "Pod"):
                pod = document["metadata"]["name"] + ("-pod-0" if document["kind"] == "Deployment" else "")
                if pod not in self.pods:
                    self.pods.append(pod)
                podman("pod", "rm", "--force", pod, timeout=300)
        _checked(podman("kube", "play", "--network", "host", "--replace", str(path), timeout=300))
        return path

    def _run_pod(self, pod: Manifest, timeout: float) -> tuple[int, str]:
        """Play ``pod`` (one container, with the ConfigMaps it reads) and wait for it: its exit
        code and log."""
        (container,) = pod["spec"]["containers"]
        configmaps = [obj for obj in self.objects if obj["kind"] == "ConfigMap"]
        self._play(f"pod-{pod['metadata']['name']}", [*configmaps, pod])
        name = f"{pod['metadata']['name']}-{container['name']}"
        exited = int(_checked(podman("wait", name, timeout=timeout)).strip().splitlines()[-1])
        log = podman("logs", name)
        return exited, log.stdout + log.stderr

    def run_job(self, name: str, timeout: float = 300) -> tuple[int, str]:
        """Play the Job named ``*name`` as a Pod; its exit code and log."""
        job = find(self.objects, "Job", name)
        spec = job["spec"]["template"]["spec"]
        return self._run_pod(pod_of(job["metadata"]["name"], spec, spec["containers"]), timeout)

    def run_init_containers(self, timeout: float = 300) -> dict[str, tuple[int, str]]:
        """Each Deployment's init containers, each played as a Pod of its own in their order (the
        next only after the last exited 0): exit code and log by Deployment."""
        outcomes = {}
        for workload in (obj for obj in self.objects if obj["kind"] == "Deployment"):
            spec = workload["spec"]["template"]["spec"]
            code, logs = 0, ""
            for index, init in enumerate(spec.get("initContainers", [])):
                code, log = self._run_pod(pod_of(f"{workload['metadata']['name']}-init{index}", spec, [init]), timeout)
                logs += log
                if code != 0:
                    break
            if spec.get("initContainers"):
                outcomes[workload["metadata"]["name"]] = (code, logs)
        return outcomes

    def http_port(self, deployment: str) -> int:
        """The ``http`` containerPort of the Deployment named ``*deployment`` (its listener here)."""
        container = find(self.objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
        return int(next(port["containerPort"] for port in container["ports"] if port["name"] == "http"))

    def play_workloads(self) -> None:
        self._play(
            "workloads",
            [for_podman(obj) if obj["kind"] == "Deployment" else obj for obj in self.objects if obj["kind"] in PLAYED_KINDS],
        )

    def upgrade(self, objects: list[Manifest]) -> None:
        """``helm upgrade`` of this release to the chart rendered as ``objects`` (same release, so
        same names): from here on the Job, the init containers and the Deployments played are the
        new ones, while the pods already playing serve on until :meth:`replace_workloads` -- as a
        cluster runs the ``pre-upgrade`` hook while the old pods serve.  The Secrets must be those
        created (helm would update a changed one in place; a podman secret a running container
        reads cannot change), so a changed one is an error, not a silent mix of the two releases."""

        def secrets_of(chart: list[Manifest]) -> dict[str, dict[str, str]]:
            return {obj["metadata"]["name"]: _secret_data(obj) for obj in chart if obj["kind"] == "Secret"}

        if secrets_of(objects) != secrets_of(self.objects):
            raise ValueError("the upgrade changes the release's Secrets, which this harness cannot replace under running pods")
        self.objects = objects

    def replace_workloads(self) -> dict[str, Replaced]:
        """Each Deployment's pod replaced by that of :attr:`objects` (after :meth:`upgrade`), one
        Deployment after the other: the old pod stopped (SIGTERM, then its grace period), its
        containers' logs kept, the pod removed and the new one played without its init
        containers (run them first: :meth:`run_init_containers`).  Kube play cannot roll (see
        the module docstring): each Deployment serves nothing from its old pod's stop until its
        new process listens.  By Deployment: how long the stop and the play took (not the new
        process's own start-up) and the old pod's logs through its stop."""
        configmaps = [obj for obj in self.objects if obj["kind"] == "ConfigMap"]
        replaced = {}
        for workload in (obj for obj in self.objects if obj["kind"] == "Deployment"):
            name = workload["metadata"]["name"]
            started = time.monotonic()
            podman("pod", "stop", f"{name}-pod-0", timeout=300)
            logs = {}
            for container in workload["spec"]["template"]["spec"]["containers"]:
                log = podman("logs", f"{name}-pod-0-{container['name']}")
                logs[container["name"]] = log.stdout + log.stderr
            self._play(f"workload-{name}", [*configmaps, for_podman(workload)])
            replaced[name] = Replaced(time.monotonic() - started, logs)
        return replaced

    def container(self, deployment: str, container: str) -> str:
        """The podman name of ``container`` in the pod of the Deployment named ``*deployment``."""
        return f"{find(self.objects, 'Deployment', deployment)['metadata']['name']}-pod-0-{container}"

    def exec(self, deployment: str, container: str, *command: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.container(deployment, container), *command)

    def create_token(self, kind: str, label: str) -> str:
        """The chart's NOTES command: ``iwscope token create --kind KIND`` in the API container;
        the token it prints."""
        created = self.exec("api", "api", "iwscope", "token", "create", "--kind", kind, "--label", label)
        assert created.returncode == 0, created.stderr
        return created.stdout.strip()

    def logs(self, deployment: str, container: str) -> str:
        result = podman("logs", self.container(deployment, container))
        return result.stdout + result.stderr

    def down(self) -> None:
        for path in reversed(self.plays):
            podman("kube", "down", str(path), timeout=120)
        for pod in self.pods:  # what a failed play left (kube down removes only what it made)
            podman("pod", "rm", "--force", pod)
        for name in self.secrets:
            podman("secret", "rm", name)
