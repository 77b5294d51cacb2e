"""Which per-chunk core runs: the compiled one where it was built, else the Python one.

`make install` (and any `pip install` from source with a C compiler) builds
`middleware/_relaycore.c` (`RelayCore`) and `middleware/_frame.c` (`Frame`), picked here,
and the other compiled modules their own modules pick; where no compiler exists the install goes on without them and this module says so once for each, at
import. `SIDESTREAM_NO_EXTENSIONS=1` picks the Python twins even where the compiled ones were
built (the test suite runs once each way).
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING

DISABLE = "SIDESTREAM_NO_EXTENSIONS"


def compiled(name: str) -> ModuleType | None:
    """The compiled module `name`, or None: turned off by `SIDESTREAM_NO_EXTENSIONS`, or not
    built (one log line)."""
    if os.environ.get(DISABLE, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        logging.getLogger("sidestream").info(
            "%s is not built (%s): the per-chunk path runs in pure Python", name, exc
        )
        return None


if TYPE_CHECKING:
    from middleware.frame import Frame, first_token
    from middleware.relaycore import RelayCore
else:
    _core = compiled("middleware._relaycore")
    if _core is not None:
        RelayCore = _core.RelayCore
    else:
        from middleware.relaycore import RelayCore
    _frame = compiled("middleware._frame")
    if _frame is not None:
        Frame, first_token = _frame.Frame, _frame.first_token
    else:
        from middleware.frame import Frame, first_token

__all__ = ["Frame", "RelayCore", "compiled", "first_token"]
