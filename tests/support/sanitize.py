"""`make sanitize`: every C extension the build makes, under AddressSanitizer and UBSan.

Whatever `setup.py` builds (hand-written C or Cython's output alike) is built again with
`-fsanitize=address,undefined`, in a copy of the tree under `build/sanitize/`, so that the
working tree's own extensions stay as they are. The twin-equivalence tests and the
differential fuzz (`tests/unit/test_twins_fuzz.py`) then run there against it, with:

- libasan and libubsan preloaded: the interpreter itself is not instrumented, so the
  sanitizers' runtimes must be in the process before any extension loads;
- `PYTHONMALLOC=malloc`: pymalloc's arenas would hide an over-read of a small object from
  ASan, which sees only what malloc hands out;
- leaks not reported (the interpreter leaves its own at exit), and any other report fatal;
- `SIDESTREAM_FUZZ_SCALE` (default 3) multiplying each property test's examples, so the run
  is time-boxed by its example counts, not by a clock: a few minutes on two cores (CI's);
  a property at 3,000 examples runs 9,000 under the sanitizers, past pytest's usual
  per-test limit, which is raised here to match.

A build in which any extension did not compile fails here: a sanitizer run over the Python
twins alone would prove nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.support import build_requires

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "sanitize"
SANITIZERS = "-fsanitize=address,undefined"
FLAGS = f"{SANITIZERS} -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
# The tests that hold each compiled routine to its twin, and the differential fuzz.
TESTS = [
    "tests/unit/test_core_twins.py",
    "tests/unit/test_usage_twins.py",
    "tests/unit/test_headers.py",
    "tests/unit/test_read_headers.py",
    "tests/unit/test_response_head.py",
    "tests/unit/test_resume_stamper.py",
    "tests/unit/test_twins_fuzz.py",
]


def runtime(name: str) -> str:
    """The path of the compiler's sanitizer runtime `name` (libasan.so, libubsan.so)."""
    cc = os.environ.get("CC", sysconfig.get_config_var("CC") or "cc").split()[0]
    path = subprocess.run(
        [cc, f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.path.isabs(path):
        sys.exit(f"sanitize: {cc} has no {name} (Debian: apt-get install gcc)")
    return path


def copy_tree() -> Path:
    """The tracked and new files of the tree (no build output, no venv) under OUT."""
    tree = OUT / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file() and not source.name.endswith(".so"):
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    return tree


def build(tree: Path) -> list[str]:
    """Build every extension in place with the sanitizers; the module names built."""
    env = {**os.environ, "CFLAGS": FLAGS, "LDFLAGS": SANITIZERS, "SIDESTREAM_REQUIRE_BUILD": "1"}
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"],
        cwd=tree,
        env=env,
        check=True,
    )
    built = sorted(
        str(path.relative_to(tree)).split(".")[0].replace("/", ".")
        for path in tree.rglob("*.so")
        if path.parts[len(tree.parts)] in ("middleware", "sidecar")
    )
    if not built:
        sys.exit("sanitize: no extension was built")
    return built


def main() -> int:
    # The in-place build uses the venv's own setuptools and Cython: pyproject's pins.
    build_requires.install()
    tree = copy_tree()
    built = build(tree)
    print(f"sanitize: built with {SANITIZERS}: {', '.join(built)}", flush=True)
    env = {
        **os.environ,
        "LD_PRELOAD": f"{runtime('libasan.so')} {runtime('libubsan.so')}",
        "PYTHONMALLOC": "malloc",
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:strict_string_checks=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "SIDESTREAM_FUZZ_SCALE": os.environ.get("SIDESTREAM_FUZZ_SCALE", "3"),
        "SIDESTREAM_SANITIZED": " ".join(built),
    }
    env.pop("SIDESTREAM_NO_EXTENSIONS", None)
    # From the copy: its packages come first on sys.path, ahead of the editable install.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=1200"]
    command += TESTS
    return subprocess.run(command, cwd=tree, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
