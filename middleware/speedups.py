"""Which per-chunk core runs: the compiled one where it was built, else the Python one.

`make install` (and any `pip install` from source with a C compiler) builds
`middleware/_relaycore.c` (`RelayCore`) and `middleware/_frame.c` (`Frame`), picked here,
and the other compiled modules their own modules pick; where no compiler exists the install
goes on without them. `SIDESTREAM_NO_EXTENSIONS=1` picks the Python twins even where the
compiled ones were built (the test suite runs once each way). `core()` says which runs, where
a user reads it: the sidecar's start line and `sidestream --version`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

DISABLE = "SIDESTREAM_NO_EXTENSIONS"
# The compiled modules asked for so far, and whether each was there.
_asked: dict[str, bool] = {}


def disabled() -> bool:
    return os.environ.get(DISABLE, "") not in ("", "0")


def compiled(name: str) -> ModuleType | None:
    """The compiled module `name`, or None: turned off by `SIDESTREAM_NO_EXTENSIONS`, or not
    built (`core()` names it)."""
    if disabled():
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        _asked[name] = False
        return None
    _asked[name] = True
    return module


def core() -> str:
    """Which core runs, in words, from the compiled modules the imports asked for."""
    if disabled():
        return f"pure-Python core: {DISABLE}=1"
    missing = [name for name, found in _asked.items() if not found]
    if not missing:
        return "compiled core"
    if len(missing) == len(_asked):
        return "pure-Python core: the compiled one is not built"
    return f"compiled core, pure Python for {', '.join(missing)} (not built)"


if TYPE_CHECKING:
    from middleware.frame import Frame, first_token
    from middleware.relaycore import RelayCore, Tally
else:
    _core = compiled("middleware._relaycore")
    if _core is not None:
        RelayCore, Tally = _core.RelayCore, _core.Tally
    else:
        from middleware.relaycore import RelayCore, Tally
    _frame = compiled("middleware._frame")
    if _frame is not None:
        Frame, first_token = _frame.Frame, _frame.first_token
    else:
        from middleware.frame import Frame, first_token

__all__ = ["Frame", "RelayCore", "Tally", "compiled", "core", "first_token"]
