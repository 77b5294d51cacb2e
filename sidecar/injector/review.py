"""AdmissionReview v1 in, AdmissionReview out: the webhook's decision (pure, no I/O).

A pod is injected only when it is a Pod CREATE, is not injected yet, is not on the host
network and its annotations parse. A bad annotation never blocks a pod unless the
operator chose `on_invalid="deny"`: by default the pod is admitted uninjected with a
`warnings` entry (kubectl prints it) saying why. `dryRun` requests get the same answer:
the webhook has no side effects to skip (`sideEffects: None`).
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any, Literal

from sidecar.injector.patch import already_injected, build_patch, conflicts
from sidecar.injector.settings import DEFAULT_IMAGE, InvalidAnnotation, parse_settings

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
    try:
        settings, warnings = parse_settings(annotations, default_image)
        problems = conflicts(pod, settings)
        if problems:
            raise InvalidAnnotation(problems)
    except InvalidAnnotation as error:
        message = f"sidestream: not injected: {error}"
        log.warning("%s %s", name, message)
        if on_invalid == "deny":
            return {"allowed": False, "status": {"code": 400, "message": message}}
        return {"allowed": True, "warnings": [message]}
    ops, patch_warnings = build_patch(pod, settings)
    log.info(
        "injecting %s (%s mode, dry run: %s)", name, settings.mode, bool(request.get("dryRun"))
    )
    response: JSON = {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(ops).encode()).decode("ascii"),
    }
    warnings = [f"sidestream: {w}" for w in warnings + patch_warnings]
    if warnings:
        response["warnings"] = warnings
    return response


def _pod_name(pod: JSON, request: JSON) -> str:
    metadata = pod.get("metadata") or {}
    name = metadata.get("name") or (metadata.get("generateName") or "") + "*"
    return f"{request.get('namespace') or metadata.get('namespace') or '?'}/{name}"
