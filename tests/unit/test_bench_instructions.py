"""`bench.lab.instructions`' arithmetic and its count of the cyclic collector's passes, which
it shows apart because whether a pass lands in a load is chance."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lab.instructions import callgrind_total, collector, line

# `.ci/run` installs valgrind; elsewhere the counting tests say what is missing.
needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind is not installed (apt-get install valgrind)"
)


def test_the_slope_is_per_token_and_the_rest_per_stream() -> None:
    """Rule: two loads of 10 streams, of 5 and 205 tokens, costing 1,000 a token and 60,000 a
    stream, give back exactly those two figures."""
    a = 10 * (60_000 + 5 * 1_000)
    b = 10 * (60_000 + 205 * 1_000)
    assert line(a, b, 10, 5, 205) == (1_000, 60_000)


def run_counted(tmp_path: Path, code: str) -> Path:
    out = tmp_path / "callgrind.out"
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    subprocess.run([*argv, sys.executable, "-c", code], check=True, capture_output=True)
    return out


@needs_valgrind
def test_a_collection_is_counted_and_the_rest_is_what_is_left_without_it(tmp_path: Path) -> None:
    """Rule: of two programs that differ only by one full collection over 20,000 lists, the
    one with it has that pass counted, callees included (start-up and exit collect in both),
    and what is left without the collector's passes is the same for both, within 2%."""
    heap = "import gc; gc.disable(); x = [[i] for i in range(20000)]"
    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    collected = run_counted(tmp_path / "with", f"{heap}; gc.collect(); del x")
    plain = run_counted(tmp_path / "without", f"{heap}; del x")
    passes = collector([collected]), collector([plain])
    total = callgrind_total([collected]), callgrind_total([plain])
    assert passes[0] - passes[1] > 0.05 * total[0]
    rest = total[0] - passes[0], total[1] - passes[1]
    assert abs(rest[0] - rest[1]) < 0.02 * rest[1], (passes, total)
