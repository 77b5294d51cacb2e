"""The one seam between the compiled core and the Python one: what runs is decided here.

`make install` (and any `pip install` from source with a C compiler and Cython) builds the
compiled modules; where it cannot, the install goes on without them. `compiled` is the one
place that imports them: the compiled module where it was built and `SIDESTREAM_NO_EXTENSIONS`
(read here only) is not set, else None and the Python twin runs (the test suite runs once
each way). The middleware's picks are bound below: `RelayCore` and `Tally`
(`middleware/_relaycore.c`), `Frame` and `first_token` (`_frame.c`), forced usage's scanner
(`_usage.c`); resume's stamper where it is used (`middleware.resume.producer`: `stamper.py`
compiled by Cython; binding it here would import the resume package with every module); the
sidecar's in `sidecar.speedups`, which asks `compiled` the same way (this package never
imports the sidecar). `core()` says which runs, where a user reads it: the
sidecar's start line and `sidestream --version`, once both modules have asked.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

DISABLE = "SIDESTREAM_NO_EXTENSIONS"
# The compiled modules asked for so far, and whether each runs (False: not built, or off).
_asked: dict[str, bool] = {}


def disabled() -> bool:
    return os.environ.get(DISABLE, "") not in ("", "0")


def compiled(name: str) -> ModuleType | None:
    """The compiled module `name`, or None: turned off by `SIDESTREAM_NO_EXTENSIONS`, or not
    built (`core()` names it)."""
    if disabled():
        _asked[name] = False
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
# Forced usage's two questions answered in one pass over the bytes (`usage`, `usage_hide`);
# None: the json module answers them.
usage_scanner: ModuleType | None = compiled("middleware._usage")

__all__ = ["Frame", "RelayCore", "Tally", "compiled", "core", "first_token", "usage_scanner"]
