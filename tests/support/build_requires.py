"""`python -m tests.support.build_requires`: install pyproject's `[build-system] requires`
(setuptools, Cython) into the running interpreter's environment.

`pip install` builds in an isolated environment from that list; an in-place build
(`setup.py build_ext --inplace`: `make sanitize`, a developer's rebuild) uses the venv's own
tools instead. The Makefile's venv recipes and `make sanitize` install them from here, so
the pins have one source: pyproject.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def requires() -> list[str]:
    """The build requirements pyproject names."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        return list(tomllib.load(file)["build-system"]["requires"])


def install() -> None:
    """Install them with this interpreter's pip (quick when they are there already)."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", *requires()]
    subprocess.run(command, check=True)


if __name__ == "__main__":
    install()
