"""Stream ids, event ids and credential hashes: pure functions, no I/O.

A stream id is 128 random bits, URL-safe base64 (22 characters). An event id is
`<stream-id>:<n>`, n the event's 1-based index in the stream (comments are not events), so
a client that only counts the events it received can name its resume point.

A stream's credential hash is HMAC-SHA256 keyed by the deployment's secret over the stream id
and the request's credential headers (`Authorization`, `X-Api-Key`, `Cookie` by default), so
that whoever reads the store can neither test guesses of a credential without the secret nor
tell that two streams share one; a stream without credentials gets a hash too, so that a
replica with another secret cannot resume or stop it either.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

ID_BYTES = 16  # 128 bits
# Explicit ASCII classes, not `\d` or `\w` (Unicode in a str pattern) nor `str.isdigit()`
# (true for "³", which `int()` refuses, and for "٣", which it reads as 3): a resume point is
# 1 to 15 ASCII digits, whatever the client's encoding made of its bytes.
_STREAM_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")
_EVENT_ID = re.compile(r"([A-Za-z0-9_-]{16,64}):([0-9]{1,15})")
_POINT = re.compile(r"[0-9]{1,15}")
_OWS = " \t"  # a header's optional whitespace (RFC 9110), the only one stripped
# The request headers whose value a resume must repeat (the original request's credentials).
CREDENTIAL_HEADERS = (b"authorization", b"x-api-key", b"cookie")
# A shorter key could be guessed along with the credentials by whoever reads the store.
MIN_SECRET_BYTES = 16


class InvalidEventId(ValueError):
    """A `Last-Event-ID` (or `after=`) that is not `<stream-id>:<n>` (or a whole number)."""


def new_stream_id() -> str:
    return secrets.token_urlsafe(ID_BYTES)


def valid_stream_id(value: str) -> bool:
    return _STREAM_ID.fullmatch(value) is not None


def parse_event_id(value: str) -> tuple[str, int]:
    """`<stream-id>:<n>` into (stream id, n); InvalidEventId otherwise."""
    match = _EVENT_ID.fullmatch(value.strip(_OWS))
    if match is None:
        raise InvalidEventId(value)
    return match[1], int(match[2])


def parse_after(value: str) -> int:
    """The `after=<n>` of a resume URL (already percent-decoded); InvalidEventId unless it
    is 1 to 15 ASCII digits, with no whitespace (a query value carries none)."""
    if _POINT.fullmatch(value) is None:
        raise InvalidEventId(value)
    return int(value)


def credential_hash(
    key: bytes,
    stream_id: str,
    headers: list[tuple[bytes, bytes]],
    names: tuple[bytes, ...] = CREDENTIAL_HEADERS,
) -> str:
    """The stream's credential hash (see the module docstring): stored with the stream and
    compared on resume and stop, so neither the credentials nor the key are ever stored.
    `names`: the credential headers, lower-case."""
    found: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        name = name.lower()
        if name not in names:
            continue
        if name == b"cookie":  # cookie by cookie: HTTP/2 may split the header into several
            found.extend((name, c.strip(b" \t")) for c in value.split(b";") if c.strip(b" \t"))
        else:
            found.append((name, value))
    mac = hmac.new(key, stream_id.encode() + b"\0", hashlib.sha256)
    for name, value in sorted(found):
        mac.update(name + b"\0" + value + b"\0")
    return mac.hexdigest()


def same_credentials(stored: str, presented: str) -> bool:
    return hmac.compare_digest(stored, presented)
