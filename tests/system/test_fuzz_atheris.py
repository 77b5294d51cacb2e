"""Bounded coverage-guided fuzzing of the SSE scanner (atheris, in a subprocess).

atheris ends its process when it is done, so the harness in tests/support/fuzz/ runs as a child;
this test fails when the fuzzer finds an input that breaks a scanner rule (atheris then
exits non-zero and prints the input).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).parents[1] / "support" / "fuzz" / "sse_atheris.py"
ROOT = Path(__file__).parents[2]


def test_atheris_finds_no_split_that_changes_the_events() -> None:
    """Any split of any input gives the same events, state and truncation as the whole (5 s)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(HARNESS), "-max_total_time=5", "-max_len=512", "-seed=1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Done" in result.stderr
