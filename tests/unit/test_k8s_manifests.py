"""k8s/ and the Dockerfile: schema-valid against Kubernetes 1.33, yamllint-clean, and the
rules a schema cannot check (probes, shutdown budget, hardening, the Service's named port,
the webhook's scoping, cert-manager wiring). `kubectl kustomize` builds each overlay in
tests/system/test_k8s_kustomize.py."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from sidecar.injector import InjectorSettings, required_grace_period
from sidecar.injector.drain import ENDPOINT_PROPAGATION, model_hold, model_hook, sidecar_hook
from sidecar.injector.patch import ADMIN_PORT_NAME, PORT_NAME, sidecar_container

JSON = dict[str, Any]
ROOT = Path(__file__).parents[2]
K8S = ROOT / "k8s"
K8S_VERSION = "1.33"
YAML_FILES = sorted(p for p in K8S.rglob("*.yaml"))
# Not Kubernetes resources: kustomizations, the plain Prometheus rules file, and a kustomize
# transformer's configuration (k8s/injector/follow-namespace).
NOT_RESOURCES = {"kustomization.yaml", "sidestream-rules.yaml", "replacements.yaml"}
RESOURCE_FILES = [p for p in YAML_FILES if p.name not in NOT_RESOURCES]
KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
# CRDs kubernetes-validate has no schema for: checked by hand below.
CRDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def load_all(path: Path) -> list[JSON]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resources(*paths: str) -> list[JSON]:
    return [doc for p in paths for doc in load_all(K8S / p)]


def find(docs: list[JSON], kind: str, name: str) -> JSON:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_containers(pod_spec: JSON) -> Iterator[JSON]:
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec["containers"]


def env_of(container: JSON) -> dict[str, str]:
    """Literal env values (entries read from the downward API or a Secret are left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def validate(doc: JSON) -> None:
    if (doc["apiVersion"], doc["kind"]) in CRDS:
        assert doc["metadata"]["name"] and isinstance(doc["spec"], dict)
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# --- every file --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_yamllint(path: Path) -> None:
    """Every YAML file under k8s/ passes yamllint (k8s/.yamllint), warnings included."""
    config = YamlLintConfig(file=str(K8S / ".yamllint"))
    problems = list(linter.run(path.read_text(), config, str(path)))
    assert not problems, "\n".join(f"{p.line}:{p.column} {p.message}" for p in problems)


@pytest.mark.parametrize("path", RESOURCE_FILES, ids=rel)
def test_schema_strict_1_33(path: Path) -> None:
    """Every resource validates with kubernetes-validate --strict against Kubernetes 1.33."""
    docs = load_all(path)
    assert docs
    for doc in docs:
        validate(doc)


def test_strict_validation_rejects_unknown_fields() -> None:
    """The validator is really strict: a misspelt field in a Deployment fails."""
    [deployment] = resources("base/deployment.yaml")
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


# --- the model Deployment ----------------------------------------------------------------------


def check_model_deployment(deployment: JSON, docs: list[JSON]) -> None:
    """Rules for any form of the model Deployment (native, classic, observability, llama.cpp):
    the model container is the one named like the Deployment (vllm, llama-cpp)."""
    spec = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod_containers(spec)}
    name = deployment["metadata"]["name"]
    sidecar, model = containers["sidestream"], containers[name]
    native = sidecar in spec.get("initContainers", [])
    assert native == (sidecar.get("restartPolicy") == "Always")
    for init in spec.get("initContainers", []):
        if init.get("restartPolicy") != "Always":
            assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(init)
    # Probes: startup and liveness on the sidecar's /livez only, readiness on /readyz.
    for probe in ("startupProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"] == {"path": "/livez", "port": ADMIN_PORT_NAME}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": ADMIN_PORT_NAME}
    assert env_of(sidecar)["SIDESTREAM_ADMIN_LISTEN"].startswith("0.0.0.0:")

    # Readiness asks the model the path its own probes ask (vLLM /health, llama-cpp-python
    # /openapi.json): the sidecar's default, /health, where none is set.
    health = env_of(sidecar).get("SIDESTREAM_UPSTREAM_HEALTH", "/health")
    for probe in ("startupProbe", "livenessProbe"):
        assert f'127.0.0.1:8000{health}"' in model[probe]["exec"]["command"][-1], probe

    # Shutdown: the sidecar's own preStop starts its drain (native) or sleeps out endpoint
    # propagation before its SIGTERM does (classic); the model's preStop holds it serving for
    # the whole drain, with nothing run in its image but `sleep` in the classic form; grace
    # covers the whole budget.
    drain = float(env_of(sidecar)["SIDESTREAM_DRAIN_TIMEOUT"])
    admin_port = int(env_of(sidecar)["SIDESTREAM_ADMIN_LISTEN"].rpartition(":")[2])
    assert sidecar["lifecycle"]["preStop"] == sidecar_hook(admin_port, native)
    assert model["lifecycle"]["preStop"] == model_hook(drain, native)
    assert model_hold(drain) >= ENDPOINT_PROPAGATION + drain
    shutdown = [a for a in model["args"] if a.startswith("--shutdown-timeout=")]
    if name == "vllm":
        assert shutdown, "vLLM must run with --shutdown-timeout"
    model_shutdown = int(shutdown[0].partition("=")[2]) if shutdown else 0
    grace = spec["terminationGracePeriodSeconds"]
    assert grace >= required_grace_period(drain)
    assert grace >= 5 + drain + 5 + model_shutdown

    # The Service reaches the pod only through the sidecar's named port.
    service = find(docs, "Service", name)
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    for port in service["spec"]["ports"]:
        owners = [
            c["name"]
            for c in pod_containers(spec)
            for p in c.get("ports", [])
            if p["name"] == port["targetPort"]
        ]
        assert owners == ["sidestream"], (
            f"targetPort {port['targetPort']!r} is declared by {owners}"
        )
    upstream = env_of(sidecar)["SIDESTREAM_UPSTREAM"].rpartition(":")[2]
    assert f"--port={upstream}" in model["args"] and "--host=127.0.0.1" in model["args"]

    pdb = find(docs, "PodDisruptionBudget", name)
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    check_network_policy(find(docs, "NetworkPolicy", name), deployment)

    # The admin port is on the pod IP for the kubelet, so the preStop drain must reach it
    # over loopback, the one place POST /drain answers without a token.
    if native:
        hook = sidecar["lifecycle"]["preStop"]["exec"]["command"][-1]
        assert re.findall(r"http://([^:/\"]+):", hook) == ["127.0.0.1"]
    assert "SIDESTREAM_ADMIN_TOKEN_FILE" not in env_of(sidecar)

    for container in pod_containers(spec):
        if container is not sidecar:
            check_model_container(container, spec)


def check_model_container(container: JSON, pod_spec: JSON) -> None:
    """A model container runs as a non-root UID with USER and HOME set, HOME writable: a UID
    without a passwd entry makes getpass.getuser() raise unless USER is set (torch >= 2.11,
    vllm-project/vllm#44548); and the restricted Pod Security settings."""
    name = container["name"]
    security = container["securityContext"]
    assert isinstance(security.get("runAsUser"), int) and security["runAsUser"] > 0, name
    assert security["runAsNonRoot"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}, name
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}, name
    assert security["readOnlyRootFilesystem"] is True, name
    env = env_of(container)
    assert env.get("USER"), f"{name}: USER is not set"
    home = env.get("HOME", "")
    assert home.startswith("/"), f"{name}: HOME is not set"
    writable = {v["name"] for v in pod_spec.get("volumes", []) if "emptyDir" in v}
    mounts = [
        m["mountPath"]
        for m in container.get("volumeMounts", [])
        if m["name"] in writable and not m.get("readOnly")
    ]
    assert any(home == m or home.startswith(m.rstrip("/") + "/") for m in mounts), (
        f"{name}: HOME {home} is not on a writable emptyDir"
    )


def check_network_policy(policy: JSON, deployment: JSON) -> None:
    """The pods admit the traffic port from anywhere and the admin port only from the
    monitoring namespace; nothing else (the kubelet's probes come from the node, which
    NetworkPolicy always allows)."""
    spec = policy["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    anyone, monitoring = spec["ingress"]
    assert "from" not in anyone
    assert anyone["ports"] == [{"port": PORT_NAME, "protocol": "TCP"}]
    assert monitoring["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert monitoring["ports"] == [{"port": ADMIN_PORT_NAME, "protocol": "TCP"}]
    sidecar = next(
        c
        for c in pod_containers(deployment["spec"]["template"]["spec"])
        if c["name"] == "sidestream"
    )
    declared = {p["name"] for p in sidecar["ports"]}
    assert {PORT_NAME, ADMIN_PORT_NAME} <= declared


def test_base_deployment_rules() -> None:
    """The base: native sidecar, probes, shutdown budget, Service targetPort, PDB,
    NetworkPolicy, the preStop drain over loopback."""
    docs = resources(
        "base/deployment.yaml", "base/service.yaml", "base/pdb.yaml", "base/networkpolicy.yaml"
    )
    check_model_deployment(find(docs, "Deployment", "vllm"), docs)


def test_base_sidecar_is_what_the_injector_injects() -> None:
    """The hand-written native sidecar equals the injector's container for upstream-port
    8000, so the two ways to adopt sidestream cannot drift apart."""
    [deployment] = resources("base/deployment.yaml")
    [sidecar] = deployment["spec"]["template"]["spec"]["initContainers"]
    assert sidecar == sidecar_container(InjectorSettings(upstream_port=8000))


def all_deployments() -> list[tuple[str, JSON]]:
    return [(rel(p), d) for p in RESOURCE_FILES for d in load_all(p) if d["kind"] == "Deployment"]


@pytest.mark.parametrize(
    "deployment", [d for _, d in all_deployments()], ids=[n for n, _ in all_deployments()]
)
def test_hardening(deployment: JSON) -> None:
    """Every container: non-root, read-only root with an emptyDir at /tmp, no privilege
    escalation, all capabilities dropped, RuntimeDefault seccomp, requests and a memory
    limit; no service account token."""
    spec = deployment["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    empty_dirs = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    for container in pod_containers(spec):
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True and security.get("runAsUser", 1) != 0
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        assert tmp and tmp[0]["name"] in empty_dirs, f"{container['name']}: /tmp is not an emptyDir"


# --- observability -----------------------------------------------------------------------------


def test_jaeger_demo_ports_and_otel_env() -> None:
    """Jaeger all-in-one exposes OTLP 4317/4318 and the UI on 16686; the overlay points the
    sidecar's OTEL_EXPORTER_OTLP_ENDPOINT at its OTLP/HTTP port and leaves the service name
    to the base (no second OTEL_SERVICE_NAME)."""
    docs = resources("overlays/jaeger/jaeger.yaml")
    ports = {p["port"] for p in find(docs, "Service", "jaeger")["spec"]["ports"]}
    assert {4317, 4318, 16686} <= ports
    container_ports = {
        p["containerPort"]
        for p in find(docs, "Deployment", "jaeger")["spec"]["template"]["spec"]["containers"][0][
            "ports"
        ]
    }
    assert {4317, 4318, 16686} <= container_ports
    kustomization = yaml.safe_load((K8S / "overlays" / "jaeger" / "kustomization.yaml").read_text())
    ops = [op for patch in kustomization["patches"] for op in yaml.safe_load(patch["patch"])]
    env = {op["value"]["name"]: op["value"]["value"] for op in ops if op["op"] == "add"}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert "OTEL_TRACES_SAMPLER" in env and "OTEL_SERVICE_NAME" not in env


# --- the injector ------------------------------------------------------------------------------


def test_webhook_configuration() -> None:
    """sideEffects None, failurePolicy Fail scoped by the inject label, 5 s timeout,
    reinvocation IfNeeded, kube-system and its own namespace excluded, pointing at the
    injector Service's /mutate."""
    docs = resources(
        "injector/base/webhook.yaml", "injector/base/service.yaml", "injector/base/namespace.yaml"
    )
    namespace = find(docs, "Namespace", "sidestream-system")["metadata"]["name"]
    [hook] = find(docs, "MutatingWebhookConfiguration", "sidestream-injector")["webhooks"]
    assert hook["sideEffects"] == "None" and hook["failurePolicy"] == "Fail"
    assert hook["timeoutSeconds"] == 5 and hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["objectSelector"] == {"matchLabels": {"sidestream.dev/inject": "true"}}
    [expression] = hook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
    assert set(expression["values"]) == {"kube-system", namespace}
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    service = find(docs, "Service", "sidestream-injector")
    target = hook["clientConfig"]["service"]
    assert (target["name"], target["namespace"], target["path"]) == (
        "sidestream-injector",
        namespace,
        "/mutate",
    )
    assert target["port"] in [p["port"] for p in service["spec"]["ports"]]


def test_injector_deployment() -> None:
    """Two replicas behind a PDB, serving TLS from the mounted Secret, probing /livez."""
    docs = resources(
        "injector/base/deployment.yaml", "injector/base/pdb.yaml", "injector/base/service.yaml"
    )
    deployment = find(docs, "Deployment", "sidestream-injector")
    assert deployment["spec"]["replicas"] == 2
    assert find(docs, "PodDisruptionBudget", "sidestream-injector")["spec"]["minAvailable"] == 1
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["command"] == ["python", "-m", "sidecar.injector"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")["mountPath"]
    assert args["certfile"] == f"{mount}/tls.crt" and args["keyfile"] == f"{mount}/tls.key"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["readinessProbe"]["httpGet"]["path"] == "/livez"
    port = int(args["listen"].rpartition(":")[2])
    assert port in [p["containerPort"] for p in container["ports"]]
    assert (
        find(docs, "Service", "sidestream-injector")["spec"]["ports"][0]["targetPort"]
        == container["ports"][0]["name"]
    )


def test_cert_manager_overlay_wiring() -> None:
    """inject-ca-from names the serving Certificate, whose Secret is the one the injector
    mounts and whose DNS names are the Service's; the CA is separate, so rotating the
    serving certificate keeps the caBundle valid."""
    kustomization = yaml.safe_load(
        (K8S / "injector" / "cert-manager" / "kustomization.yaml").read_text()
    )
    [op] = yaml.safe_load(kustomization["patches"][0]["patch"])
    namespace, _, certificate_name = op["value"]["cert-manager.io/inject-ca-from"].partition("/")
    assert namespace == kustomization["namespace"]
    docs = resources("injector/cert-manager/certificates.yaml", "injector/base/deployment.yaml")
    certificate = find(docs, "Certificate", certificate_name)
    deployment = find(docs, "Deployment", "sidestream-injector")
    secret = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"
    )
    assert certificate["spec"]["secretName"] == secret["secret"]["secretName"]
    assert f"sidestream-injector.{namespace}.svc" in certificate["spec"]["dnsNames"]
    issuer = find(docs, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca = find(docs, "Certificate", "sidestream-ca")
    assert (
        issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
        and ca["spec"]["isCA"] is True
    )


# --- Dockerfile --------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_dockerfile_is_multi_stage_non_root_with_the_console_script() -> None:
    """Multi-stage; the final stage runs as a numeric non-root USER with
    ENTRYPOINT ["sidestream"], the console script pyproject declares."""
    stages = dockerfile_stages()
    assert len(stages) >= 2
    final = stages[-1]
    users = [line.split()[1] for line in final if line.upper().startswith("USER ")]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    [entrypoint] = [line for line in final if line.upper().startswith("ENTRYPOINT ")]
    assert json.loads(entrypoint.split(None, 1)[1]) == ["sidestream"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "sidestream" in pyproject["project"]["scripts"]
    # k8s/ runs the image as the same user.
    assert f"runAsUser: {uid}" in (K8S / "base" / "deployment.yaml").read_text()


def test_dockerfile_final_stage_has_no_build_tools() -> None:
    """No compilers, package installs or pip in the final stage; it copies the built venv."""
    final = " ".join(dockerfile_stages()[-1])
    for tool in (
        "gcc",
        "g++",
        "build-essential",
        "apt-get install",
        "apk add",
        "pip install",
        "python3-dev",
    ):
        assert tool not in final, tool
    assert re.search(r"COPY --from=\S+ /opt/venv /opt/venv", final)


def test_dockerfile_copies_files_that_exist_and_are_not_ignored() -> None:
    """Every COPY source (outside --from) exists and .dockerignore lets it in; together they
    cover pyproject's packages, so `pip install .` in the image installs all of them."""
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore, ".dockerignore starts from nothing"
    copied: set[str] = set()
    for stage in dockerfile_stages():
        for line in stage:
            parts = line.split()
            if parts[0].upper() != "COPY" or any(p.startswith("--from") for p in parts):
                continue
            for source in parts[1:-1]:
                assert (ROOT / source).exists(), source
                assert source.rstrip("/") in allowed, f"{source} is excluded by .dockerignore"
                copied.add(source.rstrip("/"))
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for package in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert package.split(".")[0] in copied, package
    assert pyproject["project"]["readme"] in copied
