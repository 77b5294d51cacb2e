"""The compiled per-chunk core, built where a C compiler exists (metadata: pyproject.toml).

Optional: where the build fails (no compiler, no Python headers) the install goes on with
the pure-Python core, and `sidestream --version` and the start line say so (`middleware.speedups`).
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]


# Set by `make sanitize`: a build that must make every extension fails where one fails.
REQUIRED = os.environ.get("SIDESTREAM_REQUIRE_BUILD", "") not in ("", "0")


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all
            if REQUIRED:
                raise
            print(f"sidestream: the compiled core is not built ({exc}); pure Python it is")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            if REQUIRED:
                raise
            print(f"sidestream: {ext.name} is not built ({exc}); pure Python it is")


setup(
    ext_modules=[
        Extension(name, [path], extra_compile_args=FLAGS)
        for name, path in [
            ("middleware._relaycore", "middleware/_relaycore.c"),
            ("middleware._frame", "middleware/_frame.c"),
            ("middleware._usage", "middleware/_usage.c"),
            ("middleware.telemetry._otlp", "middleware/telemetry/_otlp.c"),
            ("sidecar._core", "sidecar/_core.c"),
            ("sidecar._heads", "sidecar/_heads.c"),
            ("sidecar._uvread", "sidecar/_uvread.c"),
        ]
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
