"""`bench.lab.instructions`' count of the cyclic collector's passes under valgrind's callgrind
(a child process, so the system tier; the arithmetic is tests/unit/test_bench_instructions.py).
valgrind missing is a failure, not a skip: `make test-deps` installs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.lab.instructions import callgrind_total, collector
from tests.support.tools import tool


def run_counted(tmp_path: Path, code: str) -> Path:
    out = tmp_path / "callgrind.out"
    argv = [tool("valgrind"), "--tool=callgrind", f"--callgrind-out-file={out}"]
    subprocess.run([*argv, sys.executable, "-c", code], check=True, capture_output=True)
    return out


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
