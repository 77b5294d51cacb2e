"""`tests.support.tools`: the programs the tests run are found where pip and Debian put them,
and a missing one fails its test in one line that names it and `make test-deps`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import tools


def program(directory: Path, name: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_missing_program_fails_in_one_line_naming_it_and_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Rule: a program on none of the places fails the test (never a skip), without a
    traceback, in one line naming the program and `make test-deps`."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(tools, "VENV_BIN", str(tmp_path))
    monkeypatch.setattr(tools, "SBIN", ())
    with pytest.raises(pytest.fail.Exception) as failed:
        tools.tool("sidestream-no-such-program", "nor-this-one")
    assert str(failed.value) == (
        "sidestream-no-such-program is not installed: `make test-deps` installs what the tests run"
    )
    assert not failed.value.pytrace


def test_beside_the_interpreter_comes_first_then_path_then_sbin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Rule: a program beside the interpreter (the `system` extra's kubectl) wins over one
    on PATH, which wins over /usr/sbin (where Debian puts nginx, off a user's PATH); of
    several names, the first found anywhere is taken."""
    venv, path, sbin = tmp_path / "venv", tmp_path / "path", tmp_path / "sbin"
    monkeypatch.setattr(tools, "VENV_BIN", str(venv))
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.setattr(tools, "SBIN", (str(sbin),))
    in_sbin = program(sbin, "kubectl")
    assert tools.tool("kubectl") == str(in_sbin)
    on_path = program(path, "kubectl")
    assert tools.tool("kubectl") == str(on_path)
    beside = program(venv, "kubectl")
    assert tools.tool("kubectl") == str(beside)
    alternative = program(path, "chromium-browser")
    assert tools.tool("chromium", "chromium-browser") == str(alternative)
