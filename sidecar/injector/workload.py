"""What telemetry calls an injected pod: its service name and the k8s.* resource attributes.

The names are OpenTelemetry's Kubernetes conventions: `service.name` from the workload (the
pod's `app.kubernetes.io/name` label, else its owner's name), `k8s.pod.name`,
`k8s.namespace.name` and `k8s.node.name` from the downward API. The pod's name and node are
not known at admission (a ReplicaSet's pods get their name from `generateName`, the node from
the scheduler), so they are read by the kubelet when the container starts.
"""

from __future__ import annotations

from typing import Any

WORKLOAD_LABEL = "app.kubernetes.io/name"
DOWNWARD = (
    ("K8S_POD_NAME", "metadata.name", "k8s.pod.name"),
    ("K8S_NAMESPACE_NAME", "metadata.namespace", "k8s.namespace.name"),
    ("K8S_NODE_NAME", "spec.nodeName", "k8s.node.name"),
)


def telemetry_env(workload: str | None) -> list[dict[str, Any]]:
    """The env entries, in order: the kubelet expands `$(NAME)` only for variables defined
    before the one that uses them. `workload` None: the service name is the pod's label, read
    through the downward API (so it follows the label wherever the template goes)."""
    env: list[dict[str, Any]] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path, _ in DOWNWARD
    ]
    if workload is None:
        label = f"metadata.labels['{WORKLOAD_LABEL}']"
        env.append({"name": "OTEL_SERVICE_NAME", "valueFrom": {"fieldRef": {"fieldPath": label}}})
    else:
        env.append({"name": "OTEL_SERVICE_NAME", "value": workload})
    attributes = ",".join(f"{attribute}=$({name})" for name, _, attribute in DOWNWARD)
    env.append({"name": "OTEL_RESOURCE_ATTRIBUTES", "value": attributes})
    return env


def workload_name(pod: dict[str, Any]) -> str | None:
    """None when the pod has the workload label (read at start); else its controller's name,
    a Deployment's for a ReplicaSet's pod, else the pod's own (generated) name, else
    `sidestream`."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if labels.get(WORKLOAD_LABEL):
        return None
    owners = [o for o in metadata.get("ownerReferences") or [] if o.get("controller")]
    if owners and owners[0].get("name"):
        name = str(owners[0]["name"])
        suffix = f"-{labels.get('pod-template-hash')}"  # a ReplicaSet is <deployment>-<hash>
        if (
            owners[0].get("kind") == "ReplicaSet"
            and len(name) > len(suffix)
            and name.endswith(suffix)
        ):
            return name[: -len(suffix)]
        return name
    name = metadata.get("name") or (metadata.get("generateName") or "").rstrip("-")
    return str(name) or "sidestream"
