"""sidestream as users install it: the sdist and the wheel that `python -m build` makes, each
installed into a fresh venv, run from a directory with no source tree in it.

- The wheel, with the compiled core in it: `sidestream --version` names the version and the
  core; the installed `sidestream --upstream` in front of the installed `python -m
  sidecar.emulator` streams a chat completion, and its start line names the core; the unit
  tier passes against the installed package.
- The sdist where no compiler works (`CC=false`): it installs all the same, pure Python, and
  says so.

Bounded: one build and two venvs for the module, each step under a timeout; pip's cache
serves the dependencies (only PyPI is reached, for what the cache lacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from middleware.speedups import DISABLE
from tests.support.procs import CHAT, chat, free_port, get

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
VERSION = importlib.metadata.version("sidestream")
# What the installed programs run with: no switch from the suite's own run, which runs
# once with SIDESTREAM_NO_EXTENSIONS=1, so each install shows the core it really has.
ENV = {k: v for k, v in os.environ.items() if k != DISABLE and not k.startswith("OTEL_")}
# Left out of the copies: the source packages (so the tests import the installed ones) and
# what builds, venvs and tools leave behind.
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".*_cache",
    ".hypothesis", ".coverage*", "htmlcov",
)  # fmt: skip


def run(
    *argv: str | Path, timeout: float, env: dict[str, str] = ENV, cwd: Path | None = None
) -> str:
    """Run a command to its end; its output, or a failure showing its tail."""
    result = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{argv[:4]} exited {result.returncode}:\n{output[-4000:]}"
    return output


def new_venv(path: Path, *requirements: str, env: dict[str, str] = ENV) -> Path:
    """A fresh venv at `path` with `requirements` installed; its bin directory."""
    run(sys.executable, "-m", "venv", path, timeout=120)
    run(path / "bin" / "pip", "install", "--quiet", *requirements, timeout=600, env=env)
    return path / "bin"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel of a copy of the source tree (`python -m build`: the sdist,
    then the wheel built from it, so the sdist is known to be whole)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("middleware", "sidecar"):
        shutil.copytree(ROOT / package, src / package, ignore=NOT_COPIED)
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, src, timeout=600)
    return out


@pytest.fixture(scope="module")
def wheel_bin(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel installed, and the dev extra the unit tier imports."""
    (wheel,) = dist.glob("sidestream-*.whl")
    return new_venv(tmp_path_factory.mktemp("wheel") / "venv", f"{wheel}[dev]")


@pytest.fixture(scope="module")
def sdist_bin(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the sdist installed where no C compiler works."""
    (sdist,) = dist.glob("sidestream-*.tar.gz")
    return new_venv(
        tmp_path_factory.mktemp("sdist") / "venv", str(sdist), env={**ENV, "CC": "false"}
    )


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory with no source tree: what runs there imports the installed copy."""
    return tmp_path


def test_the_wheel_holds_the_compiled_core_and_says_so(wheel_bin: Path, outside: Path) -> None:
    """`sidestream --version` from the wheel names the version and the compiled core, and
    the package it imports is the installed one."""
    assert run(wheel_bin / "sidestream", "--version", timeout=60, cwd=outside) == (
        f"sidestream {VERSION} (compiled core)\n"
    )
    where = run(
        wheel_bin / "python",
        "-c",
        "import middleware; print(middleware.__file__)",
        timeout=60,
        cwd=outside,
    )
    assert "site-packages" in where


def test_the_sdist_installs_without_a_compiler_as_pure_python(
    sdist_bin: Path, outside: Path
) -> None:
    """`pip install` of the sdist with `CC=false` succeeds, and `sidestream --version` says
    the pure-Python core runs because the compiled one is not built."""
    assert run(sdist_bin / "sidestream", "--version", timeout=60, cwd=outside) == (
        f"sidestream {VERSION} (pure-Python core: the compiled one is not built)\n"
    )


@pytest.fixture
def installs(wheel_bin: Path, sdist_bin: Path) -> dict[str, Path]:
    return {"wheel": wheel_bin, "sdist": sdist_bin}


@pytest.mark.parametrize(
    ("install", "core"),
    [("wheel", "compiled core"), ("sdist", "pure-Python core: the compiled one is not built")],
)
async def test_the_installed_sidecar_streams_from_the_installed_emulator(
    installs: dict[str, Path], install: str, core: str, outside: Path
) -> None:
    """The installed `sidestream --upstream` in front of the installed `python -m
    sidecar.emulator` streams a chat completion to its end, and its one start line names
    the version and the core."""
    bin_dir = installs[install]
    upstream, port = free_port(), free_port()
    with started(
        outside,
        emulator=[bin_dir / "python", "-m", "sidecar.emulator", "--listen", f"127.0.0.1:{upstream}"],
        sidecar=[
            bin_dir / "sidestream",
            "--upstream", f"http://127.0.0.1:{upstream}",
            "--listen", f"127.0.0.1:{port}",
            "--admin-listen", "off",
        ],
    ) as children:  # fmt: skip
        await until_listening(upstream, children["emulator"])
        await until_listening(port, children["sidecar"])
        status, _, body = await get(port, CHAT, "POST", chat(tokens=5, itl_ms=1))
    assert status == 200 and body.rstrip().endswith(b"data: [DONE]"), body[-300:]
    log = (outside / "sidecar.log").read_text()
    assert [line for line in log.splitlines() if f"sidestream {VERSION} ({core}) on" in line]


def test_the_unit_tier_passes_against_the_installed_wheel(wheel_bin: Path, tmp_path: Path) -> None:
    """The unit tier passes importing the installed wheel (its compiled twins included), not
    the source packages: no bytecode of theirs is written while it runs."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=NOT_COPIED)
    # The tests import `tests.*` and `bench.*` through `path`, which holds everything of the
    # tree but the two packages, so `middleware` and `sidecar` come from site-packages; the
    # tree keeps them for the tests that read the source files (the Dockerfile's COPY).
    path = tmp_path / "path"
    path.mkdir()
    for entry in tree.iterdir():
        if entry.name not in ("middleware", "sidecar"):
            (path / entry.name).symlink_to(entry)
    env = {k: v for k, v in ENV.items() if k != "PYTHONDONTWRITEBYTECODE"}
    run(
        wheel_bin / "pytest", "tests/unit", "-q", "-x", "-p", "no:cacheprovider",
        "-o", f"pythonpath={path}",
        timeout=800, cwd=tree, env=env,
    )  # fmt: skip
    assert not list(tree.glob("middleware/**/__pycache__"))
    assert not list(tree.glob("sidecar/**/__pycache__"))
    assert list((path / "tests").glob("support/__pycache__/*.pyc"))  # bytecode is written


@contextlib.contextmanager
def started(
    cwd: Path, **commands: list[str | Path]
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Child processes started in order, each writing to `<name>.log` in `cwd`; killed on exit."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in commands.items():
            with (cwd / f"{name}.log").open("wb") as log:
                children[name] = subprocess.Popen(
                    [str(a) for a in argv], stdout=log, stderr=log, env=ENV, cwd=cwd
                )
        yield children
    finally:
        for child in children.values():
            child.kill()
            child.wait()


async def until_listening(port: int, child: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Wait until `port` accepts a connection; fail if `child` exits first."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        assert child.poll() is None, f"{child.args[:3]} exited {child.returncode}"
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert asyncio.get_running_loop().time() < deadline, f"nothing listens on {port}"
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
