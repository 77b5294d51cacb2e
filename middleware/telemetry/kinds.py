"""What a request was, decided once, at its end, for every sink to follow: a stream, a GenAI
call that did not stream, or other traffic (the rule, for users: docs/telemetry.md).

- `STREAM`: its response has a content type the guard streams; or it asked for a stream
  (a GenAI call whose body says `"stream": true`) and got an error or no answer instead (the
  upstream's 429 or 5xx, the guard's 504, a client that left first); or the guard refused it
  at admission (refused before anything is read, and `max_streams` counts every request in
  flight, so a refusal counts as a stream that never was).
- `CALL`: a `POST` to a GenAI path (`dialects.select`) that did not stream, answered with
  JSON, or with an error, or not at all.
- `OTHER`: everything else: a CORS preflight, `HEAD`, a model listing, a 404 on another
  path, a health probe.

Only streams count in `sidestream.streams`, the cancellations, keep-alives and the
active-streams gauge; GenAI metrics and names are for streams and calls (`is_genai`); other
traffic gets an access line only with `Telemetry(access_all=True)`.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from middleware.registry import StreamRegistry


class Kind(Enum):
    STREAM = "stream"
    CALL = "call"
    OTHER = "other"


STREAM, CALL, OTHER = Kind.STREAM, Kind.CALL, Kind.OTHER


def classify(
    *,
    streamed: bool,
    refused: bool,
    call: bool,
    asked_stream: bool,
    answered: bool,
    json: bool,
    status: int,
) -> Kind:
    """The request's kind. `streamed`: its response was a guarded stream; `refused`: at
    admission; `call`: a `POST` to a GenAI path; `asked_stream`: its body says
    `"stream": true`; `answered`: the app began a response (not the guard, not nobody);
    `json`: that response is JSON; `status`: the one the client got (0: none)."""
    if streamed or refused:
        return STREAM
    if not call:
        return OTHER
    failed = status >= 400 or not answered
    if failed and asked_stream:
        return STREAM
    if json or failed:
        return CALL
    return OTHER


def is_genai(kind: Kind, streamed: bool, call: bool) -> bool:
    """Whether a request of `kind` is reported as a GenAI operation (its metrics, its span's
    name and `gen_ai.*` attributes): a call, a streamed response on any path (its format
    sniffed from its first event), and a stream that never began on a GenAI path."""
    return kind is CALL or (kind is STREAM and (streamed or call))


def streams_in(registry: StreamRegistry) -> int:
    """The streams in flight in `registry`: requests whose response is a stream, and resume
    readers (which have no `streaming`: each is one). A request whose response has not begun,
    or is not a stream, is not counted; `max_streams` admits against all of them. Read at a
    scrape, not per request."""
    return sum(1 for request in registry.requests() if getattr(request, "streaming", True))
