"""The HTTP/1.1 response head the traffic listener writes for an `http.response.start`: by
uvicorn's rules (its httptools protocol, the release named in `uvicorn_internals.CHECKED`),
its rules written as uvicorn's own loop.

A plain function of the message and the request: no I/O, no uvicorn import. uvicorn's rules,
which the tests hold this to by comparing the two on the same messages:
- the status line from `http.HTTPStatus` (no phrase for a code it does not know; a status
  outside 100..599 is a `KeyError`);
- a name with a control byte, a space or one of `()<>@,;:\\"[]={}` (RFC 9110's delimiters
  but `/` and `?`; bytes above 0x7f pass), or a value with a control byte other than tab
  (CR and LF among them: no header smuggled in), is refused:
  `RuntimeError("Invalid HTTP header name.")` / `("Invalid HTTP header value.")`, for the
  first bad header in order, its name before its value;
- names are written lower-cased, values as given;
- framing: the first `content-length` (unless a `transfer-encoding: chunked` came before
  it) gives a length (`int()` of it: a `ValueError` when it is not a number); a
  `transfer-encoding: chunked` makes the body chunked; with neither, the body is chunked
  and the head says so, except for HEAD, 204 and 304, which have no body;
- a `connection` header with the token `close` ends keep-alive; a connection not kept alive
  says `connection: close` unless the app already did.

The rules are written as uvicorn's loop over the headers in `sidecar.head_rules` (its compiled
twin `sidecar/_heads.c` picked where it was built, as `sidecar.speedups` picks), with the byte checks on all
of a head's names, then all its values, at once; a head they refuse, or of an unusual shape (a
name not `bytes`, an item not a pair), goes through uvicorn's loop as uvicorn wrote it, which
raises what uvicorn raises. The head is on the path to each stream's first token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sidecar import head_rules
from sidecar.head_rules import STATUS_LINES, Head
from sidecar.speedups import heads

response_head: Callable[[int, Sequence[Any], bool, bool], Head] = (
    head_rules.response_head if heads is None else heads.response_head
)

__all__ = ["STATUS_LINES", "Head", "response_head"]
