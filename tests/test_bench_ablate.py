"""`bench.ablate`: its source patches' anchors must still match the code, and its sink
ablations must name sinks that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ablate import ABLATIONS, patch
from middleware.telemetry.sinks import SINKS, parse_sinks

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(name for name, (parts, _) in ABLATIONS.items() if parts))
def test_each_ablation_patches_the_current_source_into_code_that_compiles(
    name: str, tmp_path: Path
) -> None:
    """Rule: every anchor is in its file exactly once (else the ablation would measure
    unpatched code or refuse to run), and the patched file is still valid Python whose
    function returns early."""
    parts, _ = ABLATIONS[name]
    for file, _, _ in parts:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text((ROOT / file).read_text())
    patch(tmp_path, parts)
    for file, _, replacement in parts:
        patched = (tmp_path / file).read_text()
        assert replacement in patched
        assert patched.count("# ABLATED") == sum(1 for p in parts if p[0] == file)
        compile(patched, file, "exec")


@pytest.mark.parametrize("name", sorted(name for name, (_, s) in ABLATIONS.items() if s))
def test_each_sink_ablation_leaves_out_a_sink_that_exists(name: str) -> None:
    """Rule: a sink ablation is configuration the sidecar accepts (an unknown name would stop
    it at start), and it leaves at least one sink out (else it would measure nothing)."""
    _, sinks = ABLATIONS[name]
    assert parse_sinks(sinks) < SINKS


def test_a_missing_anchor_stops_the_run(tmp_path: Path) -> None:
    """Rule: code that moved on from an anchor is reported, never silently left unpatched."""
    file = ABLATIONS["frame"][0][0][0]
    (tmp_path / file).parent.mkdir(parents=True)
    (tmp_path / file).write_text("def matches(body):\n    return True\n")
    with pytest.raises(SystemExit, match="anchor"):
        patch(tmp_path, ABLATIONS["frame"][0])
