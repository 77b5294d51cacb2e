"""A labelled pod that declares its own `sidestream` container (`sidecar.injector.declared`):
not injected again, but given the same drain hooks and grace as an injected pod, with a
warning; never skipped silently. Patched pods validated against Kubernetes 1.33."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from sidecar.injector import InjectorApp, required_grace_period
from sidecar.injector.drain import model_hook, sidecar_hook
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
ROOT = Path(__file__).parents[2]


async def test_a_classic_sidecar_by_hand_gets_the_drain_and_the_grace() -> None:
    """Rule: a pod with a `sidestream` container among its containers gets the classic
    sidecar's preStop, the model's hold and the grace for the default 30 s drain, a status of
    `by-hand` and a warning saying so; a second pass changes nothing."""
    review = fixture("sidecar-by-hand")
    answer = await mutate(review)
    pod = patched_pod(review, answer)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert pod["metadata"]["annotations"]["sidestream.dev/status"] == "by-hand"
    assert container(pod, CONTAINER_NAME)["lifecycle"]["preStop"] == sidecar_hook(9901, False)
    assert container(pod, "vllm")["lifecycle"]["preStop"] == model_hook(30, False)
    assert pod["spec"]["terminationGracePeriodSeconds"] == required_grace_period(30)
    [warning] = answer["response"]["warnings"]
    assert "is declared in the pod, so it was not injected" in warning
    again = copy.deepcopy(review)
    again["request"]["object"] = pod
    second = await mutate(again)
    assert patch_of(second) == [] and "warnings" not in second["response"]


def native_by_hand(env: list[JSON], restart: str | None = "Always") -> JSON:
    review = fixture("sidecar-by-hand")
    spec = review["request"]["object"]["spec"]
    sidecar = spec["containers"].pop()
    sidecar["env"] = env
    if restart is not None:
        sidecar["restartPolicy"] = restart
    spec["initContainers"] = [sidecar]
    return review


async def test_a_native_sidecar_by_hand_is_drained_on_its_own_admin_port_and_timeout() -> None:
    """Rule: the drain hook and the budget follow the declared container's own
    SIDESTREAM_ADMIN_LISTEN and SIDESTREAM_DRAIN_TIMEOUT; a preStop it has is kept."""
    review = native_by_hand(
        [
            {"name": "SIDESTREAM_ADMIN_LISTEN", "value": "0.0.0.0:9911"},
            {"name": "SIDESTREAM_DRAIN_TIMEOUT", "value": "90"},
        ]
    )
    pod = patched_pod(review, await mutate(review))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    sidecar = pod["spec"]["initContainers"][0]
    assert sidecar["lifecycle"]["preStop"] == sidecar_hook(9911, True)
    assert container(pod, "vllm")["lifecycle"]["preStop"] == model_hook(90, True)
    assert pod["spec"]["terminationGracePeriodSeconds"] == required_grace_period(90)

    review["request"]["object"]["spec"]["initContainers"][0]["lifecycle"] = {
        "preStop": {"exec": {"command": ["my-drain"]}}
    }
    answer = await mutate(review)
    pod = patched_pod(review, answer)
    assert pod["spec"]["initContainers"][0]["lifecycle"]["preStop"] == {
        "exec": {"command": ["my-drain"]}
    }
    assert any("keeps its own preStop" in w for w in answer["response"]["warnings"])


async def test_an_init_container_named_sidestream_that_is_no_sidecar_is_refused() -> None:
    """Rule: an init container `sidestream` without restartPolicy Always would run to
    completion before the model starts: denied with the reason (or, by default, admitted
    unchanged with it as a warning)."""
    review = native_by_hand([], restart=None)
    answer = await mutate(review, InjectorApp(on_invalid="deny"))
    assert answer["response"]["allowed"] is False
    assert "has no restartPolicy: Always" in answer["response"]["status"]["message"]
    answer = await mutate(review)
    assert patch_of(answer) == []
    assert "has no restartPolicy: Always" in answer["response"]["warnings"][0]


async def test_the_base_deployment_labelled_for_injection_needs_nothing_more() -> None:
    """Rule: k8s/base's pod template already has the drain hooks and the grace the injector
    would give it: labelled for injection, it gets only the status annotation."""
    deployment = yaml.safe_load((ROOT / "k8s" / "base" / "deployment.yaml").read_text())
    template = deployment["spec"]["template"]
    review = fixture("plain")
    review["request"]["object"] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "vllm-7c9d8b6f5-",
            "namespace": "inference",
            "labels": {**template["metadata"]["labels"], "sidestream.dev/inject": "true"},
        },
        "spec": template["spec"],
    }
    answer = await mutate(review)
    assert [op["path"] for op in patch_of(answer)] == [
        "/metadata/annotations",
        "/metadata/annotations/sidestream.dev~1status",
    ]
    assert len(answer["response"]["warnings"]) == 1
