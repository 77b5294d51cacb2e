"""Per-format knowledge of LLM event streams: tokens, usage, ids, finish reasons, error events.

A dialect is chosen by request path (`select`), else by the shape of the first event
(`sniff`). Dialects are stateless singletons; all per-stream state is in `StreamStats`.
One module per family of formats: `openai` (chat completions, completions, Responses; it
learns a chat stream's token chunk, `middleware.frame`), `anthropic`, `tgi`; `base` holds
`StreamStats`, the JSON helpers, `Dialect`, the generic fallback the others refine, and
`read_response`, what a whole JSON response (a call that did not stream) says. The paths
`select` knows are also what makes a `POST` a GenAI call (`middleware.telemetry.kinds`).

Hot path: `is_token` and `observe` decide with precompiled regexes and substring checks on
`event.data` and call `json.loads` only for the few events that carry something rare (the
first event, usage, a finish reason, the end-of-stream summary). The regexes look for
`"key": value` with the key's quotes unescaped, which text inside a JSON string can never
produce (its quotes are escaped), so content that merely mentions a key does not fool them.

Deliberate choices (do not "fix" these):

- Generated tokens that are not visible text still count as tokens, because the first-token
  timeout must not fire while a model reasons or writes a tool call: OpenAI
  `reasoning_content` / `reasoning` / `refusal` / tool-call `arguments`, Anthropic
  `thinking_delta` / `input_json_delta`, every Responses `response.*.delta`.
- `tokens` counts events that carry content, not model tokens; exact counts come from usage.
- `done` means the stream ended the way its protocol ends a *successful* stream: an upstream
  error event or a Responses `response.failed` does not set it.
- Malformed JSON never raises: it is counted in `StreamStats.malformed` and skipped.
"""

from __future__ import annotations

import functools

from middleware.dialects.anthropic import ANTHROPIC_EVENTS, Anthropic
from middleware.dialects.base import Dialect, StreamStats, _type, json_object, read_response
from middleware.dialects.openai import OpenAIChat, OpenAICompletions, OpenAIResponses
from middleware.dialects.tgi import TGI, TGI_TOKEN
from middleware.sse import Event

__all__ = ["Dialect", "StreamStats", "json_object", "read_response", "select", "sniff"]

GENERIC = Dialect()
OPENAI_CHAT = OpenAIChat()
OPENAI_COMPLETIONS = OpenAICompletions()
OPENAI_RESPONSES = OpenAIResponses()
ANTHROPIC = Anthropic()
TGI_STREAM = TGI()

_BY_PATH_SUFFIX = (
    ("/chat/completions", OPENAI_CHAT),
    ("/completions", OPENAI_COMPLETIONS),
    ("/responses", OPENAI_RESPONSES),
    ("/messages", ANTHROPIC),
    ("/generate_stream", TGI_STREAM),
)


@functools.lru_cache(maxsize=256)  # each request asks twice; a server serves a few paths
def select(path: str) -> Dialect | None:
    """The dialect for a request path (also under a prefix, e.g. /openai/v1/...), else None."""
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, dialect in _BY_PATH_SUFFIX:
        if path.endswith(suffix):
            return dialect
    return None


def sniff(event: Event) -> Dialect:
    """The dialect from the shape of a stream's first event, when `select` gave None."""
    kind = _type(event)
    if kind.startswith("response."):
        return OPENAI_RESPONSES
    if kind in ANTHROPIC_EVENTS:
        return ANTHROPIC
    data = event.data
    if '"chat.completion.chunk"' in data or ('"choices"' in data and '"delta"' in data):
        return OPENAI_CHAT
    if '"choices"' in data:
        return OPENAI_COMPLETIONS
    if TGI_TOKEN.search(data) is not None:
        return TGI_STREAM
    return GENERIC
