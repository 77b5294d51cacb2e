"""The loop of `otlp_encoder.Encoder.attributes`: each attribute's KeyValue field, joined.

A sidestream span has 30-odd attributes, and encoding them is the largest Python loop a stream
runs with telemetry on. Each attribute is a dictionary hit in its tag's caches and, for a
number, its bytes; what is not in them is left to the encoder's own methods, which encode it
(and keep it): `miss` for a cache miss, `other` for a value of a kind never cached.

One source, two cores: setup.py compiles this module with Cython (pure-Python mode, typed by
`otlp_attributes.pxd`) as `middleware.telemetry._otlp`, which `otlp_encoder` picks where it was
built (`middleware.speedups`); this module is the interpreted fallback.
tests/unit/test_core_twins.py runs both on the same attributes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any

BYTE = [bytes((n,)) for n in range(0x80)]  # the one-byte varints
double = struct.Struct("<d").pack


def varint(n: int) -> bytes:
    """`n` (not negative) as a protobuf varint."""
    if n < 0x80:
        return BYTE[n]
    if n < 0x4000:  # lengths, ports, status codes, most counts
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def attributes(
    items: Iterable[tuple[str, Any]],
    strings: dict[tuple[str, Any], bytes],
    doubles: dict[str, bytes],
    ints: dict[tuple[str, int], bytes],
    miss: Callable[[Any, bytes, str, Any], bytes],
    other: Callable[[bytes, str, Any], bytes],
    tagged: Any,
    tag: bytes,
) -> bytes:
    """Each (key, value) of `items` as one `tag` field: from the tag's caches (`tagged` is
    the three of them, handed on to `miss`), else from `miss` or `other`."""
    parts = []
    for key, value in items:
        kind = type(value)
        try:  # hits, nearly always: each a dict lookup (a miss costs a KeyError, once)
            if kind is str:
                parts.append(strings[key, value])
                continue
            # The usual numbers (times, rates, counts): a cached head, then the value's bytes
            # (two parts: joined once, at the end, not concatenated first).
            if kind is float:
                parts.append(doubles[key])
                parts.append(double(value))
                continue
            if kind is int and 0 <= value < 1 << 63:
                payload = BYTE[value] if value < 0x80 else varint(value)
                parts.append(ints[key, len(payload)])
                parts.append(payload)
                continue
            if kind is bool or kind is tuple:  # a flag, or strings (finish reasons)
                parts.append(strings[key, value])
                continue
        except KeyError:
            parts.append(miss(tagged, tag, key, value))
            continue
        parts.append(other(tag, key, value))
    return b"".join(parts)
