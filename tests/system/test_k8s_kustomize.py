"""`kubectl kustomize` builds each kustomization under k8s/ (kubectl is required: `make
test-deps` installs it); every resource it outputs passes tests/unit/test_k8s_manifests.py's
checks, every model container it outputs runs as a non-root UID with USER and HOME set; the
injector renders into any namespace; the monitoring component wires scraping, alerts and the
dashboard."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.injector.patch import ADMIN_PORT_NAME, CONTAINER_NAME
from tests.support.tools import tool
from tests.unit.test_k8s_manifests import (
    K8S,
    KUSTOMIZATIONS,
    check_model_container,
    check_model_deployment,
    pod_containers,
    rel,
    validate,
)

JSON = dict[str, Any]
MODEL_DEPLOYMENTS = ("vllm", "llama-cpp")  # k8s/base and k8s/overlays/llamacpp
FOLLOW_NAMESPACE = K8S / "injector" / "follow-namespace"


def build(root: Path) -> list[JSON]:
    built = subprocess.run(
        [tool("kubectl"), "kustomize", str(root)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def users_of(root: Path, field: str) -> list[Path]:
    """The kustomizations that list `root` under `field` (components, transformers)."""
    return [
        k
        for k in KUSTOMIZATIONS
        for entry in yaml.safe_load((k / "kustomization.yaml").read_text()).get(field, [])
        if (k / entry).resolve() == root.resolve()
    ]


BUILDABLE = [
    k
    for k in KUSTOMIZATIONS
    if yaml.safe_load((k / "kustomization.yaml").read_text())["kind"] != "Component"
    and k != FOLLOW_NAMESPACE
]


@pytest.mark.parametrize("root", KUSTOMIZATIONS, ids=rel)
def test_kustomize_build_validates(root: Path) -> None:
    """`kubectl kustomize` builds each kustomization; every output resource validates. A
    component is built through the overlays that use it, the namespace transformer through
    the kustomizations that list it."""
    kind = yaml.safe_load((root / "kustomization.yaml").read_text())["kind"]
    if kind == "Component":
        assert users_of(root, "components"), f"no overlay uses the component {rel(root)}"
        return
    if root == FOLLOW_NAMESPACE:
        [config] = build(root)
        assert (config["apiVersion"], config["kind"]) == ("builtin", "ReplacementTransformer")
        assert users_of(root, "transformers"), "nothing lists the namespace transformer"
        return
    docs = build(root)
    assert docs
    for doc in docs:
        validate(doc)
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] in MODEL_DEPLOYMENTS:
            check_model_deployment(doc, docs)


@pytest.mark.parametrize("root", BUILDABLE, ids=rel)
def test_every_model_container_runs_as_a_user_with_a_home(root: Path) -> None:
    """Rule: in every rendered pod template that carries the sidecar, each other container
    (the model) runs as a non-root UID with USER and HOME set, HOME writable, and the
    restricted security context (tests/unit/test_k8s_manifests.py's check_model_container)."""
    for doc in build(root):
        template = (doc.get("spec") or {}).get("template")
        if not template:
            continue
        spec = template["spec"]
        containers = list(pod_containers(spec))
        if CONTAINER_NAME not in [c["name"] for c in containers]:
            continue
        for container in containers:
            if container["name"] != CONTAINER_NAME:
                check_model_container(container, spec)


def render_into(tmp_path: Path, namespace: str, target: str) -> list[JSON]:
    """The injector kustomization `target` installed into `namespace` by an overlay of the
    shape docs/kubernetes.md gives."""
    overlay = tmp_path / namespace
    overlay.mkdir()
    resources = os.path.relpath(K8S / "injector" / target, overlay)
    transformer = os.path.relpath(FOLLOW_NAMESPACE, overlay)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": namespace,
                "resources": [resources],
                "transformers": [transformer],
            }
        )
    )
    return build(overlay)


@pytest.mark.parametrize("target", ["base", "cert-manager"])
def test_the_injector_follows_the_namespace_it_is_installed_into(
    tmp_path: Path, target: str
) -> None:
    """Rule: rendered into two namespaces, every reference names the one installed into: the
    Namespace, every namespaced object, the webhook's service and namespaceSelector, and with
    cert-manager the certificate's DNS names and inject-ca-from; the default name is gone."""
    for namespace in ("inference-system", "team-b"):
        docs = render_into(tmp_path, namespace, target)
        assert "sidestream-system" not in yaml.safe_dump_all(docs)
        by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        assert ("Namespace", namespace) in by_kind
        for doc in docs:
            validate(doc)
            if doc["kind"] not in ("Namespace", "MutatingWebhookConfiguration"):
                assert doc["metadata"]["namespace"] == namespace, doc["kind"]
        webhook = by_kind[("MutatingWebhookConfiguration", "sidestream-injector")]
        [hook] = webhook["webhooks"]
        service = by_kind[("Service", "sidestream-injector")]
        assert hook["clientConfig"]["service"]["namespace"] == service["metadata"]["namespace"]
        [expression] = hook["namespaceSelector"]["matchExpressions"]
        assert set(expression["values"]) == {"kube-system", namespace}
        if target == "cert-manager":
            certificate = by_kind[("Certificate", "sidestream-injector")]
            assert certificate["spec"]["dnsNames"] == [
                f"sidestream-injector.{namespace}.svc",
                f"sidestream-injector.{namespace}.svc.cluster.local",
            ]
            annotation = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            assert annotation == f"{namespace}/sidestream-injector"
        else:
            assert "annotations" not in webhook["metadata"]


def test_the_monitoring_component_scrapes_alerts_and_ships_the_dashboard() -> None:
    """Rule: k8s/observability, as a component, adds a PodMonitor on the sidecar's admin port
    at /metrics (the port the NetworkPolicy opens to monitoring), the PrometheusRule, and
    the dashboard as a ConfigMap labelled for Grafana's sidecar, byte for byte the file."""
    docs = build(K8S / "overlays" / "monitoring")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    monitor = by_kind[("PodMonitor", "sidestream")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (ADMIN_PORT_NAME, "/metrics")
    deployment = by_kind[("Deployment", "vllm")]
    sidecar = next(
        c
        for c in pod_containers(deployment["spec"]["template"]["spec"])
        if c["name"] == CONTAINER_NAME
    )
    assert ADMIN_PORT_NAME in [p["name"] for p in sidecar["ports"]]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"].get("matchLabels", {}).items() <= labels.items()
    policy = by_kind[("NetworkPolicy", "vllm")]
    assert any(
        rule.get("from") and {"port": ADMIN_PORT_NAME, "protocol": "TCP"} in rule["ports"]
        for rule in policy["spec"]["ingress"]
    )
    rule = by_kind[("PrometheusRule", "sidestream")]
    shipped = yaml.safe_load((K8S / "observability" / "prometheusrule.yaml").read_text())
    assert rule["spec"] == shipped["spec"]
    dashboard = by_kind[("ConfigMap", "sidestream-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    text = (K8S / "observability" / "sidestream-dashboard.json").read_text()
    assert dashboard["data"] == {"sidestream-dashboard.json": text}
    assert json.loads(text)["uid"] == "sidestream"
    base = {(d["kind"], d["metadata"]["name"]) for d in build(K8S / "base")}
    assert not base & {("PodMonitor", "sidestream"), ("PrometheusRule", "sidestream")}
