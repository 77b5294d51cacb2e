"""The outside programs the tests run (nginx, Chromium, redis-server, ...), found in one place.

`make test` installs them first (`make test-deps`, which runs `tests/support/system-deps.sh`).
A test that needs one that is missing fails with one line naming it and that command: it
never skips, or a missing program would leave its feature untested unnoticed. Only the tests
that run a program look for it, so `make test-fast` (unit and asgi) needs none.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# Where to look, in order: beside the interpreter first, where pip puts a wheel's programs
# (the `system` extra's kubectl, the version the tests were written against), which is not
# on PATH when pytest runs as `.venv/bin/pytest`; then PATH; then /usr/sbin, Debian's home
# for nginx, which is on root's PATH but not a user's.
VENV_BIN = str(Path(sys.executable).parent)
SBIN = ("/usr/sbin", "/usr/local/sbin")


def find(*names: str) -> str | None:
    """The path of the first of `names` found beside the interpreter, on PATH or in `SBIN`."""
    search = os.pathsep.join([VENV_BIN, os.environ.get("PATH", os.defpath), *SBIN])
    for name in names:
        if path := shutil.which(name, path=search):
            return path
    return None


def tool(name: str, *alternatives: str) -> str:
    """The path of program `name` (or of the first of `alternatives` found); fail the test
    in one line when none is installed."""
    path = find(name, *alternatives)
    if path is None:
        reason = f"{name} is not installed: `make test-deps` installs what the tests run"
        pytest.fail(reason, pytrace=False)
    return path
