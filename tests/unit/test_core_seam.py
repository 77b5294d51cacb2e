"""The one seam between the compiled core and the Python one (`middleware.speedups.compiled`):
by the time the sidecar names its core (the start line, `--version`), every compiled module
the build makes has been asked for, so a module that is missing is named, not hidden behind
"compiled core"."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

import middleware
import sidecar

# Where the packages the tests import are (the tree, or an installed wheel's site-packages):
# the subprocess below imports the same ones.
HOME = Path(middleware.__path__[0]).parent
# `python -m sidecar --version` with one compiled module made unimportable, as where its
# build failed: a finder ahead of the others refuses it.
HIDING = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == {name!r}:
            raise ImportError("not built")
sys.meta_path.insert(0, Refuse())
from sidecar.cli import main
raise SystemExit(main(["--version"]))
"""


def built_modules() -> set[str]:
    """The compiled modules the build made, by their files where the packages are imported
    from (the tree, or an installed wheel's site-packages)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = set()
    for package in (middleware, sidecar):
        home = Path(package.__path__[0])
        for path in home.rglob("*"):
            if path.name.endswith(suffixes):
                stem = path.name.split(".", 1)[0]
                found.add(".".join((*path.parent.relative_to(home.parent).parts, stem)))
    return found


def version_with(hidden: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SIDESTREAM_NO_EXTENSIONS"}
    code = HIDING.format(name=hidden)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=HOME, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_built_module_is_asked_for_before_the_core_is_named() -> None:
    """Rule: importing the sidecar's entry point asks the seam for every compiled module the
    build made (the middleware's and the sidecar's), so `core()` speaks of all of them."""
    from middleware import speedups
    from sidecar import cli  # noqa: F401 - what the start line and --version import

    built = built_modules()
    assert built, "the compiled core is built wherever the tests run (make install)"
    assert built <= set(speedups._asked), built - set(speedups._asked)


@pytest.mark.parametrize("hidden", ["sidecar._uvread", "middleware._usage", "sidecar._heads"])
def test_a_module_that_is_not_built_is_named_by_version(hidden: str) -> None:
    """Rule: where one compiled module is missing, `sidestream --version` says the core is
    compiled but for that module, named; it does not say "compiled core"."""
    assert hidden in built_modules()
    out = version_with(hidden)
    assert f"pure Python for {hidden} (not built)" in out, out


def test_nothing_hidden_is_the_compiled_core() -> None:
    """Rule: with every module built and the switch unset, the core is "compiled core"."""
    assert "(compiled core)" in version_with("nothing.hidden")
