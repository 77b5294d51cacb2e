"""The injection webhook: AdmissionReview fixtures through the ASGI app, patches applied
with jsonpatch and the result validated against Kubernetes 1.33, and certificate files read
for reload. Over real sockets: tests/sockets/test_injector_sockets.py; the drain hook's
script as a process: tests/system/test_injector_drain_hook.py."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import os
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sidecar.injector import (
    InjectorApp,
    InjectorSettings,
    build_patch,
    parse_settings,
    required_grace_period,
)
from sidecar.injector.__main__ import parse_args
from sidecar.injector.drain import model_hold
from sidecar.injector.patch import ADMIN_PORT_NAME, CONTAINER_NAME, PORT_NAME
from sidecar.injector.tls import ReloadingCertificate

JSON = dict[str, Any]
ROOT = Path(__file__).parents[2]
FIXTURES = Path(__file__).parents[1] / "support" / "fixtures" / "admission"
K8S_VERSION = "1.33"
INJECTING = ["plain", "minimal", "existing-init", "classic", "dry-run"]
NOT_INJECTING = [
    "no-annotations",
    "already-injected",
    "sidecar-by-hand",
    "host-network",
    "bad-values",
]


def fixture(name: str) -> JSON:
    return json.loads((FIXTURES / f"{name}.json").read_text())  # type: ignore[no-any-return]


async def call(app: InjectorApp, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """Drive the ASGI app with a hand-written receive/send; the body arrives in two parts."""
    parts = [body[: len(body) // 2], body[len(body) // 2 :]]
    sent: list[JSON] = []

    async def receive() -> JSON:
        if parts:
            chunk = parts.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(parts)}
        await asyncio.Event().wait()  # no disconnect while the app is answering
        raise AssertionError("unreachable")

    async def send(message: JSON) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": []}
    await app(scope, receive, send)
    assert sent[0]["type"] == "http.response.start"
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def mutate(review: JSON, app: InjectorApp | None = None) -> JSON:
    status, body = await call(app or InjectorApp(), "POST", "/mutate", json.dumps(review).encode())
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def patch_of(answer: JSON) -> list[JSON]:
    response = answer["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))  # type: ignore[no-any-return]


def patched_pod(review: JSON, answer: JSON) -> JSON:
    return jsonpatch.apply_patch(review["request"]["object"], patch_of(answer))  # type: ignore[no-any-return]


def container(pod: JSON, name: str) -> JSON:
    spec = pod["spec"]
    matches = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name]
    assert len(matches) == 1, f"{name}: {len(matches)} containers"
    return matches[0]  # type: ignore[no-any-return]


def env_of(c: JSON) -> dict[str, str]:
    """Literal env values (entries read from the downward API or a Secret are left out)."""
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


K8S_ATTRIBUTES = (
    "k8s.pod.name=$(K8S_POD_NAME),k8s.namespace.name=$(K8S_NAMESPACE_NAME),"
    "k8s.node.name=$(K8S_NODE_NAME)"
)


def check_pod_rules(pod: JSON) -> None:
    """Rules a schema cannot express, shared with tests/unit/test_k8s_manifests.py."""
    spec = pod["spec"]
    for init in spec.get("initContainers", []):
        if init.get("restartPolicy") != "Always":
            probes = {"startupProbe", "livenessProbe", "readinessProbe", "lifecycle"} & set(init)
            assert not probes, f"init container {init['name']} cannot have {probes}"
    sidecar = container(pod, CONTAINER_NAME)
    drain = float(env_of(sidecar).get("SIDESTREAM_DRAIN_TIMEOUT", "30"))
    assert spec["terminationGracePeriodSeconds"] >= required_grace_period(drain)
    service = yaml.safe_load((ROOT / "k8s" / "base" / "service.yaml").read_text())
    target = service["spec"]["ports"][0]["targetPort"]
    names = [
        p["name"]
        for c in spec.get("initContainers", []) + spec["containers"]
        for p in c.get("ports", [])
    ]
    assert names.count(target) == 1, f"Service targetPort {target!r} must name exactly one port"
    assert target in [p["name"] for p in sidecar["ports"]]


# --- every fixture -----------------------------------------------------------------------


@pytest.mark.parametrize("name", INJECTING + NOT_INJECTING)
async def test_answer_echoes_uid_and_type(name: str) -> None:
    """Every answer is an admission.k8s.io/v1 AdmissionReview echoing the request's uid."""
    review = fixture(name)
    answer = await mutate(review)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == review["request"]["uid"]
    assert answer["response"]["allowed"] is True


@pytest.mark.parametrize("name", INJECTING)
async def test_patched_pod_is_valid_and_follows_the_rules(name: str) -> None:
    """The patch applies, the pod validates (1.33, strict), and the schema-less rules hold:
    probes only on restartPolicy Always init containers, grace covers the drain, the
    Service's targetPort exists in the pod."""
    review = fixture(name)
    pod = patched_pod(review, await mutate(review))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    check_pod_rules(pod)
    assert pod["metadata"]["annotations"]["sidestream.dev/status"] == "injected"
    sidecar = container(pod, CONTAINER_NAME)
    assert {"name": "sidestream-tmp", "mountPath": "/tmp"} in sidecar["volumeMounts"]
    assert any(v["name"] == "sidestream-tmp" and "emptyDir" in v for v in pod["spec"]["volumes"])
    for app_container in pod["spec"]["containers"]:
        if app_container["name"] != CONTAINER_NAME:
            assert "preStop" in app_container["lifecycle"]


@pytest.mark.parametrize("name", INJECTING)
async def test_second_pass_is_empty(name: str) -> None:
    """Idempotent: the injected pod sent again (reinvocationPolicy IfNeeded) gets no patch."""
    review = fixture(name)
    again = copy.deepcopy(review)
    again["request"]["object"] = patched_pod(review, await mutate(review))
    answer = await mutate(again)
    assert patch_of(answer) == []
    assert answer["response"]["allowed"] is True


# --- what the patch does -----------------------------------------------------------------


async def test_native_sidecar_shape() -> None:
    """Native mode: an init container with restartPolicy Always, /livez for startup and
    liveness, /readyz for readiness, the admin port on 0.0.0.0, hardened."""
    review = fixture("plain")
    pod = patched_pod(review, await mutate(review))
    sidecar = pod["spec"]["initContainers"][-1]
    assert sidecar["name"] == CONTAINER_NAME and sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/livez", "port": ADMIN_PORT_NAME}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/livez", "port": ADMIN_PORT_NAME}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": ADMIN_PORT_NAME}
    assert env_of(sidecar) == {
        "SIDESTREAM_LISTEN": "0.0.0.0:8080",
        "SIDESTREAM_UPSTREAM": "http://127.0.0.1:8000",
        "SIDESTREAM_ADMIN_LISTEN": "0.0.0.0:9901",
        "SIDESTREAM_DRAIN_TIMEOUT": "30",
        "OTEL_RESOURCE_ATTRIBUTES": K8S_ATTRIBUTES,
    }
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sidecar["resources"]["requests"] and sidecar["resources"]["limits"]["memory"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == required_grace_period(30) > 30
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm", "sidestream-tmp"]


async def test_missing_parents_are_created_before_appending() -> None:
    """A pod without initContainers, volumes or lifecycle gets each parent added first."""
    review = fixture("minimal")
    ops = patch_of(await mutate(review))
    paths = [op["path"] for op in ops]
    assert paths.index("/spec/initContainers") < paths.index("/spec/initContainers/-")
    assert paths.index("/spec/volumes") < paths.index("/spec/volumes/-")
    assert {
        "op": "add",
        "path": "/spec/containers/0/lifecycle",
        "value": ops[paths.index("/spec/containers/0/lifecycle")]["value"],
    } in ops
    assert (
        next(op for op in ops if op["path"] == "/spec/terminationGracePeriodSeconds")["op"] == "add"
    )


def test_missing_annotations_are_created_and_slash_escaped() -> None:
    """No metadata.annotations: add it as {} first; the key's `/` is written `~1`."""
    pod: JSON = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "m", "image": "m"}]}}
    ops, _ = build_patch(pod, InjectorSettings(upstream_port=8000))
    assert ops[0] == {"op": "add", "path": "/metadata/annotations", "value": {}}
    assert ops[1] == {
        "op": "add",
        "path": "/metadata/annotations/sidestream.dev~1status",
        "value": "injected",
    }
    patched = jsonpatch.apply_patch(pod, ops)
    assert patched["metadata"]["annotations"] == {"sidestream.dev/status": "injected"}


async def test_existing_init_containers_hooks_and_grace_are_respected() -> None:
    """The sidecar goes after existing init containers; a longer grace period is not
    lowered; a postStart-only lifecycle gains a preStop; a user's preStop is kept, with a
    warning."""
    review = fixture("existing-init")
    answer = await mutate(review)
    pod = patched_pod(review, answer)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-model", CONTAINER_NAME]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 300
    assert required_grace_period(120) < 300
    assert not any(op["path"] == "/spec/terminationGracePeriodSeconds" for op in patch_of(answer))
    vllm = container(pod, "vllm")
    assert set(vllm["lifecycle"]) == {"postStart", "preStop"}
    assert vllm["lifecycle"]["preStop"] == {"sleep": {"seconds": model_hold(120)}}
    drain = container(pod, CONTAINER_NAME)["lifecycle"]["preStop"]["exec"]["command"][2]
    assert "127.0.0.1:9901/drain" in drain
    agent = container(pod, "metrics-agent")
    assert agent["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "2"]}}
    assert any("metrics-agent" in w and "/drain" in w for w in answer["response"]["warnings"])
    assert env_of(container(pod, CONTAINER_NAME))["SIDESTREAM_DRAIN_TIMEOUT"] == "120"


async def test_grace_period_is_raised_to_cover_a_long_drain() -> None:
    """drain-timeout 600 raises a 300 s grace period to cover it, with `replace`."""
    review = fixture("existing-init")
    review["request"]["object"]["metadata"]["annotations"]["sidestream.dev/drain-timeout"] = "600"
    ops = patch_of(await mutate(review))
    grace = next(op for op in ops if op["path"] == "/spec/terminationGracePeriodSeconds")
    assert grace == {
        "op": "replace",
        "path": "/spec/terminationGracePeriodSeconds",
        "value": required_grace_period(600),
    }
    assert grace["value"] > 600


async def test_classic_mode_maps_every_annotation() -> None:
    """Classic mode: the sidecar is a regular container with a preStop sleep and no
    restartPolicy; every annotation lands in its env var; the app's hook is `sleep` in its
    own image (the kubelet's sleep action does not exist before 1.30)."""
    review = fixture("classic")
    pod = patched_pod(review, await mutate(review))
    assert "initContainers" not in pod["spec"]
    sidecar = pod["spec"]["containers"][-1]
    assert sidecar["name"] == CONTAINER_NAME and "restartPolicy" not in sidecar
    assert sidecar["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert sidecar["image"] == "registry.example.com/sidestream:0.1.0"
    assert env_of(sidecar) == {
        "SIDESTREAM_LISTEN": "0.0.0.0:8081",
        "SIDESTREAM_UPSTREAM": "http://127.0.0.1:3000",
        "SIDESTREAM_ADMIN_LISTEN": "0.0.0.0:9902",
        "SIDESTREAM_DRAIN_TIMEOUT": "30",
        "SIDESTREAM_KEEPALIVE_INTERVAL": "2.5",
        "SIDESTREAM_IDLE_TIMEOUT": "45",
        "SIDESTREAM_FIRST_TOKEN_TIMEOUT": "120",
        "SIDESTREAM_MAX_DURATION": "900",
        "SIDESTREAM_LOG_LEVEL": "debug",
        "SIDESTREAM_USAGE": "continuous",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger.observability:4318",
        "OTEL_RESOURCE_ATTRIBUTES": K8S_ATTRIBUTES,
    }
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {
        PORT_NAME: 8081,
        ADMIN_PORT_NAME: 9902,
    }
    assert container(pod, "vllm")["lifecycle"]["preStop"] == {
        "exec": {"command": ["sleep", str(model_hold(30))]}
    }


async def test_dry_run_gets_the_same_answer() -> None:
    """dryRun has no side effects to skip: the answer equals the non-dry-run one."""
    review = fixture("dry-run")
    wet = copy.deepcopy(review)
    wet["request"]["dryRun"] = False
    assert review["request"]["dryRun"] is True
    dry_answer, wet_answer = await mutate(review), await mutate(wet)
    assert patch_of(dry_answer) == patch_of(wet_answer) != []


# --- what is not injected ------------------------------------------------------------------


async def test_already_injected_pods_get_an_empty_patch() -> None:
    """A status annotation means: no patch, no warning (tests/asgi/test_injector_declared.py
    has the pods that declare their own sidecar)."""
    answer = await mutate(fixture("already-injected"))
    assert patch_of(answer) == [] and "warnings" not in answer["response"]


async def test_host_network_pods_are_skipped_with_a_warning() -> None:
    """hostNetwork pods are admitted uninjected, and the warning says why."""
    answer = await mutate(fixture("host-network"))
    assert patch_of(answer) == []
    assert "hostNetwork" in answer["response"]["warnings"][0]


async def test_bad_values_admit_uninjected_with_every_reason() -> None:
    """Bad annotations reject nothing by default: admitted, no patch, one warning naming
    each bad annotation."""
    answer = await mutate(fixture("bad-values"))
    assert patch_of(answer) == [] and answer["response"]["allowed"] is True
    [warning] = answer["response"]["warnings"]
    for key in ("upstream-port", "idle-timeout", "mode", "usage"):
        assert f"sidestream.dev/{key}" in warning


async def test_missing_upstream_port_is_named() -> None:
    """upstream-port is required; a pod without annotations is admitted uninjected."""
    answer = await mutate(fixture("no-annotations"))
    assert patch_of(answer) == []
    assert "sidestream.dev/upstream-port is required" in answer["response"]["warnings"][0]


async def test_operator_can_deny_bad_values() -> None:
    """With on_invalid="deny" a bad annotation denies the pod with a clear message."""
    review = fixture("bad-values")
    answer = await mutate(review, InjectorApp(on_invalid="deny"))
    response = answer["response"]
    assert response["allowed"] is False and response["uid"] == review["request"]["uid"]
    assert response["status"]["code"] == 400
    assert "sidestream.dev/idle-timeout" in response["status"]["message"]
    assert "patch" not in response


async def test_port_conflict_is_a_bad_value() -> None:
    """An app container already on the sidecar's listen port: not injected, with a warning."""
    review = fixture("minimal")
    review["request"]["object"]["spec"]["containers"][0]["ports"][0]["containerPort"] = 8080
    review["request"]["object"]["metadata"]["annotations"]["sidestream.dev/upstream-port"] = "8080"
    answer = await mutate(review)
    assert patch_of(answer) == [] and "must differ" in answer["response"]["warnings"][0]
    review["request"]["object"]["metadata"]["annotations"]["sidestream.dev/upstream-port"] = "8000"
    answer = await mutate(review)
    assert patch_of(answer) == [] and "already uses port 8080" in answer["response"]["warnings"][0]


async def test_unknown_annotation_warns_but_injects() -> None:
    """A typo'd sidestream.dev/ key is a warning, not a blocked rollout."""
    review = fixture("minimal")
    review["request"]["object"]["metadata"]["annotations"]["sidestream.dev/idle-timout"] = "5"
    answer = await mutate(review)
    assert patch_of(answer) != []
    assert (
        "sidestream.dev/idle-timout is not a sidestream setting"
        in answer["response"]["warnings"][0]
    )


@pytest.mark.parametrize("change", ["UPDATE", "Service"])
async def test_only_pod_creation_is_mutated(change: str) -> None:
    """Anything but a Pod CREATE is allowed untouched."""
    review = fixture("plain")
    if change == "UPDATE":
        review["request"]["operation"] = "UPDATE"
    else:
        review["request"]["kind"]["kind"] = "Service"
    answer = await mutate(review)
    assert answer["response"] == {"allowed": True, "uid": review["request"]["uid"]}


def test_settings_parsing_edges() -> None:
    """Whitespace is trimmed, fractional seconds kept, zero and negative durations refused."""
    settings, warnings = parse_settings(
        {
            "sidestream.dev/upstream-port": " 8000 ",
            "sidestream.dev/idle-timeout": "0.5",
            "other/x": "y",
        }
    )
    assert settings.upstream_port == 8000 and dict(settings.durations) == {"idle-timeout": 0.5}
    assert warnings == []
    for bad in ("0", "-1", "1e3", "inf", ""):
        with pytest.raises(ValueError, match="idle-timeout"):
            parse_settings(
                {"sidestream.dev/upstream-port": "8000", "sidestream.dev/idle-timeout": bad}
            )
    with pytest.raises(ValueError, match="otel-endpoint"):
        parse_settings(
            {"sidestream.dev/upstream-port": "8000", "sidestream.dev/otel-endpoint": "jaeger:4318"}
        )


# --- HTTP surface ----------------------------------------------------------------------------


async def test_http_routes_and_bad_requests() -> None:
    """/livez answers; bad JSON or a non-AdmissionReview is a 400; wrong method 405; other
    paths 404; an oversized body 413."""
    app = InjectorApp()
    assert await call(app, "GET", "/livez") == (200, b"ok\n")
    assert (await call(app, "POST", "/mutate", b"{not json"))[0] == 400
    assert (await call(app, "POST", "/mutate", b'{"apiVersion": "v1", "kind": "Pod"}'))[0] == 400
    assert (await call(app, "POST", "/mutate", b"[]"))[0] == 400
    no_uid = fixture("plain")
    del no_uid["request"]["uid"]
    assert (await call(app, "POST", "/mutate", json.dumps(no_uid).encode()))[0] == 400
    assert (await call(app, "GET", "/mutate"))[0] == 405
    assert (await call(app, "GET", "/"))[0] == 404
    assert (await call(app, "POST", "/mutate", b" " * (5 * 1024 * 1024)))[0] == 413


def test_cli_arguments() -> None:
    """--listen is HOST:PORT; --certfile and --keyfile go together."""
    args = parse_args(["--listen", "127.0.0.1:9443", "--on-invalid", "deny"])
    assert (args.host, args.port, args.on_invalid, args.certfile) == (
        "127.0.0.1",
        9443,
        "deny",
        None,
    )
    with pytest.raises(SystemExit):
        parse_args(["--certfile", "cert.pem"])
    with pytest.raises(SystemExit):
        parse_args(["--listen", "9443"])


# --- TLS certificate reload ------------------------------------------------------------------


def write_pair(
    directory: Path, common_name: str, key: ec.EllipticCurvePrivateKey | None = None
) -> tuple[bytes, bytes]:
    """A self-signed certificate for 127.0.0.1/localhost, swapped in atomically."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for filename, data in (("tls.crt", cert_pem), ("tls.key", key_pem)):
        (directory / f".{filename}.new").write_bytes(data)
        os.replace(directory / f".{filename}.new", directory / filename)
    return cert_pem, key_pem


def test_half_rotated_pair_keeps_the_old_certificate(tmp_path: Path) -> None:
    """A new certificate with the old key (rotation caught mid-write) is refused and the
    live context keeps its pair; the next consistent change is loaded."""
    old_key = ec.generate_private_key(ec.SECP256R1())
    write_pair(tmp_path, "a", old_key)
    certificate = ReloadingCertificate(tmp_path / "tls.crt", tmp_path / "tls.key", interval=60)
    assert certificate.reload_if_changed() is False  # nothing changed
    write_pair(tmp_path, "b")
    key_b = (tmp_path / "tls.key").read_bytes()
    (tmp_path / "tls.key").write_bytes(
        old_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    assert certificate.reload_if_changed() is False and certificate.reloads == 0
    (tmp_path / "tls.key").write_bytes(key_b)
    assert certificate.reload_if_changed() is True and certificate.reloads == 1
