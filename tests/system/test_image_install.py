"""The container image's install, reproduced where no image builder runs (no Docker engine,
no registry): what CI can check of the Dockerfile without building it.

- deploy/image.lock is current: `make lock` into a copy of it (uv keeps the pins that still
  satisfy pyproject.toml) changes nothing.
- From exactly the files .dockerignore lets into the build context, the wheel is built as the
  build stage builds it, and deploy/image-install.sh, the script the install stage runs,
  installs it into a fresh Python 3.11 venv: the compiled core runs, `pip check` passes, and
  every installed distribution is the version the lock pins, nothing more.

The .dockerignore matcher follows Docker's (moby/patternmatcher): patterns in order, the last
that matches a path or one of its parent directories decides; `*` and `?` stop at `/`, `**`
crosses it; `!` lets a path back in.

Bounded: one build and one venv for the module, each step under a timeout; only PyPI is
reached, for what pip's and uv's caches lack.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import json
import os
import re
import shutil
import sys
from pathlib import Path

import packaging
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.tools import tool
from tests.system.test_wheel_install import ENV, run

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
LOCK = Path("deploy", "image.lock")
INSTALL = Path("deploy", "image-install.sh")
VERSION = importlib.metadata.version("sidestream")
# The image's Python: the lock is installed on it.
PYTHON = "python3.11"


# --- .dockerignore ---------------------------------------------------------------------------


class DockerIgnore:
    """The paths a .dockerignore file leaves out of a build context, as Docker decides."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, list[str], re.Pattern[str]]] = []
        for line in text.removeprefix("\ufeff").splitlines():
            pattern = line.strip()
            if not pattern or pattern.startswith("#"):
                continue
            let_in = pattern.startswith("!")
            pattern = os.path.normpath(pattern.removeprefix("!").strip()).lstrip("/")
            self.rules.append((let_in, pattern.split("/"), compile_pattern(pattern)))

    def excludes(self, path: str) -> bool:
        """Whether `path` (relative, `/`-separated) stays out of the context."""
        parts = path.split("/")
        # A pattern that matches a parent directory matches everything under it.
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for let_in, _, regex in self.rules:
            if any(regex.match(candidate) for candidate in candidates):
                excluded = not let_in
        return excluded

    def may_let_in_under(self, directory: str) -> bool:
        """Whether a `!` pattern could match something under an excluded `directory`: if none
        can, the walk skips it (as Docker does), and .git or .venv are never read."""
        parts = directory.split("/")
        for let_in, pattern_parts, _ in self.rules:
            if not let_in:
                continue
            for part, pattern_part in zip(parts, pattern_parts, strict=False):
                if pattern_part == "**":
                    return True
                if not compile_pattern(pattern_part).match(part):
                    break
            else:  # the pattern matches the directory, a parent of it, or may match below
                return True
        return False


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regular expression over a whole relative path."""
    regex, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            regex += ".*" if i == len(pattern) else "(.*/)?"
        elif pattern[i] == "*":
            regex, i = regex + "[^/]*", i + 1
        elif pattern[i] == "?":
            regex, i = regex + "[^/]", i + 1
        elif pattern[i] in "[\\":
            raise ValueError(f"{pattern!r}: this matcher does not implement {pattern[i]!r}")
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.compile(f"^{regex}$")


def context_files(root: Path) -> list[str]:
    """The files of `root` that its .dockerignore lets into a build context."""
    ignore = DockerIgnore((root / ".dockerignore").read_text())
    found: list[str] = []
    for directory, subdirs, files in os.walk(root):
        here = Path(directory).relative_to(root).as_posix()
        prefix = "" if here == "." else f"{here}/"
        subdirs[:] = sorted(
            d
            for d in subdirs
            if not ignore.excludes(prefix + d) or ignore.may_let_in_under(prefix + d)
        )
        found += [prefix + f for f in sorted(files) if not ignore.excludes(prefix + f)]
    return found


@pytest.mark.parametrize(
    ("patterns", "path", "excluded"),
    [
        # Docker's documented examples (docs.docker.com, "Build context", .dockerignore).
        ("*/temp*", "somedir/temporary.txt", True),
        ("*/temp*", "somedir/temp", True),
        ("*/temp*", "temp.txt", False),
        ("*/temp*", "a/b/temp.txt", False),
        ("*/*/temp*", "somedir/subdir/temporary.txt", True),
        ("temp?", "tempa", True),
        ("temp?", "tempab", False),
        ("**/*.go", "a/b/c.go", True),
        ("**/*.go", "c.go", True),
        ("*.md\n!README*.md", "README-secret.md", False),
        ("*.md\n!README*.md\nREADME-secret.md", "README-secret.md", True),
        # The forms this project's .dockerignore uses.
        ("*\n!middleware/", "middleware/sse.py", False),
        ("*\n!middleware/\n**/__pycache__", "middleware/__pycache__/sse.pyc", True),
        ("*\n!deploy/image.lock", "deploy/image.lock", False),
        ("*\n!deploy/image.lock", "deploy/nginx/sidestream.conf", True),
    ],
)
def test_the_dockerignore_matcher_decides_as_docker_does(
    patterns: str, path: str, excluded: bool
) -> None:
    """The build context copied below is Docker's: the matcher gives Docker's documented
    answers, the last matching pattern winning and a matched directory taking its files."""
    assert DockerIgnore(patterns).excludes(path) is excluded


# --- the lock --------------------------------------------------------------------------------


def test_the_lock_is_current_with_pyproject(tmp_path: Path) -> None:
    """`make lock` into a copy of deploy/image.lock leaves it unchanged: the checked-in lock
    satisfies pyproject.toml's dependencies as they are now."""
    lock = tmp_path / "image.lock"
    shutil.copy(ROOT / LOCK, lock)
    env = {k: v for k, v in ENV.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    run(
        tool("make"), "--no-print-directory", "lock",
        f"LOCK={lock}", f"BIN={Path(tool('uv')).parent}",
        timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    before, after = (ROOT / LOCK).read_text(), lock.read_text()
    diff = difflib.unified_diff(
        before.splitlines(), after.splitlines(), str(LOCK), "now", n=1, lineterm=""
    )
    assert after == before, f"{LOCK} is out of date: run `make lock`\n" + "\n".join(diff)


def locked(lock: str, environment: dict[str, str]) -> dict[str, str]:
    """The lock's pins whose markers hold in `environment`: name to version."""
    pins: dict[str, str] = {}
    for line in lock.splitlines():
        if not line or line[0] in "# ":  # comments, and the `--hash` lines of each pin
            continue
        requirement = Requirement(line.removesuffix("\\").strip())
        (spec,) = requirement.specifier
        assert spec.operator == "==", line
        if requirement.marker is None or requirement.marker.evaluate(environment):
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


# --- the image's install ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build context: the files .dockerignore lets in, copied."""
    context = tmp_path_factory.mktemp("context")
    for name in context_files(ROOT):
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, context / name)
    return context


@pytest.fixture(scope="module")
def image_venv(context: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The install stage's venv: the wheel built in `context` as the build stage builds it
    (`pip wheel --no-deps` on Python 3.11), installed by deploy/image-install.sh."""
    work = tmp_path_factory.mktemp("image")
    python = tool(PYTHON)
    run(python, "-m", "venv", work / "build", timeout=120)
    wheels = work / "wheels"
    run(
        work / "build" / "bin" / "pip", "wheel", "--no-deps", "--wheel-dir", wheels, ".",
        timeout=600, cwd=context,
    )  # fmt: skip
    venv = work / "venv"
    run(
        tool("sh"), context / INSTALL, venv, wheels,
        timeout=600, cwd=context, env={**ENV, "PYTHON": python},
    )  # fmt: skip
    return venv


def test_the_context_holds_what_the_image_needs_and_nothing_built(context: Path) -> None:
    """The context has the lock, the install script and the packages' sources, and none of
    what a local build or the rest of the tree leaves around (tests, deploy/nginx, .so)."""
    files = {p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file()}
    assert {LOCK.as_posix(), INSTALL.as_posix(), "pyproject.toml", "setup.py"} <= files
    assert "middleware/sse.py" in files and "sidecar/cli.py" in files
    assert not [f for f in files if f.endswith((".so", ".pyc")) or "__pycache__" in f]
    assert not [f for f in files if f.startswith(("tests/", "deploy/nginx/", ".git"))]


def test_the_image_install_runs_the_compiled_core(image_venv: Path, tmp_path: Path) -> None:
    """`sidestream --version` in the image's venv names the version and the compiled core."""
    assert run(image_venv / "bin" / "sidestream", "--version", timeout=60, cwd=tmp_path) == (
        f"sidestream {VERSION} (compiled core)\n"
    )


def test_the_image_install_passes_pip_check(image_venv: Path) -> None:
    """`pip check` against the image's venv (which has no pip of its own left) finds every
    requirement of every installed distribution satisfied."""
    out = run(
        sys.executable, "-m", "pip", "--python", image_venv / "bin" / "python", "check",
        timeout=120,
    )  # fmt: skip
    assert "No broken requirements found" in out


def test_the_image_install_has_exactly_the_locked_versions(image_venv: Path) -> None:
    """Every distribution in the image's venv but sidestream is pinned by the lock at the
    version installed, and every pin whose marker holds there is installed."""
    python = image_venv / "bin" / "python"
    listing = "import importlib.metadata as m, json\n"
    listing += "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    installed = {
        canonicalize_name(name): version
        for name, version in json.loads(run(python, "-c", listing, timeout=60)).items()
    }
    assert installed.pop(canonicalize_name("sidestream")) == VERSION
    # The markers, as the venv's own interpreter evaluates them (packaging is lent to it).
    marker_env = "import json; from packaging.markers import default_environment as e\n"
    marker_env += "print(json.dumps(e()))"
    lent = {**ENV, "PYTHONPATH": str(Path(packaging.__file__).parent.parent)}
    environment = json.loads(run(python, "-c", marker_env, timeout=60, env=lent))
    assert installed == locked((ROOT / LOCK).read_text(), environment)
