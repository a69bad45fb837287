"""The Helm chart (docs/deployment.md): lint, render, Kubernetes-schema validation of every object, and
assertions on what the rendered objects do (hooks, probes, security, secrets, checksums)."""

from __future__ import annotations

import base64
import json
import pathlib
import re
import shlex
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from celery import Celery
from chartrender import (
    CHART,
    CI_VALUE_SETS,
    NAMESPACE,
    HelmFailed,
    Manifest,
    containers,
    deep_merge,
    find,
    helm_lint,
    helm_template,
    of_kind,
    pod_spec,
    workloads,
)

#: Kubernetes versions every rendered object must validate against: the chart's kubeVersion
#: floor, the version helm 3.16 assumes, and the newest schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ["1.25.0", "1.31.0", kubernetes_validate.latest_version()]
APP_COMPONENTS = ("api", "worker", "beat", "dashboard")
HOOK = "helm.sh/hook"
EXTERNAL = "external-db-values"
INGRESS_HPA = "ingress-hpa-values"
DEFAULT = "default-values"
BUILTIN = "builtin-values"
IMAGE_USER = 10001


def test_the_four_ci_value_sets_exist() -> None:
    assert set(CI_VALUE_SETS) == {DEFAULT, EXTERNAL, INGRESS_HPA, BUILTIN}


@pytest.mark.parametrize("value_set", sorted(CI_VALUE_SETS))
def test_helm_lint_strict(helm: pathlib.Path, value_set: str) -> None:
    output = helm_lint(helm, [CI_VALUE_SETS[value_set]])
    assert "0 chart(s) failed" in output, output
    assert "[ERROR]" not in output and "[WARNING]" not in output, output


@pytest.mark.parametrize("value_set", sorted(CI_VALUE_SETS))
@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(
    rendered_sets: dict[str, list[Manifest]], value_set: str, kubernetes_version: str
) -> None:
    objects = rendered_sets[value_set]
    assert len(objects) >= 12
    problems = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {error.message} at {list(error.path)}")
    assert not problems, "\n".join(problems)


def test_schema_validation_catches_a_broken_object(rendered_sets: dict[str, list[Manifest]]) -> None:
    """Negative control: the validator is strict, so a misspelt field in a real object fails."""
    api = json.loads(json.dumps(find(rendered_sets[EXTERNAL], "Deployment", "api")))
    pod_spec(api)["containers"][0]["readinessprobe"] = pod_spec(api)["containers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, KUBERNETES_VERSIONS[1], strict=True)


@pytest.mark.parametrize("value_set", sorted(CI_VALUE_SETS))
def test_objects_reference_each_other_consistently(rendered_sets: dict[str, list[Manifest]], value_set: str) -> None:
    objects = rendered_sets[value_set]
    for obj in objects:
        assert obj["metadata"].get("namespace") in (None, NAMESPACE)
        assert len(obj["metadata"]["name"]) <= 63
    names = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
    pod_templates = [(w, w["spec"]["template"]) for w in workloads(objects)]
    for service in of_kind(objects, "Service"):
        selector = service["spec"]["selector"]
        targets = [w for w, template in pod_templates if selector.items() <= template["metadata"]["labels"].items()]
        assert len(targets) == 1, f"Service {service['metadata']['name']} selects {len(targets)} workloads"
        target_ports = {port["name"] for c in pod_spec(targets[0])["containers"] for port in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in target_ports
    for budget in of_kind(objects, "PodDisruptionBudget"):
        labels = budget["spec"]["selector"]["matchLabels"]
        assert [w for w, t in pod_templates if labels.items() <= t["metadata"]["labels"].items()]
    for workload in workloads(objects):
        spec = pod_spec(workload)
        account = spec.get("serviceAccountName", "default")
        assert account == "default" or ("ServiceAccount", account) in names
        for container in containers(workload):
            for source in container.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in names
            mounts = {mount["name"] for mount in container.get("volumeMounts", [])}
            volumes = {volume["name"] for volume in spec.get("volumes", [])}
            claims = {claim["metadata"]["name"] for claim in workload["spec"].get("volumeClaimTemplates", [])}
            assert mounts <= volumes | claims, f"{workload['metadata']['name']}: {mounts - volumes - claims}"
    for scaler in of_kind(objects, "HorizontalPodAutoscaler"):
        target = scaler["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) in names
        assert 1 <= scaler["spec"]["minReplicas"] <= scaler["spec"]["maxReplicas"]
        assert "replicas" not in find(objects, "Deployment", target["name"])["spec"]
    for ingress in of_kind(objects, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                service = find(objects, "Service", backend["name"])
                assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}


@pytest.mark.parametrize("value_set", sorted(CI_VALUE_SETS))
def test_all_components_are_deployed(rendered_sets: dict[str, list[Manifest]], value_set: str) -> None:
    objects = rendered_sets[value_set]
    for component in APP_COMPONENTS:
        find(objects, "Deployment", component)
    for component in ("api", "dashboard"):
        find(objects, "Service", component)
    find(objects, "ConfigMap", "config")
    find(objects, "ServiceAccount", "iwscope")
    assert len(of_kind(objects, "Job")) == 1
    assert {b["metadata"]["name"].rsplit("-", 1)[-1] for b in of_kind(objects, "PodDisruptionBudget")} == {
        "api",
        "worker",
        "dashboard",
    }
    builtin = value_set in (DEFAULT, BUILTIN)
    assert {s["metadata"]["name"].rsplit("-", 1)[-1] for s in of_kind(objects, "StatefulSet")} == (
        {"postgresql", "redis"} if builtin else set()
    )


def test_ingress_and_autoscalers_when_enabled(rendered_sets: dict[str, list[Manifest]]) -> None:
    objects = rendered_sets[INGRESS_HPA]
    ingress = find(objects, "Ingress", "iwscope")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"][0]["secretName"] == "iwscope-tls"
    backends = {p["path"]: p["backend"]["service"]["name"] for p in ingress["spec"]["rules"][0]["http"]["paths"]}
    assert backends["/api"].endswith("-api") and backends["/"].endswith("-dashboard")
    scalers = {h["spec"]["scaleTargetRef"]["name"].rsplit("-", 1)[-1]: h for h in of_kind(objects, "HorizontalPodAutoscaler")}
    assert set(scalers) == {"api", "worker"}
    assert scalers["api"]["spec"]["maxReplicas"] == 6
    assert {m["resource"]["name"] for m in scalers["api"]["spec"]["metrics"]} == {"cpu", "memory"}
    for other in (DEFAULT, EXTERNAL, BUILTIN):
        assert not of_kind(rendered_sets[other], "Ingress")
        assert not of_kind(rendered_sets[other], "HorizontalPodAutoscaler")


# --- migrations -----------------------------------------------------------------------


def test_migration_job_is_a_pre_install_pre_upgrade_hook(rendered_sets: dict[str, list[Manifest]]) -> None:
    objects = rendered_sets[EXTERNAL]
    job = find(objects, "Job", "migrate")
    annotations = job["metadata"]["annotations"]
    assert annotations[HOOK] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert int(annotations["helm.sh/hook-weight"]) == 0
    assert containers(job)[0]["command"] == ["iwscope", "db", "upgrade"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    # At pre-install the release's Secret does not exist: the Job reads a hook-scoped copy
    # created before it (lower weight), not the regular Secret.
    hook_secret = find(objects, "Secret", "migrate")
    assert hook_secret["metadata"]["annotations"][HOOK] == "pre-install,pre-upgrade"
    assert int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    assert hook_secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in containers(job)[0]["env"] if "valueFrom" in e}
    assert refs["DATABASE_URL"]["name"] == hook_secret["metadata"]["name"]
    assert refs["DATABASE_URL"]["key"] in hook_secret["data"]
    assert not containers(job)[0].get("envFrom"), "a pre-install hook cannot read the release's ConfigMap"
    # Nothing else is a hook: regular objects are managed (and deleted) by the release.
    hooks = sorted(o["metadata"]["name"] for o in objects if HOOK in (o["metadata"].get("annotations") or {}))
    assert hooks == sorted([job["metadata"]["name"], hook_secret["metadata"]["name"]])


@pytest.mark.parametrize("value_set", [INGRESS_HPA, DEFAULT, BUILTIN])
def test_migration_job_is_a_plain_job_without_hooks(rendered_sets: dict[str, list[Manifest]], value_set: str) -> None:
    """GitOps (useHelmHooks false) and the built-in database: no Helm hook annotations at all."""
    objects = rendered_sets[value_set]
    assert not [o for o in objects if HOOK in (o["metadata"].get("annotations") or {})]
    job = find(objects, "Job", next(j["metadata"]["name"] for j in of_kind(objects, "Job")))
    assert re.fullmatch(r".+-migrate-[0-9a-f]{8}", job["metadata"]["name"]), job["metadata"]["name"]
    assert containers(job)[0]["command"] == ["iwscope", "db", "upgrade"]


def test_plain_migration_job_name_follows_the_image(helm: pathlib.Path) -> None:
    """A Job's pod template is immutable: a new image must give a new Job name."""
    values = [CI_VALUE_SETS[INGRESS_HPA]]
    first = of_kind(helm_template(helm, values, {"image": {"tag": "1.0.0"}}), "Job")[0]["metadata"]["name"]
    again = of_kind(helm_template(helm, values, {"image": {"tag": "1.0.0"}}), "Job")[0]["metadata"]["name"]
    other = of_kind(helm_template(helm, values, {"image": {"tag": "1.0.1"}}), "Job")[0]["metadata"]["name"]
    assert first == again != other


@pytest.mark.parametrize("value_set", sorted(CI_VALUE_SETS))
def test_only_the_job_migrates_and_every_other_pod_waits_for_the_schema(
    rendered_sets: dict[str, list[Manifest]], value_set: str
) -> None:
    objects = rendered_sets[value_set]
    for workload in workloads(objects):
        commands = [" ".join(c.get("command", []) + c.get("args", [])) for c in containers(workload)]
        if workload["kind"] == "Job":
            assert commands == ["iwscope db upgrade"]
            continue
        assert not [c for c in commands if "db upgrade" in c], workload["metadata"]["name"]
        if workload["kind"] == "Deployment":
            init = pod_spec(workload)["initContainers"]
            assert [c["name"] for c in init] == ["wait-for-schema"]
            assert init[0]["command"][:2] == ["sh", "-c"]
            assert re.search(r"until iwscope db check; do .*sleep \d+;\s*done", init[0]["command"][2])


# --- probes -----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(CI_VALUE_SETS))
def test_readiness_and_liveness_probes(rendered_sets: dict[str, list[Manifest]], value_set: str) -> None:
    objects = rendered_sets[value_set]
    api = pod_spec(find(objects, "Deployment", "api"))["containers"][0]
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert "--port" in api["command"]
    assert int(api["command"][api["command"].index("--port") + 1]) == api["ports"][0]["containerPort"]
    dashboard = pod_spec(find(objects, "Deployment", "dashboard"))["containers"][0]
    assert dashboard["readinessProbe"]["httpGet"]["port"] == "http"
    assert dashboard["livenessProbe"]["httpGet"]["port"] == "http"
    worker = pod_spec(find(objects, "Deployment", "worker"))["containers"][0]
    probe = worker["livenessProbe"]["exec"]["command"]
    assert probe[:2] == ["sh", "-c"]
    ping = shlex.split(probe[2])
    assert ping[:2] == ["celery", "-A"] and ping[3:5] == ["inspect", "ping"]
    # The probe pings exactly this pod's worker: the node name the worker is started with,
    # with the pod hostname (%h for celery, $HOSTNAME for the shell) filled in.
    node_name = worker["command"][worker["command"].index("--hostname") + 1]
    assert ping[ping.index("-d") + 1] == node_name.replace("%h", "$HOSTNAME")
    assert worker["livenessProbe"]["timeoutSeconds"] > int(ping[ping.index("--timeout") + 1])
    assert "readinessProbe" not in pod_spec(find(objects, "Deployment", "beat"))["containers"][0]


def test_worker_probe_names_the_real_celery_app(rendered_sets: dict[str, list[Manifest]]) -> None:
    """The `-A module:attribute` of the probe resolves to the collector's Celery app."""
    import importlib

    worker = pod_spec(find(rendered_sets[EXTERNAL], "Deployment", "worker"))["containers"][0]
    ping = shlex.split(worker["livenessProbe"]["exec"]["command"][2])
    module_name, attribute = ping[2].split(":")
    assert isinstance(getattr(importlib.import_module(module_name), attribute), Celery)


# --- security -----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(CI_VALUE_SETS))
def test_security_context_on_every_container(rendered_sets: dict[str, list[Manifest]], value_set: str) -> None:
    checked = 0
    for workload in workloads(rendered_sets[value_set]):
        spec = pod_spec(workload)
        pod_context = spec["securityContext"]
        assert spec["automountServiceAccountToken"] is False
        assert pod_context["runAsNonRoot"] is True
        assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
        iwscope_pod = workload["metadata"]["labels"]["app.kubernetes.io/component"] not in ("postgresql", "redis")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in containers(workload):
            context = container["securityContext"]
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert context["runAsNonRoot"] is True, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], where
            tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{where}: /tmp must be a writable emptyDir"
            if iwscope_pod:
                assert context["runAsUser"] == IMAGE_USER and pod_context["runAsUser"] == IMAGE_USER, where
            if container.get("workingDir"):
                assert container["workingDir"] == "/tmp", f"{where}: working directory must be writable"
            checked += 1
    assert checked >= 9


# --- secrets ----------------------------------------------------------------------------


def _secret_refs(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
    }


def test_chart_created_secret_holds_the_urls_and_tokens(rendered_sets: dict[str, list[Manifest]]) -> None:
    objects = rendered_sets[EXTERNAL]
    values = yaml.safe_load(CI_VALUE_SETS[EXTERNAL].read_text(encoding="utf-8"))
    secret = find(objects, "Secret", "secrets")
    decoded = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert decoded == {
        "DATABASE_URL": values["postgresql"]["url"],
        "REDIS_URL": values["redis"]["url"],
        "IWSCOPE_ADMIN_TOKEN": values["secret"]["adminToken"],
        "IWSCOPE_ENROLL_TOKEN": values["secret"]["enrollToken"],
    }
    config = find(objects, "ConfigMap", "config")["data"]
    assert not set(config) & set(decoded), "secrets must not leak into the ConfigMap"
    for component in APP_COMPONENTS:
        deployment = find(objects, "Deployment", component)
        for container in containers(deployment):
            refs = _secret_refs(container)
            assert {"DATABASE_URL", "REDIS_URL"} <= set(refs)
            for name, ref in refs.items():
                assert ref["name"] == secret["metadata"]["name"] and ref["key"] == name
            # Bootstrap tokens only where they are used: the API container.
            has_tokens = {"IWSCOPE_ADMIN_TOKEN", "IWSCOPE_ENROLL_TOKEN"} <= set(refs)
            assert has_tokens == (component == "api" and container["name"] == "api"), container["name"]


def test_existing_secret_is_honoured(rendered_sets: dict[str, list[Manifest]]) -> None:
    objects = rendered_sets[INGRESS_HPA]
    assert not of_kind(objects, "Secret"), "with existingSecret the chart creates no Secret"
    expected_keys = {
        "DATABASE_URL": "database-url",
        "REDIS_URL": "redis-url",
        "IWSCOPE_ADMIN_TOKEN": "admin-token",
        "IWSCOPE_ENROLL_TOKEN": "enroll-token",
    }
    seen: set[str] = set()
    for workload in workloads(objects):
        for container in containers(workload):
            for name, ref in _secret_refs(container).items():
                assert ref["name"] == "iwscope-prod"
                assert ref["key"] == expected_keys[name]
                assert ref.get("optional", False) == name.startswith("IWSCOPE_"), name
                seen.add(name)
    assert seen == set(expected_keys)


def test_builtin_datastores_share_the_generated_passwords(rendered_sets: dict[str, list[Manifest]]) -> None:
    """One render, one password: the URL the apps use matches the datastores' password."""
    objects = rendered_sets[DEFAULT]
    data = {k: base64.b64decode(v).decode() for k, v in find(objects, "Secret", "secrets")["data"].items()}
    assert len(data["POSTGRES_PASSWORD"]) == 32 and len(data["REDIS_PASSWORD"]) == 32
    assert data["DATABASE_URL"] == (
        f"postgresql+psycopg://iwscope:{data['POSTGRES_PASSWORD']}"
        f"@{find(objects, 'Service', 'postgresql')['metadata']['name']}:5432/iwscope"
    )
    assert data["REDIS_URL"] == (
        f"redis://:{data['REDIS_PASSWORD']}@{find(objects, 'Service', 'redis')['metadata']['name']}:6379/0"
    )
    postgres = pod_spec(find(objects, "StatefulSet", "postgresql"))["containers"][0]
    assert _secret_refs(postgres)["POSTGRES_PASSWORD"]["key"] == "POSTGRES_PASSWORD"


# --- singletons, checksums, schema -----------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(CI_VALUE_SETS))
def test_beat_is_exactly_one_pod(rendered_sets: dict[str, list[Manifest]], value_set: str) -> None:
    objects = rendered_sets[value_set]
    beat = find(objects, "Deployment", "beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    targets = {h["spec"]["scaleTargetRef"]["name"] for h in of_kind(objects, "HorizontalPodAutoscaler")}
    assert beat["metadata"]["name"] not in targets


def test_beat_replicas_cannot_be_raised(helm: pathlib.Path) -> None:
    with pytest.raises(HelmFailed, match="beat"):
        helm_template(helm, [CI_VALUE_SETS[EXTERNAL]], {"beat": {"replicas": 2}})


def _checksums(objects: list[Manifest]) -> dict[str, dict[str, str]]:
    return {
        component: {
            k: v
            for k, v in find(objects, "Deployment", component)["spec"]["template"]["metadata"]["annotations"].items()
            if k.startswith("checksum/")
        }
        for component in APP_COMPONENTS
    }


def test_checksum_annotations_roll_pods_on_config_and_secret_changes(helm: pathlib.Path) -> None:
    base = [CI_VALUE_SETS[EXTERNAL]]
    original = _checksums(helm_template(helm, base))
    assert _checksums(helm_template(helm, base)) == original, "renders must be deterministic"
    for sums in original.values():
        assert set(sums) == {"checksum/config", "checksum/secret"}
        assert all(re.fullmatch(r"[0-9a-f]{64}", value) for value in sums.values())
    config_changed = _checksums(helm_template(helm, base, {"config": {"logLevel": "DEBUG"}}))
    secret_changed = _checksums(helm_template(helm, base, {"secret": {"adminToken": "another-admin-token-0123"}}))
    for component in APP_COMPONENTS:
        assert config_changed[component]["checksum/config"] != original[component]["checksum/config"]
        assert config_changed[component]["checksum/secret"] == original[component]["checksum/secret"]
        assert secret_changed[component]["checksum/secret"] != original[component]["checksum/secret"]
        assert secret_changed[component]["checksum/config"] == original[component]["checksum/config"]


def test_checksum_follows_existing_secret_name(helm: pathlib.Path) -> None:
    base = [CI_VALUE_SETS[INGRESS_HPA]]
    before = _checksums(helm_template(helm, base))
    after = _checksums(helm_template(helm, base, {"secret": {"existingSecret": "iwscope-prod-v2"}}))
    assert before["api"]["checksum/secret"] != after["api"]["checksum/secret"]


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ({"no_such_value": 1}, "Additional property no_such_value is not allowed"),
        ({"api": {"replicas": 0}}, "api.replicas"),
        ({"config": {"env": "prod"}}, "config.env"),
        ({"config": {"logLevel": "LOUD"}}, "config.logLevel"),
        ({"postgresql": {"url": "mysql://db/iwscope"}}, "postgresql.url"),
        ({"api": {"resources": {"requests": {"cpu": "lots"}}}}, "api.resources.requests.cpu"),
        (
            {"ingress": {"hosts": [{"host": "x.example", "paths": [{"path": "/", "pathType": "Prefix", "service": "worker"}]}]}},
            "service",
        ),
        ({"migrations": {"hookDeletePolicy": "never"}}, "migrations.hookDeletePolicy"),
        ({"worker": {"celeryApp": "not a module"}}, "worker.celeryApp"),
        ({"secret": {"adminToken": "short"}}, "secret.adminToken"),
        ({"config": {"database": {"poolSize": 0}}}, "config.database.poolSize"),
        ({"config": {"database": {"poolTimeoutSeconds": 0}}}, "config.database.poolTimeoutSeconds"),
        ({"config": {"apiThreads": 1}}, "config.apiThreads"),
        ({"config": {"precisionCheckSeconds": 0}}, "config.precisionCheckSeconds"),
        ({"api": {"workers": 0}}, "api.workers"),
        ({"config": {"admission": {"maxInProgress": 0}}}, "config.admission.maxInProgress"),
        ({"config": {"cache": {"credentialSeconds": 3600}}}, "config.cache.credentialSeconds"),
    ],
)
def test_values_schema_rejects_bad_values(helm: pathlib.Path, overrides: dict[str, Any], complaint: str) -> None:
    with pytest.raises(HelmFailed) as failure:
        helm_template(helm, [CI_VALUE_SETS[EXTERNAL]], overrides)
    assert "don't meet the specifications of the schema" in str(failure.value)
    assert complaint in str(failure.value)


def test_external_database_without_url_fails_with_a_clear_message(helm: pathlib.Path) -> None:
    overrides = {
        "postgresql": {"builtin": {"enabled": False}},
        "redis": {"url": "redis://r:6379/0", "builtin": {"enabled": False}},
    }
    with pytest.raises(HelmFailed, match="postgresql.url is required"):
        helm_template(helm, [], overrides)


def test_database_settings_reach_every_container_as_settings_accept_them(
    helm: pathlib.Path, rendered_sets: dict[str, list[Manifest]]
) -> None:
    """The ConfigMap carries the pool settings under the names the collector's Settings read,
    with values Settings accepts; an over-large pool fails at render time, not in the pods."""
    from iwscope.config import Settings

    data = find(rendered_sets[EXTERNAL], "ConfigMap", "config")["data"]
    assert {
        k: data[k]
        for k in (
            "IWSCOPE_DB_POOL_SIZE",
            "IWSCOPE_DB_MAX_OVERFLOW",
            "IWSCOPE_DB_POOL_TIMEOUT_S",
            "IWSCOPE_RETRY_AFTER_S",
            "IWSCOPE_API_THREADS",
        )
    } == {
        "IWSCOPE_DB_POOL_SIZE": "20",
        "IWSCOPE_DB_MAX_OVERFLOW": "0",
        "IWSCOPE_DB_POOL_TIMEOUT_S": "3",
        "IWSCOPE_RETRY_AFTER_S": "2",
        "IWSCOPE_API_THREADS": "40",
    }
    tuned = helm_template(
        helm,
        [CI_VALUE_SETS[EXTERNAL]],
        {"config": {"database": {"poolSize": 4, "maxOverflow": 2, "poolTimeoutSeconds": 0.5, "retryAfterSeconds": 7}}},
    )
    env = {k: v for k, v in find(tuned, "ConfigMap", "config")["data"].items() if k.startswith("IWSCOPE_")}
    settings = Settings.model_validate({**env, "IWSCOPE_ENV": "development"})
    assert (settings.db_pool_size, settings.db_max_overflow, settings.db_pool_timeout_s, settings.retry_after_s) == (4, 2, 0.5, 7)
    for component in ("api", "worker", "beat"):
        sources = [
            ref["configMapRef"]["name"]
            for c in containers(find(tuned, "Deployment", component))
            for ref in c.get("envFrom", [])
            if "configMapRef" in ref
        ]
        assert find(tuned, "ConfigMap", "config")["metadata"]["name"] in sources, component
    with pytest.raises(HelmFailed, match="is over 200 connections per process"):
        helm_template(helm, [CI_VALUE_SETS[EXTERNAL]], {"config": {"database": {"poolSize": 150, "maxOverflow": 60}}})


def test_api_workers_admission_and_caches_reach_the_api_as_settings_accept_them(helm: pathlib.Path) -> None:
    from iwscope.config import Settings

    tuned = helm_template(
        helm,
        [CI_VALUE_SETS[EXTERNAL]],
        {
            "api": {"workers": 3},
            "config": {
                "admission": {"maxInProgress": 30, "maxOtherInProgress": 6},
                "cache": {"scheduleSeconds": 2, "credentialSeconds": 0, "credentialNotifiedSeconds": 90},
            },
        },
    )
    api = pod_spec(find(tuned, "Deployment", "api"))["containers"][0]
    assert api["command"][api["command"].index("--workers") + 1] == "3"
    env = {k: v for k, v in find(tuned, "ConfigMap", "config")["data"].items() if k.startswith("IWSCOPE_")}
    settings = Settings.model_validate({**env, "IWSCOPE_ENV": "development"})
    assert (
        settings.max_in_progress,
        settings.max_other_in_progress,
        settings.schedule_cache_s,
        settings.credential_cache_s,
        settings.credential_cache_notified_s,
    ) == (30, 6, 2.0, 0.0, 90.0)
    with pytest.raises(HelmFailed, match="maxOtherInProgress .* is over maxInProgress"):
        helm_template(helm, [CI_VALUE_SETS[EXTERNAL]], {"config": {"admission": {"maxInProgress": 4, "maxOtherInProgress": 8}}})


def test_dashboard_can_be_disabled(helm: pathlib.Path) -> None:
    objects = helm_template(helm, [CI_VALUE_SETS[EXTERNAL]], {"dashboard": {"enabled": False}})
    assert not [o for o in objects if o["metadata"]["name"].endswith("-dashboard")]
    with pytest.raises(HelmFailed, match="dashboard.enabled is false"):
        helm_template(helm, [CI_VALUE_SETS[INGRESS_HPA]], {"dashboard": {"enabled": False}})


def test_analysis_copy_mounts_one_claim_where_the_worker_writes_and_the_readers_read(helm: pathlib.Path) -> None:
    def copy_of(objects: list[Manifest]) -> dict[str, tuple[str | None, str | None]]:
        """Per Deployment: the claim of its ``analysis-copy`` volume and where it is mounted."""
        found = {}
        for o in objects:
            if o["kind"] != "Deployment":
                continue
            spec = o["spec"]["template"]["spec"]
            claims = [v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes", []) if v["name"] == "analysis-copy"]
            mounts = [
                m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", []) if m["name"] == "analysis-copy"
            ]
            found[o["metadata"]["name"].rsplit("-", 1)[-1]] = (claims[0] if claims else None, mounts[0] if mounts else None)
        return found

    def config_of(objects: list[Manifest]) -> dict[str, str]:
        return next(o["data"] for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config"))

    plain = helm_template(helm, [CI_VALUE_SETS[EXTERNAL]])
    assert all(value == (None, None) for value in copy_of(plain).values())
    assert "IWSCOPE_ANALYSIS_COPY_DIR" not in config_of(plain)
    shared = helm_template(helm, [CI_VALUE_SETS[EXTERNAL]], {"analysisCopy": {"existingClaim": "iwscope-copy"}})
    mounted = copy_of(shared)
    for component in ("api", "worker", "dashboard"):
        assert mounted[component] == ("iwscope-copy", "/var/lib/iwscope/analysis-copy"), component
    assert mounted["beat"] == (None, None)
    assert config_of(shared)["IWSCOPE_ANALYSIS_COPY_DIR"] == "/var/lib/iwscope/analysis-copy"
    with pytest.raises(HelmFailed, match="mountPath"):
        helm_template(helm, [CI_VALUE_SETS[EXTERNAL]], {"analysisCopy": {"existingClaim": "x", "mountPath": "relative"}})


# --- network policy -------------------------------------------------------------------------


def _selected(policy: Manifest, labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


@pytest.mark.parametrize("value_set", [EXTERNAL, BUILTIN])
def test_network_policies(rendered_sets: dict[str, list[Manifest]], value_set: str) -> None:
    objects = rendered_sets[value_set]
    values = deep_merge(
        yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8")),
        yaml.safe_load(CI_VALUE_SETS[value_set].read_text(encoding="utf-8")),
    )
    # The pods must be allowed to reach the ports of the database and Redis they are given.
    needed_ports = {53}
    for service, default_port in (("postgresql", 5432), ("redis", 6379)):
        url = values[service]["url"]
        needed_ports.add(default_port if values[service]["builtin"]["enabled"] else urlsplit(url).port)
    policies = of_kind(objects, "NetworkPolicy")
    for workload in workloads(objects):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        component = labels["app.kubernetes.io/component"]
        ingress_policies = [p for p in policies if _selected(p, labels) and "Ingress" in p["spec"]["policyTypes"]]
        assert ingress_policies, f"{component} has no ingress policy"
        rules = [rule for p in ingress_policies for rule in p["spec"].get("ingress", [])]
        if component in ("worker", "beat", "migrate"):
            assert rules == [], f"{component} must accept no connections"
        elif component in ("api", "dashboard"):
            assert [port["port"] for rule in rules for port in rule["ports"]] == ["http"]
        else:  # built-in datastores: only from this release's iwscope pods
            for rule in rules:
                expression = rule["from"][0]["podSelector"]["matchExpressions"][0]
                assert set(expression["values"]) == {"api", "worker", "beat", "dashboard", "migrate"}
        if component not in ("postgresql", "redis"):
            egress = [p for p in policies if _selected(p, labels) and "Egress" in p["spec"]["policyTypes"]]
            assert len(egress) == 1
            ports = {port["port"] for rule in egress[0]["spec"]["egress"] for port in rule.get("ports", [])}
            assert needed_ports <= ports, f"{component}: egress allows {ports}, needs {needed_ports}"
    assert not of_kind(rendered_sets[DEFAULT], "NetworkPolicy")


# --- documentation --------------------------------------------------------------------------


def _render_notes(helm: pathlib.Path, tmp_path: pathlib.Path, overrides: dict[str, Any]) -> str:
    """NOTES.txt as Helm renders it: helm template skips NOTES, so a copy of the chart wraps
    it in a named template and a ConfigMap."""
    import shutil

    chart = tmp_path / "iwscope"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text(encoding="utf-8")
    (chart / "templates" / "zz-rendered-notes.yaml").write_text(
        '{{- define "test.notes" -}}\n' + notes + "{{- end -}}\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rendered-notes\n"
        'data:\n  notes: {{ include "test.notes" . | toJson }}\n',
        encoding="utf-8",
    )
    objects = helm_template(helm, [], overrides, chart=chart)
    return str(find(objects, "ConfigMap", "rendered-notes")["data"]["notes"])


def test_notes_tell_how_to_reach_the_dashboard_and_create_an_enroll_token(
    helm: pathlib.Path, tmp_path: pathlib.Path, rendered_sets: dict[str, list[Manifest]]
) -> None:
    notes = _render_notes(helm, tmp_path, {})
    api = find(rendered_sets[DEFAULT], "Deployment", "api")["metadata"]["name"]
    dashboard = find(rendered_sets[DEFAULT], "Service", "dashboard")["metadata"]["name"]
    assert f"kubectl -n {NAMESPACE} exec deploy/{api} -c api -- iwscope token create --kind enroll" in notes
    assert f"port-forward svc/{dashboard} 8050:80" in notes
    assert "WARNING: the built-in PostgreSQL and Redis are for trying iwscope out" in notes
    with_ingress = _render_notes(helm, tmp_path / "b", yaml.safe_load(CI_VALUE_SETS[INGRESS_HPA].read_text()))
    assert "https://iwscope.example.org/" in with_ingress
    assert "WARNING" not in with_ingress


def _commented_keys(lines: list[str]) -> list[str]:
    """Keys of values.yaml without a comment line directly above them, except inside
    free-form blocks (resources, probe timings, security contexts, host rules) whose own key
    is commented."""
    free_form = {"resources", "readinessProbe", "livenessProbe", "podSecurityContext", "securityContext", "hosts", "extraEgress"}
    missing: list[str] = []
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in lines:
        stripped = line.strip()
        match = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9_]*):", line)
        if match:
            indent, key = len(match.group(1)), match.group(2)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            inside_free_form = any(name in free_form for _, name in stack)
            if not previous.startswith("#") and not inside_free_form:
                missing.append(".".join([name for _, name in stack] + [key]))
            stack.append((indent, key))
        if stripped:
            previous = stripped
    return missing


def test_every_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    assert _commented_keys(lines) == []
    assert _commented_keys(["a: 1", "# -- b", "b: 2"]) == ["a"], "the check itself must catch a bare key"


def test_every_documented_value_is_in_the_schema() -> None:
    """values.yaml and values.schema.json describe the same keys."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            return resolve(schema["$defs"][node["$ref"].rsplit("/", 1)[-1]])
        return node

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        node = resolve(node)
        if isinstance(value, dict) and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or 'root'} is not strict"
            for key, child in value.items():
                assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
                walk(child, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "")


def test_chart_readme_documents_production_and_the_value_sets() -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    for needle in (
        "postgresql.builtin.enabled",
        "existingSecret",
        "useHelmHooks",
        "managed or operator-run",
        "iwscope token create --kind enroll",
        *[f"ci/{name}.yaml" for name in CI_VALUE_SETS],
    ):
        assert needle in readme, needle
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
