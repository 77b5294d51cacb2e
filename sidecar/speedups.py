"""The sidecar's compiled modules, asked of the one seam (`middleware.speedups.compiled`):
`_core.c` (`H1Core`, the chunk writer), `_heads.c` (the head rules) and `_uvread.c`. The other
sidecar modules take them from here, and `running()` names the core for the start line and
`--version` once every compiled module, the middleware's and these, was asked for.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from middleware import speedups
from middleware.speedups import compiled

core: ModuleType | None = compiled("sidecar._core")
heads: ModuleType | None = compiled("sidecar._heads")  # `sidecar.head_rules`' twin

if TYPE_CHECKING:
    from sidecar.upstream.h1core import H1Core
elif core is not None:
    H1Core = core.H1Core
else:
    from sidecar.upstream.h1core import H1Core

# The upstream read taking the GIL once (`servers.uvloop_internals`); None: uvloop's own.
uvread: ModuleType | None = compiled("sidecar._uvread")


def running() -> str:
    """Which core runs, in words: every compiled module has been asked for by now (the
    middleware's when this imported `middleware.speedups`, the sidecar's above)."""
    return speedups.core()


__all__ = ["H1Core", "core", "heads", "running", "uvread"]
