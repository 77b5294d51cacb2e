"""Forced usage: every OpenAI-style stream ends with the server's own token counts.

OpenAI-style servers send a usage chunk only when the client asked for it with
`stream_options.include_usage`, and most clients do not. With `usage="force"` the guard
asks for it on the client's behalf — it rewrites a streaming chat/completions or
completions request's body before the app (the proxy, the upstream) reads it — and, when
the client had not asked, takes out again what that caused (`usage_hide.HideUsage`, an
`Edit` on the relay: the usage chunk, `"usage":null` members), so that the client reads the
bytes it would have read without. `usage="continuous"` also asks vLLM for
`continuous_usage_stats`, so that a stream cut anywhere has the server's counts so far; its
per-chunk `usage` members are hidden too.

Deliberate choices (do not "fix" these):

- Only a body that is a JSON object with `"stream": true`, no duplicate key, valid UTF-8,
  and no larger than `BODY_LIMIT` is rewritten; anything else goes on byte for byte, and so
  does a request whose client asked for usage itself. Responses and Anthropic requests carry
  usage already and are not touched.
- The body is read before the app sees the request, so what is held per request has a
  stated bound: `BODY_LIMIT`, or the caller's lower `limit` (the sidecar's `--max-body`),
  plus the one message that crossed it (the server made it already; it is handed on). A
  body whose Content-Length is past the limit is not read here at all. How long the read
  may take is the server's to bound (the sidecar's `--body-timeout`).
- When the body has no `stream_options`, the field is inserted as text before the object's
  closing brace: every other byte stays as the client wrote it (numbers keep their
  spelling). An existing `stream_options` object is amended by re-serializing the body
  (key order and non-ASCII text kept; insignificant whitespace and number spelling are not).
- What the client is shown instead, and which bytes are held for it: `usage_hide`.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Coroutine
from operator import itemgetter
from typing import Any

from middleware.dialects import select
from middleware.speedups import usage_scanner
from middleware.types import Message, Receive, Scope
from middleware.usage_hide import HideUsage

MODES = ("pass", "force", "continuous")
BODY_LIMIT = 1 << 20  # request bytes read and parsed at most; a larger body goes unchanged
PATHS = ("openai.chat", "openai.completions")  # the dialects whose requests are rewritten
# The request's question answered in one pass over the bytes, without the JSON's objects,
# where built (`middleware/_usage.c`); what it leaves to this module (ASK) is answered here.
_compiled = usage_scanner


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate("a duplicate key")
    return obj


# One decoder: `json.loads` with a hook makes a decoder per call, a reference cycle that
# waits for the cyclic collector. Its scanner is called as `JSONDecoder.decode` calls it,
# without decode's two Python frames and two regex matches (on the path to the first token).
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)
_SCAN = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]  # typeshed names the class
_BLANKS = " \t\n\r"  # JSON's whitespace


def _decode(text: str) -> Any:
    """`_DECODER.decode(text)`: one JSON value, whitespace around it, ValueError otherwise."""
    start = len(text) - len(text.lstrip(_BLANKS))
    try:
        obj, end = _SCAN(text, start)
    except StopIteration:
        raise ValueError("no JSON value") from None
    if text[end:].strip(_BLANKS):
        raise ValueError("data after the JSON value")
    return obj


# What each mode asks for (`force`, `continuous`), and that as the field inserted in a body.
_ASKED: tuple[dict[str, bool], ...] = (
    {"include_usage": True},
    {"include_usage": True, "continuous_usage_stats": True},
)
_INSERTED = tuple(
    b',"stream_options":' + json.dumps(asked, separators=(",", ":")).encode() for asked in _ASKED
)


def rewrite(body: bytes, mode: str) -> bytes | None:
    """The request body with usage asked for, or None to forward `body` unchanged (not a
    streaming JSON object, malformed, or the client asked for usage itself)."""
    if len(body) > BODY_LIMIT:
        return None
    if _compiled is not None:
        at = _compiled.request(body)
        if at >= 0:  # the offset of the closing brace: no stream_options yet
            return body[:at] + _INSERTED[mode == "continuous"] + body[at:]
        if at == _compiled.UNCHANGED:
            return None
    try:
        obj = _decode(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or obj.get("stream") is not True:
        return None
    continuous = mode == "continuous"
    options = obj.get("stream_options")
    if options is None and "stream_options" not in obj:
        end = body.rstrip().rfind(b"}")
        return body[:end] + _INSERTED[continuous] + body[end:]
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return None  # an odd value, or the client asked: theirs to keep
    obj["stream_options"] = {**options, **_ASKED[continuous]}
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


_NAME = itemgetter(0)


def _with_length(scope: Scope, length: int) -> None:
    """Set the request's Content-Length to the rewritten body's (when it had one): in the
    server's list, where it is one (a copy would keep both for as long as the stream runs:
    the server holds on to its own)."""
    headers = scope.get("headers") or []
    value = b"%d" % length
    if isinstance(headers, list):
        # The names listed, counted and found by C loops: a Python loop over every header
        # was forced usage's largest Python cost per request.
        names = list(map(_NAME, headers))
        at = -1
        for _ in range(names.count(b"content-length")):
            at = names.index(b"content-length", at + 1)
            headers[at] = (b"content-length", value)
    elif any(name == b"content-length" for name, _ in headers):
        scope["headers"] = [
            (name, value if name == b"content-length" else old) for name, old in headers
        ]


def _declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, if it has one that is a plain number."""
    headers = scope.get("headers") or []
    names = list(map(_NAME, headers))  # found by a C loop, as in `_with_length`
    if b"content-length" not in names:
        return None
    value: bytes = headers[names.index(b"content-length")][1]
    return int(value) if value.isdigit() else None


def prepare(
    scope: Scope, receive: Receive, mode: str, limit: int = BODY_LIMIT
) -> Coroutine[Any, Any, tuple[Receive, HideUsage | None]] | None:
    """`force(...)`, to be awaited, for a POST to an OpenAI chat/completions or completions
    path when `mode` forces usage; None for any other request, and for any in mode "pass".
    `limit`: request body bytes read at most (never past `BODY_LIMIT`). Not a coroutine
    itself: a request's way to its first token awaits one coroutine less."""
    if mode == "pass" or scope.get("method") != "POST":
        return None
    dialect = select(scope.get("path", ""))
    if dialect is None or dialect.name not in PATHS:
        return None
    return force(scope, receive, mode, min(limit, BODY_LIMIT))


async def force(
    scope: Scope, receive: Receive, mode: str, limit: int = BODY_LIMIT
) -> tuple[Receive, HideUsage | None]:
    """Read the request body (up to `limit` bytes) and ask for usage in it. Returns the
    receive the app reads instead (the body, rewritten or not, then the client's receive)
    and the edit that hides usage from a client that did not ask (None when nothing was
    forced)."""
    declared = _declared_length(scope)
    if declared is not None and declared > limit:
        return receive, None  # too large to rewrite: not read here
    read: list[Message] = []
    size = 0
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            return _Replay(read, receive), None  # gone before its body was in
        size += len(message.get("body", b""))
        if size > limit:
            return _Replay(read, receive), None
        if not message.get("more_body", False):
            break
    body = (
        read[0].get("body", b"") if len(read) == 1 else b"".join(m.get("body", b"") for m in read)
    )
    rewritten = rewrite(body, mode)
    if rewritten is None:
        return _Replay(read, receive), None
    _with_length(scope, len(rewritten))
    message = {"type": "http.request", "body": rewritten, "more_body": False}
    return _Replay([message], receive), HideUsage(continuous=mode == "continuous")


class _Replay:
    """A receive that returns `messages` (the list is taken), then whatever `receive`
    returns. An object with two slots rather than a closure (a function, its cells and a
    list): the app keeps it for as long as the stream runs."""

    __slots__ = ("pending", "receive")

    def __init__(self, messages: list[Message], receive: Receive) -> None:
        self.pending: list[Message] | None = messages
        self.receive = receive

    async def __call__(self) -> Message:
        pending = self.pending
        if pending:
            message = pending.pop(0)
            if not pending:
                self.pending = None
            return message
        return await self.receive()
