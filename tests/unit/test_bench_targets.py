"""The benchmark's target names: `sidestream` is the sidecar as shipped, and each `+` names
one thing changed from it (`bench.targets.VARIANTS`); a name that is not a target is refused
before anything starts."""

from __future__ import annotations

import pytest

from bench.targets import TARGETS, known, proxy_targets, telemetry_on, variant


def test_sidestream_as_shipped_has_telemetry_on_and_no_changes() -> None:
    """Rule: the bare `sidestream` target is the configuration a user gets: telemetry on,
    nothing changed; `+no-otel` is the one that turns telemetry off."""
    assert variant("sidestream") == ("sidestream", frozenset())
    assert telemetry_on("sidestream") and telemetry_on("sidestream+pass")
    assert telemetry_on("alt") and not telemetry_on("alt+no-otel")
    assert not telemetry_on("sidestream+no-otel+pass")
    assert not telemetry_on("nginx") and not telemetry_on("direct")


@pytest.mark.parametrize(
    "name",
    [
        "sidestream+otel",  # the old name of as shipped: not a variant
        "sidestream+pass+pass",
        "sidestream+pass+continuous",
        "sidestream+resume+redis",
        "nginx+no-otel",
        "sidestreams",
        "",
    ],
)
def test_a_name_that_is_not_a_target_is_refused(name: str) -> None:
    """Rule: an unknown variant, one named twice, two that exclude each other, or a `+` on a
    target that is not sidestream, is not a target; `proxy_targets` refuses it by the
    parser's error, before any process starts."""
    assert not known(name)
    errors: list[str] = []

    def error(message: str) -> None:
        errors.append(message)
        raise SystemExit(2)

    with pytest.raises(SystemExit):
        proxy_targets(f"nginx,{name}" if name else "", error)
    assert errors and "sidestream or alt, then any of +no-otel" in errors[0]


def test_every_listed_target_is_known() -> None:
    """Rule: the targets a `--targets` help lists are all accepted."""
    assert all(known(t) for t in TARGETS)
