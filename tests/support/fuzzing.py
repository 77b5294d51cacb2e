"""How many examples a property test tries: its own count, times `SIDESTREAM_FUZZ_SCALE`.

`make test` runs each property at its own count (scale 1); `make sanitize` runs the twin
properties under AddressSanitizer and UBSan at a larger scale, the differential fuzz, time-boxed
by the counts it asks for.
"""

from __future__ import annotations

import os

SCALE = max(1, int(os.environ.get("SIDESTREAM_FUZZ_SCALE", "1") or "1"))


def examples(count: int) -> int:
    """`count` examples, scaled."""
    return count * SCALE
