"""The compiled core is optional: where no C compiler works, `pip` still builds sidestream,
pure Python, and says so (issue #31's rule for the source distribution)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_build_without_a_compiler_falls_back_to_pure_python(tmp_path: Path) -> None:
    """`pip wheel` with a compiler that always fails (CC=/bin/false) succeeds; each compiled
    module is named as not built, and the wheel holds the Python cores and no binary."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("middleware", "sidecar"):
        shutil.copytree(
            ROOT / package, src / package, ignore=shutil.ignore_patterns("*.so", "__pycache__")
        )
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(src)],
        env={**os.environ, "CC": "/bin/false"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "middleware._relaycore is not built" in output
    assert "sidecar._core is not built" in output
    assert "sidecar._heads is not built" in output
    assert "middleware._usage is not built" in output
    assert "middleware.telemetry._otlp is not built" in output
    assert "middleware.resume._stamper is not built" in output
    assert "sidecar._uvread is not built" in output  # no twin: uvloop's own reads then
    (wheel,) = tmp_path.glob("sidestream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "middleware/relaycore.py" in names and "sidecar/upstream/h1core.py" in names
    assert "middleware/telemetry/gaps.py" in names
    assert "sidecar/servers/response_head.py" in names
    assert "middleware/usage.py" in names
    assert "middleware/telemetry/otlp_encoder.py" in names
    assert not [n for n in names if n.endswith(".so")]
