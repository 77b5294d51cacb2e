"""What every dialect shares: the per-stream `StreamStats`, JSON helpers that never raise,
and `Dialect`, the generic fallback the others refine."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from middleware.sse import Event

if TYPE_CHECKING:
    from middleware.frame import Frame


@dataclass(slots=True)
class StreamStats:
    """What `Dialect.observe` learned about one stream; read by telemetry at its end."""

    events: int = 0  # events observed
    tokens: int = 0  # events that carried content (see Dialect.is_token)
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    input_tokens: int | None = None  # from usage, when the stream reports it
    output_tokens: int | None = None
    cache_read_tokens: int | None = None  # input tokens served from the provider's cache
    cache_creation_tokens: int | None = None  # input tokens written to it (Anthropic)
    reasoning_tokens: int | None = None  # output tokens spent on reasoning
    done: bool = False  # saw the dialect's end-of-stream marker
    malformed: int = 0  # events whose JSON could not be parsed where it was needed
    frame: Frame | None = None  # learned from a plain token chunk (Dialect.count_chunk)


# What json.loads runs under its Python layers: the C scanner, (value, end) from an index
# (typeshed does not declare the attribute).
_scan: Callable[[str, int], tuple[Any, int]]
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """The JSON object `text` holds, None when it holds anything else or is not JSON.

    Compact UTF-8 JSON, what servers send and clients post, goes to the C scanner directly:
    `json.loads`' Python layers (encoding detection, whitespace skipping, its checks) cost
    more than parsing a chunk. Whatever the scanner does not take whole (whitespace around
    the value, a BOM, UTF-16, not JSON) is left to `json.loads`, so the result is its own.
    """
    try:
        data = text.decode() if isinstance(text, bytes) else text
        obj, end = _scan(data, 0)
        if end == len(data):
            return obj if type(obj) is dict else None
    except (StopIteration, ValueError, RecursionError):
        pass
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _loads(data: str, stats: StreamStats) -> dict[str, Any]:
    """The event's JSON object, or {} (counted as malformed) when it is not one."""
    obj = json_object(data)
    if obj is not None:
        return obj
    stats.malformed += 1
    return {}


def _dict(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def _int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage(stats: StreamStats, obj: dict[str, Any], input_key: str, output_key: str) -> None:
    """Take the token counts from `obj`'s usage object, when it has one."""
    usage = _dict(obj, "usage")
    if usage:
        stats.input_tokens = _int(usage, input_key)
        stats.output_tokens = _int(usage, output_key)
        # OpenAI's and vLLM's details objects (chat: prompt_/completion_tokens_details;
        # Responses: input_/output_tokens_details); Anthropic's cache counts sit beside.
        details = _dict(usage, "prompt_tokens_details") or _dict(usage, "input_tokens_details")
        if details:
            stats.cache_read_tokens = _int(details, "cached_tokens")
        out = _dict(usage, "completion_tokens_details") or _dict(usage, "output_tokens_details")
        if out:
            stats.reasoning_tokens = _int(out, "reasoning_tokens")
        if "cache_read_input_tokens" in usage:
            stats.cache_read_tokens = _int(usage, "cache_read_input_tokens")
        if "cache_creation_input_tokens" in usage:
            stats.cache_creation_tokens = _int(usage, "cache_creation_input_tokens")


def _identify(obj: dict[str, Any], stats: StreamStats) -> None:
    """Take the response id and model from `obj` where the stats do not have them yet."""
    if stats.response_id is None:
        stats.response_id = _str(obj, "id")
    if stats.response_model is None:
        stats.response_model = _str(obj, "model")


def read_response(obj: dict[str, Any], stats: StreamStats) -> None:
    """Take what a whole JSON response holds (a call that did not stream), or a part of one
    (`{"usage": {...}}`), into `stats`: id and model, usage in either shape (OpenAI chat and
    completions: `prompt_tokens`, `completion_tokens`; Anthropic Messages and OpenAI
    Responses: `input_tokens`, `output_tokens`), and the finish reasons (OpenAI's
    `choices[].finish_reason`, Anthropic's `stop_reason`). Never raises."""
    _identify(obj, stats)
    usage = _dict(obj, "usage")
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        _usage(stats, obj, "prompt_tokens", "completion_tokens")
    elif usage:
        _usage(stats, obj, "input_tokens", "output_tokens")
    choices = obj.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        reason = _str(choice, "finish_reason") if isinstance(choice, dict) else None
        if reason is not None:
            stats.finish_reasons.append(reason)
    reason = _str(obj, "stop_reason")
    if reason is not None:
        stats.finish_reasons.append(reason)


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One complete SSE event; json.dumps escapes newlines, so `data` is one line."""
    line = "data: " + json.dumps(data, separators=(",", ":")) + "\n\n"
    return (line if event is None else f"event: {event}\n{line}").encode()


_TYPE = re.compile(r'"type"\s*:\s*"([^"\\]*)"')


def _type(event: Event) -> str:
    """The event's type: its `event:` field, else the first "type" key of its data."""
    if event.event != "message":
        return event.event
    match = _TYPE.search(event.data)
    return match.group(1) if match else ""


class Dialect:
    """Generic fallback: every data event except `[DONE]` is a chunk carrying content."""

    name = "generic"
    operation = "chat"

    def is_token(self, event: Event) -> bool:
        return event.data != "[DONE]" and event.data != ""

    def first_token(self, parts: list[bytes]) -> bool | None:
        """Does one of these events carry a token, decided on their bytes (`parts`: the
        data of whole one-line `data:` events), without making the events: True, False, or
        None where the events must be made and asked (`is_token`). None here: always."""
        return None

    def observe(self, event: Event, stats: StreamStats) -> None:
        """Update `stats` from one event. Never raises on malformed data."""
        stats.events += 1
        if self.is_token(event):
            stats.tokens += 1
        self._details(event, stats)

    def count_chunk(self, body: bytes, stats: StreamStats) -> bool:
        """Account for a whole chunk at once, without splitting it into events.

        A fast path for the usual chunk: only called at an event boundary. Returns False,
        changing nothing, when the chunk is not plain enough to decide this way; the caller
        then feeds it event by event.
        """
        return False

    def _details(self, event: Event, stats: StreamStats) -> None:
        if event.data == "[DONE]":
            stats.done = True
        elif stats.events == 1 and event.data.startswith("{"):
            _identify(_loads(event.data, stats), stats)

    def error_event(self, error: dict[str, str]) -> bytes:
        """One complete terminal SSE event carrying `error` (message, type, code)."""
        return _sse({"error": error})
