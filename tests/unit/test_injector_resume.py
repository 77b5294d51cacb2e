"""The injector's resume annotations (`sidecar.injector.settings`): each maps onto its
`SIDESTREAM_RESUME*` variable; bad values are named problems."""

from __future__ import annotations

import pytest

from sidecar.injector.settings import InvalidAnnotation, parse_settings


def test_resume_annotations_map_onto_their_env_vars() -> None:
    """Rule: `resume`, `resume-store`, `resume-grace`, `resume-ttl` land in SIDESTREAM_RESUME,
    SIDESTREAM_RESUME_STORE, SIDESTREAM_RESUME_GRACE and SIDESTREAM_RESUME_TTL; a Redis store
    comes with the Secret its resume secret is read from (SIDESTREAM_RESUME_SECRET_FILE)."""
    settings, warnings = parse_settings(
        {
            "sidestream.dev/upstream-port": "8000",
            "sidestream.dev/resume": "true",
            "sidestream.dev/resume-store": "redis://redis.default:6379/0",
            "sidestream.dev/resume-secret": "sidestream-resume",
            "sidestream.dev/resume-grace": "45",
            "sidestream.dev/resume-ttl": "900",
        }
    )
    env = {e["name"]: e["value"] for e in settings.env() if "value" in e}
    assert warnings == []
    assert env["SIDESTREAM_RESUME"] == "true"
    assert env["SIDESTREAM_RESUME_STORE"] == "redis://redis.default:6379/0"
    assert env["SIDESTREAM_RESUME_GRACE"] == "45" and env["SIDESTREAM_RESUME_TTL"] == "900"
    assert env["SIDESTREAM_RESUME_SECRET_FILE"].endswith("/secret")
    off, _ = parse_settings({"sidestream.dev/upstream-port": "8000"})
    assert not any(e["name"].startswith("SIDESTREAM_RESUME") for e in off.env())


def test_bad_resume_annotations_are_named() -> None:
    """Rule: a resume value that is not a boolean, a store that is not memory or redis://,
    and a grace that is not a positive number are each named."""
    with pytest.raises(InvalidAnnotation) as caught:
        parse_settings(
            {
                "sidestream.dev/upstream-port": "8000",
                "sidestream.dev/resume": "maybe",
                "sidestream.dev/resume-store": "mysql://x",
                "sidestream.dev/resume-grace": "-1",
            }
        )
    text = str(caught.value)
    for key in ("resume:", "resume-store:", "resume-grace:"):
        assert f"sidestream.dev/{key}" in text
