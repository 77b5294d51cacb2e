"""Which per-read core the sidecar runs: compiled (`sidecar/_core.c`, `sidecar/_heads.c`) or
Python.

The same choice as `middleware.speedups` (whose `compiled` this uses): the compiled core
where it was built and `SIDESTREAM_NO_EXTENSIONS` is not set, else the Python one.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from middleware.speedups import compiled

core: ModuleType | None = compiled("sidecar._core")
heads: ModuleType | None = compiled("sidecar._heads")  # `sidecar.head_rules`' twin

if TYPE_CHECKING:
    from sidecar.upstream.h1core import H1Core
elif core is not None:
    H1Core = core.H1Core
else:
    from sidecar.upstream.h1core import H1Core

__all__ = ["H1Core", "core", "heads"]
