"""`bench.resume_scale` (one redis-server, two sidecars with resume on it) at its smallest
size: the sizing figures in docs/resume.md come from a benchmark that runs, and whose report
is whole and agrees with itself."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from bench.resume_scale import LONG_TOKENS
from bench.targets import ROOT
from tests.support.tools import tool

STREAMS, TOKENS, ITL_MS = 4, 20, 20
DEFAULT_MAX_BYTES = 1024 * 1024  # the default --resume-max-bytes


def test_the_smallest_run_reports_every_figure_consistently(tmp_path: Path) -> None:
    """Rule: `python -m bench.resume_scale` writes a report with every figure present, finite
    and agreeing: every stream whole (all its tokens seen, ended), each token appended to
    Redis (an XADD each, inside EVAL batches), CPU and memory above zero, the saturation
    estimate equal to its stated formula, and the long stream trimmed to the default
    limit."""
    env = {**os.environ, "PATH": f"{Path(tool('redis-server')).parent}:{os.environ['PATH']}"}
    argv = [sys.executable, "-m", "bench.resume_scale", "--streams", str(STREAMS)]
    argv += ["--tokens", str(TOKENS), "--itl-ms", str(ITL_MS), "--out", str(tmp_path)]
    subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True, timeout=100)
    (written,) = tmp_path.glob("*-resume-scale.md")
    text = written.read_text()
    raw = json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])
    (step,) = raw["steps"]
    assert step["streams_whole"] == STREAMS
    assert step["tokens"] == STREAMS * TOKENS
    assert step["commands"]["xadd"] >= step["tokens"]
    assert step["commands"]["eval"] >= 1
    for key in ("commands_per_token", "redis_in_bytes_per_token", "bytes_per_stream"):
        assert 0 < step[key] < math.inf, (key, step[key])
    assert 0 < step["redis_cpu_100k"] < math.inf
    per_token = step["redis_cpu_100k"] / 1e5
    assert math.isclose(step["saturating_streams"], ITL_MS / 1000 / per_token, rel_tol=1e-9)
    assert step["one_stream"]["entries"] > TOKENS  # its tokens, and its role, finish and end
    long = raw["long_stream"]
    assert long["entries"] < LONG_TOKENS  # trimmed: the oldest events went
    assert DEFAULT_MAX_BYTES < long["stream_bytes"] < 4 * DEFAULT_MAX_BYTES
    assert f"| {STREAMS} | {STREAMS * TOKENS} | {STREAMS} |" in text
