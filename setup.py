"""The compiled per-chunk core, built where a C compiler exists (metadata: pyproject.toml).

Optional: where the build fails (no compiler, no Python headers, no Cython) the install goes
on with the pure-Python core, and `sidestream --version` and the start line say so
(`middleware.speedups`).

Python modules compiled by Cython (pure-Python mode, typed by the `.pxd` beside each) are
built under another name: the interpreted module stays importable as the fallback. Their
source and `.pxd` are copied under the build directory as the compiled module's name
(`frame.py` as `_frame.py`, aiohttp's `reader_py.py` to `reader_c` done without a second
file in the tree), and compiled from there.
"""

import os
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]
# The Python modules compiled by Cython: the compiled module's name and its source (typed by
# the `.pxd` beside it). frame.py compiled stayed behind its hand C `_frame.c`
# (docs/performance.md, "Cython for the frame").
CYTHON: dict[str, str] = {
    "middleware.telemetry._otlp": "middleware/telemetry/otlp_attributes.py",
    "middleware.resume._stamper": "middleware/resume/stamper.py",
}
# The `.pxd` alone gives the C types: the annotations in the `.py` are for mypy.
DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,
    "binding": False,
    "always_allow_keywords": False,
}


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
            if ext.name in CYTHON:
                ext.sources = [self.cythonize(ext)]
            super().build_extension(ext)
        except Exception as exc:
            if REQUIRED:
                raise
            print(f"sidestream: {ext.name} is not built ({exc}); pure Python it is")

    def cythonize(self, ext: Extension) -> str:
        """The C that Cython writes for the Python module `ext` is compiled from, copied with
        its `.pxd` under the build directory as the compiled module's name."""
        from Cython.Build import cythonize

        source = Path(CYTHON[ext.name])
        copy = Path(self.build_temp, "cython", *ext.name.split(".")).with_suffix(".py")
        copy.parent.mkdir(parents=True, exist_ok=True)
        # Dated by the newest of the sources and this file (the directives), so that Cython
        # writes the C again when one of them changed, and only then.
        newest = max(
            os.path.getmtime(path) for path in (source, source.with_suffix(".pxd"), __file__)
        )
        for suffix in (".py", ".pxd"):
            shutil.copyfile(source.with_suffix(suffix), copy.with_suffix(suffix))
            os.utime(copy.with_suffix(suffix), (newest, newest))
        # Named by `ext`, not by the copy's place: the module is `middleware._frame`, and its
        # `.pxd` is looked for by that name, from the copy's root.
        module = Extension(ext.name, [str(copy)])
        root = str(Path(self.build_temp, "cython"))
        (compiled,) = cythonize(
            [module],
            compiler_directives=DIRECTIVES,
            include_path=[root],
            quiet=True,
            force=self.force,
        )
        return str(compiled.sources[0])


def depends(path: str) -> list[str]:
    """A compiled Python module's `.pxd`: a change to it is a rebuild, and the sdist ships it."""
    return [str(Path(path).with_suffix(".pxd"))] if path.endswith(".py") else []


setup(
    ext_modules=[
        Extension(name, [path], extra_compile_args=FLAGS, depends=depends(path))
        for name, path in [
            ("middleware._relaycore", "middleware/_relaycore.c"),
            ("middleware._frame", "middleware/_frame.c"),
            ("middleware._usage", "middleware/_usage.c"),
            ("sidecar._core", "sidecar/_core.c"),
            ("sidecar._heads", "sidecar/_heads.c"),
            ("sidecar._uvread", "sidecar/_uvread.c"),
            *CYTHON.items(),
        ]
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
