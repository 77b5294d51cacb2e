"""What the injector wires into the pod besides the sidecar itself: Secrets by reference
(never a value in an annotation), and telemetry's service name and k8s.* resource attributes
from the downward API. AdmissionReview fixtures through the ASGI app; patched pods validated
against Kubernetes 1.33."""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate
import pytest

from sidecar.injector import InjectorApp
from sidecar.injector.patch import CONTAINER_NAME
from tests.asgi.test_injector import (
    K8S_VERSION,
    container,
    fixture,
    mutate,
    patch_of,
    patched_pod,
)

JSON = dict[str, Any]
P = "sidestream.dev/"
PASSWORD = "hunter2-do-not-print"


def review_with(annotations: dict[str, str], name: str = "minimal") -> JSON:
    review = fixture(name)
    review["request"]["object"]["metadata"]["annotations"].update(annotations)
    return review


async def denial(annotations: dict[str, str]) -> str:
    """The message of the denial these annotations get (the operator chose `deny`)."""
    answer = await mutate(review_with(annotations), InjectorApp(on_invalid="deny"))
    response = answer["response"]
    assert response["allowed"] is False and "patch" not in response
    message: str = response["status"]["message"]
    return message


REDIS = {
    P + "resume": "true",
    P + "resume-store": "rediss://sidestream@redis.inference:6380/0",
    P + "resume-secret": "sidestream-resume",
    P + "resume-store-password": "redis-auth/requirepass",
    P + "admin-token": "sidestream-admin",
}


async def test_secrets_are_mounted_by_reference_into_the_sidecar_alone() -> None:
    """Rule: resume-secret, resume-store-password and admin-token name a Secret (and a key);
    the sidecar alone mounts just that key, read-only, and its *_FILE variable points at the
    file. The pod validates."""
    review = review_with(REDIS)
    pod = patched_pod(review, await mutate(review))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    sidecar = container(pod, CONTAINER_NAME)
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    mounts = {m["name"]: m for m in sidecar["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    expected = {
        "SIDESTREAM_RESUME_SECRET_FILE": ("sidestream-resume", "secret"),
        "SIDESTREAM_RESUME_STORE_PASSWORD_FILE": ("redis-auth", "requirepass"),
        "SIDESTREAM_ADMIN_TOKEN_FILE": ("sidestream-admin", "token"),
    }
    for variable, (secret, key) in expected.items():
        path = env[variable]
        assert path is not None and path.endswith(f"/{key}")
        [(name, mount)] = [(n, m) for n, m in mounts.items() if path == f"{m['mountPath']}/{key}"]
        assert mount["readOnly"] is True
        assert volumes[name]["secret"] == {
            "secretName": secret,
            "items": [{"key": key, "path": key}],
        }
    for other in pod["spec"]["containers"]:
        if other["name"] != CONTAINER_NAME:
            assert not {m["name"] for m in other.get("volumeMounts", [])} & set(mounts)
    assert env["SIDESTREAM_RESUME_STORE"] == REDIS[P + "resume-store"]


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{PASSWORD}@redis.inference:6379/0",
        f"rediss://app:{PASSWORD}@redis.inference:6380",
        f"redis://redis.inference:6379/0?password={PASSWORD}",
    ],
)
async def test_a_redis_url_carrying_a_password_is_refused_without_printing_it(url: str) -> None:
    """Rule: a password in the resume-store annotation (user part or query) is refused, and the
    reason names the Secret annotation to use instead; the password is in no message."""
    annotations = {**REDIS, P + "resume-store": url}
    del annotations[P + "resume-store-password"]
    message = await denial(annotations)
    assert f"{P}resume-store-password" in message and "carries a password" in message
    assert PASSWORD not in message
    answer = await mutate(review_with(annotations))  # the default policy: admitted, uninjected
    assert patch_of(answer) == [] and PASSWORD not in str(answer)


async def test_a_bad_store_url_is_named_without_its_password() -> None:
    """Rule: a resume-store that is neither memory nor redis:// is named with its password
    masked, as the sidecar's own errors do."""
    message = await denial({P + "resume-store": f"mysql://root:{PASSWORD}@db:3306"})
    assert "mysql://root:***@db:3306" in message and PASSWORD not in message


async def test_a_secret_pasted_into_an_annotation_is_not_echoed() -> None:
    """Rule: an annotation that should name a Secret but holds something else is refused
    without repeating what it holds."""
    message = await denial({P + "admin-token": f"Bearer {PASSWORD}"})
    assert f"{P}admin-token: expected the name of a Secret" in message
    assert PASSWORD not in message


async def test_a_redis_store_needs_the_resume_secret() -> None:
    """Rule: the sidecar does not start with a Redis store and no resume secret, so the
    injector refuses that pod up front; a password Secret without a Redis store is refused
    too."""
    annotations = {**REDIS}
    del annotations[P + "resume-secret"]
    assert f"{P}resume-secret is required with a Redis resume-store" in await denial(annotations)
    message = await denial({P + "resume-store-password": "redis-auth"})
    assert f"{P}resume-store-password needs a redis:// resume-store" in message


def literal_env(sidecar: JSON) -> list[tuple[str, str | None, str | None]]:
    return [
        (e["name"], e.get("value"), e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"))
        for e in sidecar["env"]
    ]


async def test_telemetry_names_the_workload_and_the_pod_from_the_downward_api() -> None:
    """Rule: OTEL_SERVICE_NAME is the pod's app.kubernetes.io/name label and
    OTEL_RESOURCE_ATTRIBUTES carries k8s.pod.name, k8s.namespace.name and k8s.node.name, each
    read through the downward API by a variable defined before its $(NAME) use."""
    review = fixture("plain")
    pod = patched_pod(review, await mutate(review))
    env = literal_env(container(pod, CONTAINER_NAME))
    names = [name for name, _, _ in env]
    fields = {name: path for name, _, path in env if path is not None}
    assert fields["OTEL_SERVICE_NAME"] == "metadata.labels['app.kubernetes.io/name']"
    [attributes] = [value for name, value, _ in env if name == "OTEL_RESOURCE_ATTRIBUTES"]
    assert attributes is not None
    pairs = dict(pair.split("=") for pair in attributes.split(","))
    referenced = {key: re.fullmatch(r"\$\((\w+)\)", value) for key, value in pairs.items()}
    expected = {
        "k8s.pod.name": "metadata.name",
        "k8s.namespace.name": "metadata.namespace",
        "k8s.node.name": "spec.nodeName",
    }
    assert set(referenced) == set(expected)
    for key, match in referenced.items():
        assert match is not None
        assert fields[match[1]] == expected[key]
        assert names.index(match[1]) < names.index("OTEL_RESOURCE_ATTRIBUTES")


@pytest.mark.parametrize(
    ("owner", "labels", "generate_name", "service"),
    [
        (
            {"kind": "ReplicaSet", "name": "vllm-7c9d8b6f5"},
            {"pod-template-hash": "7c9d8b6f5"},
            "",
            "vllm",
        ),
        ({"kind": "StatefulSet", "name": "llama"}, {}, "", "llama"),
        ({"kind": "Job", "name": "batch-7"}, {}, "", "batch-7"),
        (None, {}, "scratch-", "scratch"),
    ],
)
async def test_without_the_label_the_service_name_is_the_owner(
    owner: JSON | None, labels: dict[str, str], generate_name: str, service: str
) -> None:
    """Rule: a pod without app.kubernetes.io/name is named after its controller (a
    ReplicaSet's pod after its Deployment), else after its own generated name."""
    review = copy.deepcopy(fixture("minimal"))
    metadata = review["request"]["object"]["metadata"]
    metadata["labels"] = {"sidestream.dev/inject": "true", **labels}
    metadata["generateName"] = generate_name
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "uid": "u-1", "controller": True, **owner}
        ]
    pod = patched_pod(review, await mutate(review))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    env = literal_env(container(pod, CONTAINER_NAME))
    assert ("OTEL_SERVICE_NAME", service, None) in env
