"""The injector's sizing annotations (`sidecar.injector.sizing`): CPU and memory requests and
limits, max-streams, upstream-health, and the memory rule that fits the streams and the
memory resume store under the limit. A real process under that rule:
tests/system/test_injector_sizing_rss.py."""

from __future__ import annotations

import re

import pytest

from sidecar.config import FLAGS
from sidecar.injector import InjectorSettings, InvalidAnnotation, parse_settings
from sidecar.injector.patch import sidecar_container
from sidecar.injector.sizing import (
    BASE_MEMORY,
    DEFAULT_MAX_STREAMS,
    STORE_SHARE,
    STREAM_MEMORY,
    MiB,
)

P = "sidestream.dev/"


def settings_for(**annotations: str) -> tuple[InjectorSettings, dict[str, str]]:
    """Parse `upstream-port: 8000` plus `annotations` (underscores for dashes); return the
    settings and the sidecar's literal env."""
    ours = {P + "upstream-port": "8000"}
    ours |= {P + key.replace("_", "-"): value for key, value in annotations.items()}
    settings, _ = parse_settings(ours)
    env = {e["name"]: e["value"] for e in settings.env() if "value" in e}
    return settings, env


def problems_for(**annotations: str) -> str:
    with pytest.raises(InvalidAnnotation) as caught:
        settings_for(**annotations)
    return str(caught.value)


def test_the_rule_assumes_the_sidecars_own_max_streams_default() -> None:
    """Rule: with no max-streams annotation the memory rule counts the streams the sidecar
    will admit, its own --max-streams default."""
    [default] = [d for flag, _, d, _ in FLAGS if flag == "max-streams"]
    assert int(str(default)) == DEFAULT_MAX_STREAMS


def test_defaults_fit_and_map_onto_the_container() -> None:
    """Rule: without annotations the sidecar gets 100m CPU and 128Mi requested, a 256Mi memory
    limit and no CPU limit, and that limit holds the process and 10,000 streams."""
    settings, env = settings_for()
    container = sidecar_container(settings)
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert 256 * MiB >= BASE_MEMORY + DEFAULT_MAX_STREAMS * STREAM_MEMORY
    assert "SIDESTREAM_MAX_STREAMS" not in env and "SIDESTREAM_UPSTREAM_HEALTH" not in env


def test_resource_annotations_map_onto_the_container() -> None:
    """Rule: cpu-request, cpu-limit, memory-request and memory-limit land in the container's
    resources as written; a memory limit below the default request lowers the request."""
    settings, _ = settings_for(
        cpu_request="250m", cpu_limit="2", memory_request="300Mi", memory_limit="1Gi"
    )
    assert sidecar_container(settings)["resources"] == {
        "requests": {"cpu": "250m", "memory": "300Mi"},
        "limits": {"cpu": "2", "memory": "1Gi"},
    }
    settings, _ = settings_for(memory_limit="100Mi", max_streams="1000")
    assert sidecar_container(settings)["resources"]["requests"]["memory"] == "100Mi"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cpu-request", "0m"),
        ("cpu-request", "5m"),
        ("cpu-request", "65"),
        ("cpu-request", "1e3"),
        ("cpu-limit", "two"),
        ("memory-request", "16Mi"),
        ("memory-request", "1.5Gi"),
        ("memory-limit", "32Mi"),
        ("memory-limit", "100Ti"),
        ("memory-limit", "256m"),
        ("max-streams", "0"),
        ("max-streams", "100001"),
        ("max-streams", "off"),
        ("upstream-health", "health"),
        ("upstream-health", "/a b"),
        ("upstream-health", "/" + "x" * 256),
    ],
)
def test_out_of_range_values_are_named(key: str, value: str) -> None:
    """Rule: each sizing annotation has a range; a value outside it, or in a form other than
    the plain ones (millicores or cores, whole bytes with a unit), is refused by name."""
    assert f"{P}{key}: {value!r}" in problems_for(**{key.replace("-", "_"): value})


def test_a_limit_below_its_request_is_refused() -> None:
    """Rule: Kubernetes refuses a limit below its request, so the injector names it first."""
    text = problems_for(cpu_request="500m", cpu_limit="250m")
    assert f"{P}cpu-limit 250m is below the CPU request 500m" in text
    text = problems_for(memory_request="512Mi", memory_limit="256Mi")
    assert f"{P}memory-request 512Mi is above the memory limit 256Mi" in text


def test_max_streams_and_upstream_health_map_onto_their_env_vars() -> None:
    """Rule: max-streams and upstream-health land in SIDESTREAM_MAX_STREAMS and
    SIDESTREAM_UPSTREAM_HEALTH."""
    _, env = settings_for(max_streams="64", upstream_health="/openapi.json")
    assert env["SIDESTREAM_MAX_STREAMS"] == "64"
    assert env["SIDESTREAM_UPSTREAM_HEALTH"] == "/openapi.json"


def test_a_limit_that_cannot_hold_the_streams_is_refused_with_what_fits() -> None:
    """Rule: memory-limit >= 64 MiB + 16 KiB per stream. 128Mi cannot hold the default 10,000
    streams; the refusal names the max-streams that fits, and that value is accepted."""
    text = problems_for(memory_limit="128Mi")
    assert f"{P}memory-limit 128Mi cannot hold 10000 streams" in text
    most = int(re.findall(r"set max-streams to (\d+) or fewer", text)[0])
    assert most == (128 * MiB - BASE_MEMORY) // STREAM_MEMORY
    settings_for(memory_limit="128Mi", max_streams=str(most))
    assert "cannot hold" in problems_for(memory_limit="128Mi", max_streams=str(most + 1))


def test_the_memory_store_bound_is_lowered_to_fit_the_limit() -> None:
    """Rule: with resume on and the memory store, SIDESTREAM_RESUME_MEMORY is 3/4 of what the
    limit leaves after the process and the streams (the sidecar's own 256 MiB would be the
    whole limit); Redis stores get no bound."""
    for store in ({}, {"resume_store": "memory"}):
        _, env = settings_for(resume="true", memory_limit="512Mi", max_streams="1000", **store)
        left = 512 * MiB - BASE_MEMORY - 1000 * STREAM_MEMORY
        assert int(env["SIDESTREAM_RESUME_MEMORY"]) == int(left * STORE_SHARE)
    _, env = settings_for(resume="true")  # the defaults leave ~27 MiB: enough
    assert 8 * MiB <= int(env["SIDESTREAM_RESUME_MEMORY"]) < 256 * MiB - 220 * MiB
    _, env = settings_for(
        resume="true", resume_store="redis://redis.default:6379/0", resume_secret="sidestream"
    )
    assert "SIDESTREAM_RESUME_MEMORY" not in env
    _, env = settings_for()
    assert "SIDESTREAM_RESUME_MEMORY" not in env


def test_a_memory_store_bound_that_does_not_fit_is_refused_with_the_limit_that_would() -> None:
    """Rule: a resume-memory the operator set is kept or refused, never lowered: 200Mi under
    the default 256Mi limit is refused, and the memory-limit the refusal names is accepted
    with it."""
    text = problems_for(resume="true", resume_memory="200Mi")
    assert f"{P}resume-memory 200Mi does not fit" in text
    need = re.findall(r"raise memory-limit to (\d+Mi)", text)[0]
    _, env = settings_for(resume="true", resume_memory="200Mi", memory_limit=need)
    assert env["SIDESTREAM_RESUME_MEMORY"] == str(200 * MiB)


def test_too_little_room_for_any_store_is_refused() -> None:
    """Rule: when the limit leaves the memory store under 8 MiB, the pod is refused with the
    memory-limit that would leave it 8 MiB, and that limit is accepted."""
    text = problems_for(resume="true", memory_limit="230Mi")
    assert "under the 8.0Mi minimum" in text
    need = re.findall(r"raise memory-limit to (\d+Mi)", text)[0]
    settings_for(resume="true", memory_limit=need)
