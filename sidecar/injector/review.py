"""AdmissionReview v1 in, AdmissionReview out: the webhook's decision (pure, no I/O).

A pod is injected only when it is a Pod CREATE, is not injected yet, is not on the host
network and its annotations parse. A pod that declares its own `sidestream` container gets
the drain hooks and grace instead (`declared.py`). A bad annotation never blocks a pod
unless the operator chose `on_invalid="deny"` (k8s/injector does: a warning on a pod that a
ReplicaSet creates reaches no one, a denial is the ReplicaSet's FailedCreate event): by
default the pod is admitted uninjected with a `warnings` entry saying why. `dryRun`
requests get the same answer: the webhook has no side effects to skip (`sideEffects: None`).
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any, Literal

from sidecar.injector.declared import declared_patch, declared_sidecar
from sidecar.injector.patch import already_injected, build_patch, conflicts
from sidecar.injector.settings import DEFAULT_IMAGE, InvalidAnnotation, parse_settings
from sidecar.injector.workload import workload_name

JSON = dict[str, Any]
InvalidPolicy = Literal["admit", "deny"]
API_VERSION = "admission.k8s.io/v1"

log = logging.getLogger("sidecar.injector")


class BadReview(ValueError):
    """The request body is not an AdmissionReview v1 request."""


def review(
    body: JSON, *, default_image: str = DEFAULT_IMAGE, on_invalid: InvalidPolicy = "admit"
) -> JSON:
    """Answer one AdmissionReview request."""
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise BadReview(f"expected an AdmissionReview of {API_VERSION}")
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise BadReview("AdmissionReview without request.uid")
    response = _decide(request, default_image, on_invalid)
    response["uid"] = request["uid"]
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _decide(request: JSON, default_image: str, on_invalid: InvalidPolicy) -> JSON:
    pod = request.get("object")
    kind = request.get("kind") or {}
    if (
        request.get("operation") != "CREATE"
        or kind.get("kind") != "Pod"
        or not isinstance(pod, dict)
    ):
        return {"allowed": True}
    name = _pod_name(pod, request)
    if already_injected(pod):
        return {"allowed": True}
    if (pod.get("spec") or {}).get("hostNetwork"):
        log.warning("not injecting %s: hostNetwork pod", name)
        return {
            "allowed": True,
            "warnings": [
                "sidestream: not injected: hostNetwork pods would bind the sidecar's "
                "ports on the node"
            ],
        }
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    declared = declared_sidecar(pod)
    try:
        if declared is not None:
            ops, warnings = declared_patch(pod, declared)
            what = "drain hooks for its own sidecar"
        else:
            settings, warnings = parse_settings(annotations, default_image)
            problems = conflicts(pod, settings)
            if problems:
                raise InvalidAnnotation(problems)
            ops, patch_warnings = build_patch(pod, settings, workload_name(pod))
            warnings += patch_warnings
            what = f"the sidecar, {settings.mode} mode"
    except InvalidAnnotation as error:
        message = f"sidestream: not injected: {error}"
        log.warning("%s %s", name, message)
        if on_invalid == "deny":
            return {"allowed": False, "status": {"code": 400, "message": message}}
        return {"allowed": True, "warnings": [message]}
    log.info("patching %s: %s (dry run: %s)", name, what, bool(request.get("dryRun")))
    response: JSON = {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(ops).encode()).decode("ascii"),
    }
    warnings = [f"sidestream: {w}" for w in warnings]
    if warnings:
        response["warnings"] = warnings
    return response


def _pod_name(pod: JSON, request: JSON) -> str:
    metadata = pod.get("metadata") or {}
    name = metadata.get("name") or (metadata.get("generateName") or "") + "*"
    return f"{request.get('namespace') or metadata.get('namespace') or '?'}/{name}"
