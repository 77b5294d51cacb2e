"""The compiled modules as built, whatever SIDESTREAM_NO_EXTENSIONS says: the switch decides
what runs, not what exists, so the tests of a compiled part run in both passes of the suite."""

from __future__ import annotations

import importlib
from types import ModuleType


def built(name: str) -> ModuleType | None:
    """The compiled module `name`, or None where it was not built."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
