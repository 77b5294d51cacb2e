"""`python -m bench.paced`'s choice of scenario: `--flood` measures scenario b (CPU per token of
a saturated proxy), without it scenario a, in turns and together alike; its ratios are to the
first target, repetition by repetition."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from bench import paced, run, scenarios

CPU = {"nginx": 2.0, "sidestream": 2.3}  # CPU s per 100k tokens by target, in scenario a


@pytest.fixture
def fake_load(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Sessions and loads that record which scenario ran for which target, no processes."""
    ran: list[str] = []

    @contextlib.contextmanager
    def session(target: str, sink_port: int) -> Iterator[str]:
        yield target

    @contextlib.contextmanager
    def otlp_sink() -> Iterator[int]:
        yield 0

    def paced_load(s: Any, tokens: int, stamp: str) -> dict[str, float]:
        ran.append(f"a {s}")
        return {"a_cpu_100k": CPU[s]}

    def flood_load(s: Any) -> dict[str, float]:
        ran.append(f"b {s}")
        return {"b_cpu_100k": CPU[s] / 4}

    monkeypatch.setattr(run, "session", session)
    monkeypatch.setattr(paced, "session", session)
    monkeypatch.setattr(paced, "otlp_sink", otlp_sink)
    monkeypatch.setattr(paced, "telemetry_wired", lambda sink_port: True)  # as shipped exports
    monkeypatch.setattr(scenarios, "paced", paced_load)
    monkeypatch.setattr(scenarios, "flood", flood_load)
    return ran


@pytest.mark.parametrize("together", [False, True], ids=["in-turns", "together"])
@pytest.mark.parametrize("flood", [False, True], ids=["a", "b"])
def test_flood_picks_scenario_b_and_the_ratio_is_to_the_first_target(
    fake_load: list[str], capsys: pytest.CaptureFixture[str], together: bool, flood: bool
) -> None:
    """Rule: `--flood` runs scenario b for every target and reports its CPU per token; without
    it, scenario a. The ratio is each target's figure over the first target's."""
    argv = ["--targets", "nginx,sidestream", "--reps", "2"]
    argv += ["--flood"] * flood + ["--together"] * together
    assert paced.main(argv) == 0
    scenario = "b" if flood else "a"
    assert sorted(fake_load) == sorted(f"{scenario} {t}" for t in ("nginx", "sidestream") * 2)
    out = capsys.readouterr().out
    assert f"\nscenario {scenario}," in out
    assert "| sidestream | " in out and "| 1.150x |" in out  # 2.3 / 2.0, either scenario
